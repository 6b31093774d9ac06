#!/usr/bin/env bash
# What the network path costs, in one run: the same queries against
#   1. the engine alone (quiver-bench engine, in process, one segment, 1 thread; read
#      the row at the nprobe its calibration prints),
#   2. `quiver standalone` (every role in one process, file object store), and
#   3. a local multi-process cluster (scripts/local-cluster.sh: 1 meta, 1 indexer,
#      2 searchers, 1 gateway over a local S3 server),
# each through quiver-bench cluster at concurrency 1, 16, 64 (REST, strong reads).
#
#   crates/quiver-bench/scripts/network-path.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR [NAME]
#
# Needs release builds of quiver and quiver-bench (cargo build --release -p quiver -p quiver-bench).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,12p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4 name=${5:-net}
source "$(dirname "$0")/common.sh"
mkdir -p "$out"
work=$(mktemp -d -t quiver-netpath.XXXXXX)
standalone_pid=""
cleanup() {
    [ -n "$standalone_pid" ] && kill -TERM "$standalone_pid" 2>/dev/null && wait "$standalone_pid" 2>/dev/null
    QUIVER_BIN=$quiver "$repo/scripts/local-cluster.sh" stop "$work/cluster" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "== standalone"
"$quiver" standalone --data-dir "$work/standalone" --http-listen 127.0.0.1:7900 --grpc-listen 127.0.0.1:7901 \
    --cache-size 4GiB >"$work/standalone.log" 2>&1 &
standalone_pid=$!
wait_ready http://127.0.0.1:7900
"$bench" cluster --endpoint http://127.0.0.1:7900 --collection "$name" --load --base "$base" \
    --queries "$queries" --gt "$gt" --k 10 --concurrency 1,16,64 --max-queries "$max_queries" \
    --json "$out/standalone.json" | tee "$out/standalone.txt"
kill -TERM "$standalone_pid"; wait "$standalone_pid" || true; standalone_pid=""

echo "== local cluster (1 meta, 1 indexer, 2 searchers, 1 gateway, S3)"
QUIVER_BIN=$quiver HTTP_PORT=7950 CACHE_SIZE=4GiB "$repo/scripts/local-cluster.sh" start "$work/cluster"
"$bench" cluster --endpoint http://127.0.0.1:7950 --collection "$name" --load --base "$base" \
    --queries "$queries" --gt "$gt" --k 10 --concurrency 1,16,64 --max-queries "$max_queries" \
    --json "$out/cluster.json" | tee "$out/cluster.txt"
QUIVER_BIN=$quiver "$repo/scripts/local-cluster.sh" stop "$work/cluster"

echo "== engine alone (one segment; it prints the nprobe its calibration picks)"
"$bench" engine --base "$base" --queries "$queries" --gt "$gt" --metric cosine --k 10 \
    --nprobe "${ENGINE_NPROBE:-8,16,32,64,128,192,256}" --rescore 1 --threads 1 --max-queries "$max_queries" \
    --json "$out/engine.json" | tee "$out/engine.txt"
