#!/usr/bin/env bash
# The test command (README): installs what the tests need, starts a throwaway PostgreSQL and
# a podman API service, and runs every check: format, dependency direction, clippy, docs,
# the tests (nextest), the doctests, the host example, the benches in smoke mode. It ends
# with how many tests ran against each service; a service that does not start fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

apt_install() {
    echo "installing $* with apt-get"
    if [ -z "${SANDLANE_APT_UPDATED:-}" ]; then
        apt-get update -qq
        export SANDLANE_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap
# The terminals test drives `sandlane sandbox shell` in a tmux pane.
command -v tmux >/dev/null 2>&1 || apt_install tmux
# The Kubernetes driver's test points kubectl at its fake API server.
command -v kubectl >/dev/null 2>&1 || apt_install kubernetes-client
export SANDLANE_KUBECTL
SANDLANE_KUBECTL=$(command -v kubectl)
# The brokered-secrets tests run the clients an agent uses inside sandboxes (on bubblewrap
# this host's programs, on containers an image made of them) and fetch undici with npm; the
# terminal test drives `sandlane sandbox shell` in tmux.
clients=()
for tool in curl git openssl python3 tmux; do command -v "$tool" >/dev/null 2>&1 || clients+=("$tool"); done
command -v node >/dev/null 2>&1 || clients+=(nodejs)
command -v npm >/dev/null 2>&1 || clients+=(npm)
if [ ${#clients[@]} -gt 0 ]; then apt_install "${clients[@]}"; fi

# Every test runs here: a developer's opt-out (tests::services) does not apply.
if [ -n "${SANDLANE_TEST_SKIP:-}" ]; then
    echo "test.sh: ignoring SANDLANE_TEST_SKIP=$SANDLANE_TEST_SKIP (the test command runs every test)"
    unset SANDLANE_TEST_SKIP
fi

# Throwaway services for the tests: PostgreSQL (store contract and end-to-end tests) and a
# podman API service (container driver tests). Each script installs what it lacks.
marks=""
cleanup() {
    if [ -n "${SANDLANE_TEST_PODMAN_DIR:-}" ]; then bash scripts/podman-throwaway.sh stop "$SANDLANE_TEST_PODMAN_DIR" || true; fi
    if [ -n "${SANDLANE_TEST_PG_DIR:-}" ]; then bash scripts/pg-throwaway.sh stop "$SANDLANE_TEST_PG_DIR" || true; fi
    if [ -n "${SANDLANE_KUBE_VALIDATE_DIR:-}" ]; then bash scripts/kube-validate.sh stop "$SANDLANE_KUBE_VALIDATE_DIR" || true; fi
    if [ -n "${SANDLANE_TEST_BROWSER_DIR:-}" ]; then bash scripts/browser.sh stop "$SANDLANE_TEST_BROWSER_DIR" || true; fi
    if [ -n "$marks" ]; then rm -rf "$marks"; fi
}
trap cleanup EXIT

# start_service NAME SCRIPT VAR...: runs `SCRIPT start` and exports what it prints. A start
# that fails, or leaves one of the variables unset, fails the test command, naming it.
start_service() {
    local name=$1 script=$2 exports var
    shift 2
    if ! exports="$(bash "$script" start)"; then
        echo "test.sh: $name did not start: \`bash $script start\` failed (its messages are above)" >&2
        exit 1
    fi
    eval "$exports"
    for var in "$@"; do
        if [ -z "${!var:-}" ]; then
            echo "test.sh: $name did not start: \`bash $script start\` set no $var" >&2
            exit 1
        fi
    done
}
start_service PostgreSQL scripts/pg-throwaway.sh SANDLANE_TEST_PG_DIR SANDLANE_TEST_POSTGRES_URL
start_service podman scripts/podman-throwaway.sh SANDLANE_TEST_PODMAN_DIR SANDLANE_TEST_DOCKER_HOST \
    SANDLANE_TEST_CONTAINER_IMAGE
# kubernetes-validate (PyPI) for the Kubernetes driver's objects against the 1.33 schemas.
start_service kubernetes-validate scripts/kube-validate.sh SANDLANE_KUBE_VALIDATE_DIR SANDLANE_KUBERNETES_VALIDATE
# Headless Chromium (Debian's) and playwright-core (npm) for the preview links' browser test.
start_service browser scripts/browser.sh SANDLANE_TEST_BROWSER_DIR SANDLANE_TEST_CHROMIUM SANDLANE_TEST_PLAYWRIGHT

# Each test handed a service records itself here (tests/src/services.rs).
marks="$(mktemp -d /tmp/sandlane-test-marks.XXXXXX)"
export SANDLANE_TEST_MARKS="$marks"

step() { echo; echo "==> $*"; }

step "format"
cargo fmt --all --check
step "dependency direction"
bash scripts/check-deps.sh
step "the console's xterm.js: the checked-in copy is what its pin installs (scripts/console-assets.sh)"
bash scripts/console-assets.sh --check
step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
step "build (the binary the end-to-end tests spawn, and the host example)"
cargo build --workspace --bins --examples --locked
step "tests"
cargo nextest run --workspace --locked --no-fail-fast
ran_tests() { # service: how many distinct tests recorded it
    if [ -f "$marks/$1" ]; then sort -u "$marks/$1" | wc -l; else echo 0; fi
}
on_postgres=$(ran_tests postgres)
on_podman=$(ran_tests podman)
on_validate=$(ran_tests kubernetes-validate)
on_kubectl=$(ran_tests kubectl)
on_browser=$(ran_tests browser)
step "the static supervisor (scripts/supervisor-static.sh): one file bound into each container"
static="$(bash scripts/supervisor-static.sh --dev)"
[[ "$static" == /* ]] || static="$PWD/$static"
SANDLANE_SUPERVISOR_BIN="$static" cargo nextest run --locked -p adapters \
    -E 'test(=container::tests::passes_the_driver_contract) | test(=container::tests::the_token_is_a_read_only_file_and_nowhere_else)'
step "doctests (nextest does not run them)"
cargo test --doc --workspace --locked
step "the host example (README), run"
example_out="$("${CARGO_TARGET_DIR:-target}/debug/examples/host_chain")"
example_want="step authorize                ok
step ensure_session_sandbox   ok
step start                    ok
execution exec-1 is in_progress"
if [ "$example_out" != "$example_want" ]; then
    printf 'host_chain printed:\n%s\nexpected (a warning line means its sandbox was not provisioned):\n%s\n' \
        "$example_out" "$example_want" >&2
    exit 1
fi
echo "$example_out"
step "API contract (Schemathesis against the real server as each kind of caller; a generated Python client)"
bash scripts/api-fuzz.sh
step "MCP (the official MCP Python SDK against the real server)"
bash scripts/mcp-test.sh
step "the TypeScript SDK against the real server (its types against the served document)"
bash scripts/sdk-typescript.sh
step "the Python SDK against the real server (mypy --strict, pytest)"
bash scripts/sdk-python.sh
step "webhooks (two replicas on PostgreSQL, the reference standardwebhooks verifier, a 60 s outage)"; WEBHOOK_DOWN_SECONDS=60 bash scripts/webhooks-test.sh
step "bench smoke (tiny counts, dev profile, so the bench command cannot rot)"
bash scripts/bench.sh --smoke

step "summary"
echo "tests run against PostgreSQL: $on_postgres; against podman: $on_podman; with kubernetes-validate: $on_validate; with kubectl: $on_kubectl; in a browser: $on_browser"
if [ "$on_postgres" -eq 0 ] || [ "$on_podman" -eq 0 ]; then
    echo "test.sh: no test ran against $([ "$on_postgres" -eq 0 ] && echo PostgreSQL || echo podman)" >&2
    exit 1
fi
if [ "$on_validate" -eq 0 ] || [ "$on_kubectl" -eq 0 ]; then
    echo "test.sh: no test ran with $([ "$on_validate" -eq 0 ] && echo kubernetes-validate || echo kubectl)" >&2
    exit 1
fi
if [ "$on_browser" -eq 0 ]; then
    echo "test.sh: no test ran in the browser" >&2
    exit 1
fi
