#!/usr/bin/env bash
# Builds the real node's two images as OCI archives with umoci (no container daemon, no
# registry, no base image downloaded), for `ctr images import`:
#
#   pause.tar      registry.k8s.io/pause:3.10.2: the kubelet's sandbox image, compiled from
#                  the pause.c of the pinned k8s.io/kubernetes module (static, like upstream's
#                  Makefile builds it)
#   postgres.tar   localhost/devctl/postgres:15: PostgreSQL 15 from this machine's Debian
#                  packages (postgresql-15, postgresql-client-15 and their shared libraries,
#                  tzdata, dash as /bin/sh), laid out like the official postgres image: the
#                  binaries in /usr/lib/postgresql/15/bin, user postgres with uid 999
#
#   tools/node/images.sh OUT_DIR     # builds what OUT_DIR lacks; prints OUT_DIR last
#
# The operator image comes from tools/image/build.sh. The archives are keyed by what they
# are built from (the pause source's version; the Debian package versions and this script):
# OUT_DIR is a cache, and a change builds again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../control-plane/versions.env
source "$here/../control-plane/versions.env"

log() { printf '[node images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed ($2)"; }
need umoci "Debian package umoci (tools/install-prerequisites.sh installs it)"
need gcc "the pause binary is compiled from its C source"
need ldd "part of libc-bin; it lists the shared libraries the engine binaries need"

out="${1:?usage: images.sh OUT_DIR}"
mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9

PAUSE_VERSION=3.10.2
PAUSE_IMAGE="registry.k8s.io/pause:$PAUSE_VERSION"
POSTGRES_IMAGE="localhost/devctl/postgres:15"
created="1970-01-01T00:00:00Z"
# The images run this machine's binaries: its architecture (Debian's name is the OCI one).
arch="$(dpkg --print-architecture)"

# new_image <work dir> <tag>: an empty image and its unpacked bundle in <work dir>.
new_image() {
  umoci init --layout "$1/oci" >&2
  umoci new --image "$1/oci:$2" >&2
  umoci unpack --image "$1/oci:$2" "$1/bundle" >&2
}

# finish_image <work dir> <tag> <archive> <umoci config args...>: one layer, the config,
# then an OCI archive whose index names the image by its full reference.
finish_image() {
  local work="$1" tag="$2" archive="$3"; shift 3
  umoci repack --image "$work/oci:$tag" --history.created_by "tools/node/images.sh" \
    --history.created "$created" "$work/bundle" >&2
  umoci config --image "$work/oci:$tag" --architecture "$arch" --os linux --created "$created" \
    --no-history "$@" >&2
  umoci gc --layout "$work/oci" >&2
  tar -C "$work/oci" -cf "$archive.tmp" .
  mv "$archive.tmp" "$archive"
}

pause_archive="$out/pause-$PAUSE_VERSION.tar"
if [[ ! -f $pause_archive ]]; then
  source_dir="$(cd "$here/../control-plane/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  [[ -f $source_dir/build/pause/linux/pause.c ]] || die "no build/pause/linux/pause.c in $source_dir"
  work="$(mktemp -d "$out/.pause.XXXXXX")"
  new_image "$work" "$PAUSE_VERSION"
  # The flags of build/pause/Makefile.
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-devctl" \
    -o "$work/bundle/rootfs/pause" "$source_dir/build/pause/linux/pause.c"
  strip "$work/bundle/rootfs/pause"
  finish_image "$work" "$PAUSE_VERSION" "$pause_archive" \
    --config.user 65535:65535 --config.entrypoint /pause --clear config.cmd
  rm -rf "$work"
  log "built $PAUSE_IMAGE ($pause_archive)"
fi

packages=(postgresql-15 postgresql-client-15 libpq5 tzdata dash)
versions="$(dpkg-query -W -f '${Package}=${Version} ' "${packages[@]}")" \
  || die "the Debian packages ${packages[*]} must be installed (tools/install-prerequisites.sh)"
# The packages' versions and this script: either changing builds the image again.
key="$({ echo "$versions"; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-12)"
postgres_archive="$out/postgres-15-$key.tar"
if [[ ! -f $postgres_archive ]]; then
  work="$(mktemp -d "$out/.postgres.XXXXXX")"
  new_image "$work" 15
  rootfs="$work/bundle/rootfs"
  # Debian's merged /usr, so that the libraries' /lib paths land where the loader looks.
  install -d -m 0755 "$rootfs/usr/bin" "$rootfs/usr/sbin" "$rootfs/usr/lib" "$rootfs/usr/lib64" \
    "$rootfs/etc"
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$rootfs/$d"; done
  # Every file of the packages but documentation; the time zones as a tree (its posix/ and
  # right/ links would otherwise be copied over).
  install -d -m 0755 "$rootfs/usr/share"
  cp -a /usr/share/zoneinfo "$rootfs/usr/share/"
  dpkg -L "${packages[@]}" | grep -Ev '^/usr/share/(doc|man|locale|lintian|zoneinfo)/' | while read -r path; do
    if [[ -L $path || -f $path ]]; then
      cp -a --parents "$path" "$rootfs" 2>/dev/null || cp -aL --parents "$path" "$rootfs"
    fi
  done
  ln -sf dash "$rootfs/usr/bin/sh"
  # The shared libraries every program and module of the set needs, and the loader.
  find "$rootfs/usr/lib/postgresql" "$rootfs/usr/bin" -type f -perm -u+x -o -name '*.so' -type f \
    | while read -r file; do ldd "$file" 2>/dev/null || true; done \
    | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u \
    | while read -r library; do
        [[ -e $rootfs$library ]] || { install -d "$rootfs$(dirname "$library")"; cp -L "$library" "$rootfs$library"; }
      done
  # cp --parents makes the directories it adds private (0700): every user reads the image.
  find "$rootfs" -type d -exec chmod go+rx {} +
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' \
    >"$rootfs/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$rootfs/etc/group"
  printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  ln -sf /usr/share/zoneinfo/Etc/UTC "$rootfs/etc/localtime"
  install -d -m 1777 "$rootfs/tmp"
  install -d -m 2777 "$rootfs/var/run/postgresql"
  install -d -m 0755 -o 999 -g 999 "$rootfs/var/lib/postgresql"
  finish_image "$work" 15 "$postgres_archive" \
    --config.user 999:999 --clear config.entrypoint --config.cmd postgres \
    --config.env PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin \
    --config.env PGDATA=/var/lib/postgresql/data \
    --config.label "org.opencontainers.image.title=postgres" \
    --config.label "org.opencontainers.image.description=PostgreSQL 15 from Debian's packages, for devctl's real-node tests"
  rm -rf "$work"
  log "built $POSTGRES_IMAGE ($postgres_archive)"
fi

# What the harness imports, one "reference archive" per line.
printf '%s %s\n' "$PAUSE_IMAGE" "$pause_archive" "$POSTGRES_IMAGE" "$postgres_archive" >"$out/images.txt"
echo "$out"
