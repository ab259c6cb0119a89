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

if [ -f scripts/pg-throwaway.sh ]; then
    eval "$(bash scripts/pg-throwaway.sh start)"
    trap 'bash scripts/pg-throwaway.sh stop "$SANDLANE_TEST_PG_DIR"' EXIT
fi

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
