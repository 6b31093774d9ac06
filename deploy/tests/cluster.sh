#!/usr/bin/env bash
# Containerised cluster test: the topology of deploy/docker-compose.yml (3 meta,
# 1 indexer, 2 searchers, 1 gateway; read-only root filesystems, the same flags) as
# podman containers on one podman network, with moto as the S3 server in a container
# made here (MinIO's image, which docker-compose.yml keeps for users, cannot be pulled
# without an image registry). Driven through the gateway's published port:
#   1. waits until every container's healthcheck (curl /readyz, as in compose) passes
#      and the cluster status shows 3 meta members with a leader, 1 indexer, 2 searchers;
#   2. creates a collection (2 shards, replication 2), waits until both searchers serve
#      every shard, upserts points with payloads, and checks that each point searched by
#      its own vector comes back first (strong consistency) and that a filter works;
#   3. kills a searcher container (SIGKILL) and checks that every search still succeeds
#      with the right answer, that meta marks the searcher dead, and that writes go on.
# Fails (non-zero, with every container's last log lines) on the first wrong answer;
# removes its containers, network and volumes either way.
#
#   deploy/tests/cluster.sh [IMAGE]      # default localhost/quiver:dev; builds it unless
#                                        # QUIVER_CLUSTER_SKIP_BUILD=1
#
# QUIVER_CT_SUBNET_PREFIX (default 10.78.0) is the /24 of the test network: indexers and
# searchers register their --listen address with meta, so they get fixed addresses
# (as in compose).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
image="${1:-localhost/quiver:dev}"
subnet_prefix="${QUIVER_CT_SUBNET_PREFIX:-10.78.0}"
moto_version=5.2.5
s3_image="localhost/quiver-test-s3:moto-$moto_version"
# shellcheck source=deploy/image/common.sh
source "$repo/deploy/image/common.sh"

started=$(date +%s)
if [[ "${QUIVER_CLUSTER_SKIP_BUILD:-0}" != 1 ]]; then
    "$repo/deploy/build-image.sh" "$image"
fi
quiver_podman_setup
podman image exists "$image" || quiver_die "image $image does not exist (build it with deploy/build-image.sh)"

# --- the S3 server's image: Debian + python3 from apt, moto from PyPI ------------------
quiver_debian_base localhost/quiver-base-python:"$QUIVER_DEBIAN_SUITE" minbase \
    "python3,python3-venv,ca-certificates" "" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    -- "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "ENV LANG=C.UTF-8"
build_volumes=()
[[ -f /etc/ssl/certs/ca-certificates.crt ]] \
    && build_volumes+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
quiver_log "building $s3_image"
podman build --quiet --pull=never --layers --file "$repo/deploy/tests/s3.Containerfile" \
    --build-arg "BASE_IMAGE=localhost/quiver-base-python:$QUIVER_DEBIAN_SUITE" \
    --build-arg "MOTO_VERSION=$moto_version" "${build_volumes[@]}" \
    --tag "$s3_image" "$repo/deploy/tests" >/dev/null
setup_seconds=$(( $(date +%s) - started ))

# --- the cluster ---------------------------------------------------------------------------
label="io.quiver.test=cluster"
network=quiver-cluster-test
remove_everything() {
    podman ps -a --filter "label=$label" --format '{{.Names}}' | xargs -r podman rm --force --volumes --time 0 >/dev/null || true
    podman network rm --force "$network" >/dev/null 2>&1 || true
    podman volume ls --filter "label=$label" --format '{{.Name}}' | xargs -r podman volume rm --force >/dev/null 2>&1 || true
}
dump_logs() {
    local name
    for name in $(podman ps -a --filter "label=$label" --format '{{.Names}}' | sort); do
        echo "--- $name ($(podman inspect --format '{{.State.Status}}' "$name")):" >&2
        podman logs --tail 25 "$name" 2>&1 | sed 's/^/  /' >&2 || true
    done
}
fail() {
    printf 'CLUSTER TEST FAILED: %s\n' "$*" >&2
    dump_logs
    exit 1
}
# Leftovers of an earlier run that was killed (the subnet would collide).
remove_everything
trap remove_everything EXIT

