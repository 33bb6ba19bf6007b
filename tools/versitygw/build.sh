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

# shellcheck source=../lib/go-tool.sh
source "$here/../lib/go-tool.sh"

go_tool_build versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw cmd/versitygw "$here" \
  "${DEVCTL_VERSITYGW_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/devctl/versitygw}" \
  "-s -w -X main.Version=$VERSITYGW_VERSION -X main.Build=devctl -X main.BuildTime=unknown" \
  "2 minutes"
