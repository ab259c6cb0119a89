#!/usr/bin/env bash
# The bench command (README: `make bench`): builds the benches in release mode, starts a
# throwaway durable PostgreSQL and a throwaway podman set-up (runc, a local busybox image),
# runs crates/app/benches/lane.rs, crates/app/benches/policy.rs, crates/app/benches/streams.rs,
# crates/app/benches/egress.rs, crates/adapters/benches/container.rs and
# crates/adapters/benches/kube.rs (the Kubernetes driver through its fake API server) once
# each, prints their tables and writes them into BENCHMARKS.md (between the bench markers;
# the notes around them are kept), all under the same `Run:` line (date and commit).
#
#   bash scripts/bench.sh            # full run (release build; several minutes)
#   bash scripts/bench.sh --smoke    # every bench once with tiny counts, dev profile, no file written
#
# Both reuse the test command's services when their variables are set
# (SANDLANE_TEST_POSTGRES_URL; SANDLANE_TEST_PODMAN_DIR, SANDLANE_TEST_DOCKER_HOST,
# SANDLANE_TEST_CONTAINER_IMAGE) and start their own otherwise. PostgreSQL is required. When
# podman cannot be set up, the podman peer row and the container table are skipped, and the
# report says so. The smoke run is part of scripts/test.sh so that this command cannot rot;
# it never triggers a release build.
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
    for c in ${cleanups[@]+"${cleanups[@]}"}; do eval "$c" || true; done
}
trap cleanup EXIT

command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap

# start_service NAME SCRIPT VAR...: runs `SCRIPT start` and exports what it prints; returns
# non-zero, naming the service, when the start fails or leaves a variable unset.
start_service() {
    local name=$1 script=$2 exports var
    shift 2
    if ! exports="$(bash "$script" start)"; then
        log "$name did not start: \`bash $script start\` failed (its messages are above)"
        return 1
    fi
    eval "$exports"
    for var in "$@"; do
        if [[ -z "${!var:-}" ]]; then
            log "$name did not start: \`bash $script start\` set no $var"
            return 1
        fi
    done
}

if [[ -z "${SANDLANE_TEST_POSTGRES_URL:-}" ]]; then
    start_service PostgreSQL scripts/pg-throwaway.sh SANDLANE_TEST_PG_DIR SANDLANE_TEST_POSTGRES_URL || exit 1
    cleanups+=("bash scripts/pg-throwaway.sh stop '$SANDLANE_TEST_PG_DIR'")
fi

# The container side: the throwaway podman set-up of scripts/podman-throwaway.sh (runc,
# lowered ulimits, its own image store, a local busybox image). The container bench talks to
# its API service; the lane bench's peer drives the podman CLI, which a storage.conf pointing
# at that store makes use it. Returns non-zero when podman cannot be set up.
podman_skipped=""
setup_podman() {
    if [[ -z "${SANDLANE_TEST_PODMAN_DIR:-}" || -z "${SANDLANE_TEST_DOCKER_HOST:-}" ]]; then
        start_service podman scripts/podman-throwaway.sh SANDLANE_TEST_PODMAN_DIR SANDLANE_TEST_DOCKER_HOST \
            SANDLANE_TEST_CONTAINER_IMAGE || return 1
        cleanups+=("bash scripts/podman-throwaway.sh stop '$SANDLANE_TEST_PODMAN_DIR'")
    fi
    local dir="$SANDLANE_TEST_PODMAN_DIR"
    printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/root"\nrunroot = "%s/runroot"\n' \
        "$dir" "$dir" >"$dir/storage.conf"
    export CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_STORAGE_CONF="$dir/storage.conf"
    if ! podman image exists "$SANDLANE_TEST_CONTAINER_IMAGE"; then
        log "podman: image $SANDLANE_TEST_CONTAINER_IMAGE is not in $dir"
        return 1
    fi
    export SANDLANE_BENCH_PODMAN_IMAGE="$SANDLANE_TEST_CONTAINER_IMAGE"
    log "podman $(podman --version | awk '{print $3}') with runc, image $SANDLANE_BENCH_PODMAN_IMAGE"
}
if ! setup_podman; then
    podman_skipped="podman could not be set up (\`bash scripts/podman-throwaway.sh start\` failed)"
    log "$podman_skipped: the podman peer row and the container table are skipped"
    unset SANDLANE_BENCH_PODMAN_IMAGE
