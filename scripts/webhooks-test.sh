#!/usr/bin/env bash
# Webhooks from outside: two `sandlane serve` replicas on one throwaway PostgreSQL (one data
# dir, as replicas share their keys), a receiver verifying every delivery with the
# reference `standardwebhooks` library (PyPI, pinned in tests/webhooks/requirements.txt, in
# a throwaway virtualenv), tests/webhooks/test_webhooks.py driving it: a sandbox's life
# (ready, suspended, resumed, deprovisioned), the receiver down for WEBHOOK_DOWN_SECONDS
# (default 60) with nothing lost and nothing twice, a tampered signature refused.
#
#   bash scripts/webhooks-test.sh [SANDLANE_BIN]
#   WEBHOOK_DOWN_SECONDS=5 bash scripts/webhooks-test.sh   # a shorter outage
#
# Needs root and bubblewrap, as the server's sandboxes do.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin=${1:-}
if [ -z "$bin" ]; then
    cargo build --quiet --locked -p app --bin sandlane -p supervisor >&2
    bin=${CARGO_TARGET_DIR:-$repo/target}/debug/sandlane
fi
venv=$(mktemp -d -t sandlane-webhooks-venv.XXXXXX)
work=$(mktemp -d -t sandlane-serve.XXXXXX) # the name serve-throwaway.sh's stop accepts
chmod 0755 "$work"
pg_dir=
pid_b=
cleanup() {
    if [ -n "$pid_b" ]; then kill "$pid_b" 2>/dev/null || true; fi
    bash scripts/serve-throwaway.sh stop "$work" >/dev/null 2>&1 || true
    if [ -n "$pg_dir" ]; then bash scripts/pg-throwaway.sh stop "$pg_dir" || true; fi
    rm -rf "$venv"
}
trap cleanup EXIT
echo "webhooks-test: virtualenv with $(grep -v '^#' tests/webhooks/requirements.txt | tr '\n' ' ')"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/webhooks/requirements.txt
eval "$(bash scripts/pg-throwaway.sh start)"
pg_dir=$SANDLANE_TEST_PG_DIR
database_url=$SANDLANE_TEST_POSTGRES_URL

while read -r name; do unset "$name"; done < <(compgen -e | grep '^SANDLANE_' || true)
export SANDLANE_DATA_DIR=$work/data
export SANDLANE_DATABASE_URL=$database_url
export SANDLANE_LISTEN=127.0.0.1:0
export SANDLANE_LOG_FORMAT=json
# The receiver is on loopback; retries every 0.5 s doubling to 2 s, so it is found soon
# after it comes back; the idle pass often, for a quick suspension.
export SANDLANE_WEBHOOKS__ALLOW_PRIVATE=true
export SANDLANE_WEBHOOKS__INTERVAL_MS=200
export SANDLANE_WEBHOOKS__BACKOFF_INITIAL_MS=500
export SANDLANE_WEBHOOKS__BACKOFF_MAX_MS=2000
export SANDLANE_WEBHOOKS__MAX_ATTEMPTS=1000
export SANDLANE_BACKGROUND__POLICY_INTERVAL_MS=200
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
service_key=$("$bin" caller add --id svc-hooks --class service --org acme)
"$bin" org set acme --idle-timeout 2s >/dev/null
secret=$("$bin" org set acme --webhook-url "http://127.0.0.1:$port/hook" | tail -1)
case "$secret" in whsec_*) ;; *) echo "webhooks-test: no secret printed" >&2; exit 1 ;; esac

start() { # LOG: starts a replica, prints its URL
    local log=$1 url=
    RUST_LOG=info setsid "$bin" serve >"$log" 2>&1 </dev/null &
    echo $! >"$log.pid"
    for _ in $(seq 1 300); do
        url=$(bash scripts/serve-throwaway.sh url "$log")
        [ -n "$url" ] && break
        sleep 0.1
    done
    [ -n "$url" ] || { cat "$log" >&2; echo "webhooks-test: a replica did not start" >&2; exit 1; }
    echo "$url"
}
url_a=$(start "$work/server.log")
cp "$work/server.log.pid" "$work/pid"
url_b=$(start "$work/server-b.log")
pid_b=$(cat "$work/server-b.log.pid")
echo "webhooks-test: replicas at $url_a and $url_b, receiver on port $port"
# The secret is in no log line of either replica.
status=0
(cd "$venv" && WEBHOOK_SECRET=$secret WEBHOOK_PORT=$port REPLICA_A=$url_a REPLICA_B=$url_b \
    SERVICE_KEY=$service_key "$venv/bin/python" "$repo/tests/webhooks/test_webhooks.py") || status=$?
if grep -qF "$secret" "$work/server.log" "$work/server-b.log"; then
    echo "webhooks-test: FAILED: the signing secret is in a replica's log" >&2
    status=1
fi
if [ "$status" != 0 ]; then
    echo "--- replica A's warnings" >&2; grep -i '"level":"\(WARN\|ERROR\)"' "$work/server.log" | tail -20 >&2 || true
fi
exit "$status"
