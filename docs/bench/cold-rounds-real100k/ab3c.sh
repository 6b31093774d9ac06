#!/usr/bin/env bash
# ab3.sh LABEL BINDIR
cd /var/tmp/s52; ./cl3c.sh swap $2
R=/var/tmp/real
$2/quiver-bench cluster --endpoint http://127.0.0.1:7970 --collection served --queries $R/queries.fvecs --gt $R/gt100k.ivecs --include-payload --concurrency 1,16 --max-queries ${NQ:-2000} --server-pid $(cat cl3.pids) --json /var/tmp/s52/ab3-$1.json 2>&1 | grep -E "^ +(1|16) +0\." | sed "s/^/$1 /"
