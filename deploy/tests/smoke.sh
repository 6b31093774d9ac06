#!/usr/bin/env bash
# Smoke test of the container image, run by CI (.ci/run):
#   1. builds it with deploy/build-image.sh (podman, base images made from Debian
#      packages; skipped with QUIVER_SMOKE_SKIP_BUILD=1);
#   2. checks what it is: entrypoint quiver, user 10001, OCI labels, no shell, the
#      three binaries run, size within QUIVER_IMAGE_MAX_MB (default 120);
#   3. runs `quiver standalone` on a named volume, creates a collection, upserts points
#      with payloads and searches them over REST (curl), filtered and not, checks the
#      process runs as uid 10001 and that the image's HEALTHCHECK passes;
#   4. replaces the container by a new one on the same volume and checks the points
#      are still there and searchable, and that new writes work.
# Fails (non-zero, with the container's log) on the first wrong answer; removes its
# containers and volume either way.
#
#   deploy/tests/smoke.sh [IMAGE]      # default localhost/quiver:dev
#
# QUIVER_CARGO_PROFILE is passed on to build-image.sh (CI uses image-ci).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
image="${1:-localhost/quiver:dev}"
max_mb="${QUIVER_IMAGE_MAX_MB:-120}"
# shellcheck source=deploy/image/common.sh
source "$repo/deploy/image/common.sh"

started=$(date +%s)
if [[ "${QUIVER_SMOKE_SKIP_BUILD:-0}" != 1 ]]; then
    "$repo/deploy/build-image.sh" "$image"
fi
build_seconds=$(( $(date +%s) - started ))
quiver_podman_setup
podman image exists "$image" || quiver_die "image $image does not exist (build it with deploy/build-image.sh)"

