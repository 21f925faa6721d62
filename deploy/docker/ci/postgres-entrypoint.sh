#!/bin/sh
# First start: a cluster owned by $POSTGRES_USER with password authentication over TCP and the
# database $POSTGRES_DB; every start: the server in the foreground on $PGHOST:$PGPORT.
set -eu
: "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 --no-instructions >/dev/null
  rm -f "$pwfile"
  pg_ctl --wait --options "-c listen_addresses=''" start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    createdb --host=/var/run/postgresql --username="$POSTGRES_USER" "$POSTGRES_DB"
  fi
  pg_ctl --wait stop >/dev/null
fi
exec postgres -c listen_addresses="$PGHOST" -c port="$PGPORT" \
  -c unix_socket_directories=/var/run/postgresql
