# Shared by the benchmark scripts here (sourced, not run): where the binaries
# are, and waiting for a server to be ready.
#   QUIVER_BIN, QUIVER_BENCH: the binaries (default: the release builds of
#   CARGO_TARGET_DIR or the repository's target/); MAX_QUERIES (1000).
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
bench=${QUIVER_BENCH:-$target/release/quiver-bench}
quiver=${QUIVER_BIN:-$target/release/quiver}
max_queries=${MAX_QUERIES:-1000}

# wait_ready URL [TENTHS]: waits until URL/readyz answers (default 60 s).
wait_ready() {
    for _ in $(seq 1 "${2:-600}"); do curl -fs -o /dev/null "$1/readyz" && return 0; sleep 0.1; done
    echo "$1 not ready"; exit 1
}
