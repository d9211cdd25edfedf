#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback for the tests (issue 17).
#   .ci/pg.sh start DIR   initdb in DIR (as the `postgres` user when run as
#                         root), start it on a free port; prints the URL
#                         (postgres://oceancode@127.0.0.1:PORT/oceancode)
#   .ci/pg.sh stop DIR    stop it and remove DIR
# PG_OPTS replaces the default "-c fsync=off" (tests need no durability;
# the bench runs with PG_OPTS="-c fsync=on").
# Needs Debian's postgresql package (apt-get install -y postgresql).
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?cluster dir}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "pg.sh: no PostgreSQL server (apt-get install -y postgresql)" >&2; exit 1; }
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "$cmd" in
start)
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  as_pg "$bin/initdb" -D "$dir/data" -U oceancode --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir ${PG_OPTS:--c fsync=off} -c max_connections=200" start >/dev/null
  as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U oceancode oceancode
  echo "postgres://oceancode@127.0.0.1:$port/oceancode"
  ;;
stop)
  if [ -d "$dir/data" ]; then as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true; fi
  rm -rf "$dir"
  ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
