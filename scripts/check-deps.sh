#!/usr/bin/env bash
# The dependency-direction check: domain <- ports <- adapters <- app, nothing pointing back;
# the supervisor (the program inside every sandbox) depends on domain alone of ours, and its
# whole tree holds no database, HTTP, Kubernetes, container-engine or JWT crate.
#
# domain and ports may depend (normal dependencies, with every feature on) only on the
# crates allowed below: anything else fails the check, whatever it is. Their whole trees
# may not reach a crate of ours they must not see, and the adapters may not depend on the
# HTTP server or the app.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0

# The names of `crate`'s normal dependencies, `depth` levels down (0: the whole tree), with
# every feature on (or with FEATURES, when set, instead).
deps() {
    local crate=$1 depth=$2 tree features=(--all-features)
    if [ -n "${FEATURES+set}" ]; then
        features=(--no-default-features)
        [ -n "$FEATURES" ] && features+=(--features "$FEATURES")
    fi
    # A failing cargo fails the script (set -e on the assignment).
    if ((depth > 0)); then
        tree=$(cargo tree -p "$crate" -e normal "${features[@]}" --prefix none --depth "$depth")
    else
        tree=$(cargo tree -p "$crate" -e normal "${features[@]}" --prefix none)
    fi
    awk 'NR > 1 {print $1}' <<<"$tree" | sort -u
}

allow() { # crate, the only direct normal dependencies it may have
    local crate=$1 found extra
    shift
    found=$(deps "$crate" 1)
    extra=$(grep -vxF -f <(printf '%s\n' "$@") <<<"$found" | tr '\n' ' ' || true)
    if [ -n "$extra" ]; then
        echo "dependency direction violated: crates/$crate may depend only on: $*; it depends on: $extra" >&2
        fail=1
    else
        echo "dependency direction ok: crates/$crate depends on $(tr '\n' ' ' <<<"$found")(allowed: $*)"
    fi
}

forbid() { # crate, regex of dependency names its whole tree may not hold
    local crate=$1 pattern=$2 found
    found=$(grep -E "^($pattern)$" <<<"$(deps "$crate" 0)" | tr '\n' ' ' || true)
    if [ -n "$found" ]; then
        echo "dependency direction violated: crates/$crate depends on: $found" >&2
        fail=1
    else
        echo "dependency direction ok: crates/$crate's tree has none of ($pattern)"
    fi
}

allow domain serde sha2 thiserror
allow ports domain async-trait thiserror mockall
allow supervisor domain tokio libc rustix seccompiler serde serde_json subtle getrandom tar thiserror
forbid domain 'ports|supervisor|adapters|app|tests|tokio|async-trait|sqlx|sqlx-core|axum|hyper|bollard|jsonwebtoken'
forbid ports 'supervisor|adapters|app|tests|tokio|sqlx|sqlx-core|axum|hyper|bollard|jsonwebtoken'
forbid supervisor 'ports|adapters|app|tests|sqlx|sqlx-core|axum|hyper|hyper-util|tower|kube|kube-client|k8s-openapi|bollard|jsonwebtoken|clap|tracing'
# The adapters as the server links them (no features): no HTTP server, no app. Their
# `testing` feature (the Kubernetes driver's fake API server, for tests and benches) may
# use axum, never the app.
FEATURES="" forbid adapters 'axum|app'
FEATURES=testing forbid adapters 'app'
exit "$fail"
