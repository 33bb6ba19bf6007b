#!/usr/bin/env bash
# Builds the pinned helm from its published Go module into a cache outside the repository,
# keyed by version. Skipped when the binary is already in the cache. Helm is only used to test
# the generated chart (deploy/helm/devctl, crates/cli/tests/helm.rs); devctl itself never
# runs it.
#
#   tools/helm/build.sh                 # build if missing, print the binary's path last
#   DEVCTL_HELM_DIR=/x build.sh         # override the cache root
#
# Nothing prebuilt is downloaded: everything comes from the Go module proxy, verified against
# go.sum in this directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${DEVCTL_HELM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/helm}"
bin_dir="$cache_root/$HELM_VERSION/bin"
binary="$bin_dir/helm"
module=helm.sh/helm/v3

log() { printf '[helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "$binary" ]]; then
  log "helm $HELM_VERSION already built"
  echo "$binary"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build helm)"
mkdir -p "$bin_dir"

# One build at a time: parallel test binaries and tools/test.sh may all ask for it.
exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  log "another build holds $cache_root/.build.lock; waiting for it"
  flock 9
fi
if [[ -x "$binary" ]]; then # built by whoever held the lock
  log "helm $HELM_VERSION already built"
  echo "$binary"
  exit 0
fi

# versions.env is the pin everything reads; go.mod must agree with it.
required="$(awk -v m="$module" '$1 == m { print $2 }' "$here/go.mod")"
[[ "$required" == "$HELM_VERSION" ]] \
  || die "$here/go.mod requires $module $required but versions.env pins $HELM_VERSION; run: (cd $here && go get -tool $module/cmd/helm@$HELM_VERSION && go mod tidy)"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

# Fail fast and clearly when the module proxy is unreachable (instead of a wall of go errors).
proxy="$(go env GOPROXY | cut -d, -f1)"
if [[ "$proxy" == http* ]] && ! curl -fsS -m 20 -o /dev/null "$proxy/$module/@v/$HELM_VERSION.info"; then
  die "the Go module proxy $proxy is unreachable (tried $proxy/$module/@v/$HELM_VERSION.info)"
fi

# The same -X flags as helm's Makefile: `helm version` reports the pin, and the Kubernetes
# version helm assumes for `helm template`/`lint` (.Capabilities.KubeVersion) is one major
# above client-go's v0.x, as upstream computes it.
client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$here/go.mod")"
[[ -n "$client_go" ]] || die "$here/go.mod does not require k8s.io/client-go"
k8s_minor="${client_go#v0.}"; k8s_minor="${k8s_minor%%.*}"
ldflags="-s -w -X $module/internal/version.version=$HELM_VERSION -X $module/internal/version.gitTreeState=clean"
for p in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X $module/$p.k8sVersionMajor=1 -X $module/$p.k8sVersionMinor=$k8s_minor"
done

log "building helm $HELM_VERSION (about 3 minutes cold on 2 cores)"
start=$SECONDS
tmp="$(mktemp -d "$bin_dir/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(cd "$here" && go build -ldflags "$ldflags" -o "$tmp/helm" "$module/cmd/helm") \
  || die "go build of $module/cmd/helm@$HELM_VERSION failed"
mv "$tmp/helm" "$binary"
log "built helm in $((SECONDS - start)) s"

echo "$binary"
