#!/usr/bin/env bash
# The bench command (README: `make bench`): builds the lane bench in release mode, starts a
# throwaway durable PostgreSQL and a throwaway podman set-up (runc, a local busybox image),
# runs crates/app/benches/lane.rs once, prints its table and writes it into BENCHMARKS.md
# (between the bench markers; the notes around them are kept).
#
#   bash scripts/bench.sh            # full run (release build; several minutes)
#   bash scripts/bench.sh --smoke    # tiny counts, dev profile, no podman, no file written
#
# Both reuse SANDLANE_TEST_POSTGRES_URL when it is set (the test command's cluster) and
# start their own throwaway cluster otherwise. The smoke run is part of scripts/test.sh so
# that this command cannot rot; it never triggers a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

smoke=0
case "${1:-}" in
    --smoke) smoke=1 ;;
    "") ;;
    *)
        echo "usage: $0 [--smoke]" >&2
        exit 2
        ;;
esac

log() { echo "bench: $*" >&2; }

apt_install() {
    log "installing $* with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}

cleanups=()
cleanup() {
    local c
    for c in "${cleanups[@]}"; do eval "$c" || true; done
}
trap cleanup EXIT

command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap

if [[ -z "${SANDLANE_TEST_POSTGRES_URL:-}" ]]; then
    eval "$(bash scripts/pg-throwaway.sh start)"
    cleanups+=("bash scripts/pg-throwaway.sh stop '$SANDLANE_TEST_PG_DIR'")
fi

# The container peer: the throwaway podman set-up of scripts/podman-throwaway.sh (runc,
# lowered ulimits, its own image store, a local busybox image), driven through the podman
# CLI: a storage.conf pointing at that store makes plain `podman` commands use it.
setup_podman() {
    eval "$(bash scripts/podman-throwaway.sh start)"
    cleanups+=("bash scripts/podman-throwaway.sh stop '$SANDLANE_TEST_PODMAN_DIR'")
    local dir="$SANDLANE_TEST_PODMAN_DIR"
    printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/root"\nrunroot = "%s/runroot"\n' \
        "$dir" "$dir" >"$dir/storage.conf"
    export CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_STORAGE_CONF="$dir/storage.conf"
    podman image exists "$SANDLANE_TEST_CONTAINER_IMAGE"
    export SANDLANE_BENCH_PODMAN_IMAGE="$SANDLANE_TEST_CONTAINER_IMAGE"
    log "podman $(podman --version | awk '{print $3}') with runc, image $SANDLANE_BENCH_PODMAN_IMAGE"
}

if ((smoke)); then
    out="$(cargo bench --locked --profile dev -p app --bench lane -- --smoke)"
    echo "$out"
    grep -q '^| # | measurement | result | target | status |$' <<<"$out" ||
        { log "the smoke run printed no table"; exit 1; }
else
    if ! setup_podman; then
        log "podman could not be set up: the peer row is skipped"
        unset SANDLANE_BENCH_PODMAN_IMAGE
    fi
    cargo bench --locked -p app --bench lane -- --out "$PWD/BENCHMARKS.md"
fi
