#!/usr/bin/env bash
# What one I/O costs, counted rather than timed: instructions and simulated cache misses per I/O
# of `ferrite perf` on a raw malloc bdev, on a passthru over one and on a thick lvol on one, under
# valgrind's cachegrind (a 32 KiB 8-way L1 data cache and a 512 KiB 8-way last level, the size
# of this machine's L2). The counts do not move with the machine's speed, which drifts by
# ±10% from one second to the next here: a change of a few instructions or of one cache line
# per I/O shows, where timed runs need an hour to see 1%.
# Counted: the functions of the I/O path (the bdev layer, its modules, the perf job, memcpy),
# not the reactor's loop and the deferred queue's poll (`drain`, inlined into the poller's
# closure), which also run when idle. The bdevs are
# 256 MiB (4 KiB blocks; the lvol 248 MiB on a lvstore with 4 MiB clusters), so at QD 128 the
# requests in flight copy more than the last level holds, as on the 1 GiB bdevs of
# lvol_vs_spdk.sh. Printed per cell: Ir (instructions), D1 and LL misses (reads + writes) per
# I/O, and for the passthru and the lvol what they add to the raw bdev.
# SPDK is not the peer here: its build uses AVX-512 instructions that valgrind 3.19 cannot run.
# FERRITE_BIN counts another build (an A/B of two builds: the counts are repeatable to ~1%).
# Usage: [CELLS=regex] [FERRITE_BIN=...] bench/io_cost.sh [SECONDS]   (cells "randread 1", ...)
source "$(dirname "$0")/common.sh"
T=${1:-1}
FERRITE=${FERRITE_BIN:-$FERRITE}
need valgrind valgrind
need cg_annotate valgrind
cat > "$TMP/cost.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"MA","num_blocks":65536,"block_size":4096}},
 {"method":"bdev_malloc_create","params":{"name":"MB","num_blocks":65536,"block_size":4096}},
 {"method":"bdev_malloc_create","params":{"name":"MC","num_blocks":65536,"block_size":4096}},
 {"method":"bdev_passthru_create","params":{"base_bdev_name":"MC","name":"PC"}},
 {"method":"bdev_lvol_create_lvstore","params":{"bdev_name":"MB","lvs_name":"lvs0","cluster_sz":4194304}},
 {"method":"bdev_lvol_create","params":{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":248}},
 {"method":"bdev_wait_for_examine"}]}]}
J
# cost BDEV WORKLOAD QD -> "Ir D1 LL" per I/O of the I/O path
cost() {
  valgrind --tool=cachegrind --cache-sim=yes --D1=32768,8,64 --LL=524288,8,64 \
    --cachegrind-out-file="$TMP/cg.out" "$FERRITE" perf --json "$TMP/cost.json" -T "$1" -q "$3" -o 4096 \
    -w "$2" -t "$T" --reactor-mode poll --results-json "$TMP/cg.json" >/dev/null 2>"$TMP/cg.err" ||
    fail "ferrite perf under cachegrind failed: $(tail -3 "$TMP/cg.err")"
  cg_annotate --show=Ir,D1mr,D1mw,DLmr,DLmw --threshold=0 "$TMP/cg.out" >"$TMP/cg.txt" 2>/dev/null ||
    fail "cg_annotate failed"
  python3 - "$TMP/cg.json" "$TMP/cg.txt" <<'P'
import json, re, sys
r = json.load(open(sys.argv[1]))["results"][0]
ios = r["iops"] * r["runtime"]
tot = [0] * 5
for line in open(sys.argv[2]):
    m = re.match(r"\s*((?:(?:[\d,]+|\.)\s+(?:\([^)]*\)\s+)?){5})(\S.*)$", line)
    if not m or ":" not in m.group(2):
        continue
    name = m.group(2)
    if not re.search(r"ferrite_bdev|ferrite_lvol|ferrite_perf|memcpy|memmove", name):
        continue
    if re.search(r"::drain$|::drain |defer::\{\{closure|start_poller::\{\{closure", name):
        continue
    nums = re.findall(r"([\d,]+|\.)(?:\s+\([^)]*\))?\s+", m.group(1))
    tot = [t + (0 if x == "." else int(x.replace(",", ""))) for t, x in zip(tot, nums)]
print(f"{tot[0] / ios:.0f} {(tot[1] + tot[2]) / ios:.2f} {(tot[3] + tot[4]) / ios:.2f}")
P
}
printf '%-22s %-9s %9s %8s %8s   %s\n' cell bdev Ir/io D1/io LL/io "added to raw (Ir, D1, LL)"
for w in randread randwrite; do
  for qd in 1 128; do
    [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"$w $qd" || continue
    read -r ri rd rl <<<"$(cost MA $w $qd)"
    printf '%-22s %-9s %9s %8s %8s\n' "$w 4k qd$qd" raw "$ri" "$rd" "$rl"
    for b in PC lvs0/l0; do
      read -r i d l <<<"$(cost "$b" $w $qd)"
      label=passthru; [ "$b" = PC ] || label=lvol
      printf '%-22s %-9s %9s %8s %8s   %+d %+.2f %+.2f\n' "" "$label" "$i" "$d" "$l" $((i - ri)) \
        "$(python3 -c "print($d - $rd)")" "$(python3 -c "print($l - $rl)")"
    done
  done
done
