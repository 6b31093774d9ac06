#!/usr/bin/env bash
# Data larger than the searcher's cache and memory, on the multi-process cluster
# over an S3 server, in one run:
#   1. scripts/local-cluster.sh starts meta, an indexer, ONE searcher and a gateway
#      over S3 (a moto server it starts, or AWS_ENDPOINT_URL); BASE is loaded with a
#      payload on every point and settles (flushes and merges done);
#   2. for each cache size (CACHE_PERCENTS of the collection's segment bytes,
#      default "100 25 5"), the searcher is restarted with an empty cache of that
#      size inside a memory cgroup of MEM_LIMIT bytes (page cache included), its
#      warm-up of the codes timed (MiB/s from its log), then searched cold (no
#      warm-up queries) and warm at concurrency 1, 16, 64 (quiver-bench cluster,
#      REST, strong reads, payloads returned): QPS, p50/p99, recall, errors, cache
#      hit ratio, bytes fetched per query, and every process's peak RSS.
#
#   crates/quiver-bench/scripts/beyond-ram-cluster.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR
#
# Environment: MEM_LIMIT (default 1 GiB), CACHE_PERCENTS, MAX_QUERIES (1000),
# QUIVER_BIN / QUIVER_BENCH (release builds), WORK_DIR (kept when given: a second
# run with the same WORK_DIR skips the load). Needs root (cgroup v1 memory
# controller at /sys/fs/cgroup/memory).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,20p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4
limit=${MEM_LIMIT:-1073741824}
percents=${CACHE_PERCENTS:-"100 25 5"}
source "$(dirname "$0")/common.sh"
name=beyond
port=7850
endpoint=http://127.0.0.1:$port
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${WORK_DIR:-$(mktemp -d -t quiver-beyond-cluster.XXXXXX)}
mkdir -p "$work"
cluster_dir=$work/cluster
cgroup=/sys/fs/cgroup/memory/quiver-beyond-cluster
cluster_script="$repo/scripts/local-cluster.sh"
cleanup() {
    QUIVER_BIN="$quiver" "$cluster_script" stop "$cluster_dir" >/dev/null 2>&1 || true
    [ -d "$cgroup" ] && rmdir "$cgroup" 2>/dev/null
    [ -z "${WORK_DIR:-}" ] && rm -rf "$work"
}
trap cleanup EXIT

echo "== 1. cluster over S3, load with payloads, settle"
# The searcher first starts with a cache larger than the data: the load is not
# what is measured here.
QUIVER_BIN="$quiver" SEARCHERS=1 HTTP_PORT=$port CACHE_SIZE=4GiB "$cluster_script" start "$cluster_dir"
pids() { cat "$cluster_dir/pids/$1"; }
if ! curl -fs -o /dev/null "$endpoint/v1/collections/$name"; then
    started=$SECONDS
    "$bench" cluster --endpoint "$endpoint" --collection "$name" --load --base "$base" \
        --load-payloads --include-payload --settle-seconds 60 --queries "$queries" --gt "$gt" \
        --indexer-metrics "http://127.0.0.1:$((port + 12))/metrics" \
        --k 10 --concurrency 1 --max-queries 200 --json "$out/load.json" | tee "$out/load.txt"
    echo "load + settle + 200 queries: $((SECONDS - started)) s" | tee -a "$out/load.txt"
fi
segment_bytes=$(curl -fs "$endpoint/v1/collections/$name" | python3 -c 'import json, sys; print(json.load(sys.stdin)["bytes"])')
echo "segment bytes: $segment_bytes" | tee "$out/segments.txt"

# The searcher's command line, as local-cluster.sh starts it, with another cache size.
meta="127.0.0.1:$((port + 1))"
searcher_http="127.0.0.1:$((port + 41))"
store="${QUIVER_OBJECT_STORE:-s3://quiver-local/data}"
export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-http://127.0.0.1:$((port + 90))}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_REGION="${AWS_REGION:-us-east-1}" AWS_ALLOW_HTTP=true
export RUST_LOG="${RUST_LOG:-info,openraft=warn}"

peak_rss() { # pid → "VmHWM kB RssAnon kB"
    awk '/VmHWM/ {h=$2} /RssAnon/ {a=$2} END {print h, a}' "/proc/$1/status"
}

mkdir -p "$cgroup"
for percent in $percents; do
    cache_bytes=$((segment_bytes * percent / 100))
    echo "== 2. cache at $percent % of the segment bytes ($((cache_bytes >> 20)) MiB), searcher in a $((limit >> 20)) MiB memory cgroup"
    old=$(pids searcher-1)
    kill -TERM "$old"
    for _ in $(seq 1 300); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
    rm -rf "$cluster_dir/cache-1"
    echo "$limit" >"$cgroup/memory.limit_in_bytes"
    echo 0 >"$cgroup/memory.max_usage_in_bytes" 2>/dev/null || true
    sync
    echo 3 >/proc/sys/vm/drop_caches
    log="$cluster_dir/logs/searcher-1-$percent.log"
    sh -c "echo \$\$ > $cgroup/cgroup.procs; exec \"$quiver\" searcher --meta $meta --object-store $store \
        --cache-dir \"$cluster_dir/cache-1\" --cache-size $cache_bytes --listen 127.0.0.1:$((port + 21)) \
        --node-id searcher-1 --http-listen $searcher_http" >"$log" 2>&1 &
    echo $! >"$cluster_dir/pids/searcher-1"
    searcher=$(pids searcher-1)
    started=$SECONDS
    for _ in $(seq 1 3000); do curl -fs -o /dev/null "http://$searcher_http/readyz" && break; sleep 0.1; done
    curl -fs -o /dev/null "http://$searcher_http/readyz" || { echo "searcher not ready:"; tail -20 "$log"; exit 1; }
    echo "searcher ready after $((SECONDS - started)) s" | tee "$out/cache-$percent-warm-up.txt"
    grep "warm-up fetched" "$log" | sed 's/\x1b\[[0-9;]*m//g' | tee -a "$out/cache-$percent-warm-up.txt" || true
    gateway=$(pids gateway)
    for pass in cold warm; do
        extra=()
        [ "$pass" = cold ] && extra=(--no-warm-up)
        "$bench" cluster --endpoint "$endpoint" --collection "$name" --queries "$queries" --gt "$gt" \
            --k 10 --concurrency 1,16,64 --max-queries "$max_queries" --include-payload \
            --server-pid "$gateway,$searcher" "${extra[@]}" \
            --json "$out/cache-$percent-$pass.json" | tee "$out/cache-$percent-$pass.txt"
    done
    {
        echo "peak RSS / RssAnon (kB): searcher $(peak_rss "$searcher"), gateway $(peak_rss "$gateway"), indexer $(peak_rss "$(pids indexer)"), meta $(peak_rss "$(pids meta)")"
        echo "searcher cgroup peak usage: $(($(cat "$cgroup/memory.max_usage_in_bytes") >> 20)) MiB of $((limit >> 20)) MiB, OOM kills: $(awk '/oom_kill / {print $2}' "$cgroup/memory.oom_control")"
        echo "errors logged by the searcher: $(grep -c ' ERROR ' "$log" || true)"
    } | tee "$out/cache-$percent-memory.txt"
done
echo "== done: $out"
