#!/usr/bin/env bash
# clstart.sh BINDIR : a fresh file-store cluster under /var/tmp/s51/clf (gateway on 7950), real 100k loaded with payloads, settled
CL=/var/tmp/s51/clf
QUIVER_BIN=$1/quiver /work/main/scripts/local-cluster.sh stop $CL > /dev/null 2>&1
rm -rf $CL /var/tmp/s51/clf-store
QUIVER_OBJECT_STORE=file:///var/tmp/s51/clf-store QUIVER_BIN=$1/quiver HTTP_PORT=7950 /work/main/scripts/local-cluster.sh start $CL || exit 1
(cd $CL/pids && cat gateway searcher-* indexer meta | paste -sd, -) > /var/tmp/s51/cl.pids
$1/quiver-bench cluster --endpoint http://127.0.0.1:7950 --collection served --queries /var/tmp/real/queries.fvecs --gt /var/tmp/real/gt100k.ivecs --load --load-payloads --base /var/tmp/real/base100k.fvecs --settle-seconds 30 --include-payload --concurrency 16 --max-queries 2000 --json /var/tmp/s51/cl-load.json 2>&1 | tail -3
