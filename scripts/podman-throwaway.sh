#!/usr/bin/env bash
# A throwaway podman API service (Docker Engine API) for the container driver's tests and
# benchmarks.
#
#   eval "$(bash scripts/podman-throwaway.sh start)"   # prints export lines
#   ... run tests (they read SANDLANE_TEST_DOCKER_HOST, SANDLANE_TEST_CONTAINER_IMAGE) ...
#   bash scripts/podman-throwaway.sh stop "$SANDLANE_TEST_PODMAN_DIR"
#   bash scripts/podman-throwaway.sh tools-image DIR   # prints the tools image's name
#
# Installs podman, runc, catatonit and busybox-static with apt-get when missing.
# Everything lives in a fresh temp dir: a containers.conf that selects runc (crun fails on
# this kind of machine), lowers the default ulimits below the host's hard limits, uses
# cgroupfs, a short exec exit delay and a libpod tmp dir of its own; the image store
# (--root/--runroot); the API socket. The test image is built without any registry: a
# rootfs of Debian's static busybox (its applets as symlinks, /workspace owned by uid
# 1000), imported with `podman import`. Diagnostics go to stderr so that stdout holds
# only the export lines.
#
# `tools-image DIR` adds, once per service, an image with the clients a real agent uses
# (bash, curl, git, openssl, grep, Python 3, Node) on top of the busybox one, for the tests
# that need them inside a container: still no registry, the host's own programs copied with
# the libraries `ldd` names, Python's standard library and git's helper programs.
set -euo pipefail
# The image's rootfs and the service's files must be readable by the sandboxes' users
# whatever umask the caller runs under (a test process that started an in-process server
# runs under its umask 077, and would make /bin/sh unreadable inside every container).
umask 022

IMAGE=localhost/sandlane-busybox:test
TOOLS_IMAGE=localhost/sandlane-tools:test
# The sandbox's PATH: a tool is taken from where a sandbox on bubblewrap would find it.
SANDBOX_PATH=/usr/local/bin:/usr/bin:/bin

log() { echo "podman-throwaway: $*" >&2; }

