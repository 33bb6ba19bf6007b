#!/usr/bin/env bash
# Builds the devctl operator image (devctl-operator + devctl-agent) as an OCI image layout
# with umoci: no container daemon, no base image, nothing downloaded. The image holds the
# two stripped release binaries, the shared libraries the operator links and the dynamic
# loader (copied from this machine, found with ldd), a CA bundle, /etc/passwd for user
# 65532, and nothing else: no shell, no package manager. The agent is linked statically:
# database pods copy it out of this image into the engine's image, whose libc is not ours.
#
# Usage: tools/image/build.sh [LAYOUT_DIR]
#   LAYOUT_DIR           where the OCI layout goes (default: $DEVCTL_IMAGE_LAYOUT, else
#                        target/image/oci); replaced on every run
#   DEVCTL_IMAGE_TAG     the tag (default: v<workspace version>, the tag of the operator's
#                        DEFAULT_IMAGE ghcr.io/devctl/devctl-operator:v<version>)
#   DEVCTL_IMAGE_SOURCE  the source label (default: https://github.com/devctl/devctl, the
#                        repository ghcr.io/devctl links images to)
#   DEVCTL_IMAGE_PROFILE the cargo profile of the two binaries (default: release, what
#                        ships; tools/test.sh passes image-check, see Cargo.toml)
# Prints the image reference (oci:<layout>:<tag>) as the last line of stdout; logs go to
# stderr. Push it with:
#   skopeo copy oci:target/image/oci:v0.1.0 docker://REGISTRY/devctl-operator:v0.1.0
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

