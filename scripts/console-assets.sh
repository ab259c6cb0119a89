#!/usr/bin/env bash
# The console's third-party files (crates/app/console/vendor/): xterm.js, pinned in
# crates/app/console/package-lock.json, installed with `npm ci` into a throwaway dir and
# copied verbatim (its ES module, its stylesheet, its licence). The copies are checked in,
# so `cargo build` never needs npm; the test command runs `--check`, which fails when
# re-running this script would change anything.
#
#   bash scripts/console-assets.sh           # (re)write crates/app/console/vendor/
#   bash scripts/console-assets.sh --check   # exit 1 when vendor/ differs from the pin
#
# Diagnostics go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=write
case "${1:-}" in
"") ;;
--check) mode=check ;;
*) echo "usage: console-assets.sh [--check]" >&2; exit 2 ;;
esac

console=crates/app/console
dir=$(mktemp -d -t sandlane-console.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp "$console/package.json" "$console/package-lock.json" "$dir/"
(cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
xterm=$dir/node_modules/@xterm/xterm
mkdir "$dir/vendor"
cp "$xterm/lib/xterm.mjs" "$dir/vendor/xterm.mjs"
cp "$xterm/css/xterm.css" "$dir/vendor/xterm.css"
cp "$xterm/LICENSE" "$dir/vendor/LICENSE-xterm.txt"

if [ "$mode" = check ]; then
    if ! diff -r "$dir/vendor" "$console/vendor" >/dev/null; then
        diff -rq "$dir/vendor" "$console/vendor" >&2 || true
        echo "console-assets: $console/vendor differs from the pinned xterm.js; run bash scripts/console-assets.sh" >&2
        exit 1
    fi
    echo "console-assets: $console/vendor matches the pinned xterm.js $(node -p "require('$xterm/package.json').version")" >&2
else
    rm -rf "$console/vendor"
    cp -r "$dir/vendor" "$console/vendor"
    echo "console-assets: wrote $console/vendor (xterm.js $(node -p "require('$xterm/package.json').version"))" >&2
fi
