#!/usr/bin/env bash
# cpusplit.sh PIDS(comma) -- CMD : CPU ms per process and thread-name class around CMD (threads keyed by tid)
pids=${1//,/ }; shift; shift
snap() { for p in $pids; do for t in /proc/$p/task/*; do n=$(cat $t/comm 2>/dev/null) || continue; s=($(cut -d')' -f2 $t/stat 2>/dev/null)) || continue; echo "${t##*/} $p ${n%%-[0-9]*} $(( ${s[11]} + ${s[12]} ))"; done; done; }
snap > /tmp/cs.before; "$@" > /tmp/cs.out 2>&1; snap > /tmp/cs.after
grep -E "^ +[0-9]+ +0\.9" /tmp/cs.out
awk 'NR==FNR {b[$1]=$4; next} {d[$2" "$3]+=$4-($1 in b ? b[$1] : 0)} END {for (k in d) if (d[k]>0) print k, d[k]*10 " ms"}' /tmp/cs.before /tmp/cs.after | sort
