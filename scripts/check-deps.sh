#!/usr/bin/env bash
# The dependency-direction check: domain <- ports <- adapters <- app, nothing pointing back.
# The pure domain may not depend on async runtimes, databases or other crates of ours;
# the ports may not depend on infrastructure.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
forbid() { # crate, regex of forbidden dependency names
    local crate=$1 pattern=$2 tree found
    tree=$(cargo tree -p "$crate" -e normal --prefix none) # fails the script if cargo fails
    found=$(awk '{print $1}' <<<"$tree" | grep -E "^($pattern)$" | sort -u | tr '\n' ' ' || true)
    if [ -n "$found" ]; then
        echo "dependency direction violated: crates/$crate depends on: $found" >&2
        fail=1
    else
        echo "dependency direction ok: crates/$crate has none of ($pattern)"
    fi
}
forbid domain 'tokio|async-trait|sqlx|sqlx-core|axum|hyper|bollard|jsonwebtoken|ports|adapters|app'
forbid ports 'tokio|sqlx|sqlx-core|axum|hyper|bollard|jsonwebtoken|adapters|app'
forbid adapters 'axum|app'
exit "$fail"