run_id="quiver-smoke-$$"
volume="$run_id-data"
container=""
fail() {
    printf 'SMOKE TEST FAILED: %s\n' "$*" >&2
    if [[ -n "$container" ]]; then
        echo "--- last lines of $container's log:" >&2
        podman logs --tail 60 "$container" >&2 || true
    fi
    exit 1
}
cleanup() {
    podman ps -a --filter "label=io.quiver.test=$run_id" --format '{{.Names}}' \
        | xargs -r podman rm --force --volumes --time 0 >/dev/null 2>&1 || true
    podman volume rm --force "$volume" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# --- the image itself ----------------------------------------------------------------
inspect() { podman image inspect --format "$1" "$image"; }
size_bytes="$(inspect '{{.Size}}')"
size_mb=$(( (size_bytes + 999999) / 1000000 ))
echo "image $image: $size_mb MB ($size_bytes bytes, uncompressed), built in ${build_seconds}s"
[[ $size_mb -le $max_mb ]] || fail "the image is $size_mb MB, over the $max_mb MB target"
[[ "$(inspect '{{json .Config.Entrypoint}}')" == '["quiver"]' ]] || fail "entrypoint is $(inspect '{{json .Config.Entrypoint}}'), not [\"quiver\"]"
[[ "$(inspect '{{.Config.User}}')" == 10001:10001 ]] || fail "image user is '$(inspect '{{.Config.User}}')', not 10001:10001"
for label in title source licenses version revision created; do
    value="$(inspect "{{index .Labels \"org.opencontainers.image.$label\"}}")"
    [[ -n "$value" && "$value" != "<no value>" ]] || fail "label org.opencontainers.image.$label is missing"
done
echo "labels: version $(inspect '{{index .Labels "org.opencontainers.image.version"}}'), revision $(inspect '{{index .Labels "org.opencontainers.image.revision"}}')"
healthcheck="$(podman inspect --type image --format '{{json .Config.Healthcheck}}' "$image" 2>/dev/null || true)"
[[ "$healthcheck" == *readyz* ]] || fail "the image has no HEALTHCHECK (podman keeps it only with --format docker): $healthcheck"
for binary in quiver quiverctl quiver-bench; do
    podman run --rm --no-healthcheck --label "io.quiver.test=$run_id" --entrypoint "$binary" "$image" --version >/dev/null \
        || fail "$binary --version does not run in the image"
done
if [[ "${QUIVER_SMOKE_ALLOW_SHELL:-0}" != 1 ]]; then
    if podman run --rm --no-healthcheck --label "io.quiver.test=$run_id" --entrypoint /bin/sh "$image" -c true >/dev/null 2>&1; then
        fail "the image has a shell (/bin/sh); set QUIVER_SMOKE_ALLOW_SHELL=1 for a base image that has one"
    fi
    echo "no shell in the image"
fi

# --- a standalone on a volume ----------------------------------------------------------
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:$port"
podman volume create --label "io.quiver.test=$run_id" "$volume" >/dev/null

start_standalone() {
    container="$run_id-$1"
    # The HEALTHCHECK runs when the test asks (`podman healthcheck run`), not on a
    # timer: podman's timers need systemd, which CI machines may not run.
    quiver_podman_quiet run --detach --name "$container" --label "io.quiver.test=$run_id" --health-interval disable \
        --publish "127.0.0.1:$port:7700" --volume "$volume:/data" \
        "$image" standalone --data-dir /data --http-listen 0.0.0.0:7700 --log-format text >/dev/null \
        || fail "podman run failed"
    local deadline=$(( $(date +%s) + 90 ))
    until curl -fsS -o /dev/null "$base/readyz" 2>/dev/null; do
        [[ "$(podman inspect --format '{{.State.Running}}' "$container")" == true ]] || fail "$container exited"
        [[ $(date +%s) -lt $deadline ]] || fail "$container not ready after 90 s"
        sleep 0.5
    done
}

# api METHOD PATH [BODY] -> prints the JSON answer; fails on an HTTP error.
api() {
    local answer body=()
    [[ $# -ge 3 ]] && body=(--data "$3")
    answer="$(curl -sS --fail-with-body -X "$1" -H 'content-type: application/json' \
        "${body[@]}" "$base$2")" || fail "$1 $2 -> $answer"
    printf '%s' "$answer"
}
# expect JSON PYTHON_EXPRESSION DESCRIPTION: the expression, over `r` (the parsed JSON), must be true.
expect() {
    python3 -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2" \
        || fail "$3: got $1"
}

check_user() {
    local pid uid
    pid="$(podman inspect --format '{{.State.Pid}}' "$container")"
    uid="$(awk '/^Uid:/ {print $2 ":" $3 ":" $4 ":" $5}' "/proc/$pid/status")"
    [[ "$uid" == 10001:10001:10001:10001 ]] || fail "quiver runs as uid $uid (real:effective:saved:fs), not 10001"
    podman top "$container" user huser args | sed 's/^/  /'
}

check_points() {
    local search
    search="$(api POST /v1/collections/smoke/search '{"vector": [1, 0.1, 0, 0], "k": 3, "include_payload": true, "consistency": "strong"}')"
    expect "$search" 'r["hits"][0]["id"] == 1 and r["hits"][0]["payload"]["lang"] == "en" and len(r["hits"]) == 3' \
        "search: point 1 (lang en) first of 3"
    search="$(api POST /v1/collections/smoke/search '{"vector": [1, 0, 0, 0], "k": 10, "filter": "lang = \"de\"", "include_payload": true, "consistency": "strong"}')"
    expect "$search" '[h["id"] for h in r["hits"]] == [2] and r["hits"][0]["payload"]["title"] == "zwei"' \
        "filtered search: only point 2 (lang de)"
    local got
    got="$(api POST /v1/collections/smoke/points/get '{"ids": [3]}')"
    expect "$got" '[p["id"] for p in r["points"]] == [3] and r["points"][0]["payload"]["title"] == "three"' "get: point 3 with its payload"
}

echo "== first container"
start_standalone first
check_user
podman healthcheck run "$container" >/dev/null || fail "the image's HEALTHCHECK fails on a ready standalone"
echo "HEALTHCHECK passes"
api PUT /v1/collections/smoke '{"dimension": 4, "metric": "cosine", "payload_schema": [{"name": "lang", "type": "keyword"}]}' >/dev/null
upsert="$(api POST /v1/collections/smoke/points '{"points": [
    {"id": 1, "vector": [1, 0, 0, 0], "payload": {"lang": "en", "title": "one"}},
    {"id": 2, "vector": [0, 1, 0, 0], "payload": {"lang": "de", "title": "zwei"}},
    {"id": 3, "vector": [0, 0, 1, 0], "payload": {"lang": "en", "title": "three"}}]}')"
expect "$upsert" '"sequence" in r' "upsert answers with a sequence"
check_points
podman exec "$container" quiverctl collections list | grep -q smoke || fail "quiverctl in the container does not list the collection"
echo "upsert, search, filtered search, get, quiverctl: ok"
quiver_podman_quiet stop --time 30 "$container" >/dev/null
quiver_podman_quiet rm --volumes "$container" >/dev/null

echo "== second container on the same volume"
start_standalone second
check_user
described="$(api GET /v1/collections/smoke)"
expect "$described" 'r["points"] == 3' "the collection has its 3 points after the restart"
check_points
api POST /v1/collections/smoke/points '{"points": [{"id": 4, "vector": [0, 0, 0, 1], "payload": {"lang": "fr", "title": "quatre"}}]}' >/dev/null
search="$(api POST /v1/collections/smoke/search '{"vector": [0, 0, 0.1, 1], "k": 1, "consistency": "strong"}')"
expect "$search" 'r["hits"][0]["id"] == 4' "a point written after the restart is found"
echo "data survived the restart; writes after it work"

echo "smoke test passed: image $image, $size_mb MB, $(( $(date +%s) - started ))s in all"
