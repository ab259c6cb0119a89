#!/usr/bin/env bash
# The Python SDK's checks (sdk/python): a throwaway virtualenv with the package installed
# the way a user installs it (`pip install sdk/python[terminal]`) and the test tools pinned
# in sdk/python/requirements-test.txt; mypy --strict over the package and its tests; a throwaway server
# (scripts/serve-throwaway.sh); pytest against it. The server and the virtualenv go on
# every exit path; any failure exits non-zero.
#
#   bash scripts/sdk-python.sh [SANDLANE_BIN]
#
# SANDLANE_BIN is passed to serve-throwaway.sh (default: its debug build, built when
# missing); its sandlane-supervisor must lie beside it. Needs python3 with venv and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin=${1:-}

work=$(mktemp -d -t sandlane-sdk-py.XXXXXX)
server_dir=
child=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    if [ -n "$server_dir" ]; then
        bash "$repo/scripts/serve-throwaway.sh" stop "$server_dir" || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() { echo "sdk-python: $*" >&2; }
# Runs a step as a child and waits for it, so that a TERM or INT sent to this script
# ends it at once (bash runs a trap only between commands, never during a foreground one).
run() {
    "$@" &
    child=$!
    wait "$child"
    child=
}

step "virtualenv and pinned tools"
python3 -m venv "$work/venv"
py=$work/venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
run timeout 300 "$py" -m pip install --quiet -r sdk/python/requirements-test.txt
step "pip install sdk/python[terminal]"
# A copy, so that the build leaves nothing in the checkout.
cp -r sdk/python "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
run timeout 300 "$py" -m pip install --quiet --no-build-isolation "$work/src[terminal]"
# The tests must import the installed package, never the checkout's src/.
"$py" -c 'import sandlane, sys; sys.exit(0 if "site-packages" in sandlane.__file__ else "sandlane imported from " + sandlane.__file__)'

step "mypy --strict (the package, then the tests against the installed package and its py.typed)"
run timeout 300 "$py" -m mypy --strict --config-file sdk/python/pyproject.toml --cache-dir "$work/mypy-cache" \
    sdk/python/src/sandlane
run timeout 300 "$py" -m mypy --strict --config-file sdk/python/pyproject.toml --cache-dir "$work/mypy-cache-tests" \
    sdk/python/tests

step "a throwaway server"
exports=$(bash scripts/serve-throwaway.sh start ${bin:+"$bin"})
eval "$exports"
server_dir=$SANDLANE_TEST_SERVER_DIR
# The binary, for the tests that change the org's policy with `sandlane org set`.
export SANDLANE_TEST_BIN=${bin:-${CARGO_TARGET_DIR:-$repo/target}/debug/sandlane}

step "pytest"
cd sdk/python
run timeout 600 "$py" -m pytest -p no:cacheprovider -q --durations=5 tests
