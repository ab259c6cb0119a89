#!/usr/bin/env bash
# Builds sandlane-supervisor statically linked (glibc, static-pie), for container and
# Kubernetes images that should not depend on the host's or the image's C library: one file,
# no loader, no libraries. Prints the path of the program it built.
#
#   bash scripts/supervisor-static.sh [--dev]     # release by default
#
# The static build needs an explicit --target (so the flag reaches only the target's crates,
# not build scripts and proc macros); its output lives under target/<triple>/.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [[ "${1:-}" == "--dev" ]]; then profile=dev; fi
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --locked --quiet --profile "$profile" -p supervisor --bin sandlane-supervisor --target "$triple" >&2
dir=$([[ $profile == dev ]] && echo debug || echo release)
program="${CARGO_TARGET_DIR:-target}/$triple/$dir/sandlane-supervisor"
if ldd "$program" >/dev/null 2>&1 && ! ldd "$program" 2>&1 | grep -q 'statically linked'; then
    echo "supervisor-static.sh: $program is not static" >&2
    exit 1
fi
echo "$program"
