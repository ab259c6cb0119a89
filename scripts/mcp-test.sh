#!/usr/bin/env bash
# The MCP endpoint from outside: the official MCP Python SDK (PyPI, pinned in
# tests/mcp/requirements.txt, in a throwaway virtualenv) against a real server
# (scripts/serve-throwaway.sh), running tests/mcp/test_mcp.py with pytest.
#
#   bash scripts/mcp-test.sh [SANDLANE_BIN]
#
# Run by the test command; needs root and bubblewrap, as the server's sandboxes do.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d -t sandlane-mcp-venv.XXXXXX)
server_dir=
cleanup() {
    if [ -n "$server_dir" ]; then bash scripts/serve-throwaway.sh stop "$server_dir" || true; fi
    rm -rf "$venv"
}
trap cleanup EXIT
echo "mcp-test: virtualenv with $(grep -v '^#' tests/mcp/requirements.txt | tr '\n' ' ')"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
exports=$(bash scripts/serve-throwaway.sh start ${1:+"$1"})
eval "$exports"
server_dir=$SANDLANE_TEST_SERVER_DIR
(cd "$venv" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/mcp/test_mcp.py")
