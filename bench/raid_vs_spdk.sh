#!/usr/bin/env bash
# RAID bdevs: ferrite perf against SPDK v26.05's bdevperf, side by side in one run, same JSON
# config, same flags, one core (-m 0x1). Members are 256 MiB malloc bdevs of 4 KiB blocks.
# Cells: raid0 and raid1 over 2 malloc (strip 64 KiB for raid0): 4 KiB randread and randwrite
# at QD 128, 128 KiB writes (randwrite) at QD 32; raid5f over 3 malloc (strip 64 KiB, so a
# stripe is 128 KiB): full-stripe randwrite (-o 128k) at QD 32 and 4 KiB randread at QD 128.
# Ferrite runs with --fill (every block written once before the timed run: reads of
# never-written malloc memory would hit the zero page); SPDK's malloc memory is zeroed at
# creation (really there). Each cell alternates the two programs ROUNDS times, prints medians
# and the ratio Ferrite/SPDK. SPDK builds raid5f only with --with-raid5f: a build without it
# (the project's) gives Ferrite's raid5f numbers alone (ratio "-").
# PLOT=DIR (bench/common.sh): the first round of each cell also draws DIR/raid-CELL.svg, both
# programs' IOPS in each second side by side.
# Usage: [ROUNDS=1] [PLOT=DIR] bench/raid_vs_spdk.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
ROUNDS=${ROUNDS:-1}
need_spdk examples/bdevperf
mk() { # NAME LEVEL STRIP_KB MEMBERS...
  local name=$1 level=$2 strip=$3 m="" e=""
  shift 3
  for b in "$@"; do
    e+="{\"method\":\"bdev_malloc_create\",\"params\":{\"name\":\"$b\",\"num_blocks\":65536,\"block_size\":4096}},"
    m+="\"$b\","
  done
  local s=""
  [ "$strip" = 0 ] || s="\"strip_size_kb\":$strip,"
  echo "{\"subsystems\":[{\"subsystem\":\"bdev\",\"config\":[$e{\"method\":\"bdev_raid_create\",\"params\":{\"name\":\"$name\",\"raid_level\":\"$level\",$s\"base_bdevs\":[${m%,}]}},{\"method\":\"bdev_wait_for_examine\"}]}]}" >"$TMP/$name.json"
}
mk R0 raid0 64 M0 M1
mk R1 raid1 0 M0 M1
mk R5 raid5f 64 M0 M1 M2

# ferrite_iops BDEV QD SIZE WORKLOAD [SERIES]: with SERIES, the run's results (and its series)
# are kept in that file.
ferrite_iops() {
  local res=${5:-$TMP/f.json}
  "$FERRITE" perf --json "$TMP/$1.json" -T "$1" -q "$2" -o "$3" -w "$4" -t "$T" -m 0x1 --fill "${FERRITE_MEM[@]}" \
    --results-json "$res" >"$TMP/f.out" 2>&1 || { cat "$TMP/f.out" >&2; fail "ferrite perf failed on $*"; }
  json_get "$res" "int(d['total']['iops'])"
}

# spdk_iops BDEV QD SIZE WORKLOAD [SERIES]: bdevperf's Total line (its report lines start with
# \r); with SERIES, bdevperf runs with -S 1 and its IOPS of each second go into that file.
spdk_iops() {
  local periodic=()
  [ -z "${5:-}" ] || periodic=(-S 1)
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --json "$TMP/$1.json" -T "$1" -q "$2" \
    -o "$3" -w "$4" -t "$T" -m 0x1 --no-pci "${SPDK_MEM[@]}" "${periodic[@]}" 2>/dev/null >"$TMP/bp.out" || true
  [ -z "${5:-}" ] || bdevperf_series <"$TMP/bp.out" >"$5"
  tr '\r' '\n' <"$TMP/bp.out" | awk '/^ *Total *:/ {printf "%d\n", $3}' | tail -1
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

spdk_memory 2048
echo "ferrite $(git -C "$ROOT" rev-parse --short HEAD), SPDK $(basename "$SPDK_DIR"), ${T}s per run, $ROUNDS round(s)"
printf '%-5s %-10s %5s %4s %12s %12s %6s\n' bdev workload size qd ferrite spdk ratio
# CELLS="BDEV WORKLOAD SIZE QD;..." runs only those cells (a rerun of a doubtful one).
IFS=';' read -r -a cells <<<"${CELLS:-R0 randread 4096 128;R0 randwrite 4096 128;R0 randwrite 128k 32;R1 randread 4096 128;R1 randwrite 4096 128;R1 randwrite 128k 32;R5 randwrite 128k 32;R5 randread 4096 128}"
for cell in "${cells[@]}"; do
  read -r b w sz qd <<<"$cell"
  f=() s=() keep_f='' keep_s=''
  [ -z "$PLOT" ] || keep_f="$TMP/series-f.json" keep_s="$TMP/series-s.txt"
  for _ in $(seq "$ROUNDS"); do
    f+=("$(ferrite_iops "$b" "$qd" "$sz" "$w" "$keep_f")")
    s+=("$(spdk_iops "$b" "$qd" "$sz" "$w" "$keep_s")")
    if [ -n "$keep_f" ]; then # the first round's runs are the picture
      [ -s "$keep_s" ] && plot_cell "raid-$b-$w-$sz-qd$qd" "ferrite perf vs bdevperf: $b $w $sz QD $qd, one core" \
        "$keep_f" bdevperf "$keep_s"
      keep_f='' keep_s=''
    fi
  done
  fm=$(printf '%s\n' "${f[@]}" | median)
  sm=$(printf '%s\n' "${s[@]}" | grep . | median || true)
  if [ -n "$sm" ] && [ "$sm" -gt 0 ]; then
    printf '%-5s %-10s %5s %4s %12s %12s %6.2f\n' "$b" "$w" "$sz" "$qd" "$fm" "$sm" "$(python3 -c "print($fm/$sm)")"
  else
    printf '%-5s %-10s %5s %4s %12s %12s %6s\n' "$b" "$w" "$sz" "$qd" "$fm" "-" "-"
  fi
done
