#!/usr/bin/env bash
# A headless browser for the browser test: Debian's chromium (installed with apt-get when
# missing) and playwright-core (npm, pinned in tests/browser/package-lock.json) installed
# into a throwaway dir.
#
#   eval "$(bash scripts/browser.sh start)"   # prints export lines
#   ... cargo nextest run -p tests browser ...
#   bash scripts/browser.sh stop "$SANDLANE_TEST_BROWSER_DIR"
#
# Diagnostics go to stderr so that stdout holds only the export lines.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
start)
    chromium=$(command -v chromium || true)
    if [ -z "$chromium" ]; then
        echo "browser: installing chromium with apt-get" >&2
        if [ -z "${SANDLANE_APT_UPDATED:-}" ]; then apt-get update -qq >&2; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
        chromium=$(command -v chromium)
    fi
    dir=$(mktemp -d -t sandlane-browser.XXXXXX)
    cp tests/browser/package.json tests/browser/package-lock.json "$dir/"
    echo "browser: npm ci (playwright-core) in $dir; $("$chromium" --version 2>/dev/null || echo "$chromium")" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "export SANDLANE_TEST_BROWSER_DIR=$dir"
    echo "export SANDLANE_TEST_CHROMIUM=$chromium"
    echo "export SANDLANE_TEST_PLAYWRIGHT=$dir"
    ;;
stop)
    dir=${2:?usage: browser.sh stop DIR}
    case "$dir" in
    */sandlane-browser.*) rm -rf "$dir" ;;
    *) echo "browser: refusing to remove $dir" >&2; exit 1 ;;
    esac
    ;;
*)
    echo "usage: browser.sh start | stop DIR" >&2
    exit 2
    ;;
esac