install_missing() {
    local missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    # The init the driver asks for (HostConfig.Init); only a Recommends of podman.
    command -v catatonit >/dev/null 2>&1 || missing+=(catatonit)
    [[ -x /bin/busybox ]] || missing+=(busybox-static)
    if ((${#missing[@]})); then
        log "installing ${missing[*]} with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        if [[ -z "${SANDLANE_APT_UPDATED:-}" ]]; then
            apt-get update -qq >&2
        fi
        apt-get install -y -qq "${missing[@]}" >&2
    fi
}

# Lower than the host's hard limits, so the runtime can apply them.
ulimits() {
    local nofile nproc
    nofile="$(ulimit -Hn)"
    nproc="$(ulimit -Hu)"
    [[ "$nofile" == unlimited || "$nofile" -gt 4096 ]] && nofile=4096
    [[ "$nproc" == unlimited || "$nproc" -gt 4096 ]] && nproc=4096
    echo "\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\""
}

podman_in() {
    local dir="$1"
    shift
    CONTAINERS_CONF="$dir/containers.conf" podman --root "$dir/root" --runroot "$dir/runroot" \
        --storage-driver overlay --cgroup-manager cgroupfs --events-backend file "$@"
}

# base_rootfs ROOTFS: the busybox rootfs every test image starts from.
base_rootfs() {
    local rootfs="$1" applet
    mkdir -p "$rootfs"/{bin,etc,tmp,workspace,run/sandlane,proc,sys,dev}
    cp /bin/busybox "$rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [[ "$applet" == busybox ]] || ln -s busybox "$rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n' \
        >"$rootfs/etc/passwd"
    printf 'root:x:0:\nsandbox:x:1000:\n' >"$rootfs/etc/group"
    chmod 1777 "$rootfs/tmp"
    chown 1000:1000 "$rootfs/workspace"
    chmod 0700 "$rootfs/workspace"
}

# import_rootfs DIR ROOTFS IMAGE: the rootfs as an image of the service's store.
import_rootfs() {
    local dir="$1" rootfs="$2" image="$3"
    tar -C "$rootfs" -cf "$rootfs.tar" .
    podman_in "$dir" import --change 'CMD ["/bin/sh"]' "$rootfs.tar" "$image" >/dev/null
    rm -rf "$rootfs" "$rootfs.tar"
}

build_image() {
    base_rootfs "$1/rootfs"
    import_rootfs "$1" "$1/rootfs" "$IMAGE"
}

# copy_with_libs ROOTFS FILE...: each file at its own path under ROOTFS, with every library
# `ldd` says it loads (and the loader).
copy_with_libs() {
    local rootfs="$1" file lib
    shift
    for file in "$@"; do
        cp -L --parents "$file" "$rootfs/"
        while read -r lib; do
            [[ -e "$rootfs$lib" ]] || cp -L --parents "$lib" "$rootfs/"
        done < <(ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
    done
}

build_tools_image() {
    local dir="$1" rootfs="$1/tools-rootfs" tool path missing=() python stdlib gitexec
    for tool in bash curl git openssl grep python3 node; do
        PATH="$SANDBOX_PATH" command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if ((${#missing[@]})); then
        log "the tools image needs ${missing[*]} on $SANDBOX_PATH"
        exit 1
    fi
    rm -rf "$rootfs"
    base_rootfs "$rootfs"
    for tool in bash curl git openssl grep python3 node; do
        path="$(PATH="$SANDBOX_PATH" command -v "$tool")"
        copy_with_libs "$rootfs" "$path"
    done
    # Scripts say /bin/bash.
    ln -sf "$(PATH="$SANDBOX_PATH" command -v bash)" "$rootfs/bin/bash"
    python="$(PATH="$SANDBOX_PATH" command -v python3)"
    stdlib="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
    tar -C / --exclude='*/test' --exclude='*/tests' --exclude='*/idlelib' --exclude='*/tkinter' \
        --exclude='*/ensurepip' -cf - "${stdlib#/}" | tar -C "$rootfs" -xf -
    copy_with_libs "$rootfs" "$stdlib"/lib-dynload/*.so
    gitexec="$(PATH="$SANDBOX_PATH" git --exec-path)"
    tar -C / -cf - "${gitexec#/}" | tar -C "$rootfs" -xf -
    copy_with_libs "$rootfs" "$gitexec/git-remote-http"
    [[ -e /etc/ssl/openssl.cnf ]] && cp -L --parents /etc/ssl/openssl.cnf "$rootfs/"
    import_rootfs "$dir" "$rootfs" "$TOOLS_IMAGE"
}

tools_image() {
    local dir="${1:?usage: podman-throwaway.sh tools-image DIR}"
    dir="${dir%/}"
    [[ -f "$dir/containers.conf" ]] || { log "$dir is not a throwaway podman dir"; exit 1; }
    # One build at a time per service; the second caller finds the image.
    exec 9>"$dir/tools-image.lock"
    flock 9
    if ! podman_in "$dir" image exists "$TOOLS_IMAGE"; then
        log "building $TOOLS_IMAGE from this host's programs"
        build_tools_image "$dir"
    fi
    echo "$TOOLS_IMAGE"
}

start() {
    install_missing
    local dir
    dir="$(mktemp -d /tmp/sandlane-podman.XXXXXX)"
    cat >"$dir/containers.conf" <<EOF
[containers]
default_ulimits = [$(ulimits)]
log_driver = "k8s-file"

[engine]
runtime = "runc"
# Its own: the default (/run/libpod) is shared by every podman of the host, and the
# system reset of stop removes it, under the feet of other throwaway services.
tmp_dir = "$dir/tmp"
# conmon keeps an exited exec's record for this long (default 300 s, one conmon process
# per exec); the driver reads the exit code right away.
exit_command_delay = 5
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    build_image "$dir"
    local sock="$dir/podman.sock"
    # The service's working directory is its own dir: conmon writes an `oom` file into its
    # working directory when a container process meets the memory limit.
    cd "$dir"
    CONTAINERS_CONF="$dir/containers.conf" setsid podman --root "$dir/root" --runroot "$dir/runroot" \
        --storage-driver overlay --cgroup-manager cgroupfs --events-backend file \
        system service --time=0 "unix://$sock" >"$dir/service.log" 2>&1 </dev/null &
    echo $! >"$dir/service.pid"
    local i
    for i in $(seq 1 200); do
        if [[ -S "$sock" ]]; then
            # The socket appears when the service accepts; ask it when curl is there.
            if ! command -v curl >/dev/null 2>&1 || curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
                break
            fi
        fi
        if ! kill -0 "$(cat "$dir/service.pid")" 2>/dev/null; then
            log "the podman service exited; its log follows"
            cat "$dir/service.log" >&2
            exit 1
        fi
        sleep 0.05
    done
    [[ -S "$sock" ]] || { log "no socket at $sock after 10 s"; cat "$dir/service.log" >&2; exit 1; }
    log "serving the Docker Engine API on unix://$sock (image $IMAGE)"
    echo "export SANDLANE_TEST_PODMAN_DIR=$dir"
    echo "export SANDLANE_TEST_DOCKER_HOST=unix://$sock"
    echo "export SANDLANE_TEST_CONTAINER_IMAGE=$IMAGE"
}

# Unmounts the store's own bind mount (podman's overlay driver); a process on its way out
# can hold it busy for a moment, so it retries, then detaches it.
unmount_store() {
    local dir="$1" tries
    for tries in $(seq 1 20); do
        grep -qF " $dir/root/overlay " /proc/mounts || return 0
        umount -R "$dir/root/overlay" 2>/dev/null || sleep 0.25
    done
    umount -R -l "$dir/root/overlay" 2>/dev/null || true
}

stop() {
    local dir="${1:?usage: podman-throwaway.sh stop DIR}"
    dir="${dir%/}"
    [[ -f "$dir/containers.conf" ]] || { log "$dir is not a throwaway podman dir"; exit 1; }
    # Containers first (their mounts live under the dir), then the service.
    podman_in "$dir" rm --all --force --time 0 >/dev/null 2>&1 || true
    podman_in "$dir" volume prune --force >/dev/null 2>&1 || true
    if [[ -f "$dir/service.pid" ]]; then
        local pid
        pid="$(cat "$dir/service.pid")"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # Whatever else still runs on this dir: conmon processes of exec sessions whose delayed
    # cleanup has not run yet, and the `podman … cleanup` commands they start (one of those
    # recreated the store behind the rm below).
    local pids tries
    for tries in $(seq 1 30); do
        pids="$(pgrep -f -- "$dir/" || true)"
        [[ -n "$pids" ]] || break
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null || true
        sleep 0.1
    done
    pids="$(pgrep -f -- "$dir/" || true)"
    if [[ -n "$pids" ]]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    podman_in "$dir" system reset --force >/dev/null 2>&1 || true
    for tries in 1 2 3; do
        unmount_store "$dir"
        rm -rf "$dir" 2>/dev/null && break
        sleep 0.5
    done
    if [[ -e "$dir" ]]; then
        log "could not remove $dir"
        exit 1
    fi
    log "stopped and removed $dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    tools-image) tools_image "${2:-}" ;;
    *)
        echo "usage: $0 start | stop DIR | tools-image DIR" >&2
        exit 2
        ;;
esac
