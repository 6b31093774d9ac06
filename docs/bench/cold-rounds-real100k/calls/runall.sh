#!/usr/bin/env bash
cd /var/tmp/s52
export STORE=http://127.0.0.1:45293
for b in new2 ev; do NQ=1600 CONC=64 ./ab3.sh c64-$b /var/tmp/bins/$b; done
for b in new2 ev; do NQ=400 CONC=1 ./ab3.sh c1-$b /var/tmp/bins/$b; done
for b in new2 ev; do NQ=800 CONC=16 CACHE=96MiB ./ab3.sh c16m96-$b /var/tmp/bins/$b; done
for b in new2 ev; do NQ=3000 CONC=16 CACHE=1GiB STORE=http://127.0.0.1:8014 ./ab3.sh warm-$b /var/tmp/bins/$b; done
echo DONE