fi

# The CPUs' idle and total jiffies so far (I/O wait counts as busy).
cpu_jiffies() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5, t; exit }' /proc/stat; }

# Waits until the machine is quiet (two seconds in a row with at least 75 % of the CPUs
# idle; at most 180 s) before a bench measures: the one before it may leave work behind
# (the lane bench's 1,000 sandboxes: the kernel detaches and flushes their loop devices and
# takes their cgroups offline after they are deprovisioned), and no bench should measure
# the previous one's teardown.
settle() {
    local quiet=0 waited=0 i0 t0 i1 t1
    while ((quiet < 2 && waited < 180)); do
        read -r i0 t0 < <(cpu_jiffies)
        sleep 1
        read -r i1 t1 < <(cpu_jiffies)
        waited=$((waited + 1))
        if (((i1 - i0) * 100 >= 75 * (t1 - t0))); then quiet=$((quiet + 1)); else quiet=0; fi
    done
    if ((quiet < 2)); then
        log "the machine was not quiet within 180 s; measuring anyway"
    else
        log "the machine was quiet after ${waited} s"
    fi
}

# Replaces the lines between the markers BEGIN and END of BENCHMARKS.md with FILE's.
splice() {
    local begin=$1 end=$2 content=$3 report=BENCHMARKS.md
    if ! grep -qxF "$begin" "$report" || ! grep -qxF "$end" "$report"; then
        log "$report has no markers $begin … $end"
        return 1
    fi
    awk -v b="$begin" -v e="$end" -v f="$content" '
        $0 == b { print; while ((getline line < f) > 0) print line; skip = 1; next }
        $0 == e { skip = 0 }
        !skip { print }' "$report" >"$report.new"
    mv "$report.new" "$report"
}

if ((smoke)); then
    export SANDLANE_BENCH_RUN="smoke run"
    # Every bench runs sandboxes, whose supervisor is a program of its own.
    cargo build --locked --quiet -p supervisor --bin sandlane-supervisor
    out="$(cargo bench --locked --profile dev -p app --bench lane -- --smoke)"
    echo "$out"
    grep -q '^| # | measurement | result | target | status |$' <<<"$out" ||
        { log "the lane smoke run printed no table"; exit 1; }
    out="$(cargo bench --locked --profile dev -p app --bench policy -- --smoke)"
    echo "$out"
    grep -q '^| measurement | result | target | status |$' <<<"$out" ||
        { log "the policy smoke run printed no table"; exit 1; }
    out="$(cargo bench --locked --profile dev -p app --bench streams -- --smoke)"
    echo "$out"
    [[ "$(grep -c '^| S[0-9] |' <<<"$out")" -eq 4 ]] || { log "the streams smoke run printed no table of 4 rows"; exit 1; }
    out="$(cargo bench --locked --profile dev -p app --bench egress -- --smoke)"
    echo "$out"
    [[ "$(grep -c '^| E[0-9] |' <<<"$out")" -eq 5 ]] || { log "the egress smoke run printed no table of 5 rows"; exit 1; }
    # The adapters' focused benches: criterion's --test mode (each benchmark once), and
    # tiny counts for the hand-written ones.
    out="$(cargo bench --locked --profile dev -p adapters --bench jwt -- --test)"
    echo "$out"
    [[ "$(grep -c '^Success$' <<<"$out")" -ge 4 ]] || { log "the jwt bench did not run its 4 benchmarks"; exit 1; }
    out="$(BENCH_SECS=0.2 cargo bench --locked --profile dev -p adapters --bench audit)"
    echo "$out"
    grep -q 'postgres' <<<"$out" || { log "the audit bench printed no Postgres row"; exit 1; }
    out="$(cargo bench --locked --profile dev -p app --bench density -- --smoke)"
    echo "$out"
    grep -q '^| server threads |' <<<"$out" || { log "the density smoke run printed no table"; exit 1; }
    out="$(cargo bench --locked --profile dev -p adapters --bench broker -- --smoke)"
    echo "$out"
    grep -q '^  brokered ' <<<"$out" || { log "the broker bench printed no brokered row"; exit 1; }
    out="$(BENCH_ROUNDS=2 cargo bench --locked --profile dev -p supervisor --bench start)"
    echo "$out"
    grep -q '^| default build | dynamic |' <<<"$out" || { log "the supervisor start bench printed no table"; exit 1; }
    out="$(BENCH_ITERS=2 cargo bench --locked --profile dev -p adapters --bench bwrap)"
    echo "$out"
    grep -q '^driver exec (rlimits+cgroups, uid drop)' <<<"$out" || { log "the bwrap bench printed no table"; exit 1; }
    out="$(SANDLANE_BENCH_ROUNDS=1 cargo bench --locked --profile dev -p adapters --features testing --bench kube)"
    echo "$out"
    grep -q '^| kubernetes (' <<<"$out" || { log "the kube bench printed no table"; exit 1; }
    if [[ -z "$podman_skipped" ]]; then
        out="$(SANDLANE_BENCH_ROUNDS=1 cargo bench --locked --profile dev -p adapters --bench container)"
        echo "$out"
        grep -q '^| container (' <<<"$out" || { log "the container bench printed no table"; exit 1; }
    fi
