#!/usr/bin/env bash
# What compare-and-write and a held LBA range lock cost, in one run of `ferrite perf` pairs on
# two cores (malloc bdevs, 4 KiB blocks and I/O, QD 32, reactors polling):
#  (a) compare-and-write: `-w compare_and_write,randwrite -m 0x3` runs random compare-and-writes
#      on core 0 over its half of a 16 MiB bdev while core 1 writes randomly in the other half;
#      its IOPS against the same run's write IOPS of core 1, and against core 0's own write IOPS
#      in a run of `-w randwrite` on both cores. Goal: CAW >= 0.8x write.
#  (b) a held lock: `-w randwrite -m 0x3` on a bdev of 2 x 4096 + 1 blocks, with
#      `--hold-lock 8192` (a range lock on the last block, which no job writes) and without;
#      total write IOPS with against without. Goal: >= 0.95x.
# Each pair runs REPEAT times (A B, B A, ...: the machine drifts) and the medians are compared.
#  (c) counted, not timed (COUNT=0 skips it): instructions per I/O of the I/O path (the bdev
#      layer, perf's job, memcpy/memcmp; as bench/io_cost.sh counts them) under valgrind's
#      cachegrind, for (b)'s writes with and without the held lock and for (a)'s
#      compare-and-write against a write on one core; a shared machine moves the timed ratios
#      by +-20% from one run to the next, the counts by ~1%.
# perf's end-of-run line "Range locks of ...: N granted" shows what the lock path did (a few
# lease grants for millions of compare-and-writes; one lock held through the run).
# Usage: [REPEAT=3] bench/range_lock_cost.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
REPEAT=${REPEAT:-3}
cat >"$TMP/rl.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"CAW","num_blocks":4096,"block_size":4096}},
 {"method":"bdev_malloc_create","params":{"name":"LCK","num_blocks":8193,"block_size":4096}}]}]}
J
# perf NAME BDEV ARGS...: one run; results in $TMP/NAME.json, output in $TMP/NAME.out.
perf() {
  local name=$1 bdev=$2
  shift 2
  "$FERRITE" perf --json "$TMP/rl.json" -T "$bdev" -q 32 -o 4096 -t "$T" -m 0x3 --reactor-mode poll \
    --results-json "$TMP/$name.json" "$@" >"$TMP/$name.out" 2>&1 || fail "ferrite perf $* failed: $(tail -3 "$TMP/$name.out")"
}
# iops NAME CORE_INDEX: the IOPS of the job on the run's CORE_INDEXth core.
iops() { json_get "$TMP/$1.json" "round(sorted(d['results'], key=lambda r: int(r['core_mask'], 16))[$2]['iops'])"; }
locks() { grep -h "Range locks" "$TMP/$1.out" | sed 's/^/    /'; }
: >"$TMP/a.txt"
: >"$TMP/b.txt"
for i in $(seq 1 "$REPEAT"); do
  order="mix base"
  [ $((i % 2)) = 1 ] || order="base mix"
  for o in $order; do
    case $o in
      mix) perf mix CAW -w compare_and_write,randwrite ;;
      base) perf base CAW -w randwrite ;;
    esac
  done
  echo "$(iops mix 0) $(iops mix 1) $(iops base 0) $(iops base 1)" >>"$TMP/a.txt"
  echo "(a) round $i: CAW core 0 $(iops mix 0), write core 1 $(iops mix 1) | write-only run: $(iops base 0) $(iops base 1)"
  locks mix
  order="held free"
  [ $((i % 2)) = 1 ] || order="free held"
  for o in $order; do
    case $o in
      held) perf held LCK -w randwrite --hold-lock 8192 ;;
      free) perf free LCK -w randwrite ;;
    esac
  done
  echo "$(iops held 0) $(iops held 1) $(iops free 0) $(iops free 1)" >>"$TMP/b.txt"
  echo "(b) round $i: with lock $(iops held 0) + $(iops held 1), without $(iops free 0) + $(iops free 1)"
  locks held
