#!/usr/bin/env bash
# kubernetes-validate (PyPI, pinned in tests/kube/requirements.txt) in a throwaway
# virtualenv, for the Kubernetes driver's schema test: every object the driver builds is
# checked against the Kubernetes 1.33 schemas with --strict.
#
#   eval "$(bash scripts/kube-validate.sh start)"   # prints export lines
#   ... cargo nextest run -p adapters kubernetes:: ...
#   bash scripts/kube-validate.sh stop "$SANDLANE_KUBE_VALIDATE_DIR"
#
# Diagnostics go to stderr so that stdout holds only the export lines. Needs python3 with
# venv.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
start)
    dir=$(mktemp -d -t sandlane-kube-validate.XXXXXX)
    echo "kube-validate: virtualenv with $(grep -v '^#' tests/kube/requirements.txt | tr '\n' ' ')" >&2
    python3 -m venv "$dir/venv" >&2
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check -r tests/kube/requirements.txt >&2
    "$dir/venv/bin/kubernetes-validate" --version >&2
    echo "export SANDLANE_KUBE_VALIDATE_DIR=$dir"
    echo "export SANDLANE_KUBERNETES_VALIDATE=$dir/venv/bin/kubernetes-validate"
    ;;
stop)
    dir=${2:?usage: kube-validate.sh stop DIR}
    case "$dir" in
    */sandlane-kube-validate.*) rm -rf "$dir" ;;
    *) echo "kube-validate: refusing to remove $dir" >&2; exit 1 ;;
    esac
    ;;
*)
    echo "usage: kube-validate.sh start | stop DIR" >&2
    exit 2
    ;;
esac
