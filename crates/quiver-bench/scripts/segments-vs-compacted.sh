#!/usr/bin/env bash
# Search cost against segment count, in one run: `quiver standalone` (defaults)
# loads BASE with a payload on every point and settles at the segment count a
# plain load leaves ("natural"); it is searched at concurrency 1 and 16 (REST,
# strong reads, payloads returned, server CPU per query); then `quiverctl compact`
# merges the shard into one segment and the same queries run again. Prints QPS
# and CPU of the natural layout as a share of the compacted one's.
#
#   crates/quiver-bench/scripts/segments-vs-compacted.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR
#
# Environment: QUIVER_BIN, QUIVER_BENCH, QUIVERCTL (release builds), MAX_QUERIES
# (1000), WORK_DIR (the standalone's data; a temporary directory by default).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,13p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4
source "$(dirname "$0")/common.sh"
quiverctl=${QUIVERCTL:-$(dirname "$quiver")/quiverctl}
name=layout
port=7970
endpoint=http://127.0.0.1:$port
mkdir -p "$out"
work=${WORK_DIR:-$(mktemp -d -t quiver-layout.XXXXXX)}
mkdir -p "$work"
pid=""
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    [ -z "${WORK_DIR:-}" ] && rm -rf "$work"
}
trap cleanup EXIT

"$quiver" standalone --data-dir "$work/standalone" --http-listen 127.0.0.1:$port \
    --grpc-listen 127.0.0.1:$((port + 1)) >"$work/standalone.log" 2>&1 &
pid=$!
wait_ready "$endpoint" 1200

echo "== 1. load (payloads), settle, search: the natural layout"
"$bench" cluster --endpoint "$endpoint" --collection "$name" --load --base "$base" \
    --load-payloads --settle-seconds 60 --queries "$queries" --gt "$gt" --k 10 \
    --concurrency 1,16 --max-queries "$max_queries" --include-payload --server-pid "$pid" \
    --json "$out/natural.json" | tee "$out/natural.txt"

echo "== 2. quiverctl compact, then the same searches on one segment"
"$quiverctl" --endpoint "$endpoint" compact "$name" | tee "$out/compact.txt"
started=$SECONDS
while true; do
    segments=$(curl -fs "$endpoint/v1/collections/$name" | python3 -c 'import json, sys; print(json.load(sys.stdin)["segments"])')
    [ "$segments" = 1 ] && break
    if [ $((SECONDS - started)) -gt 3600 ]; then echo "still $segments segments after an hour"; exit 1; fi
    sleep 5
done
echo "compacted to 1 segment in $((SECONDS - started)) s" | tee -a "$out/compact.txt"
"$bench" cluster --endpoint "$endpoint" --collection "$name" --queries "$queries" --gt "$gt" \
    --k 10 --concurrency 1,16 --max-queries "$max_queries" --include-payload --server-pid "$pid" \
    --json "$out/compacted.json" | tee "$out/compacted.txt"

python3 - "$out/natural.json" "$out/compacted.json" <<'EOF' | tee "$out/summary.txt"
import json, sys
natural, compacted = (json.load(open(path)) for path in sys.argv[1:3])
print(f"{'concurrency':>11} {'recall n/c':>15} {'QPS n/c':>15} {'QPS share':>9} {'CPU ms/q n/c':>15} {'scanned n/c':>17}")
for n, c in zip(natural["points"], compacted["points"]):
    print(f"{n['concurrency']:>11} {n['recall']:.4f}/{c['recall']:.4f} {n['qps']:>7.0f}/{c['qps']:<7.0f} "
          f"{n['qps'] / c['qps']:>8.0%} {n['server_cpu_ms_per_query']:>7.3f}/{c['server_cpu_ms_per_query']:<7.3f} "
          f"{n['rows_scanned']:>8.0f}/{c['rows_scanned']:<8.0f}")
EOF
