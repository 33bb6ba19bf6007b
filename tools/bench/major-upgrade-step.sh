#!/usr/bin/env bash
# Times `devctl-agent upgrade` (Debian 15 -> PyPI 17) of a 1 GiB database (one table, 4.2 M rows)
# by copy and by link, as root (the tools run as `postgres`). EXTRA=--check times the check alone.
# docs/performance.md, "PostgreSQL major upgrade step".
set -euo pipefail
AGENT="${DEVCTL_AGENT:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug/devctl-agent}"
OLD=/usr/lib/postgresql/15/bin; NEW="${DEVCTL_POSTGRES_DIR:-/var/cache/devctl/postgresql}/17/bin"
for method in copy link; do
  root=$(mktemp -d /tmp/upbench-XXXX); chown postgres: "$root"; mkdir "$root/run"; chown postgres: "$root/run"
  port=$((40000 + RANDOM % 2000))
  as() { runuser -u postgres -- env LANG=C.UTF-8 "$@"; }
  as $OLD/initdb -D "$root/pgdata" --username=postgres --auth-local=peer --auth-host=scram-sha-256 --data-checksums --encoding=UTF8 --no-instructions >/dev/null
  as $OLD/pg_ctl -D "$root/pgdata" -o "-c port=$port -c listen_addresses='' -c unix_socket_directories=$root/run" -l "$root/log" -w start >/dev/null
  as $OLD/psql -h "$root/run" -p $port -U postgres -d postgres -XAtq -c "create table t (id bigint primary key, v text); insert into t select g, repeat(md5(g::text), 6) from generate_series(1, 4200000) g;" 
  as $OLD/psql -h "$root/run" -p $port -U postgres -d postgres -XAtq -c "select pg_size_pretty(pg_database_size('postgres'))"
  as $OLD/pg_ctl -D "$root/pgdata" -m fast -w stop >/dev/null
  sync
  start=$(date +%s.%N)
  (cd "$root" && as $AGENT upgrade --old-bindir $OLD --new-bindir $NEW --data "$root/pgdata" --socket-dir "$root/run" --port $port --method $method ${EXTRA:-})
  end=$(date +%s.%N)
  echo "$method: $(echo "$end - $start" | bc) s"
  rm -rf "$root"
done
