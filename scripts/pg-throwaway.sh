#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks.
#
#   eval "$(bash scripts/pg-throwaway.sh start)"   # prints export lines
#   ... run tests (they read SANDLANE_TEST_POSTGRES_URL) ...
#   bash scripts/pg-throwaway.sh stop "$SANDLANE_TEST_PG_DIR"
#
#   bash scripts/pg-throwaway.sh run -- cargo nextest run -p adapters   # start, run, stop
#
# The cluster lives in a fresh temp dir, runs as the unprivileged `postgres` user (created
# when missing), listens on a unix socket in that dir and on 127.0.0.1 at a free port, and
# keeps the durable defaults (fsync, synchronous_commit, full_page_writes on).
# Binaries come from /usr/lib/postgresql/*/bin or /usr/local/bin; when neither has them,
# `apt-get install -y postgresql` is run. Logs go to DIR/log. Diagnostics go to stderr so
# that stdout holds only the export lines.
set -euo pipefail

PG_USER=postgres

log() { echo "pg-throwaway: $*" >&2; }

find_bindir() {
    local d
    for d in /usr/lib/postgresql/*/bin /usr/local/bin; do
        if [[ -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

as_pg() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u "$PG_USER" -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 - <<'PY' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

start() {
    local bindir
    if ! bindir="$(find_bindir)"; then
        log "no initdb/pg_ctl found; installing postgresql"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
        bindir="$(find_bindir)" || { log "postgresql binaries still missing"; exit 1; }
    fi
    if [[ "$(id -u)" == 0 ]] && ! id "$PG_USER" >/dev/null 2>&1; then
        log "creating user $PG_USER"
        useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_USER"
    fi
    local dir port
    dir="$(mktemp -d /tmp/sandlane-pg.XXXXXX)"
    chmod 0755 "$dir"
    mkdir "$dir/data" "$dir/sock"
    if [[ "$(id -u)" == 0 ]]; then chown -R "$PG_USER:" "$dir"; fi
    as_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-instructions \
        >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    local tries=0
    while :; do
        port="$(free_port)"
        if as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 30 \
            -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir/sock \
                -c fsync=on -c synchronous_commit=on -c full_page_writes=on \
                -c max_connections=300" start >&2; then
            break
        fi
        tries=$((tries + 1))
        if ((tries >= 3)); then
            log "postgres did not start; log follows"
            cat "$dir/log" >&2 || true
            exit 1
        fi
    done
    echo "$bindir" >"$dir/bindir"
    log "started in $dir on 127.0.0.1:$port ($bindir)"
    echo "export SANDLANE_TEST_PG_DIR=$dir"
    echo "export SANDLANE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres"
}

stop() {
    local dir="${1:?usage: pg-throwaway.sh stop DIR}"
    [[ -d "$dir/data" ]] || { log "$dir is not a throwaway cluster"; exit 1; }
    local bindir
    bindir="$(cat "$dir/bindir" 2>/dev/null || find_bindir)"
    as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
    log "stopped and removed $dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    run)
        shift
        [[ "${1:-}" == "--" ]] && shift
        [[ $# -gt 0 ]] || { echo "usage: $0 run -- COMMAND..." >&2; exit 2; }
        eval "$(start)"
        trap 'stop "$SANDLANE_TEST_PG_DIR"' EXIT
        "$@"
        ;;
    *)
        echo "usage: $0 start | stop DIR | run -- COMMAND..." >&2
        exit 2
        ;;
esac
