#!/usr/bin/env bash
# The test command (README): installs what the tests need, starts a throwaway PostgreSQL,
# and runs every check: format, clippy, docs, dependency direction, the example, the tests.
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

# Throwaway services for the tests: PostgreSQL (store contract and end-to-end tests) and a
# podman API service (container driver tests). Each script installs what it lacks.
cleanup() {
    if [ -n "${SANDLANE_TEST_PODMAN_DIR:-}" ]; then bash scripts/podman-throwaway.sh stop "$SANDLANE_TEST_PODMAN_DIR" || true; fi
    if [ -n "${SANDLANE_TEST_PG_DIR:-}" ]; then bash scripts/pg-throwaway.sh stop "$SANDLANE_TEST_PG_DIR" || true; fi
}
trap cleanup EXIT
eval "$(bash scripts/pg-throwaway.sh start)"
eval "$(bash scripts/podman-throwaway.sh start)"

step() { echo; echo "==> $*"; }

step "format"
cargo fmt --all --check
step "dependency direction"
bash scripts/check-deps.sh
step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
step "build (the binary the end-to-end tests spawn, and the host example)"
cargo build --workspace --bins --examples --locked
step "tests"
cargo nextest run --workspace --locked --no-fail-fast
step "API contract (Schemathesis against the real server as each kind of caller; a generated Python client)"
bash scripts/api-fuzz.sh
step "bench smoke (tiny counts, dev profile, so the bench command cannot rot)"
bash scripts/bench.sh --smoke