else
    run="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
    git diff --quiet HEAD -- crates scripts Cargo.toml Cargo.lock || run="$run with uncommitted changes"
    export SANDLANE_BENCH_RUN="$run"
    # Each bench is built first, then measured on a quiet machine (see settle); every bench
    # runs sandboxes, whose supervisor is a program of its own.
    cargo build --locked --release -p supervisor --bin sandlane-supervisor
    cargo bench --locked -p app --no-run --bench lane --bench policy --bench streams --bench egress
    settle
    cargo bench --locked -p app --bench lane -- --out "$PWD/BENCHMARKS.md"
    settle
    cargo bench --locked -p app --bench policy -- --out "$PWD/BENCHMARKS.md"
    section="$(mktemp)"
    cleanups+=("rm -f '$section'")
    settle
    cargo bench --locked -p app --bench streams -- --out "$section"
    splice '<!-- bench:streams:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:streams:end -->' "$section"
    settle
    cargo bench --locked -p app --bench egress -- --out "$section"
    splice '<!-- bench:egress:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:egress:end -->' "$section"
    if [[ -z "$podman_skipped" ]]; then
        cargo bench --locked -p adapters --no-run --bench container
        settle
        SANDLANE_BENCH_ROUNDS=20 cargo bench --locked -p adapters --bench container | tee "$section"
    else
        printf 'Run: %s.\n\nSkipped: %s.\n' "$run" "$podman_skipped" >"$section"
    fi
    splice '<!-- bench:container:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:container:end -->' "$section"
    # The Kubernetes driver through its fake API server, beside bubblewrap (the supervisor
    # program it runs is the release build's).
    cargo bench --locked -p adapters --features testing --no-run --bench kube
    settle
    SANDLANE_BENCH_ROUNDS=20 cargo bench --locked -p adapters --features testing --bench kube | tee "$section"
    splice '<!-- bench:kube:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:kube:end -->' "$section"
    # The supervisor program: the default build beside the static one.
    static="$(bash scripts/supervisor-static.sh)"
    [[ "$static" == /* ]] || static="$PWD/$static"
    cargo bench --locked -p supervisor --no-run --bench start
    settle
    SANDLANE_SUPERVISOR_STATIC="$static" cargo bench --locked -p supervisor --bench start | tee "$section"
    splice '<!-- bench:supervisor:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:supervisor:end -->' "$section"
    log "wrote BENCHMARKS.md"
fi
