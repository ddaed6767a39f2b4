#!/bin/bash
# Starts fa4_native.sh once per machine, detached, and follows its log for at most SECONDS.
# Usage: bash bench/gpu_container/fa4_poll.sh WORK_DIR WHEELS_DIR SECONDS [OUT_DIR]
W=$1; WHEELS=$2; LIMIT=${3:-540}; OUT_DIR=${4:-}
mkdir -p "$W"
if [ ! -f "$W/started" ]; then
    touch "$W/started"
    setsid nohup bash -c "bash bench/gpu_container/fa4_native.sh $W $WHEELS; touch $W/finished" >"$W/run.log" 2>&1 &
fi
end=$(($(date +%s) + LIMIT)); shown=0
while [ "$(date +%s)" -lt $end ] && [ ! -f "$W/finished" ]; do
    sleep 5
    lines=$(wc -l <"$W/run.log")
    if [ "$lines" -gt "$shown" ]; then sed -n "$((shown + 1)),${lines}p" "$W/run.log" | cut -c1-300; shown=$lines; fi
done
lines=$(wc -l <"$W/run.log")
[ "$lines" -gt "$shown" ] && sed -n "$((shown + 1)),${lines}p" "$W/run.log" | cut -c1-300
[ -f "$W/finished" ] && echo "POLL: finished" || echo "POLL: still running"
[ -n "$OUT_DIR" ] && cp "$W/run.log" "$OUT_DIR/"
exit 0
