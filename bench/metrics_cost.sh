#!/usr/bin/env bash
# What Prometheus scrapes cost the data path: `ferrite perf` on a null bdev (4 KiB randread,
# QD 128, one core, reactor polling) with `--metrics` and a scrape every 100 ms, in three arms
# (below). Runs alternate (the machine drifts) REPEAT times each; ratios of median IOPS. Goal:
# >= 0.99. The scraper (standing in for a Prometheus elsewhere) runs on core 1, off the
# reactor's core 0, as the daemon's metrics thread does on its own.
# Usage: [REPEAT=5] bench/metrics_cost.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
REPEAT=${REPEAT:-5}
cat >"$TMP/null.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]}]}
J
# run NAME [ARGS...]: one run; prints its IOPS.
run() {
  local name=$1
  shift
  "$FERRITE" perf --json "$TMP/null.json" -q 128 -o 4096 -w randread -t "$T" -m 0x1 --reactor-mode poll \
    --results-json "$TMP/$name.json" "$@" >"$TMP/$name.out" 2>&1 || fail "ferrite perf $* failed: $(tail -3 "$TMP/$name.out")"
  json_get "$TMP/$name.json" "round(sum(r['iops'] for r in d['results']))"
}
# The scraper: one python process on core 1 that GETs PATH every 100 ms, counts the answers and
# keeps the last (forking a curl, or even a `sleep`, every 100 ms costs a polling reactor on a
# 2-core VM a third of its IOPS by itself: that is the scraper's machine, not the daemon).
cat >"$TMP/scrape.py" <<'P'
import sys, time, urllib.request
url, out, last = sys.argv[1], sys.argv[2], sys.argv[3]
n = 0
while True:
    time.sleep(0.1)
    try:
        body = urllib.request.urlopen(url, timeout=1).read()
        n += 1
        open(out, "w").write(str(n))
        open(last, "wb").write(body)
    except Exception:
        pass
P
# Three arms, each with the scraper beside the run:
#   none:    no --metrics (the scraper's connections are refused);
#   root:    --metrics, the scraper GETs / (served by the metrics thread, nothing gathered);
#   metrics: --metrics, the scraper GETs /metrics (gathered on reactor 0 and rendered).
# metrics/none is the issue's ratio; it includes the scraper and the metrics thread working on
# core 1, which on this VM slows core 0 by itself. metrics/root has the same processes on core 1
# in both arms: what gathering costs the data path. The daemon's own counter
# ferrite_metrics_gather_seconds_total (reactor 0's time in gathering tasks, an upper bound)
# over the run's seconds is the same cost, measured without a ratio.
arm() {
  local name=$1 port
  port=$(free_port)
  echo 0 >"$TMP/scrapes"
  : >"$TMP/last"
  local path=/metrics
  [ "$name" = root ] && path=/
  taskset -c 1 python3 "$TMP/scrape.py" "http://127.0.0.1:$port$path" "$TMP/scrapes" "$TMP/last" &
  local scraper=$!
  local iops
  if [ "$name" = none ]; then
    iops=$(run none)
  else
    iops=$(run "$name" --metrics "127.0.0.1:$port")
  fi
  kill "$scraper" 2>/dev/null || true
  wait "$scraper" 2>/dev/null || true
  local cost=-
  if [ "$name" = metrics ]; then
    cost=$(awk '/^ferrite_metrics_gather_seconds_total / {print $2}' "$TMP/last")
  fi
  echo "$iops $(cat "$TMP/scrapes") ${cost:--}"
}
for a in none root metrics; do : >"$TMP/$a.txt"; done
: >"$TMP/cost.txt"
for i in $(seq 1 "$REPEAT"); do
  order="none root metrics"
  [ $((i % 2)) = 1 ] || order="metrics root none"
  for a in $order; do
    read -r iops n cost < <(arm "$a")
    echo "$iops" >>"$TMP/$a.txt"
    [ "$cost" = - ] || echo "$cost" >>"$TMP/cost.txt"
    echo "round $i: $a $iops IOPS ($n scrapes$([ "$cost" = - ] || echo ", reactor 0 gathered for $cost s"))"
  done
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
mn=$(median "$TMP/none.txt")
mr=$(median "$TMP/root.txt")
mm=$(median "$TMP/metrics.txt")
mc=$(median "$TMP/cost.txt")
read -r r1 r2 frac < <(python3 -c "print(f'{$mm/$mn:.4f} {$mm/$mr:.4f} {$mc/$T:.6f}')")
echo "median IOPS: none $mn, root $mr, metrics $mm"
echo "metrics/none $r1 (scraper and metrics thread on core 1 included); metrics/root $r2 (gathering only; goal >= 0.99)"
echo "reactor 0 gathered for $mc s of a ${T} s run: $frac of the data path at most"
echo "$(date -u +%FT%TZ) metrics_cost T=$T REPEAT=$REPEAT none=$mn root=$mr metrics=$mm metrics/none=$r1 metrics/root=$r2 gather_fraction=$frac" >>"$OUT/metrics_cost.txt"
