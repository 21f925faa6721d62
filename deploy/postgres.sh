# shellcheck shell=bash
# Sourced by deploy/demo.sh: find a PostgreSQL server, or start a throwaway one.
#
# ensure_postgres sets OML_ADMIN_DSN (a connection that may create databases), in this order:
#   1. $OML_PG_DSN when set: that server (the database named in it is used for the lake);
#   2. a server answering at 127.0.0.1:5432 as user postgres (trust auth), unless
#      OML_DEMO_THROWAWAY_PG=1;
#   3. a throwaway cluster from the PostgreSQL binaries (initdb, pg_ctl) under
#      $OML_DEMO_PG_DIR, on 127.0.0.1:$OML_DEMO_PG_PORT (default 55432), run by a non-root
#      user (the postgres account, else nobody, when the script runs as root); stopped again by
#      stop_postgres.

PG_STARTED_DIR=""
PG_RUN_AS=()

_pg_answers() {
  "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import sys, psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
EOF
}

_pg_bindir() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
    return
  fi
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir
    return
  fi
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin /usr/local/pgsql/bin /opt/homebrew/opt/postgresql*/bin \
    2>/dev/null | sort -V | tail -1)
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

_start_cluster() {
  local bindir port dir user
  bindir=$(_pg_bindir) || true
  if [ -z "$bindir" ]; then
    echo "demo: no PostgreSQL server and no PostgreSQL binaries (initdb, pg_ctl) found." >&2
    echo "      Install PostgreSQL 15 (Debian: apt-get install postgresql) or set OML_PG_DSN." >&2
    return 1
  fi
  port="${OML_DEMO_PG_PORT:-55432}"
  if [ "$(id -u)" = 0 ]; then
    # PostgreSQL refuses to run as root: run the cluster as an unprivileged account, in a
    # directory that account can reach.
    user=postgres
    id "$user" >/dev/null 2>&1 || user=nobody
    dir="${OML_DEMO_PG_DIR:-/var/tmp/oml-demo-pg}"
    mkdir -p "$dir"
    chown "$user" "$dir"
    chmod 700 "$dir"
    PG_RUN_AS=(runuser -u "$user" --)
    command -v runuser >/dev/null 2>&1 || PG_RUN_AS=(su -s /bin/sh "$user" -c)
  else
    dir="${OML_DEMO_PG_DIR:-$STATE/pg}"
    mkdir -p "$dir"
    chmod 700 "$dir"
  fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    echo "demo: initdb a throwaway cluster in $dir"
    _pg_as "$bindir/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >"$STATE/initdb.log" 2>&1 \
      || { cat "$STATE/initdb.log" >&2; return 1; }
  fi
  echo "demo: starting PostgreSQL on 127.0.0.1:$port"
  _pg_as "$bindir/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $dir" start >/dev/null \
    || { tail -20 "$dir/server.log" >&2; return 1; }
  PG_STARTED_DIR="$dir"
  PG_BINDIR="$bindir"
  OML_ADMIN_DSN="postgresql://postgres@127.0.0.1:$port/postgres"
}

_pg_as() {
  if [ "${#PG_RUN_AS[@]}" -eq 0 ]; then
    "$@"
  elif [ "${PG_RUN_AS[0]}" = su ]; then
    "${PG_RUN_AS[@]}" "$(printf '%q ' "$@")"
  else
    "${PG_RUN_AS[@]}" "$@"
  fi
}

ensure_postgres() {
  if [ -n "${OML_PG_DSN:-}" ]; then
    _pg_answers "$OML_PG_DSN" || { echo "demo: OML_PG_DSN does not answer" >&2; return 1; }
    OML_ADMIN_DSN="$OML_PG_DSN"
    echo "demo: using the server named by OML_PG_DSN"
  elif [ "${OML_DEMO_THROWAWAY_PG:-}" != 1 ] \
    && _pg_answers "postgresql://postgres@127.0.0.1:5432/postgres"; then
    OML_ADMIN_DSN="postgresql://postgres@127.0.0.1:5432/postgres"
    echo "demo: using the PostgreSQL server at 127.0.0.1:5432"
  else
    _start_cluster
  fi
}

stop_postgres() {
  if [ -n "$PG_STARTED_DIR" ]; then
    echo "demo: stopping the throwaway PostgreSQL cluster"
    _pg_as "$PG_BINDIR/pg_ctl" -D "$PG_STARTED_DIR" -m fast stop >/dev/null 2>&1 || true
    PG_STARTED_DIR=""
  fi
}
