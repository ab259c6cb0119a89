#!/usr/bin/env bash
# The API contract, checked from outside: starts the real `sandlane serve` on loopback (a
# temp data dir, SQLite, bubblewrap), then
#   1. runs Schemathesis against its /openapi.json once per kind of caller (a user key, a
#      service key, a sandbox token read from inside a sandbox) with every check and the
#      examples, coverage, fuzzing and stateful phases, a fixed seed and a bounded number
#      of examples; any failure fails the script;
#      (tests/api/hooks.py generates tar bodies and checks NDJSON responses line by line);
#   2. generates a Python client from the same document with openapi-python-client and runs
#      tests/api/client_test.py with it (ensure, exec, a streamed exec, files, a background
#      process and its output, audit, typed errors).
# Both tools come from PyPI, pinned in tests/api/requirements.txt, into a throwaway
# virtualenv. Run by the test command; alone: `bash scripts/api-fuzz.sh` (as root, with
# bubblewrap installed). SANDLANE_FUZZ_EXAMPLES and SANDLANE_FUZZ_SEED override the bounds.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
examples=${SANDLANE_FUZZ_EXAMPLES:-40}
seed=${SANDLANE_FUZZ_SEED:-16}

work=$(mktemp -d -t sandlane-api-fuzz.XXXXXX)
chmod 0755 "$work" # sandbox uids traverse to their workspaces under data.sandboxes
server_pid=
# Ends every sandbox of this run (they outlive their server by design): the supervisor's
# hello, then `shutdown`; its pid namespace goes with it.
end_sandboxes() {
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
}
cleanup() {
    end_sandboxes
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    # The driver's per-sandbox cgroups outlive the server: remove this run's (empty) ones.
    sleep 0.2
    for dir in "$work"/data/sandboxes/sbx_* "$work"/data/warm/*; do
        [ -e "$dir" ] || continue
        rmdir /sys/fs/cgroup/*/sandlane/"$(basename "$dir")" 2>/dev/null || true
    done
    # Workspaces with a quota are loop-mounted images: unmount this run's (deepest first).
    awk -v root="$work/" 'index($5, root) == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r mount; do umount "$mount" 2>/dev/null || umount -l "$mount" || true; done
    # The token directories are in memory, where the server's start line says: this run's go.
    local tokens
    tokens=$(grep -o 'tokens: in memory (/dev/shm/sandlane-[0-9a-f]*)' "$work/server.log" 2>/dev/null |
        head -1 | sed 's/.*(\(.*\))/\1/' || true)
    if [ -n "$tokens" ]; then rm -rf "$tokens"; fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "api-fuzz: virtualenv with $(grep -v '^#' tests/api/requirements.txt | tr '\n' ' ')"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check -r tests/api/requirements.txt

cargo build --quiet --locked -p app --bin sandlane
bin=${CARGO_TARGET_DIR:-$repo/target}/debug/sandlane

# The embedded set-up, whatever the caller's environment says.
while read -r name; do unset "$name"; done < <(compgen -e | grep '^SANDLANE_' || true)
export SANDLANE_DATA_DIR=$work/data
export SANDLANE_LISTEN=127.0.0.1:0
export SANDLANE_LOG_FORMAT=json
user_key=$("$bin" caller add --id user-ada --class user --org acme)
service_key=$("$bin" caller add --id svc-platform --class service --org acme)
# The one destination of the fuzzed secrets (tests/api/hooks.py moves their hosts there).
"$bin" org set acme --egress-allow '*.fuzz.test' >/dev/null

RUST_LOG=warn,app::server=info "$bin" serve >"$work/server.log" 2>&1 &
server_pid=$!
py() { "$work/venv/bin/python" -c "$@"; }
listening_at() { # the address of the JSON log line "sandlane listening"
    py 'import json, sys
for line in open(sys.argv[1], errors="replace"):
    try:
        fields = json.loads(line).get("fields", {})
    except ValueError:
        continue
    if fields.get("message") == "sandlane listening":
        print("http://" + fields["address"])
        break' "$work/server.log"
}
url=
for _ in $(seq 1 300); do
    url=$(listening_at)
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "api-fuzz: the server exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { cat "$work/server.log" >&2; echo "api-fuzz: the server never said where it listens" >&2; exit 1; }
echo "api-fuzz: server at $url"

# A sandbox token: ensure a sandbox as the user, read the token file from inside it.
api() { # METHOD PATH CREDENTIAL [JSON]
    curl --silent --show-error --fail-with-body -X "$1" "$url$2" -H "authorization: Bearer $3" \
        -H 'content-type: application/json' ${4:+--data "$4"}
}
sandbox=$(api PUT /v1/orgs/acme/sessions/fuzz-token/sandbox "$user_key" '{"execution_id":"fuzz-token-1"}' |
    py 'import json,sys; print(json.load(sys.stdin)["sandbox"]["id"])')
sandbox_token=$(api POST "/v1/orgs/acme/sandboxes/$sandbox/exec" "$user_key" \
    '{"argv":["/bin/sh","-c","cat \"$SANDLANE_TOKEN_FILE\""]}' |
    py 'import json,sys; r=json.load(sys.stdin); assert r["exit_code"]==0, r; print(r["stdout"].strip())')

failed=0
summaries=()
for caller in user service sandbox-token; do
    case $caller in
        user) credential=$user_key ;;
        service) credential=$service_key ;;
        sandbox-token) credential=$sandbox_token ;;
    esac
    log=$work/schemathesis-$caller.log
    echo "api-fuzz: schemathesis as the $caller (seed $seed, at most $examples examples per operation)"
    # One worker: a fixed seed then gives the same run. From the temp dir, so its
    # .hypothesis and report folders stay out of the repository.
    status=0
    (cd "$work" && NO_COLOR=1 PYTHONPATH="$repo/tests/api" SCHEMATHESIS_HOOKS=hooks \
        "$work/venv/bin/schemathesis" --config-file "$repo/tests/api/schemathesis.toml" run "$url/openapi.json" \
        --header "Authorization: Bearer $credential" \
        --checks all --phases examples,coverage,fuzzing,stateful \
        --seed "$seed" --max-examples "$examples" --workers 1 \
        --request-timeout 30 --no-color) >"$log" 2>&1 || status=$?
    summary=$(grep -E '^=+ .* =+$' "$log" | tail -n1)
    summaries+=("schemathesis ($caller): ${summary:-no summary line; exit $status}")
    # Warnings do not fail the run; say what they were (a user may not read the audit, a
    # sandbox token may only exec: operations that answer them only 403 are expected).
    while IFS= read -r warning; do summaries+=("    $warning"); done < <(grep -E '^ +⚠' "$log" | sed 's/^ *//' || true)
    if [ "$status" -ne 0 ]; then
        cat "$log"
        failed=1
    fi
done

echo "api-fuzz: generating the Python client from $url/openapi.json"
(cd "$work" && "$work/venv/bin/openapi-python-client" generate --url "$url/openapi.json" --meta none \
    --config "$repo/tests/api/client-config.yaml" --output-path "$work/sandlane_client") >"$work/generate.log" 2>&1 ||
    { cat "$work/generate.log"; exit 1; }
if grep -qi 'warning' "$work/generate.log"; then
    cat "$work/generate.log"
    echo "api-fuzz: openapi-python-client warned about the document" >&2
    failed=1
fi
client_status=0
PYTHONPATH=$work SANDLANE_URL=$url SANDLANE_USER_KEY=$user_key SANDLANE_SERVICE_KEY=$service_key \
    SANDLANE_SANDBOX_TOKEN=$sandbox_token "$work/venv/bin/python" tests/api/client_test.py || client_status=$?
[ "$client_status" -eq 0 ] || failed=1

printf '%s\n' "${summaries[@]}"
if [ "$failed" -ne 0 ]; then
    echo "api-fuzz: FAILED (server log: last lines below)" >&2
    tail -n 40 "$work/server.log" >&2
    exit 1
fi
echo "api-fuzz: ok"