podman network create --label "$label" --subnet "$subnet_prefix.0/24" "$network" >/dev/null \
    || fail "cannot create network $network on $subnet_prefix.0/24 (set QUIVER_CT_SUBNET_PREFIX)"

s3_env=(--env AWS_ENDPOINT_URL=http://s3:9000 --env AWS_REGION=us-east-1
    --env AWS_ACCESS_KEY_ID=quiver --env AWS_SECRET_ACCESS_KEY=quiver-secret-key)
meta_list="meta1:7100,meta2:7100,meta3:7100"

# run_role NAME HTTP_PORT [podman run options…] -- quiver arguments…
run_role() {
    local name="$1" http_port="$2"
    shift 2
    local options=()
    while [[ "$1" != -- ]]; do options+=("$1"); shift; done
    shift
    # As in docker-compose.yml: read-only root, a tmpfs /tmp, the healthcheck curls /readyz.
    # The healthcheck runs when the test asks (`podman healthcheck run`), not on a timer.
    quiver_podman_quiet run --detach --name "quiver-ct-$name" --label "$label" \
        --network "$network" --network-alias "$name" --read-only --tmpfs /tmp \
        --health-cmd "[\"curl\", \"-fsS\", \"-o\", \"/dev/null\", \"http://127.0.0.1:$http_port/readyz\"]" \
        --health-interval disable --env RUST_LOG=info \
        "${options[@]}" "$image" "$@" --log-format text >/dev/null \
        || fail "podman run of $name failed"
}

# wait_healthy NAME… : until each container's healthcheck passes (at most 120 s).
wait_healthy() {
    local name deadline=$(( $(date +%s) + 120 ))
    for name in "$@"; do
        until podman healthcheck run "quiver-ct-$name" >/dev/null 2>&1; do
            [[ "$(podman inspect --format '{{.State.Running}}' "quiver-ct-$name")" == true ]] || fail "$name exited"
            [[ $(date +%s) -lt $deadline ]] || fail "$name not healthy after 120 s"
            sleep 1
        done
    done
}

quiver_log "starting the S3 server, 3 meta, 1 indexer, 2 searchers, 1 gateway"
cluster_started=$(date +%s)
# Every container gets a fixed address: an address left to the network's allocator can be
# one a later container asks for (the allocator goes on from where the last run stopped;
# a run had the third meta take the first searcher's .31).
quiver_podman_quiet run --detach --name quiver-ct-s3 --label "$label" --network "$network" --network-alias s3 \
    --ip "$subnet_prefix.10" "$s3_image" >/dev/null || fail "podman run of the S3 server failed"
for node in 1 2 3; do
    podman volume create --label "$label" "quiver-ct-meta$node-data" >/dev/null
    run_role "meta$node" 7101 --ip "$subnet_prefix.1$node" --volume "quiver-ct-meta$node-data:/data" -- \
        meta --node-id "$node" --data-dir /data --listen 0.0.0.0:7100 --advertise-address "meta$node:7100" \
        --peers "1=meta1:7100,2=meta2:7100,3=meta3:7100" --init --http-listen 0.0.0.0:7101
done
# The bucket (moto accepts any credentials), from inside the S3 container.
deadline=$(( $(date +%s) + 60 ))
until podman exec quiver-ct-s3 /opt/moto/bin/python -c \
    'import urllib.request as u; u.urlopen(u.Request("http://127.0.0.1:9000/quiver", method="PUT"), timeout=5)' 2>/dev/null; do
    [[ $(date +%s) -lt $deadline ]] || fail "cannot create the bucket in the S3 server"
    sleep 1
done
wait_healthy meta1 meta2 meta3

