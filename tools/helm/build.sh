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

# shellcheck source=../lib/go-tool.sh
source "$here/../lib/go-tool.sh"
module=helm.sh/helm/v3

# The same -X flags as helm's Makefile: `helm version` reports the pin, and the Kubernetes
# version helm assumes for `helm template`/`lint` (.Capabilities.KubeVersion) is one major
# above client-go's v0.x, as upstream computes it.
client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$here/go.mod")"
[[ -n "$client_go" ]] || { echo "error: $here/go.mod does not require k8s.io/client-go" >&2; exit 1; }
k8s_minor="${client_go#v0.}"; k8s_minor="${k8s_minor%%.*}"
ldflags="-s -w -X $module/internal/version.version=$HELM_VERSION -X $module/internal/version.gitTreeState=clean"
for p in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X $module/$p.k8sVersionMajor=1 -X $module/$p.k8sVersionMinor=$k8s_minor"
done

go_tool_build helm "$HELM_VERSION" "$module" cmd/helm "$here" \
  "${DEVCTL_HELM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/helm}" "$ldflags" "3 minutes"
