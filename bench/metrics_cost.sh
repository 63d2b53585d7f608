#!/usr/bin/env bash
# What Prometheus scrapes cost the data path: `ferrite perf` on a null bdev (4 KiB randread,
# QD 128, one core, reactor polling) with `--metrics` and a scrape of /metrics every 100 ms,
# against the same run without metrics. Runs alternate (with, without, without, with, ...: the
# machine drifts) REPEAT times each; the ratio of the median IOPS is the cost. Goal: >= 0.99.
# The scraper (standing in for a Prometheus elsewhere) runs on core 1, off the reactor's core
# 0, as the daemon's metrics thread does on its own.
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
# The scraper: one python process on core 1 that GETs /metrics every 100 ms and counts the
# answers (forking a curl, or even a `sleep`, every 100 ms costs a polling reactor on a 2-core VM
# a third of its IOPS by itself: that is the scraper's machine, not the daemon).
cat >"$TMP/scrape.py" <<'P'
import sys, time, urllib.request
url, out = sys.argv[1], sys.argv[2]
n = 0
while True:
    time.sleep(0.1)
    try:
        urllib.request.urlopen(url, timeout=1).read()
        n += 1
        open(out, "w").write(str(n))
    except Exception:
        pass
P
# scraped NAME [ARGS...]: a run with the scraper beside it; prints its IOPS and the scrape count.
# Both sides have the scraper: "with" adds --metrics (so it is answered), "without" leaves the
# port closed (its connections are refused), so the ratio is what serving the scrapes costs.
scraped() {
  local name=$1 port
  shift
  port=$(free_port)
  echo 0 >"$TMP/scrapes"
  taskset -c 1 python3 "$TMP/scrape.py" "http://127.0.0.1:$port/metrics" "$TMP/scrapes" &
  local scraper=$!
  local iops
  if [ "$name" = with ]; then
    iops=$(run with --metrics "127.0.0.1:$port")
  else
    iops=$(run without)
  fi
  kill "$scraper" 2>/dev/null || true
  wait "$scraper" 2>/dev/null || true
  echo "$iops $(cat "$TMP/scrapes")"
}
: >"$TMP/with.txt"
: >"$TMP/without.txt"
for i in $(seq 1 "$REPEAT"); do
  order="with without"
  [ $((i % 2)) = 1 ] || order="without with"
  for o in $order; do
    case $o in
      with) read -r w s < <(scraped with); echo "$w" >>"$TMP/with.txt"; echo "round $i: with metrics $w IOPS ($s scrapes)" ;;
      without) read -r b _ < <(scraped without); echo "$b" >>"$TMP/without.txt"; echo "round $i: without     $b IOPS" ;;
    esac
  done
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
mw=$(median "$TMP/with.txt")
mb=$(median "$TMP/without.txt")
ratio=$(python3 -c "print(f'{$mw/$mb:.4f}')")
echo "median IOPS: with a scrape every 100 ms $mw, without $mb: ratio $ratio (goal >= 0.99)"
echo "$(date -u +%FT%TZ) metrics_cost T=$T REPEAT=$REPEAT with=$mw without=$mb ratio=$ratio" >>"$OUT/metrics_cost.txt"
