#!/usr/bin/env bash
# ab3.sh LABEL BINDIR : restarts cl3.sh's cluster (same environment: STORE, CACHE, NAME,
# PREFIX, COLLECTION, QUIVER_CONFIG) with BINDIR's quiver, then NQ (2000) queries at
# c = 1 and c = 16 (or CONC), payloads returned; writes /var/tmp/s52/ab3-LABEL.json; then
# prints the gateway's joined searches and the searcher's evictions and pool calls.
cd /var/tmp/s52; ./cl3.sh swap $2
R=/var/tmp/real
$2/quiver-bench cluster --endpoint http://127.0.0.1:7970 --collection ${COLLECTION:-served} --queries $R/queries.fvecs --gt $R/gt100k.ivecs --include-payload --concurrency ${CONC:-1,16} --max-queries ${NQ:-2000} --server-pid $(cat ${NAME:-cl3}.pids) --json /var/tmp/s52/ab3-$1.json 2>&1 | grep -E "^ +[0-9]+ +0\." | sed "s/^/$1 /"
curl -s http://127.0.0.1:7970/metrics | grep -E "^quiver_gateway_(searches_joined|joined_batches)_total" | sed "s/^/$1 /"
curl -s http://127.0.0.1:8011/metrics | grep -E "^quiver_cache_((awaited_)?evictions|fetch_ahead_left)_total|^quiver_searcher_search_pool_calls" | sed "s/^/$1 /"
