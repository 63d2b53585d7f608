#!/usr/bin/env bash
# Idle cost of `ferrite serve` in adaptive mode: start-up time (until the RPC socket answers),
# CPU use over 10 s of idleness, and RSS (the demo's malloc bdev is untouched, so its pages are
# not resident). Usage: bench/idle.sh
source "$(dirname "$0")/common.sh"
SOCK="$TMP/ferrite.sock"
start=$(date +%s%N)
"$FERRITE" serve -m 0x3 -r "$SOCK" --json "$ROOT/examples/demo.json" --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$TMP"' EXIT
until "$FERRITE" rpc -s "$SOCK" -t 1 spdk_get_version >/dev/null 2>&1; do sleep 0.005; done
ready=$(( ($(date +%s%N) - start) / 1000000 ))
sleep 1
ticks() { awk '{print $14+$15}' "/proc/$pid/stat"; }
t0=$(ticks); sleep 10; t1=$(ticks)
hz=$(getconf CLK_TCK)
cpu=$(python3 -c "print(100*($t1-$t0)/$hz/10)")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
echo "startup_ms=$ready idle_cpu_percent=$cpu rss_kib=$rss (2 reactors, adaptive)"
kill -TERM $pid; wait $pid