run_role indexer1 7201 --ip "$subnet_prefix.21" "${s3_env[@]}" -- \
    indexer --node-id indexer1 --meta "$meta_list" --object-store s3://quiver/quiver \
    --listen "$subnet_prefix.21:7200" --http-listen 0.0.0.0:7201
for node in 1 2; do
    podman volume create --label "$label" "quiver-ct-searcher$node-cache" >/dev/null
    run_role "searcher$node" 7301 --ip "$subnet_prefix.3$node" --volume "quiver-ct-searcher$node-cache:/cache" "${s3_env[@]}" -- \
        searcher --node-id "searcher$node" --meta "$meta_list" --object-store s3://quiver/quiver \
        --cache-dir /cache --cache-size 1GiB --listen "$subnet_prefix.3$node:7300" --http-listen 0.0.0.0:7301
done
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
run_role gateway 7700 --ip "$subnet_prefix.40" --publish "127.0.0.1:$port:7700" -- \
    gateway --meta "$meta_list" --http-listen 0.0.0.0:7700 --grpc-listen 0.0.0.0:7701
wait_healthy indexer1 searcher1 searcher2 gateway
echo "cluster healthy after $(( $(date +%s) - cluster_started ))s"

# --- driving it through the gateway ------------------------------------------------------
base="http://127.0.0.1:$port"
# A call may wait out the S3 server: moto (Python, in a container) has stalled for
# ~30 s on a 2-core CI machine (the indexer's PUTs timed out and were retried while
# the write waited), so the bound is 120 s — this test checks the wiring, not speed.
# A stall longer than the gateway's request timeout answers 504 DEADLINE_EXCEEDED
# (seen once: moto stopped answering the searcher that had to load a flush); that
# answer is retryable by contract, so it is retried once, and said so.
api() {
    local answer body=() attempt
    [[ $# -ge 3 ]] && body=(--data "$3")
    for attempt in 1 2; do
        if answer="$(curl -sS --max-time 120 --fail-with-body -X "$1" -H 'content-type: application/json' \
            "${body[@]}" "$base$2")"; then
            printf '%s' "$answer"
            return 0
        fi
        check "$answer" 'r["error"]["code"] == "DEADLINE_EXCEEDED"' && [[ $attempt == 1 ]] || break
        quiver_log "$1 $2 -> $answer; retrying once (a 504 is retryable)"
    done
    fail "$1 $2 -> ${answer:-no answer}"
}
# check JSON PYTHON_EXPRESSION DESCRIPTION: the expression over `r` (the parsed JSON) holds.
check() {
    python3 -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2" 2>/dev/null
}
expect() { check "$@" || fail "$3: got $1"; }
# eventually SECONDS PATH PYTHON_EXPRESSION DESCRIPTION: GET PATH until the expression holds.
eventually() {
    local deadline=$(( $(date +%s) + $1 )) answer
    while true; do
        answer="$(curl -sS --max-time 10 "$base$2" 2>/dev/null || true)"
        check "$answer" "$3" && return 0
        [[ $(date +%s) -lt $deadline ]] || fail "$4 (not within $1 s): last answer $answer"
        sleep 1
    done
}

status="$(api GET /admin/v1/cluster)"
expect "$status" 'len(r["meta"]["members"]) == 3 and r["meta"]["leader"] is not None' "3 meta members and a leader"
eventually 60 /admin/v1/cluster \
    'sorted(n["id"] for n in r["nodes"] if n["role"] in ("indexer", "searcher") and n["state"] == "alive") == ["indexer1", "searcher1", "searcher2"]' \
    "indexer1, searcher1 and searcher2 alive in the cluster status"

collection=cluster_test
dimension=16
points=400
api PUT "/v1/collections/$collection" \
    "{\"dimension\": $dimension, \"metric\": \"cosine\", \"shards\": 2, \"replication\": 2, \"payload_schema\": [{\"name\": \"group\", \"type\": \"keyword\"}]}" >/dev/null
eventually 120 "/admin/v1/collections/$collection/shards" \
    'len(r["shards"]) == 2 and all(sorted(s["id"] for s in shard["searchers"] if s["ready"]) == ["searcher1", "searcher2"] for shard in r["shards"])' \
    "both searchers ready on both shards"

# Deterministic vectors (seeded), written in batches of 100.
vectors_file="$(mktemp -t quiver-cluster-test.XXXXXX.json)"
trap 'rm -f "$vectors_file"; remove_everything' EXIT
python3 - "$points" "$dimension" > "$vectors_file" <<'PY'
import json, random, sys
count, dimension = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(16)
print(json.dumps([[rng.gauss(0, 1) for _ in range(dimension)] for _ in range(count)]))
PY
batch() {  # batch FIRST LAST -> the upsert body of points FIRST..LAST-1
    python3 -c 'import json, sys
vectors = json.load(open(sys.argv[1])); first, last = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps({"points": [{"id": i, "vector": vectors[i], "payload": {"group": "g%d" % (i % 4), "n": i}} for i in range(first, last)]}))' \
        "$vectors_file" "$1" "$2"
}
for first in $(seq 0 100 $(( points - 1 ))); do
    answer="$(api POST "/v1/collections/$collection/points" "$(batch "$first" $(( first + 100 )))")"
    expect "$answer" '"sequence" in r' "upsert of points $first.. answers with a sequence"
done
eventually 60 "/v1/collections/$collection" "r[\"points\"] == $points" "the collection counts $points points"

# search_own ID… : each point searched by its own vector comes back first, with its payload.
search_own() {
    local id body answer
    for id in "$@"; do
        body="$(python3 -c 'import json, sys
vectors = json.load(open(sys.argv[1]))
print(json.dumps({"vector": vectors[int(sys.argv[2])], "k": 5, "include_payload": True, "consistency": "strong"}))' "$vectors_file" "$id")"
        answer="$(api POST "/v1/collections/$collection/search" "$body")"
        expect "$answer" "r[\"hits\"][0][\"id\"] == $id and r[\"hits\"][0][\"score\"] > 0.999 and r[\"hits\"][0][\"payload\"][\"n\"] == $id and len(r[\"hits\"]) == 5" \
            "point $id searched by its own vector comes back first"
    done
}
sample_ids=(0 1 7 42 99 100 155 199 250 333 398 399)
search_own "${sample_ids[@]}"
body="$(python3 -c 'import json, sys
vectors = json.load(open(sys.argv[1]))
print(json.dumps({"vector": vectors[5], "k": 10, "filter": "group = \"g1\"", "include_payload": True, "consistency": "strong"}))' "$vectors_file")"
answer="$(api POST "/v1/collections/$collection/search" "$body")"
expect "$answer" 'r["hits"][0]["id"] == 5 and len(r["hits"]) == 10 and all(h["payload"]["group"] == "g1" for h in r["hits"])' \
    "a filtered search returns only its group, the query's own point first"
echo "loaded $points points; ${#sample_ids[@]} searches by own vector and a filtered search: ok"

quiver_log "killing searcher1 (SIGKILL)"
podman kill --signal KILL quiver-ct-searcher1 >/dev/null
search_own "${sample_ids[@]}"
echo "all ${#sample_ids[@]} searches right after the kill succeeded"
eventually 60 /admin/v1/cluster \
    '[n["state"] for n in r["nodes"] if n["id"] == "searcher1"] in (["dead"], [])' \
    "meta marks searcher1 dead"
answer="$(api POST "/v1/collections/$collection/points" "$(batch 0 1 | sed 's/"n": 0/"n": 0, "after": "kill"/')")"
expect "$answer" '"sequence" in r' "an upsert after the kill answers"
search_own "${sample_ids[@]}"
echo "searcher1 is dead; searches and writes go on with searcher2 alone"

echo "cluster test passed in $(( $(date +%s) - started ))s (image and S3 server setup ${setup_seconds}s)"
