#!/usr/bin/env bash
# Builds the pinned versitygw (an S3-compatible object store; its posix backend serves a
# directory) from its published Go module into a cache outside the repository, keyed by
# version. Skipped when the binary is already in the cache.
#
#   tools/versitygw/build.sh              # build if missing, print the binary's path last
#   DEVCTL_VERSITYGW_DIR=/x build.sh      # override the cache root
#
# Nothing prebuilt is downloaded: everything comes from the Go module proxy, verified against
# go.sum in this directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${DEVCTL_VERSITYGW_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/versitygw}"
bin_dir="$cache_root/$VERSITYGW_VERSION/bin"
binary="$bin_dir/versitygw"
module=github.com/versity/versitygw

log() { printf '[versitygw %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "$binary" ]]; then
  log "versitygw $VERSITYGW_VERSION already built"
  echo "$binary"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build versitygw)"
mkdir -p "$bin_dir"

# One build at a time: parallel test binaries and `devctl dev up` may all ask for it.
exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  log "another build holds $cache_root/.build.lock; waiting for it"
  flock 9
fi
if [[ -x "$binary" ]]; then # built by whoever held the lock
  log "versitygw $VERSITYGW_VERSION already built"
  echo "$binary"
  exit 0
fi

# versions.env is the pin everything reads; go.mod must agree with it.
required="$(awk -v m="$module" '$1 == m { print $2 }' "$here/go.mod")"
[[ "$required" == "$VERSITYGW_VERSION" ]] \
  || die "$here/go.mod requires $module $required but versions.env pins $VERSITYGW_VERSION; run: (cd $here && go get -tool $module/cmd/versitygw@$VERSITYGW_VERSION && go mod tidy)"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

# Fail fast and clearly when the module proxy is unreachable (instead of a wall of go errors).
proxy="$(go env GOPROXY | cut -d, -f1)"
if [[ "$proxy" == http* ]] && ! curl -fsS -m 20 -o /dev/null "$proxy/$module/@v/$VERSITYGW_VERSION.info"; then
  die "the Go module proxy $proxy is unreachable (tried $proxy/$module/@v/$VERSITYGW_VERSION.info)"
fi

log "building versitygw $VERSITYGW_VERSION (about 2 minutes cold on 2 cores)"
start=$SECONDS
tmp="$(mktemp -d "$bin_dir/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
ldflags="-s -w -X main.Version=$VERSITYGW_VERSION -X main.Build=devctl -X main.BuildTime=unknown"
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/versitygw" "$module/cmd/versitygw") \
  || die "go build of $module/cmd/versitygw@$VERSITYGW_VERSION failed"
mv "$tmp/versitygw" "$binary"
log "built versitygw in $((SECONDS - start)) s"

echo "$binary"
