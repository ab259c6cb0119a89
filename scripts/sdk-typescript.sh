#!/usr/bin/env bash
# The TypeScript SDK (sdk/typescript) against a real server: installs its pinned dev tools
# (`npm ci`), builds it (`tsc`, strict) and its example, starts a throwaway server
# (scripts/serve-throwaway.sh), checks that the generated types match the served
# /openapi.json, and runs its tests with node's test runner. The server is stopped on
# every way out; any failure exits non-zero.
#
#   bash scripts/sdk-typescript.sh [SANDLANE_BIN]
#
# SANDLANE_BIN is the `sandlane` to serve (its `sandlane-supervisor` beside it); without
# it, serve-throwaway.sh builds and uses the debug build. Needs node >= 20 and npm (the
# npm registry for `npm ci`), root and bubblewrap as serve-throwaway.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
sdk=$repo/sdk/typescript

bin=${1:-}
if [ -n "$bin" ]; then
    bin=$(realpath "$bin")
    [ -x "$bin" ] || { echo "sdk-typescript: $bin is not an executable" >&2; exit 2; }
fi
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "sdk-typescript: $tool is not installed (node >= 20)" >&2; exit 1; }
done
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
    { echo "sdk-typescript: node >= 20 is needed, this is $(node --version)" >&2; exit 1; }

server_dir=
cleanup() {
    local status=$?
    if [ -n "$server_dir" ]; then
        if [ "$status" -ne 0 ] && [ -f "$server_dir/server.log" ]; then
            echo "sdk-typescript: the last lines of the server's log:" >&2
            tail -n 40 "$server_dir/server.log" >&2 || true
        fi
        bash "$repo/scripts/serve-throwaway.sh" stop "$server_dir" || true
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$sdk"
echo "sdk-typescript: npm ci" >&2
timeout 300 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
echo "sdk-typescript: tsc (strict)" >&2
timeout 120 npm run --silent build
timeout 120 npm run --silent build:examples

exports=$(timeout 120 bash "$repo/scripts/serve-throwaway.sh" start ${bin:+"$bin"})
eval "$exports"
server_dir=$SANDLANE_TEST_SERVER_DIR
export SANDLANE_TEST_BIN=${bin:-${CARGO_TARGET_DIR:-$repo/target}/debug/sandlane}

echo "sdk-typescript: the generated types against $SANDLANE_TEST_SERVER_URL/openapi.json" >&2
timeout 60 node scripts/generate.mjs --check

echo "sdk-typescript: node --test" >&2
timeout 300 node --test --test-concurrency=4 test/*.test.mjs
# Terminals once more with the platform's WebSocket instead of the `ws` package's.
timeout 60 node --experimental-websocket --test test/terminal.test.mjs
