#!/usr/bin/env bash
# clswap.sh BINDIR : restart the cluster under /var/tmp/s51/clf on the same data with BINDIR's quiver, wait until it serves
CL=/var/tmp/s51/clf
QUIVER_BIN=$1/quiver /work/main/scripts/local-cluster.sh stop $CL > /dev/null 2>&1
sleep 1
QUIVER_OBJECT_STORE=file:///var/tmp/s51/clf-store QUIVER_BIN=$1/quiver HTTP_PORT=7950 /work/main/scripts/local-cluster.sh start $CL > /dev/null || exit 1
(cd $CL/pids && cat gateway searcher-* indexer meta | paste -sd, -) > /var/tmp/s51/cl.pids
for i in $(seq 60); do $1/quiver-bench cluster --endpoint http://127.0.0.1:7950 --collection served --queries /var/tmp/real/queries.fvecs --gt /var/tmp/real/gt100k.ivecs --include-payload --concurrency 4 --max-queries 3000 --json /tmp/warm.json > /tmp/warm.log 2>&1 && break; sleep 1; done
grep -E "^ +4 " /tmp/warm.log
