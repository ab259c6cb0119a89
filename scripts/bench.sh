#!/usr/bin/env bash
# The bench command (README: `make bench`): builds the benches in release mode, starts a
# throwaway durable PostgreSQL and a throwaway podman set-up (runc, a local busybox image),
# runs crates/app/benches/lane.rs, crates/app/benches/policy.rs, crates/app/benches/streams.rs,
# crates/app/benches/egress.rs, crates/app/benches/snapshots.rs, crates/app/benches/preview.rs,
# crates/adapters/benches/container.rs and crates/adapters/benches/kube.rs (the Kubernetes
# driver through its fake API server) once each, prints their tables and writes them into
# BENCHMARKS.md (between the bench markers; the notes around them are kept), all under the
# same `Run:` line (date and commit).
#
#   bash scripts/bench.sh                   # full run (release build; several minutes)
#   bash scripts/bench.sh --smoke           # every bench once with tiny counts, dev profile, no file written
#   bash scripts/bench.sh --only snapshots  # the snapshots bench alone, full (release), its section written
#   bash scripts/bench.sh --only preview    # the preview ports bench alone, likewise
#
# The snapshots bench measures on the data dir's own filesystem and on XFS: a full run
# installs xfsprogs when `mkfs.xfs` is missing, makes an XFS filesystem with reflinks in a
# sparse image file under /tmp, loop-mounts it for the bench, and unmounts and deletes it
# when it ends (also on failure). The smoke run does the same only where `mkfs.xfs` is
# already installed (else its XFS rows say skipped).
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
only=""
case "${1:-}" in
    --smoke) smoke=1 ;;
    --only)
        [[ "${2:-}" == snapshots || "${2:-}" == preview ]] ||
            { echo "usage: $0 [--smoke | --only snapshots|preview]" >&2; exit 2; }
        only=$2
        ;;
    "") ;;
    *)
        echo "usage: $0 [--smoke | --only snapshots|preview]" >&2
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

# The snapshots and preview benches alone need neither PostgreSQL nor podman (SQLite, bubblewrap).
if [[ -z "$only" && -z "${SANDLANE_TEST_POSTGRES_URL:-}" ]]; then
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
if [[ -n "$only" ]]; then
    podman_skipped="not used by --only $only"
elif ! setup_podman; then
    podman_skipped="podman could not be set up (\`bash scripts/podman-throwaway.sh start\` failed)"
    log "$podman_skipped: the podman peer row and the container table are skipped"
    unset SANDLANE_BENCH_PODMAN_IMAGE
fi

