#!/bin/bash
# Starts device.sh (or $SCRIPT, another script of this folder) in its own session (once per machine) from a copy of the repository in
# WORK_DIR, then follows its log for at most SECONDS; call again to keep following.
# Usage: [SCRIPT=real_check.sh] [EXTRA=REQUIREMENTS] bash bench/gpu_container/poll.sh WORK_DIR SECONDS [OUT_DIR]
W=${1:-/tmp/gc}
LIMIT=${2:-540}
OUT_DIR=${3:-}
mkdir -p "$W"
if [ ! -f "$W/started" ]; then
    rm -rf "$W/repo" && mkdir -p "$W/repo" && cp -a . "$W/repo/" && touch "$W/started"
    (cd "$W/repo" && setsid nohup bash -c "bash bench/gpu_container/${SCRIPT:-device.sh} $W ${EXTRA:-}; touch $W/finished" >"$W/device.log" 2>&1 &)
fi
end=$(($(date +%s) + LIMIT))
shown=0
while [ "$(date +%s)" -lt $end ] && [ ! -f "$W/finished" ]; do
    sleep 5
    lines=$(wc -l <"$W/device.log")
    if [ "$lines" -gt "$shown" ]; then sed -n "$((shown + 1)),${lines}p" "$W/device.log" | cut -c1-300; shown=$lines; fi
done
lines=$(wc -l <"$W/device.log")
[ "$lines" -gt "$shown" ] && sed -n "$((shown + 1)),${lines}p" "$W/device.log" | cut -c1-300
[ -f "$W/finished" ] && echo "POLL: finished" || echo "POLL: still running"
if [ -n "$OUT_DIR" ]; then
    cp "$W/device.log" "$OUT_DIR/" 2>/dev/null
    cp "$W"/proj/report*.json "$W"/proj/out-*.txt "$OUT_DIR/" 2>/dev/null  # out-*: the live lines, timestamped
    for log in "$W"/proj/logs*/*.log; do  # logs/ID.log, logs-80/ID.log: the same names, so prefixed
        [ -f "$log" ] && cp "$log" "$OUT_DIR/$(basename "$(dirname "$log")")-$(basename "$log")"
    done
    tail -c 200000 "$W/dockerd-overlay2.log" >"$OUT_DIR/dockerd.log" 2>/dev/null
fi
