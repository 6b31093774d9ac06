#!/usr/bin/env bash
# Tests the Helm chart and the deployment files without a Kubernetes cluster or
# Docker: lint and render with the real Helm engine (helm-python-sdk), validate the
# manifests against the Kubernetes schemas (kubernetes-validate), check the rendered
# flags against the CLI contract, and check docker-compose, Prometheus rules and the
# Grafana dashboard against docs/operations.md. Needs python3 (≥ 3.10) with venv/pip
# and access to PyPI on first run; takes well under a minute once installed.
#
#   helm/quiver/tests/run.sh [pytest arguments…]
#
# QUIVER_VENV_DIR chooses the virtualenv (default /var/tmp/quiver-helm-venv); it is
# created on first use and reinstalled when requirements.txt changes.
set -euo pipefail

tests_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv_dir="${QUIVER_VENV_DIR:-/var/tmp/quiver-helm-venv}"
python="${PYTHON:-python3}"
requirements="$tests_dir/requirements.txt"
stamp="$venv_dir/.quiver-requirements.sha256"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "error: $python is older than 3.10" >&2
    exit 1
fi

wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv_dir/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    echo "installing test dependencies into $venv_dir" >&2
    if [[ ! -x "$venv_dir/bin/python" ]]; then
        if ! "$python" -m venv "$venv_dir" 2>/dev/null; then
            # Debian/Ubuntu without python3-venv: virtualenv from PyPI does the same job.
            "$python" -m pip install --quiet --user virtualenv
            "$python" -m virtualenv --quiet "$venv_dir"
        fi
    fi
    "$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input -r "$requirements"
    echo "$wanted" > "$stamp"
fi

cd "$tests_dir"
exec "$venv_dir/bin/python" -m pytest -p no:cacheprovider -q "$@"
