#!/usr/bin/env bash
# ferrite perf against SPDK's bdevperf, side by side in one run: same JSON config, same flags,
# one core (-m 0x1), 4 KiB. Ferrite's malloc memory is transparent huge pages, SPDK's is 2 MiB
# hugepages where the bench can reserve them (bench/common.sh spdk_memory; SPDK_HUGE=0: neither side).
# Cells: null randread QD 1 and 128; malloc
# (1 GiB, memory really there on both sides) randread, randwrite and randrw at QD 1 and 128.
# Each cell alternates the two programs ROUNDS times and prints medians and the ratio.
# PLOT=DIR (bench/common.sh): the first round of each cell also draws DIR/perf-CELL.svg, both
# programs' IOPS in each second (bdevperf then runs with -S 1, which prints each second).
# Usage: [ROUNDS=3] [PLOT=DIR] bench/perf_vs_spdk.sh [SECONDS]
# Needs SPDK (../shared/anchors/spdk.sh unpacks it); prints SKIP without it.
source "$(dirname "$0")/common.sh"
T=${1:-4}
ROUNDS=${ROUNDS:-3}
need_spdk examples/bdevperf
cat >"$TMP/null.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]}]}
J
cat >"$TMP/malloc.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":262144,"block_size":4096}}]}]}
J

# ferrite_iops CONFIG QD WORKLOAD [SERIES]: the total IOPS; with SERIES, the results (with the
# per-second series) are kept in that file.
ferrite_iops() {
  local res="$TMP/f.json"
  "$FERRITE" perf --json "$1" -q "$2" -o 4096 -w "$3" -M 50 -t "$T" -m 0x1 "${FERRITE_MEM[@]}" --results-json "$res" >/dev/null 2>&1 ||
    fail "ferrite perf failed on $1 $2 $3"
  [ -z "${4:-}" ] || cp "$res" "$4"
  json_get "$res" "int(d['total']['iops'])"
}

# spdk_iops CONFIG QD WORKLOAD [SERIES]: bdevperf's Total line (its report lines start with \r);
# with SERIES, bdevperf runs with -S 1 and its IOPS of each second go into that file.
spdk_iops() {
  local periodic=()
  [ -z "${4:-}" ] || periodic=(-S 1)
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --json "$1" -q "$2" -o 4096 \
    -w "$3" -M 50 -t "$T" -m 0x1 --no-pci "${SPDK_MEM[@]}" "${periodic[@]}" 2>/dev/null >"$TMP/bp.out" || true
  [ -z "${4:-}" ] || bdevperf_series <"$TMP/bp.out" >"$4"
  tr '\r' '\n' <"$TMP/bp.out" | awk '/^ *Total *:/ {printf "%d\n", $3}' | tail -1
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

spdk_memory 2048
printf '%-7s %-9s %4s %12s %12s %6s\n' bdev workload qd ferrite spdk ratio
for cell in "null randread 1" "null randread 128" \
  "malloc randread 1" "malloc randread 128" "malloc randwrite 1" "malloc randwrite 128" \
  "malloc randrw 1" "malloc randrw 128"; do
  read -r kind w qd <<<"$cell"
  f=() s=() keep_f='' keep_s=''
  [ -z "$PLOT" ] || keep_f="$TMP/series-f.json" keep_s="$TMP/series-s.txt"
  for _ in $(seq "$ROUNDS"); do
    f+=("$(ferrite_iops "$TMP/$kind.json" "$qd" "$w" "$keep_f")")
    s+=("$(spdk_iops "$TMP/$kind.json" "$qd" "$w" "$keep_s")")
    if [ -n "$keep_f" ]; then # the first round's runs are the picture
      plot_cell "perf-$kind-$w-qd$qd" "ferrite perf vs bdevperf: $kind $w 4 KiB QD $qd, one core" "$keep_f" bdevperf "$keep_s"
      keep_f='' keep_s=''
    fi
  done
  fm=$(printf '%s\n' "${f[@]}" | median)
  sm=$(printf '%s\n' "${s[@]}" | median)
  [ -n "$sm" ] && [ "$sm" -gt 0 ] || fail "no bdevperf result for $cell"
  printf '%-7s %-9s %4s %12s %12s %6.2f\n' "$kind" "$w" "$qd" "$fm" "$sm" "$(python3 -c "print($fm/$sm)")"
done
