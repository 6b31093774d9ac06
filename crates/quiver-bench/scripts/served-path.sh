#!/usr/bin/env bash
# The served path against the engine alone, in one run (issue: served search at
# engine speed). For `quiver standalone` and a local multi-process cluster
# (scripts/local-cluster.sh: 1 meta, 1 indexer, 2 searchers, 1 gateway over a local
# S3 server), each through quiver-bench cluster (REST, strong reads, defaults):
#   1. load BASE with a payload per point, query at once (fresh: rows still in the
#      WAL tail and L0 segments), payloads returned;
#   2. wait until settled (nothing unflushed, segments unchanged for 20 s), with and
#      without payloads, and the engine alone on BASE at the recall the server
#      delivered (one segment, one thread): server CPU per query ÷ the engine's;
#   3. settled, the same queries as batch searches of 64 (/search/batch).
# Concurrency 1, 16, 64. Server CPU counts every quiver process of the deployment.
#
#   crates/quiver-bench/scripts/served-path.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR [METRIC]
#
# Needs release builds of quiver and quiver-bench (cargo build --release -p quiver -p quiver-bench).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,16p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4 metric=${5:-cosine}
source "$(dirname "$0")/common.sh"
concurrency=${CONCURRENCY:-1,16,64}
mkdir -p "$out"
work=$(mktemp -d -t quiver-served.XXXXXX)
standalone_pid=""
cleanup() {
    [ -n "$standalone_pid" ] && kill -TERM "$standalone_pid" 2>/dev/null && wait "$standalone_pid" 2>/dev/null
    QUIVER_BIN=$quiver "$repo/scripts/local-cluster.sh" stop "$work/cluster" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# measure NAME ENDPOINT PIDS
measure() {
    local name=$1 endpoint=$2 pids=$3
    local common=(--endpoint "$endpoint" --collection served --metric "$metric" --queries "$queries"
        --gt "$gt" --k 10 --concurrency "$concurrency" --max-queries "$max_queries" --server-pid "$pids")
    echo "== $name: fresh (queries right after the load), payloads"
    "$bench" cluster "${common[@]}" --load --load-payloads --base "$base" --settle-seconds 0 \
        --include-payload --json "$out/$name-fresh.json" | tee "$out/$name-fresh.txt"
    echo "== $name: settled, payloads, and the engine alone"
    "$bench" cluster "${common[@]}" --wait-settled --include-payload --engine --base "$base" \
        --json "$out/$name-settled.json" | tee "$out/$name-settled.txt"
    echo "== $name: settled, no payloads"
    "$bench" cluster "${common[@]}" --json "$out/$name-settled-nopayload.json" \
        | tee "$out/$name-settled-nopayload.txt"
    echo "== $name: settled, payloads, batch searches of 64"
    "$bench" cluster "${common[@]}" --include-payload --batch 64 \
        --json "$out/$name-settled-batch64.json" | tee "$out/$name-settled-batch64.txt"
}

"$quiver" standalone --data-dir "$work/standalone" --http-listen 127.0.0.1:7900 \
    --grpc-listen 127.0.0.1:7901 >"$work/standalone.log" 2>&1 &
standalone_pid=$!
wait_ready http://127.0.0.1:7900
measure standalone http://127.0.0.1:7900 "$standalone_pid"
kill -TERM "$standalone_pid"; wait "$standalone_pid" || true; standalone_pid=""

QUIVER_BIN=$quiver HTTP_PORT=7950 "$repo/scripts/local-cluster.sh" start "$work/cluster"
pids=$(cd "$work/cluster/pids" && cat gateway searcher-* indexer meta | paste -sd, -)
measure cluster http://127.0.0.1:7950 "$pids"
QUIVER_BIN=$quiver "$repo/scripts/local-cluster.sh" stop "$work/cluster"
