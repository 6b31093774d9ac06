#!/usr/bin/env bash
# Runs the Python SDK's tests in a venv of their own.
#
#   sdk/python/tests/run.sh [pytest args…]
#
# The venv lives in ${QUIVER_VENV_DIR:-/var/tmp/quiver-pysdk-venv} and is made with
# ${PYTHON:-python3} (3.9+) when missing; the package is installed editable with its
# test extras, again only when pyproject.toml changed. Integration tests run when
# QUIVER_TEST_ENDPOINT (a running server) or QUIVER_BIN (a quiver binary to start)
# is set, and are skipped otherwise. Exits with pytest's status.
set -euo pipefail

sdk_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${QUIVER_VENV_DIR:-/var/tmp/quiver-pysdk-venv}"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    echo "run.sh: $python is missing or older than 3.9; set PYTHON" >&2
    exit 2
fi

if [[ ! -x "$venv_dir/bin/python" ]] || ! "$venv_dir/bin/python" -c 'import sys' 2>/dev/null; then
    echo "run.sh: creating venv $venv_dir"
    rm -rf "$venv_dir"
    "$python" -m venv "$venv_dir"
    "$venv_dir/bin/python" -m pip install --quiet --upgrade pip
fi

# Reinstall only when the package metadata or the checkout location changed.
stamp="$venv_dir/.quiver-sdk-stamp"
wanted="$(cat "$sdk_dir/pyproject.toml" | sha256sum | cut -d' ' -f1) $sdk_dir"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]] \
    || ! "$venv_dir/bin/python" -c 'import quiver, pytest, pytest_asyncio, numpy' 2>/dev/null; then
    echo "run.sh: installing $sdk_dir[test] into $venv_dir"
    "$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check -e "$sdk_dir[test]"
    echo "$wanted" > "$stamp"
fi

# The editable install must point at this checkout, not another worktree.
installed_at="$("$venv_dir/bin/python" -c 'import quiver, os; print(os.path.dirname(os.path.dirname(os.path.realpath(quiver.__file__))))')"
if [[ "$installed_at" != "$sdk_dir/src" ]]; then
    echo "run.sh: quiver resolves to $installed_at, reinstalling from $sdk_dir"
    "$venv_dir/bin/python" -m pip install --quiet --disable-pip-version-check -e "$sdk_dir[test]"
    echo "$wanted" > "$stamp"
fi

if [[ -z "${QUIVER_TEST_ENDPOINT:-}" && -z "${QUIVER_BIN:-}" ]]; then
    echo "run.sh: QUIVER_TEST_ENDPOINT and QUIVER_BIN unset: integration tests will be skipped"
fi

cd "$sdk_dir"
exec "$venv_dir/bin/python" -m pytest -p no:cacheprovider "$@"
