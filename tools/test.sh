#!/usr/bin/env bash
# Runs every check and test of the project, installing what it needs first.
# This is the README's test command; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase_start=$SECONDS
phases=()
phase() { # phase <name> <command...>
  local name="$1"; shift
  local start=$SECONDS
  printf '\n==> %s\n' "$name"
  "$@"
  phases+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}
report() {
  printf '\n==> phase timings\n'
  printf '  %s\n' "${phases[@]}"
  printf '  %-28s %5d s\n' "total" $((SECONDS - phase_start))
}
trap report EXIT

phase "install prerequisites" tools/install-prerequisites.sh
phase "build control plane" tools/control-plane/build.sh
# The S3-compatible object store of the backup tests; the tests find it through this variable.
build_versitygw() { DEVCTL_VERSITYGW="$(tools/versitygw/build.sh)"; export DEVCTL_VERSITYGW; }
phase "build versitygw" build_versitygw
# Helm, built from its Go module like the control plane; crates/cli/tests/helm.rs uses it.
build_helm() { DEVCTL_HELM="$(tools/helm/build.sh)"; export DEVCTL_HELM; }
phase "build helm" build_helm
phase "cargo fmt --check" cargo fmt --all --check
phase "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
# The operator image (OCI layout, no container daemon); crates/cli/tests/image.rs inspects
# the layout this variable names instead of building it again.
build_image() {
  DEVCTL_IMAGE_LAYOUT="$PWD/target/image/oci"
  export DEVCTL_IMAGE_LAYOUT
  # The image-check profile: the image's shape without the release profile's fat LTO.
  DEVCTL_IMAGE_PROFILE=image-check tools/image/build.sh "$DEVCTL_IMAGE_LAYOUT"
}
phase "build image" build_image
# --no-fail-fast: one failing binary must not hide the results of the binaries after it.
phase "cargo test" cargo test --workspace --locked --no-fail-fast

leftovers() {
  # Every control-plane process runs from the versioned cache; none may survive the suite.
  local bin_dir; bin_dir="$(tools/control-plane/build.sh 2>/dev/null)"
  local failed=0
  if pgrep -af "^$bin_dir/" ; then
    echo "error: control-plane processes are still running after the test suite" >&2
    failed=1
  fi
  # Object stores (crates/testenv's S3Server) run the cached versitygw build.
  if pgrep -af "^$DEVCTL_VERSITYGW( |\$)" ; then
    echo "error: versitygw (object store) processes are still running after the test suite" >&2
    failed=1
  fi
  # Database pods the pod runner backs with processes: every devctl-agent, and any engine
  # whose command line names a testenv directory (/tmp/devctl-testenv-pods-*/claims/...).
  if pgrep -a -x devctl-agent || pgrep -af '(^|/)(postgres|mariadbd|mysqld) .*/tmp/devctl-testenv' ; then
    echo "error: database agents or engines are still running after the test suite" >&2
    failed=1
  fi
  [ "$failed" = 0 ] || return 1
  echo "no control-plane, object store, agent or engine process left running"
}
phase "no leftover processes" leftovers
