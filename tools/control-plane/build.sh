#!/usr/bin/env bash
# Builds the pinned control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) from published Go modules into a cache outside the
# repository, keyed by version. Binaries already in the cache are skipped.
#
#   tools/control-plane/build.sh            # build what is missing, print the bin dir last
#   DEVCTL_CONTROL_PLANE_DIR=/x build.sh    # override the cache root
#
# Nothing prebuilt is downloaded: everything comes from the Go module proxy.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${DEVCTL_CONTROL_PLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/control-plane}"
bin_dir="$cache_root/$KUBERNETES_VERSION/bin"
mkdir -p "$bin_dir"

log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build the control plane)"

# One build at a time: tests running in parallel and `devctl dev up` may all ask for the binaries.
exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  log "another build holds $cache_root/.build.lock; waiting for it"
  flock 9
fi

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

# Fail fast and clearly when the module proxy is unreachable (instead of a wall of go errors).
proxy="$(go env GOPROXY | cut -d, -f1)"
if [[ "$proxy" == http* ]] && ! curl -fsS -m 20 -o /dev/null "$proxy/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info"; then
  missing=0
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok; do
    [[ -x "$bin_dir/$b" ]] || missing=1
  done
  [[ $missing == 0 ]] || die "the Go module proxy $proxy is unreachable (tried $proxy/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info)"
fi

need() { for b in "$@"; do [[ -x "$bin_dir/$b" ]] || return 0; done; return 1; }

build() { # build <module dir> <ldflags> <output:package>...
  local dir="$1" ldflags="$2"; shift 2
  local tmp; tmp="$(mktemp -d "$bin_dir/.tmp.XXXXXX")"
  local pkgs=() outs=()
  for spec in "$@"; do outs+=("${spec%%:*}"); pkgs+=("${spec#*:}"); done
  log "building ${outs[*]} (about 8 minutes cold on 2 cores)"
  local start=$SECONDS
  # Build every command in one go so shared packages compile once.
  # A single package is written to the exact output name (etcd's module-root main package
  # would otherwise be called "server").
  local target="$tmp/"; [[ ${#pkgs[@]} == 1 ]] && target="$tmp/${outs[0]}"
  (cd "$here/$dir" && go build -ldflags "$ldflags" -o "$target" "${pkgs[@]}") || { rm -rf "$tmp"; die "go build of ${outs[*]} failed"; }
  for spec in "$@"; do
    local out="${spec%%:*}" pkg="${spec#*:}"
    [[ -e "$tmp/$out" ]] || mv "$tmp/$(basename "$pkg")" "$tmp/$out"
    mv "$tmp/$out" "$bin_dir/$out"
  done
  rm -rf "$tmp"
  log "built ${outs[*]} in $((SECONDS - start)) s"
}

# shellcheck source=../lib/kube-ldflags.sh
source "$here/../lib/kube-ldflags.sh"
kube_ldflags="$(kube_ldflags "$KUBERNETES_VERSION")"

if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  build kubernetes "$kube_ldflags" \
    kube-apiserver:k8s.io/kubernetes/cmd/kube-apiserver \
    kube-controller-manager:k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler:k8s.io/kubernetes/cmd/kube-scheduler \
    kubectl:k8s.io/kubernetes/cmd/kubectl
else
  log "kubernetes $KUBERNETES_VERSION binaries already built"
fi

if need etcd; then
  build etcd "-s -w" etcd:go.etcd.io/etcd/server/v3
else
  log "etcd $ETCD_VERSION already built"
fi

if need kwok; then
  build kwok "-s -w" kwok:sigs.k8s.io/kwok/cmd/kwok
else
  log "kwok $KWOK_VERSION already built"
fi

# kwok's own Stage definitions (pod/node lifecycles, volume provisioning) ship in its module;
# copy them next to the binaries so the harness needs no Go module cache at run time.
stages_dir="$cache_root/$KUBERNETES_VERSION/kwok-stages"
if [[ ! -f "$stages_dir/.complete" ]]; then
  kwok_src="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  mkdir -p "$stages_dir"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete \
           volume/fast/pvc-provision volume/fast/pv-bind volume/fast/pv-delete volume/fast/pvc-delete; do
    install -m 0644 "$kwok_src/kustomize/stage/$f.yaml" "$stages_dir/$(basename "$f").yaml"
  done
  touch "$stages_dir/.complete"
  log "copied kwok stages to $stages_dir"
fi

echo "$bin_dir"
