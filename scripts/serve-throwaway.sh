#!/usr/bin/env bash
# A real `sandlane serve` on loopback for clients' test suites (the SDKs', the MCP test):
# a temp data dir, SQLite, bubblewrap, the embedded defaults; three caller keys in org
# `acme` (a user, a second user, a service).
#
#   eval "$(bash scripts/serve-throwaway.sh start [SANDLANE_BIN] [-- ORG_SET_ARG…])"
#   ... SANDLANE_TEST_SERVER_URL, SANDLANE_TEST_USER_KEY, SANDLANE_TEST_USER2_KEY,
#       SANDLANE_TEST_SERVICE_KEY ...
#   bash scripts/serve-throwaway.sh stop "$SANDLANE_TEST_SERVER_DIR"
#   bash scripts/serve-throwaway.sh url LOG   # the URL a server's JSON log says it listens on
#
# `start` prints export lines; the arguments after `--` go to `sandlane org set acme`
# before the server starts (e.g. `--egress-allow '*.fuzz.test'`). An empty SANDLANE_BIN
# is the default.
#
# SANDLANE_BIN defaults to the debug build (built here when missing); its
# `sandlane-supervisor` must lie beside it. The server's log is `$SANDLANE_TEST_SERVER_DIR/server.log`.
# Diagnostics go to stderr so that stdout holds only the export lines. Run as root, with
# bubblewrap installed (the test command installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

# The URL of the JSON log line "sandlane listening" in LOG, if it is there yet.
listening_url() {
    python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    try:
        fields = json.loads(line).get("fields", {})
    except ValueError:
        continue
    if fields.get("message") == "sandlane listening":
        print("http://" + fields["address"])
        break
PY
}

# Ends every sandbox of a run (they outlive their server by design): the supervisor's
# hello, then `shutdown`; its pid namespace goes with it. Then the server, its cgroups,
# its mounts and its in-memory token dirs.
stop() {
    local work=$1
    python3 - "$work/data/sandboxes" <<'PY' || true
import json, os, socket, struct, sys
root = sys.argv[1]
def frame(msg):
    body = json.dumps(msg).encode()
    return struct.pack(">IB", len(body), 1) + body
for name in os.listdir(root) if os.path.isdir(root) else []:
    path = os.path.join(root, name, "control", "sock")
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(path)
        s.sendall(frame({"type": "hello", "version": 1}) + frame({"type": "shutdown"}))
        while s.recv(4096):
            pass
    except OSError:
        pass
PY
    if [ -f "$work/pid" ]; then
        local pid
        pid=$(cat "$work/pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    sleep 0.2
    for dir in "$work"/data/sandboxes/sbx_* "$work"/data/warm/*; do
        [ -e "$dir" ] || continue
        rmdir /sys/fs/cgroup/*/sandlane/"$(basename "$dir")" 2>/dev/null || true
    done
    awk -v root="$work/" 'index($5, root) == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r mount; do umount "$mount" 2>/dev/null || umount -l "$mount" || true; done
    local tokens
    tokens=$(grep -o 'tokens: in memory (/dev/shm/sandlane-[0-9a-f]*)' "$work/server.log" 2>/dev/null |
        head -1 | sed 's/.*(\(.*\))/\1/' || true)
    if [ -n "$tokens" ]; then rm -rf "$tokens"; fi
    rm -rf "$work"
}

case "${1:-}" in
start)
    bin=${2:-}
    org_set=()
    if [ "${3:-}" = "--" ]; then org_set=("${@:4}"); fi
    if [ -z "$bin" ]; then
        cargo build --quiet --locked -p app --bin sandlane -p supervisor >&2
        bin=${CARGO_TARGET_DIR:-$repo/target}/debug/sandlane
    fi
    work=$(mktemp -d -t sandlane-serve.XXXXXX)
    chmod 0755 "$work" # sandbox uids traverse to their workspaces under data.sandboxes
    # The embedded set-up, whatever the caller's environment says.
    while read -r name; do unset "$name"; done < <(compgen -e | grep '^SANDLANE_' || true)
    export SANDLANE_DATA_DIR=$work/data
    export SANDLANE_LISTEN=127.0.0.1:0
    export SANDLANE_LOG_FORMAT=json
    user_key=$("$bin" caller add --id user-ada --class user --org acme)
    user2_key=$("$bin" caller add --id user-bob --class user --org acme)
    service_key=$("$bin" caller add --id svc-platform --class service --org acme)
    if [ "${#org_set[@]}" -gt 0 ]; then "$bin" org set acme "${org_set[@]}" >/dev/null; fi
    RUST_LOG=warn,app::server=info setsid "$bin" serve >"$work/server.log" 2>&1 </dev/null &
    echo $! >"$work/pid"
    url=
    for _ in $(seq 1 300); do
        url=$(listening_url "$work/server.log")
        [ -n "$url" ] && break
        if ! kill -0 "$(cat "$work/pid")" 2>/dev/null; then
            cat "$work/server.log" >&2
            echo "serve-throwaway: the server exited" >&2
            stop "$work"
            exit 1
        fi
        sleep 0.1
    done
    if [ -z "$url" ]; then
        cat "$work/server.log" >&2
        echo "serve-throwaway: the server never said where it listens" >&2
        stop "$work"
        exit 1
    fi
    echo "serve-throwaway: sandlane at $url (data and log in $work)" >&2
    echo "export SANDLANE_TEST_SERVER_DIR=$work"
    echo "export SANDLANE_TEST_SERVER_URL=$url"
    echo "export SANDLANE_TEST_USER_KEY=$user_key"
    echo "export SANDLANE_TEST_USER2_KEY=$user2_key"
    echo "export SANDLANE_TEST_SERVICE_KEY=$service_key"
    ;;
stop)
    dir=${2:?usage: serve-throwaway.sh stop DIR}
    case "$dir" in
    */sandlane-serve.*) stop "$dir" ;;
    *) echo "serve-throwaway: refusing to remove $dir" >&2; exit 1 ;;
    esac
    ;;
url)
    listening_url "${2:?usage: serve-throwaway.sh url LOG}"
    ;;
*)
    echo "usage: serve-throwaway.sh start [SANDLANE_BIN] [-- ORG_SET_ARG…] | stop DIR | url LOG" >&2
    exit 2
    ;;
esac
