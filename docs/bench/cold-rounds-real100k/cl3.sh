#!/usr/bin/env bash
# cl3.sh start|swap BINDIR : a cluster over s3s-fs (:8014, or STORE), one searcher with a
# CACHE (48MiB) cache, gateway :7970. NAME (cl3) names its directory and pid file under
# /var/tmp/s52, PREFIX (data) its prefix in the bucket, COLLECTION (served) the collection;
# QUIVER_CONFIG, when set, is every role's configuration file (noconsol.toml: no
# consolidation, so the shard keeps the segments the tiered merges leave).
NAME=${NAME:-cl3}
CL=/var/tmp/s52/$NAME
COLLECTION=${COLLECTION:-served}
export AWS_ENDPOINT_URL=${STORE:-http://127.0.0.1:8014} AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
QUIVER_BIN=$2/quiver /work/main/scripts/local-cluster.sh stop $CL > /dev/null 2>&1
sleep 1
[ "$1" = start ] && rm -rf $CL
QUIVER_OBJECT_STORE=s3://quiver-local/${PREFIX:-data} QUIVER_BIN=$2/quiver HTTP_PORT=7970 SEARCHERS=1 CACHE_SIZE=${CACHE:-48MiB} /work/main/scripts/local-cluster.sh start $CL > /dev/null || exit 1
(cd $CL/pids && cat gateway searcher-* indexer meta | paste -sd, -) > /var/tmp/s52/$NAME.pids
R=/var/tmp/real
if [ "$1" = start ]; then
  $2/quiver-bench cluster --endpoint http://127.0.0.1:7970 --collection $COLLECTION --queries $R/queries.fvecs --gt $R/gt100k.ivecs --load --load-payloads --base $R/base100k.fvecs --settle-seconds 30 --include-payload --concurrency 4 --max-queries 1000 --json /tmp/cl3-load.json 2>&1 | tail -3
else
  for i in $(seq 60); do $2/quiver-bench cluster --endpoint http://127.0.0.1:7970 --collection $COLLECTION --queries $R/queries.fvecs --gt $R/gt100k.ivecs --include-payload --concurrency 1 --max-queries 20 --json /tmp/warm.json > /tmp/warm.log 2>&1 && break; sleep 1; done
fi
