#!/usr/bin/env bash
# Side by side in one run: the peers (shared/bench/run_peers.py: faiss IVF-RaBitQ +
# refine, faiss IVF-PQ fast scan + refine, faiss HNSW, hnswlib) and quiver-bench
# engine, on the same files, one after the other, single-thread QPS.
#
#   crates/quiver-bench/scripts/compare-peers.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR [engine args…]
#
# Needs the peers' venv (PEERS_PYTHON, default /var/tmp/peers/bin/python; see
# shared/bench/README.md) and a release build of quiver-bench.
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,10p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
harness=${HARNESS:-$repo/../shared/bench/run_peers.py}
python=${PEERS_PYTHON:-/var/tmp/peers/bin/python}
bench=${QUIVER_BENCH:-${CARGO_TARGET_DIR:-$repo/target}/release/quiver-bench}
mkdir -p "$out"

"$python" "$harness" --base "$base" --queries "$queries" --gt "$gt" --max-queries 1000 \
    --profile cheap --systems rabitq1+refine,ivfpqfs+refine,hnsw,hnswlib \
    --nprobes 8,16,32,64,128,192,256,384,512 --k-factors 4,16 --efs 32,64,128,256,384 \
    --out "$out/peers.json" | tee "$out/peers.txt"

"$bench" engine --base "$base" --queries "$queries" --gt "$gt" --metric cosine --k 10 \
    --max-queries 1000 --peers "$out/peers.json" --json "$out/quiver.json" "$@" | tee "$out/quiver.txt"
