#!/usr/bin/env bash
# What Prometheus scrapes cost the data path: `ferrite perf` on a null bdev (4 KiB randread,
# QD 128, one core, reactor polling) serving `--metrics`, with a scraper that GETs /metrics every
# 100 ms during every other 1-second block of wall-clock time (even seconds in one run, odd ones
# in the next: something on these VMs is slower in even seconds) and stays idle in the rest. Goal:
# IOPS with scrapes >= 0.99x IOPS without.
#
# Why one run and not runs with and without: on these VMs the IOPS of a run drift by 10% from
# one run to the next, and from one second to the next by as much, far more than the 1% asked
# about; the swings last seconds. Inside one run, each quarter second with scrapes is compared
# with the quarter seconds without in the blocks next to it (perf's series, -S 0.25, carries
# wall-clock times): the swings cancel. The scraper (standing in for a Prometheus elsewhere) runs on core 1, off
# the reactor's core 0, as the daemon's metrics thread does on its own; what both cost core 1 is
# in the ratio. The daemon's own counter ferrite_metrics_gather_seconds_total (reactor 0's time
# in gathering tasks, an upper bound) over the run's seconds is the cost measured without a ratio.
# CONTROL=1 runs the same with a scraper that never scrapes: the ratio's noise floor on this
# machine (it should read 1.00; how far it strays is how far the real ratio may).
# Usage: [REPEAT=4] [CONTROL=1] bench/metrics_cost.sh [SECONDS per run, default 60]
source "$(dirname "$0")/common.sh"
T=${1:-60}
REPEAT=${REPEAT:-4}
cat >"$TMP/null.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]}]}
J
# The scraper: one python process (forking a curl every 100 ms would cost more than the scrape);
# it writes how many scrapes it made and keeps the last answer.
cat >"$TMP/scrape.py" <<'P'
import sys, time, urllib.request
url, out, last, control, parity = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
n = 0
while True:
    time.sleep(0.1)
    if int(time.time()) % 2 != parity or (control and n > 0):
        continue
    try:
        body = urllib.request.urlopen(url, timeout=1).read()
        n += 1
        open(out, "w").write(str(n))
        open(last, "wb").write(body)
    except Exception:
        pass
P
# Pairs each interval of the series with scrapes (inside a block of the run's parity, 0.15 s after its start
# for the scraper's own 100 ms sleep, 0.05 s before its end for a scrape under way) with the mean
# of the intervals without scrapes in the blocks on either side; prints the median ratio, the
# number of intervals with scrapes and the mean IOPS of each kind.
cat >"$TMP/pairs.py" <<'P'
import json, math, statistics, sys
series = json.load(open(sys.argv[1]))["series"]
step, parity = float(sys.argv[2]), int(sys.argv[3])
def kind(p):
    start, end = p["unix_time"] - step, p["unix_time"]
    blk = math.floor(start)
    if end > blk + 1 - 0.05 or start < blk + 0.15:
        return None, blk
    return ("on" if blk % 2 == parity else "off"), blk
# Whole intervals only (the first and last may be short).
pts = [kind(p) + (p["iops"],) for p in series[1:-1]]
ratios = []
for k, blk, v in pts:
    if k == "on":
        near = [w for k2, b2, w in pts if k2 == "off" and abs(b2 - blk) == 1]
        if near:
            ratios.append(v / statistics.mean(near))
on = [v for k, _, v in pts if k == "on"]
off = [v for k, _, v in pts if k == "off"]
if not ratios:
    sys.exit("no interval with scrapes next to one without: run longer")
print(f"{statistics.median(ratios):.4f} {len(ratios)} {statistics.mean(on):.0f} {statistics.mean(off):.0f}")
P
: >"$TMP/ratios.txt"
for i in $(seq 1 "$REPEAT"); do
  port=$(free_port)
  echo 0 >"$TMP/scrapes"
  : >"$TMP/last"
  taskset -c 1 python3 "$TMP/scrape.py" "http://127.0.0.1:$port/metrics" "$TMP/scrapes" "$TMP/last" "${CONTROL:-0}" $((i % 2)) &
  scraper=$!
  "$FERRITE" perf --json "$TMP/null.json" -q 128 -o 4096 -w randread -t "$T" -S 0.25 -m 0x1 --reactor-mode poll \
    --metrics "127.0.0.1:$port" --results-json "$TMP/run.json" >"$TMP/run.out" 2>&1 ||
    fail "ferrite perf failed: $(tail -3 "$TMP/run.out")"
  kill "$scraper" 2>/dev/null || true
  wait "$scraper" 2>/dev/null || true
  read -r ratio pairs on off < <(python3 "$TMP/pairs.py" "$TMP/run.json" 0.25 $((i % 2))) || fail "run $i: no pairs"
  cost=$(awk '/^ferrite_metrics_gather_seconds_total / {print $2}' "$TMP/last")
  n=$(cat "$TMP/scrapes")
  [ "$n" -gt 0 ] || fail "run $i: the scraper got no answer"
  echo "$ratio" >>"$TMP/ratios.txt"
  echo "run $i: with scrapes/without $ratio over $pairs quarter seconds with scrapes (mean IOPS $on with, $off without);" \
    "$n scrapes, reactor 0 gathered for ${cost:-?} s of $T s"
done
median=$(sort -n "$TMP/ratios.txt" | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}')
frac=$(python3 -c "print(f'{${cost:-0}/$T:.6f}')")
if [ "${CONTROL:-0}" = 1 ]; then
  echo "median over $REPEAT control runs (one scrape at the start, then none): $median (noise floor; 1.00 is no difference)"
else
  echo "median over $REPEAT runs: IOPS with a scrape every 100 ms / without = $median (goal >= 0.99)"
fi
echo "reactor 0 gathered for $frac of the last run's time at most"
echo "$(date -u +%FT%TZ) metrics_cost T=$T REPEAT=$REPEAT CONTROL=${CONTROL:-0} with/without=$median gather_fraction=$frac" >>"$OUT/metrics_cost.txt"
