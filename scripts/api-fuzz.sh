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

work=$(mktemp -d -t sandlane-api-fuzz.XXXXXX) # the virtualenv, the tools' logs and output
server_dir=
cleanup() {
    # The server, its sandboxes, cgroups, mounts and token dirs (scripts/serve-throwaway.sh).
    if [ -n "$server_dir" ]; then bash scripts/serve-throwaway.sh stop "$server_dir" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "api-fuzz: virtualenv with $(grep -v '^#' tests/api/requirements.txt | tr '\n' ' ')"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check -r tests/api/requirements.txt

# The one destination of the fuzzed secrets (tests/api/hooks.py moves their hosts there).
eval "$(bash scripts/serve-throwaway.sh start "" -- --egress-allow '*.fuzz.test')"
server_dir=$SANDLANE_TEST_SERVER_DIR
url=$SANDLANE_TEST_SERVER_URL
user_key=$SANDLANE_TEST_USER_KEY
service_key=$SANDLANE_TEST_SERVICE_KEY
py() { "$work/venv/bin/python" -c "$@"; }
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
    tail -n 40 "$server_dir/server.log" >&2
    exit 1
fi
echo "api-fuzz: ok"
