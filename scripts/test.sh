#!/usr/bin/env bash
# Runs every test of the repository, as README.md says:
#   1. starts an S3-compatible server (moto, installed from PyPI into a venv) on
#      a free loopback port, for the tests that talk to real object storage;
#   2. cargo test --workspace (unit, integration, real `quiver` processes);
#   3. the Helm chart tests (lint, render, Kubernetes schema validation);
#   4. the Python SDK tests, including its integration tests against a real
#      `quiver standalone` built in step 2;
#   5. the OpenAPI document: validated, and every operation sent to a real
#      `quiver standalone` (tests/openapi/run.sh).
# Needs: cargo, python3 (3.10+) with venv/pip, network access to crates.io and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${QUIVER_MOTO_VENV:-/var/tmp/quiver-moto-venv}"
if [ ! -x "$venv/bin/moto_server" ]; then
    echo "== installing moto (S3-compatible test server) into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "moto[server]==5.2.5"
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_log="$(mktemp -t quiver-moto.XXXXXX.log)"
"$venv/bin/moto_server" -H 127.0.0.1 -p "$port" > "$moto_log" 2>&1 &
moto_pid=$!
cargo_log="$(mktemp -t quiver-cargo-test.XXXXXX.log)"
trap 'kill "$moto_pid" 2>/dev/null || true; rm -f "$cargo_log"' EXIT
for _ in $(seq 1 150); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.2
done
curl -s -o /dev/null "http://127.0.0.1:$port/" || { echo "moto did not start:"; cat "$moto_log"; exit 1; }
export QUIVER_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
echo "== S3 server (moto) on $QUIVER_TEST_S3_ENDPOINT"

echo "== cargo test --workspace"
cargo test --workspace 2>&1 | tee "$cargo_log"
# Sum every test binary's counts (cargo's last line is the doc tests, often 0).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "rust tests: %d passed, %d failed\n", p, f; if (p == 0 || f > 0) exit 1 }' "$cargo_log"

echo "== Helm chart tests"
bash helm/quiver/tests/run.sh

echo "== Python SDK tests (integration against a real quiver standalone)"
target_dir="${CARGO_TARGET_DIR:-target}"
export QUIVER_BIN="$(cd "$target_dir/debug" && pwd)/quiver"
[ -x "$QUIVER_BIN" ] || { echo "quiver binary not found at $QUIVER_BIN"; exit 1; }
bash sdk/python/tests/run.sh

echo "== OpenAPI document (validator, and every operation against a real quiver standalone)"
bash tests/openapi/run.sh

echo "== all tests passed"