log() { printf 'image: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed ($2)"; }

need cargo "install Rust with rustup: https://rustup.rs"
need git "the image's revision label is the commit it is built from"
need ldd "part of libc-bin; it lists the shared libraries copied into the image"
need strip "part of binutils; it keeps the image small"
need readelf "part of binutils; it checks that the agent is static"

# umoci builds the layout without a container daemon; Debian packages it. Installed the way
# tools/install-prerequisites.sh installs the database servers.
if ! command -v umoci >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 \
    || die "umoci is not installed and there is no apt-get: install umoci (https://github.com/opencontainers/umoci)"
  sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  log "installing the Debian package umoci"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends umoci >&2
fi

layout="${1:-${DEVCTL_IMAGE_LAYOUT:-target/image/oci}}"
# The version as cargo compiles it into the binaries (and into DEFAULT_IMAGE's tag).
version="$(awk '
  /^\[/ { section = $0 }
  section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' Cargo.toml)"
[[ -n $version ]] || die "no version in Cargo.toml's [workspace.package]"
tag="${DEVCTL_IMAGE_TAG:-v$version}"
revision="$(git rev-parse HEAD 2>/dev/null)" || die "not a git checkout: the revision label needs git rev-parse HEAD"
if ! git diff --quiet HEAD -- 2>/dev/null; then
  log "warning: the working tree has uncommitted changes; the revision label names $revision anyway"
fi
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "unsupported architecture $(uname -m)" ;;
esac

host="$(rustc -vV | sed -n 's/^host: //p')"
[[ $host == *-linux-gnu ]] || die "the image is built with glibc on Linux; this is $host"
profile="${DEVCTL_IMAGE_PROFILE:-release}"
[[ $profile =~ ^[a-z][a-z0-9-]*$ ]] || die "DEVCTL_IMAGE_PROFILE=$profile is not a cargo profile name"
# cargo names the directory of the dev profile "debug"; every other profile's is its name.
profile_dir="$profile"; [[ $profile != dev ]] || profile_dir=debug
log "building devctl-operator $version (profile $profile)"
cargo build --profile "$profile" --locked -p devctl-operator >&2
# The agent runs in the engine's image (copied there by the init container) on whatever libc
# that image has, or none (Alpine): static glibc (+crt-static). --target keeps the flag off
# build scripts and proc macros, which cannot be static; it also gives the agent its own
# target directory, so the operator's build above is not invalidated.
log "building devctl-agent $version (profile $profile, static)"
env "CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$host")_RUSTFLAGS=-C target-feature=+crt-static" \
  cargo build --profile "$profile" --locked --target "$host" -p devctl-agent >&2
target_dir="${CARGO_TARGET_DIR:-target}"
declare -A built=(
  [devctl-operator]="$target_dir/$profile_dir/devctl-operator"
  [devctl-agent]="$target_dir/$host/$profile_dir/devctl-agent"
)
# Static means no program interpreter: nothing for the engine image's loader to resolve.
headers="$(LC_ALL=C readelf -l "${built[devctl-agent]}")" || die "readelf cannot read ${built[devctl-agent]}"
if grep -q 'INTERP' <<<"$headers"; then
  die "${built[devctl-agent]} is not static (it names a program interpreter)"
fi
# After the build: the image is created now, not when the (minutes-long) build started.
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# Not root: umoci must not try to chown files or create device nodes, and records every
# file as owned by root, which is what the image should say anyway.
rootless=()
[[ $(id -u) == 0 ]] || rootless=(--rootless)

mkdir -p "$(dirname "$layout")"
work="$(mktemp -d "$(dirname "$layout")/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
image="$work/oci:$tag"
umoci init --layout "$work/oci" >&2
umoci new --image "$image" >&2
# An empty bundle to fill: umoci repack turns what changed in rootfs/ into the one layer.
umoci unpack "${rootless[@]}" --image "$image" "$work/bundle" >&2
rootfs="$work/bundle/rootfs"

install -d -m 0755 "$rootfs/usr/local/bin"
for binary in devctl-operator devctl-agent; do
  [[ -x ${built[$binary]} ]] || die "cargo built no ${built[$binary]}"
  strip --strip-all -o "$rootfs/usr/local/bin/$binary" "${built[$binary]}"
  chmod 0755 "$rootfs/usr/local/bin/$binary"
done
# Database pods run `/devctl-agent install <dir>` from this image (an init container; see
# crates/operator/src/database_cluster/resources/stateful_set.rs). The agent copies
# current_exe(), which resolves the link, so a symlink is enough.
ln -s usr/local/bin/devctl-agent "$rootfs/devctl-agent"

# The operator's shared libraries at the paths the loader looks them up, and the loader at
# the path the binary names (PT_INTERP). cp -L: the host's entries are often symlinks to
# versioned files.
libraries="$(ldd "${built[devctl-operator]}")"
if grep -q 'not found' <<<"$libraries"; then
  die "a shared library of devctl-operator is missing on this machine: $(grep 'not found' <<<"$libraries")"
fi
while read -r path; do
  [[ -n $path ]] || continue
  install -d -m 0755 "$rootfs$(dirname "$path")"
  cp -L "$path" "$rootfs$path"
  log "library $path"
done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$libraries" | sort -u)

install -d -m 0755 "$rootfs/etc" "$rootfs/etc/ssl/certs"
# A name for uid 65532 (what distroless calls "nonroot") so tools that look it up find one.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
# glibc reads hosts before DNS only when told; without the file its default differs.
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
# The operator talks to object stores over TLS (backup retention) and rustls-platform-verifier
# reads the system trust store; the Kubernetes API's CA comes from the ServiceAccount mount.
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [[ -f $ca_bundle ]]; then
  cp -L "$ca_bundle" "$rootfs$ca_bundle"
else
  log "warning: no $ca_bundle on this machine (Debian package ca-certificates); the image has no CA bundle"
fi
# Only root may change what the image holds, whatever this machine's umask; /tmp is the one
# place user 65532 may write.
chmod -R go-w "$rootfs"
install -d -m 1777 "$rootfs/tmp"

umoci repack "${rootless[@]}" --image "$image" \
  --history.created_by "tools/image/build.sh" --history.created "$created" "$work/bundle" >&2

labels=(
  "org.opencontainers.image.title=devctl-operator"
  "org.opencontainers.image.description=devctl Kubernetes operator for databases, with devctl-agent for database pods"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.source=${DEVCTL_IMAGE_SOURCE:-https://github.com/devctl/devctl}"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.created=$created"
)
config=(
  --config.user 65532:65532
  --config.entrypoint /usr/local/bin/devctl-operator
  --clear config.cmd
  --config.workingdir /
  --config.env PATH=/usr/local/bin
  --config.exposedports 8080/tcp
  --architecture "$arch" --os linux
  --created "$created"
  --no-history
)
# The same keys as config labels (what `docker inspect` and skopeo show) and as manifest
# annotations (where the OCI spec defines them and registries display them).
for label in "${labels[@]}"; do
  config+=(--config.label "$label" --manifest.annotation "$label")
done
umoci config --image "$image" "${config[@]}" >&2
# Every umoci step wrote a new config and manifest; drop the ones no tag reaches.
umoci gc --layout "$work/oci" >&2

rm -rf "$layout"
mv "$work/oci" "$layout"
log "image $tag in $layout"
echo "oci:$layout:$tag"
