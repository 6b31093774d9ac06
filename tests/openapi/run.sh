#!/usr/bin/env bash
# The OpenAPI document (docs/openapi.json) checked twice: by a real validator
# (openapi-spec-validator, from PyPI), and against a real `quiver standalone`
# (QUIVER_BIN) by sending every documented operation and validating each answer
# against the schema the document gives for its status.
#
#   tests/openapi/run.sh [pytest args…]
#
# The venv lives in ${QUIVER_OPENAPI_VENV:-/var/tmp/quiver-openapi-venv}.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${QUIVER_OPENAPI_VENV:-/var/tmp/quiver-openapi-venv}"
requirements="$here/requirements.txt"
stamp="$venv/.quiver-stamp"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    echo "run.sh: installing $requirements into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$wanted" > "$stamp"
fi
echo "== openapi-spec-validator docs/openapi.json"
"$venv/bin/openapi-spec-validator" "$here/../../docs/openapi.json"
[[ -n "${QUIVER_BIN:-}" ]] || { echo "run.sh: QUIVER_BIN (a quiver binary) is required" >&2; exit 2; }
cd "$here"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@"
