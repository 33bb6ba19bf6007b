#!/usr/bin/env bash
# Builds the real node's binaries from published Go modules into a cache outside the
# repository, keyed by version: kubelet and kube-proxy (the pinned k8s.io/kubernetes, through
# the control plane's wrapper module), containerd, its runc shim and ctr, runc (cgo, with
# seccomp: Debian's runc 1.1.5 cannot start containerd 2.x's pod sandboxes, "can't get final
# child's PID from pipe: EOF"), and CoreDNS with the plugins the node's Corefile uses. The CNI
# plugins are Debian's (containernetworking-plugins), installed when missing, as is
# libseccomp-dev, which runc's build links against. Nothing prebuilt is downloaded.
#
#   tools/node/build.sh            # build what is missing, print the bin dir last
#   DEVCTL_NODE_DIR=/x build.sh    # override the cache root
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=../control-plane/versions.env
source "$here/../control-plane/versions.env"

cache_root="${DEVCTL_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/node}"
# The versions and what else decides the binaries (the wrapper modules, CoreDNS's plugin
# list, this script's flags): a change to any of them builds again.
inputs="$(cd "$here" && cat build.sh ../lib/kube-ldflags.sh versions.env containerd/go.* coredns/go.* coredns/main.go runc/go.* \
  ../control-plane/kubernetes/go.* | sha256sum | cut -c1-12)"
bin_dir="$cache_root/$KUBERNETES_VERSION-$CONTAINERD_VERSION-$RUNC_VERSION-$COREDNS_VERSION-$inputs/bin"
mkdir -p "$bin_dir"

log() { printf '[node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26.6 on PATH to build the node)"
# containerd's module needs Go 1.26.6; an older local toolchain would download another.
go_version="$(go env GOVERSION)"
if [[ "$(printf '%s\n' go1.26.6 "$go_version" | sort -V | head -1)" != go1.26.6 ]]; then
  die "Go $go_version is too old: containerd $CONTAINERD_VERSION needs Go >= 1.26.6"
fi

exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  log "another build holds $cache_root/.build.lock; waiting for it"
  flock 9
fi

# Debian's CNI plugins (bridge, host-local, loopback), and what runc's build needs.
debian_packages=()
[[ -x /usr/lib/cni/bridge ]] || debian_packages+=(containernetworking-plugins)
[[ -f /usr/include/seccomp.h ]] || debian_packages+=(libseccomp-dev)
command -v gcc >/dev/null 2>&1 || debian_packages+=(gcc libc6-dev)
command -v pkg-config >/dev/null 2>&1 || debian_packages+=(pkg-config)
# kube-proxy and the kubelet program iptables; teardown deletes the bridge with ip.
command -v iptables >/dev/null 2>&1 || debian_packages+=(iptables)
command -v ip >/dev/null 2>&1 || debian_packages+=(iproute2)
if (( ${#debian_packages[@]} )); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  log "installing Debian packages: ${debian_packages[*]}"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${debian_packages[@]}" >&2
fi

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

build() { # build <wrapper dir> <ldflags> <outputs...> -- <packages...>
  local dir="$1" ldflags="$2"; shift 2
  local outs=() pkgs=()
  while [[ $1 != -- ]]; do outs+=("$1"); shift; done
  shift
  pkgs=("$@")
  local missing=0
  for out in "${outs[@]}"; do [[ -x "$bin_dir/$out" ]] || missing=1; done
  if [[ $missing == 0 ]]; then log "${outs[*]} already built"; return 0; fi
  local tmp; tmp="$(mktemp -d "$bin_dir/.tmp.XXXXXX")"
  log "building ${outs[*]}"
  local start=$SECONDS
  (cd "$dir" && go build -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") || { rm -rf "$tmp"; die "go build of ${outs[*]} failed"; }
  for out in "${outs[@]}"; do mv "$tmp/$out" "$bin_dir/$out"; done
  rm -rf "$tmp"
  log "built ${outs[*]} in $((SECONDS - start)) s"
}

# shellcheck source=../lib/kube-ldflags.sh
source "$here/../lib/kube-ldflags.sh"
kube_ldflags="$(kube_ldflags "$KUBERNETES_VERSION")"
build "$here/../control-plane/kubernetes" "$kube_ldflags" kubelet kube-proxy -- \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
build "$here/containerd" "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  containerd containerd-shim-runc-v2 ctr -- \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
# The wrapper's main package is named after its directory.
build "$here/coredns" "-s -w" coredns -- .
# runc needs cgo (its nsexec is C) and libseccomp for the RuntimeDefault profile.
CGO_ENABLED=1 GOFLAGS="$GOFLAGS -tags=seccomp,urfave_cli_no_docs" \
  build "$here/runc" "-s -w -X main.version=$RUNC_VERSION" runc -- github.com/opencontainers/runc

echo "$bin_dir"
