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
# The real node's components (kubelet, kube-proxy, containerd, runc, CoreDNS; Go modules) and
# its images (pause, PostgreSQL 15; umoci): crates/cli/tests/real_node.rs runs on them. The
# harness would build them on first use; here their cost shows as phases of its own.
# Containers need root: elsewhere the test says why it skips (and fails under CI=true).
if [[ $(id -u) == 0 ]]; then
  build_node() { tools/node/build.sh >/dev/null; }
  phase "build real node" build_node
  build_node_images() {
    local bin_dir; bin_dir="$(tools/node/build.sh 2>/dev/null)"
    tools/node/images.sh "$(dirname "$bin_dir")/images" >/dev/null
  }
  phase "build real-node images" build_node_images
fi
phase "cargo fmt --check" cargo fmt --all --check
phase "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
# Every test binary, built once; the JSON lines name the executables (for the side lane).
build_tests() {
  # The redirect opens the file before cargo runs: the target directory must exist.
  mkdir -p target
  cargo test --workspace --locked --no-run --message-format=json-render-diagnostics \
    >target/test-artifacts.json
}
phase "build tests" build_tests
# The operator image (OCI layout, no container daemon); crates/cli/tests/image.rs inspects
# the layout this variable names instead of building it again. The dev profile: CI checks
# the image's shape (layout, labels, libraries, static agent, size), not its code's speed,
# and the dependencies are then the ones the test build above compiled.
build_image() {
  DEVCTL_IMAGE_LAYOUT="$PWD/target/image/oci"
  export DEVCTL_IMAGE_LAYOUT
  DEVCTL_IMAGE_PROFILE=dev tools/image/build.sh "$DEVCTL_IMAGE_LAYOUT"
}
phase "build image" build_image

# Three lanes: the test binaries that mostly wait (a minute-by-minute schedule, failover
# timers, backups) run in two side lanes, one binary after another, beside all the others,
# whose cargo test skips their tests. The machine idles through most of the suite
# (docs/performance.md), so this cuts its wall time to about the longest lane.
# The real node's test has a lane of its own: it waits on containers for about five minutes.
side_lanes=("backup_schedule replication databases" "failover backup campaign" "real_node")
test_executable() { # test_executable <test target name>
  grep '"kind":\["test"\]' target/test-artifacts.json | grep "\"name\":\"$1\"" \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1 || true
}
run_tests() {
  local skip=() pids=() logs=() lane name bin i
  for i in "${!side_lanes[@]}"; do
    lane="${side_lanes[$i]}"
    local bins=()
    for name in $lane; do
      bin="$(test_executable "$name")"
      [[ -x $bin ]] || { echo "error: no test executable for $name" >&2; return 1; }
      bins+=("$bin")
      while read -r test; do skip+=(--skip "$test"); done \
        < <("$bin" --list --format terse | sed -n 's/: test$//p')
    done
    logs+=("target/test-lane-$i.log")
    (
      rc=0
      for bin in "${bins[@]}"; do
        printf '\n     Running %s (side lane)\n' "$bin"
        # cargo runs a package's integration tests from its directory; so does this.
        (cd crates/cli && "$bin") || rc=1
      done
      exit $rc
    ) >"target/test-lane-$i.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  # --no-fail-fast: one failing binary must not hide the results of the binaries after it.
  cargo test --workspace --locked --no-fail-fast -- --exact "${skip[@]}" || rc=1
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    printf '\n==> side lane: %s\n' "${side_lanes[$i]}"
    cat "${logs[$i]}"
  done
  return $rc
}
phase "cargo test" run_tests

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
  # The real node (crates/testenv/src/real_node/teardown.rs; it runs only as root): its
  # containers' shims, its bridge, kube-proxy's and the kubelet's iptables chains, its pod
  # cgroups, mounts and CNI results.
  if [[ $(id -u) == 0 ]]; then
    local node_dir; node_dir="$(tools/node/build.sh 2>/dev/null)"
    if pgrep -af "^$node_dir/" ; then
      echo "error: real-node processes (containerd, shims, kubelet) are still running after the test suite" >&2
      failed=1
    fi
    # Captured first: grep -q would end the pipe early, and pipefail report iptables-save's
    # SIGPIPE as a clean host.
    local rules; rules="$(iptables-save 2>/dev/null || true)"
    if ip link show devctl0 >/dev/null 2>&1 || grep -q 'KUBE-' <<<"$rules" \
        || compgen -G '/sys/fs/cgroup/*/devctl-real-node' >/dev/null \
        || compgen -G '/sys/fs/cgroup/devctl-real-node' >/dev/null \
        || grep -q '/devctl-testenv-[^/]*/node/' /proc/self/mountinfo \
        || compgen -G '/var/lib/cni/results/devctl-*' >/dev/null; then
      echo "error: the real node left its bridge, iptables chains, pod cgroups, mounts or CNI results behind" >&2
      failed=1
    fi
  fi
  [ "$failed" = 0 ] || return 1
  echo "no control-plane, object store, agent, engine or real-node process left running"
}
phase "no leftover processes" leftovers