# The snapshots bench's XFS: an XFS filesystem with reflinks (`mkfs.xfs -m reflink=1`) in a
# sparse 16 GiB image file under /tmp, loop-mounted; exported as SANDLANE_BENCH_XFS_DIR.
# It is unmounted and deleted by the cleanup at exit (a busy mount lazily: a sandbox the
# bench could not end would hold it). Returns non-zero when it cannot be made. Call it in
# this shell, not in a `$(…)`, so that its cleanup is this shell's.
setup_xfs() {
    local dir
    dir="$(mktemp -d /tmp/sandlane-bench-xfs.XXXXXX)"
    cleanups+=("teardown_xfs '$dir'")
    truncate -s 16G "$dir/xfs.img" &&
        mkfs.xfs -q -m reflink=1 "$dir/xfs.img" &&
        mkdir "$dir/mnt" &&
        timeout 60 mount -o loop "$dir/xfs.img" "$dir/mnt" &&
        chmod 0755 "$dir/mnt" || return 1
    export SANDLANE_BENCH_XFS_DIR="$dir/mnt" XFS_TMP="$dir"
    log "XFS (reflink=1) in $dir/xfs.img, mounted on $dir/mnt"
}
teardown_xfs() {
    local dir=$1
    if mountpoint -q "$dir/mnt"; then
        umount "$dir/mnt" || {
            log "XFS at $dir/mnt is busy (sandboxes the bench could not end; \`sandlane host reap\` ends them): detached lazily"
            umount -l "$dir/mnt"
        }
    fi
    rm -rf "$dir"
}
xfs_or_skip() {
    if ! setup_xfs; then
        log "no XFS filesystem could be made: the snapshots bench's XFS rows are skipped"
        unset SANDLANE_BENCH_XFS_DIR
    fi
}
# Unmounts and deletes the XFS at once (its cleanup at exit then finds nothing).
xfs_done() {
    if [[ -n "${XFS_TMP:-}" ]]; then
        teardown_xfs "$XFS_TMP"
        unset SANDLANE_BENCH_XFS_DIR XFS_TMP
    fi
}

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
    out="$(cargo bench --locked --profile dev -p app --bench preview -- --smoke)"
    echo "$out"
    [[ "$(grep -c '^| P[0-9] |' <<<"$out")" -eq 2 ]] || { log "the preview smoke run printed no table of 2 rows"; exit 1; }
    out="$(cargo bench --locked --profile dev -p app --bench terminals -- --smoke)"
    echo "$out"
    [[ "$(grep -c '^| T[0-9] |' <<<"$out")" -eq 1 ]] || { log "the terminals smoke run printed no table of 1 row"; exit 1; }
    # The snapshots bench: XFS only where mkfs.xfs is installed already (nothing installed).
    if command -v mkfs.xfs >/dev/null 2>&1; then
        xfs_or_skip
    else
        log "mkfs.xfs is missing: the snapshots smoke run measures the data dir's filesystem only"
    fi
    xfs_wanted="${SANDLANE_BENCH_XFS_DIR:-}"
    out="$(cargo bench --locked --profile dev -p app --bench snapshots -- --smoke)"
    xfs_done
    echo "$out"
    grep -q '^| [a-z0-9]* | 1 MiB ' <<<"$out" || { log "the snapshots smoke run printed no row for the data dir's filesystem"; exit 1; }
    [[ -z "$xfs_wanted" ]] || grep -q '^| XFS | 1 MiB ' <<<"$out" || { log "the snapshots smoke run printed no XFS row"; exit 1; }
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
    section="$(mktemp)"
    cleanups+=("rm -f '$section'")
    command -v mkfs.xfs >/dev/null 2>&1 || apt_install xfsprogs || log "xfsprogs could not be installed"
fi
# The snapshots bench (SQLite, bubblewrap; ext4 and XFS): in the full run, and alone.
run_snapshots() {
    cargo build --locked --release -p supervisor --bin sandlane-supervisor
    cargo bench --locked -p app --no-run --bench snapshots
    xfs_or_skip
    settle
    cargo bench --locked -p app --bench snapshots -- --out "$section"
    xfs_done
    splice '<!-- bench:snapshots:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:snapshots:end -->' "$section"
}
# The preview ports bench (SQLite, bubblewrap): in the full run, and alone.
run_preview() {
    cargo build --locked --release -p supervisor --bin sandlane-supervisor
    cargo bench --locked -p app --no-run --bench preview
    settle
    cargo bench --locked -p app --bench preview -- --out "$section"
    splice '<!-- bench:preview:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:preview:end -->' "$section"
}
if [[ "$only" == preview ]]; then
    run_preview
    log "wrote the $only section of BENCHMARKS.md"
elif [[ -n "$only" ]]; then
    run_snapshots
    log "wrote the $only section of BENCHMARKS.md"
elif ((smoke == 0)); then
    # Each bench is built first, then measured on a quiet machine (see settle); every bench
    # runs sandboxes, whose supervisor is a program of its own.
    cargo build --locked --release -p supervisor --bin sandlane-supervisor
    cargo bench --locked -p app --no-run --bench lane --bench policy --bench streams --bench egress
    settle
    cargo bench --locked -p app --bench lane -- --out "$PWD/BENCHMARKS.md"
    settle
    cargo bench --locked -p app --bench policy -- --out "$PWD/BENCHMARKS.md"
    settle
    cargo bench --locked -p app --bench streams -- --out "$section"
    splice '<!-- bench:streams:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:streams:end -->' "$section"
    settle
    cargo bench --locked -p app --bench egress -- --out "$section"
    splice '<!-- bench:egress:begin (written by `scripts/bench.sh`; edit outside the markers) -->' \
        '<!-- bench:egress:end -->' "$section"
    run_snapshots
    run_preview
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
