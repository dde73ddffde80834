#!/bin/bash
# Issue 47's bench sitting: 9807287 (before) against main (after), alternating, one machine.
LOG=${LOG:-/work/notes/sitting.log}
BEFORE=/work/wt-before; AFTER=/work/main
run() { # side bench round args...
  local side=$1 bench=$2 round=$3; shift 3
  local dir=$BEFORE; [ "$side" = after ] && dir=$AFTER
  echo "=== $bench $side round $round $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $LOG
  (cd $dir && timeout 900 node bench/$bench.js "$@" 2>&1 | grep -v '^\s*$' | tail -40) >> $LOG
}
for b in "serve --c=1,4,8 --reps=2 --parts=concurrency" "programs --c=1,4 --reps=2" "agent-cache --only replay --sessions 8 --turns 6 --n-ctx 2048 --parallel 4" "decide"; do
  set -- $b; name=$1; shift
  extra=(); [ "$name" = decide ] && extra=(--parts=rows,beside)
  run before $name 1 "$@"
  if [ "$name" = decide ]; then run after $name 1 "$@" "${extra[@]}"; run after $name 2 "$@" "${extra[@]}"; else run after $name 1 "$@"; run after $name 2 "$@"; fi
  run before $name 2 "$@"
done
echo "=== done $(date +%H:%M:%S)" >> $LOG
