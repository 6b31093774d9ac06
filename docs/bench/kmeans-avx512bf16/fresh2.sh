#!/usr/bin/env bash
# fresh2.sh BINDIR LABEL BASE QUERIES GT: load, then every 3 s: 200 queries c=16 + the shard's segments (rows, codebook)
B=$1; L=$2; BASE=$3; Q=$4; GT=$5
d=/var/tmp/s50/f2-$L; rm -rf $d; mkdir -p $d
$B/quiver standalone --data-dir $d/data --http-listen 127.0.0.1:7960 --grpc-listen 127.0.0.1:7961 > $d/sa.log 2>&1 &
pid=$!
for i in $(seq 50); do curl -sf http://127.0.0.1:7960/readyz >/dev/null && break; sleep 0.2; done
common="--endpoint http://127.0.0.1:7960 --collection served --metric ${METRIC:-cosine} --queries $Q --gt $GT --k 10 --include-payload --server-pid $pid"
$B/quiver-bench cluster $common --concurrency 1 --max-queries 200 --load --load-payloads --base $BASE --settle-seconds 0 --json $d/a.json 2>&1 | grep -E '^ +[0-9]+ |loaded' | sed "s/^/$L t=0 /"
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt ${SECS:-120} ]; do
  t=$(( $(date +%s) - start ))
  $B/quiver-bench cluster $common --concurrency 16 --max-queries 300 --json $d/b.json 2>&1 | grep -E '^ +16 ' | sed "s/^/$L t=$t /"
  curl -s http://127.0.0.1:7960/admin/v1/collections/served/shards > $d/shards-$t.json
  sleep 3
done
kill $pid; wait $pid 2>/dev/null