done
# count NAME BDEV ARGS...: "Ir_per_io lock_Ir_per_io" of one 1-second run under cachegrind.
count() {
  local name=$1 bdev=$2
  shift 2
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$TMP/$name.cg" "$FERRITE" perf --json "$TMP/rl.json" \
    -T "$bdev" -q 32 -o 4096 -t 1 --reactor-mode poll --results-json "$TMP/$name.json" "$@" >/dev/null 2>"$TMP/$name.err" ||
    fail "ferrite perf under cachegrind failed: $(tail -3 "$TMP/$name.err")"
  cg_annotate --show=Ir --threshold=0 "$TMP/$name.cg" >"$TMP/$name.txt" 2>/dev/null || fail "cg_annotate failed"
  python3 - "$TMP/$name.json" "$TMP/$name.txt" <<'C'
import json, re, sys
ios = sum(r["iops"] * r["runtime"] for r in json.load(open(sys.argv[1]))["results"])
tot = lock = 0
for line in open(sys.argv[2]):
    m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
    if not m or ":" not in m.group(2) or not re.search(r"ferrite_bdev|ferrite_perf|memcpy|memmove|memcmp", m.group(2)):
        continue
    if re.search(r"::drain$|::drain |defer::\{\{closure", m.group(2)):
        continue
    n = int(m.group(1).replace(",", ""))
    tot += n
    lock += n if re.search(r"local_locks|range_lock", m.group(2)) else 0
print(f"{tot / ios:.0f} {lock / ios:.1f}")
C
}
: >"$TMP/c.txt"
if [ "${COUNT:-1}" = 1 ]; then
  need valgrind valgrind
  need cg_annotate valgrind
  echo "(c) counting with cachegrind..."
  echo "$(count cfree LCK -w randwrite -m 0x3) $(count cheld LCK -w randwrite -m 0x3 --hold-lock 8192)" \
    "$(count ccaw CAW -w compare_and_write -m 0x1) $(count cw CAW -w randwrite -m 0x1)" >"$TMP/c.txt"
fi
python3 - "$TMP/a.txt" "$TMP/b.txt" "$TMP/c.txt" <<'P'
import statistics, sys
a = [list(map(float, l.split())) for l in open(sys.argv[1])]
b = [list(map(float, l.split())) for l in open(sys.argv[2])]
med = lambda xs: statistics.median(xs)
caw, w1, b0, b1 = (med([r[i] for r in a]) for i in range(4))
held = med([r[0] + r[1] for r in b])
free = med([r[2] + r[3] for r in b])
print(f"\n| measure (median of {len(a)}) | IOPS | ratio | goal |")
print("|---|---:|---:|---:|")
print(f"| (a) CAW, core 0, QD 32 | {caw:,.0f} | | |")
print(f"| (a) write, core 1, same run | {w1:,.0f} | CAW/write {caw / w1:.2f} | >= 0.80 |")
print(f"| (a) write, core 0, write-only run | {b0:,.0f} | CAW/write {caw / b0:.2f} | >= 0.80 |")
print(f"| (b) write, 2 cores, lock held | {held:,.0f} | held/free {held / free:.3f} | >= 0.95 |")
print(f"| (b) write, 2 cores, no lock | {free:,.0f} | | |")
c = open(sys.argv[3]).read().split()
if c:
    free_ir, _, held_ir, held_lock, caw_ir, caw_lock, w_ir, _ = map(float, c)
    print(f"\n| counted (cachegrind) | instructions per I/O | of them in range_lock/local_locks | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| (c) write, 2 cores, no lock | {free_ir:.0f} | | |")
    print(f"| (c) write, 2 cores, lock held | {held_ir:.0f} | {held_lock:.1f} | held/free {held_ir / free_ir:.3f} |")
    print(f"| (c) write, 1 core | {w_ir:.0f} | | |")
    print(f"| (c) CAW, 1 core | {caw_ir:.0f} | {caw_lock:.1f} | CAW/write {caw_ir / w_ir:.2f} |")
P
