#!/usr/bin/env bash
# Runs a real multi-process Quiver cluster on this machine: 1 meta, 1 indexer,
# N searchers and 1 gateway, each its own `quiver` process on loopback ports, over an
# object store (S3 by default: an S3-compatible server you point AWS_ENDPOINT_URL at,
# or a moto server this script starts).
#
#   scripts/local-cluster.sh start [DIR]     start (default DIR /tmp/quiver-cluster), print the endpoint
#   scripts/local-cluster.sh stop  [DIR]     SIGTERM every process, wait for them
#
# Environment: QUIVER_BIN (default: target/release/quiver), QUIVER_OBJECT_STORE
# (default s3://quiver-local/data; file:///abs/path also works), SEARCHERS (2),
# HTTP_PORT (7800), CACHE_SIZE (1GiB per searcher), AWS_* for S3. With no
# AWS_ENDPOINT_URL and an s3:// store, a moto server is started from
# QUIVER_MOTO_VENV (default /var/tmp/quiver-moto-venv, installed if missing).
set -euo pipefail

command="${1:-start}"
dir="${2:-/tmp/quiver-cluster}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${QUIVER_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/quiver}"
searchers="${SEARCHERS:-2}"
http_port="${HTTP_PORT:-7800}"
cache_size="${CACHE_SIZE:-1GiB}"
store="${QUIVER_OBJECT_STORE:-s3://quiver-local/data}"

stop() {
    [ -d "$dir/pids" ] || { echo "no cluster under $dir"; return 0; }
    # Gateway and data roles first, meta and the object store last.
    for name in gateway searcher-* indexer meta moto; do
        for file in "$dir"/pids/$name; do
            [ -f "$file" ] || continue
            kill -TERM "$(cat "$file")" 2>/dev/null || true
        done
        for file in "$dir"/pids/$name; do
            [ -f "$file" ] || continue
            pid="$(cat "$file")"
            for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$file"
        done
    done
    echo "stopped the cluster under $dir"
}

if [ "$command" = stop ]; then
    stop
    exit 0
fi
[ "$command" = start ] || { echo "usage: $0 start|stop [DIR]"; exit 2; }
[ -x "$bin" ] || { echo "no quiver binary at $bin (cargo build --release -p quiver, or set QUIVER_BIN)"; exit 1; }
mkdir -p "$dir/pids" "$dir/logs"
if ls "$dir"/pids/* >/dev/null 2>&1; then
    echo "a cluster seems to run under $dir already ($0 stop $dir)"
    exit 1
fi

spawn() { # name, args…
    local name="$1"
    shift
    "$@" >"$dir/logs/$name.log" 2>&1 &
    echo $! >"$dir/pids/$name"
}

wait_http() { # name, url
    for _ in $(seq 1 300); do
        if curl -fs -o /dev/null "$2"; then return 0; fi
        if ! kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; then
            echo "$1 exited:"; tail -20 "$dir/logs/$1.log"; stop; exit 1
        fi
        sleep 0.1
    done
    echo "$1 not ready at $2:"; tail -20 "$dir/logs/$1.log"; stop; exit 1
}

if [[ "$store" == s3://* ]] && [ -z "${AWS_ENDPOINT_URL:-}" ]; then
    venv="${QUIVER_MOTO_VENV:-/var/tmp/quiver-moto-venv}"
    if [ ! -x "$venv/bin/moto_server" ]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "moto[server]==5.2.5"
    fi
    moto_port=$((http_port + 90))
    spawn moto "$venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port"
    export AWS_ENDPOINT_URL="http://127.0.0.1:$moto_port"
    export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
    export AWS_REGION="${AWS_REGION:-us-east-1}" AWS_ALLOW_HTTP=true
    wait_http moto "$AWS_ENDPOINT_URL/"
fi
export RUST_LOG="${RUST_LOG:-info,openraft=warn}"

meta="127.0.0.1:$((http_port + 1))"
spawn meta "$bin" meta --node-id 1 --data-dir "$dir/meta" --listen "$meta" --peers "1=$meta" --init \
    --http-listen "127.0.0.1:$((http_port + 11))"
wait_http meta "http://127.0.0.1:$((http_port + 11))/readyz"

spawn indexer "$bin" indexer --meta "$meta" --object-store "$store" --listen "127.0.0.1:$((http_port + 2))" \
    --node-id indexer-1 --http-listen "127.0.0.1:$((http_port + 12))"
wait_http indexer "http://127.0.0.1:$((http_port + 12))/readyz"

for i in $(seq 1 "$searchers"); do
    spawn "searcher-$i" "$bin" searcher --meta "$meta" --object-store "$store" \
        --cache-dir "$dir/cache-$i" --cache-size "$cache_size" --listen "127.0.0.1:$((http_port + 20 + i))" \
        --node-id "searcher-$i" --http-listen "127.0.0.1:$((http_port + 40 + i))"
    wait_http "searcher-$i" "http://127.0.0.1:$((http_port + 40 + i))/healthz"
done

spawn gateway "$bin" gateway --meta "$meta" --http-listen "127.0.0.1:$http_port" \
    --grpc-listen "127.0.0.1:$((http_port + 3))"
wait_http gateway "http://127.0.0.1:$http_port/readyz"

echo "cluster up under $dir: REST http://127.0.0.1:$http_port, gRPC 127.0.0.1:$((http_port + 3)), object store $store"
echo "logs in $dir/logs; stop with: $0 stop $dir"
