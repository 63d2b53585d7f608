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
# Usage: [ROUNDS=1] bench/raid_vs_spdk.sh [SECONDS]
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

# ferrite_iops BDEV QD SIZE WORKLOAD
ferrite_iops() {
  local res="$TMP/f.json"
  "$FERRITE" perf --json "$TMP/$1.json" -T "$1" -q "$2" -o "$3" -w "$4" -t "$T" -m 0x1 --fill "${FERRITE_MEM[@]}" \
    --results-json "$res" >"$TMP/f.out" 2>&1 || { cat "$TMP/f.out" >&2; fail "ferrite perf failed on $*"; }
  json_get "$res" "int(d['total']['iops'])"
}

# spdk_iops BDEV QD SIZE WORKLOAD: bdevperf's Total line (its report lines start with \r).
spdk_iops() {
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --json "$TMP/$1.json" -T "$1" -q "$2" \
    -o "$3" -w "$4" -t "$T" -m 0x1 --no-pci "${SPDK_MEM[@]}" 2>/dev/null | tr '\r' '\n' |
    awk '/^ *Total *:/ {printf "%d\n", $3}' | tail -1 || true
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

spdk_memory 2048
echo "ferrite $(git -C "$ROOT" rev-parse --short HEAD), SPDK $(basename "$SPDK_DIR"), ${T}s per run, $ROUNDS round(s)"
printf '%-5s %-10s %5s %4s %12s %12s %6s\n' bdev workload size qd ferrite spdk ratio
# CELLS="BDEV WORKLOAD SIZE QD;..." runs only those cells (a rerun of a doubtful one).
IFS=';' read -r -a cells <<<"${CELLS:-R0 randread 4096 128;R0 randwrite 4096 128;R0 randwrite 128k 32;R1 randread 4096 128;R1 randwrite 4096 128;R1 randwrite 128k 32;R5 randwrite 128k 32;R5 randread 4096 128}"
for cell in "${cells[@]}"; do
  read -r b w sz qd <<<"$cell"
  f=() s=()
  for _ in $(seq "$ROUNDS"); do
    f+=("$(ferrite_iops "$b" "$qd" "$sz" "$w")")
    s+=("$(spdk_iops "$b" "$qd" "$sz" "$w")")
  done
  fm=$(printf '%s\n' "${f[@]}" | median)
  sm=$(printf '%s\n' "${s[@]}" | grep . | median || true)
  if [ -n "$sm" ] && [ "$sm" -gt 0 ]; then
    printf '%-5s %-10s %5s %4s %12s %12s %6.2f\n' "$b" "$w" "$sz" "$qd" "$fm" "$sm" "$(python3 -c "print($fm/$sm)")"
  else
    printf '%-5s %-10s %5s %4s %12s %12s %6s\n' "$b" "$w" "$sz" "$qd" "$fm" "-" "-"
  fi
done
