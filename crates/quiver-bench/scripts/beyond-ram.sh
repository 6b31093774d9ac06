#!/usr/bin/env bash
# Data larger than memory, in one run, with default settings:
#   1. `quiver standalone` loads BASE (a payload on every point) and settles (flushes and
#      merges done); its anonymous memory (RssAnon) and the disk's free space are
#      sampled every second, the peaks reported, and the data directory's size;
#   2. it is restarted inside a memory cgroup of MEM_LIMIT bytes (page cache
#      included: the data does not fit), the page cache dropped, and searched
#      cold then warm at concurrency 1, 16, 64 (quiver-bench cluster, REST,
#      strong reads, payloads returned).
#
#   crates/quiver-bench/scripts/beyond-ram.sh BASE.fvecs QUERIES.fvecs GT.ivecs OUT_DIR [MEM_LIMIT]
#
# MEM_LIMIT defaults to 1 GiB. Needs root (cgroup v1 memory controller at
# /sys/fs/cgroup/memory, /proc/sys/vm/drop_caches) and release builds of quiver
# and quiver-bench (cargo build --release -p quiver -p quiver-bench).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
base=$1 queries=$2 gt=$3 out=$4 limit=${5:-1073741824}
source "$(dirname "$0")/common.sh"
name=beyond
port=7960
endpoint=http://127.0.0.1:$port
mkdir -p "$out"
work=${WORK_DIR:-$(mktemp -d -t quiver-beyond-ram.XXXXXX)}
mkdir -p "$work"
cgroup=/sys/fs/cgroup/memory/quiver-beyond-ram
pid=""
sampler=""
cleanup() {
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    [ -d "$cgroup" ] && rmdir "$cgroup" 2>/dev/null
    [ -z "${WORK_DIR:-}" ] && rm -rf "$work"
}
trap cleanup EXIT

# Samples RssAnon and RssFile (kB) of $1 and the free space (MiB) of the work
# directory's filesystem every second into $2 (the free space also counts the
# builds' unnamed scratch files, which no `du` sees).
sample_memory() {
    echo -e "seconds\trss_anon_kb\trss_file_kb\tfree_disk_mib" >"$2"
    local start=$SECONDS free
    while kill -0 "$1" 2>/dev/null; do
        free=$(df -Pm "$work" | awk 'NR == 2 {print $4}')
        awk -v t=$((SECONDS - start)) -v free="$free" '/RssAnon/ {a=$2} /RssFile/ {f=$2} END {print t "\t" a "\t" f "\t" free}' \
            "/proc/$1/status" >>"$2" 2>/dev/null || true
        sleep 1
    done
}

echo "== 1. load with default settings, memory sampled"
if [ ! -d "$work/standalone" ]; then
    "$quiver" standalone --data-dir "$work/standalone" --http-listen 127.0.0.1:$port \
        --grpc-listen 127.0.0.1:$((port + 1)) >"$work/load.log" 2>&1 &
    pid=$!
    sample_memory "$pid" "$out/load-memory.tsv" &
    sampler=$!
    wait_ready "$endpoint" 1200
    started=$SECONDS
    # Loads (a payload on every point), waits until flushes and merges are done
    # (segment count unchanged for a minute), then a short settled search.
    "$bench" cluster --endpoint "$endpoint" --collection "$name" --load --base "$base" \
        --load-payloads --include-payload --settle-seconds 60 --queries "$queries" --gt "$gt" \
        --k 10 --concurrency 1 --max-queries 200 --json "$out/load.json" | tee "$out/load.txt"
    echo "load + settle + 200 queries: $((SECONDS - started)) s" | tee -a "$out/load.txt"
    kill -TERM "$pid"; wait "$pid" || true; pid=""
    wait "$sampler" 2>/dev/null || true; sampler=""
    awk 'NR > 1 && $2 > peak {peak = $2} END {printf "peak RssAnon while loading and merging: %.0f MiB\n", peak / 1024}' \
        "$out/load-memory.tsv" | tee "$out/load-memory.txt"
    # Disk taken at the peak: free space at the start less its lowest (anything
    # else writing to that disk meanwhile counts too).
    awk 'NR == 2 {first = $4; low = $4} NR > 1 && $4 < low {low = $4} END {printf "peak disk used while loading and merging: %.1f GiB\n", (first - low) / 1024}' \
        "$out/load-memory.tsv" | tee -a "$out/load-memory.txt"
fi
du -sh "$work/standalone" | tee -a "$out/load-memory.txt"

echo "== 2. searched inside a $((limit >> 20)) MiB memory cgroup (page cache included)"
mkdir -p "$cgroup"
echo "$limit" >"$cgroup/memory.limit_in_bytes"
sync
echo 3 >/proc/sys/vm/drop_caches
sh -c "echo \$\$ > $cgroup/cgroup.procs; exec \"$quiver\" standalone --data-dir \"$work/standalone\" \
    --http-listen 127.0.0.1:$port --grpc-listen 127.0.0.1:$((port + 1))" >"$work/search.log" 2>&1 &
pid=$!
sample_memory "$pid" "$out/search-memory.tsv" &
sampler=$!
wait_ready "$endpoint" 1200
for pass in cold warm; do
    "$bench" cluster --endpoint "$endpoint" --collection "$name" --queries "$queries" --gt "$gt" \
        --k 10 --concurrency 1,16,64 --max-queries "$max_queries" --include-payload --server-pid "$pid" \
        --json "$out/standalone-$pass.json" | tee "$out/standalone-$pass.txt"
done
echo "cgroup peak usage: $(( $(cat "$cgroup/memory.max_usage_in_bytes") >> 20 )) MiB, OOM kills: $(grep -c . "$cgroup/memory.oom_control" >/dev/null && awk '/oom_kill / {print $2}' "$cgroup/memory.oom_control")" \
    | tee "$out/search-memory.txt"
kill -TERM "$pid"; wait "$pid" || true; pid=""
echo "== done: $out"
