#!/usr/bin/env bash
# Logical volumes against their base and against SPDK's, side by side in one run, one core:
# Ferrite's `ferrite perf` and SPDK v26.05's bdevperf (../shared/anchors) load the same JSON
# config (bdev_malloc_create of 1 GiB with 4 KiB blocks, then bdev_lvol_create_lvstore with
# 4 MiB clusters and bdev_lvol_create; both run lvol RPCs from a config), a fresh process per run.
# Cells (IOPS, 4 KiB, 5 s):
#   malloc (raw) and thick lvol, randread and randwrite at QD 1 and 128: the lvol's share of
#     the raw malloc bdev's IOPS (issue: >= 97%), and Ferrite's lvol against SPDK's lvol;
#   thin lvol on a fresh lvstore with 1 MiB clusters, randwrite QD 32: first writes allocate
#     clusters as they go (1,024 of them), Ferrite against SPDK;
#   fully allocated thin lvol (4 MiB clusters), randread and randwrite at QD 1 and 128, against
#     the raw malloc bdev as the thick cells: in each run every block of the bdev under test
#     (the malloc bdev too) is written once before the timed part, in the same process (the
#     malloc bdev is memory and gone with it): `ferrite perf --fill` (1 MiB writes, 8 at a
#     time), and for bdevperf `-z` with two perform_tests RPCs, a 3 s sequential 1 MiB write
#     pass at QD 8 and then the timed workload.
# Each round of a read/write cell runs all four (Ferrite's malloc and lvol, SPDK's malloc and
# lvol) back to back, in an order that alternates between rounds, so each lvol/malloc quotient
# compares runs made within seconds of each other: this machine's speed drifts by 10-20% over
# minutes, which made quotients of medians taken minutes apart swing from 0.78 to 1.04. Printed:
# medians of the IOPS, and the medians of the per-round quotients. Run it on a quiet machine.
# Memory: Ferrite's malloc bdevs are transparent huge pages, SPDK's 2 MiB hugepages where the
# bench can reserve them (bench/common.sh spdk_memory; SPDK_HUGE=0: neither side).
# In-process cells ("inproc thick randwrite 1" and so on): one `ferrite perf` process holds
# two 1 GiB malloc bdevs, a thick lvol on one of them, and runs the lvol and a raw malloc bdev in
# turns of TURN s (1) (`--interleave`), so every quotient compares turns made seconds apart in
# the same process. Reads compare with the lvol's own base, read raw: two malloc bdevs of one
# process read at rates up to 3% apart (their pages differ), more than the bound measured.
# Writes cannot go to a claimed base: they compare with the other malloc bdev, and the rounds
# alternate which one holds the lvstore. Printed: the median of all the turns' quotients, their
# count and their spread (quartiles). Ferrite only: bdevperf has no such mode.
# CELLS (an extended regular expression) keeps only the cells whose "workload qd" matches
# ("randwrite 1$"; the thin cell is "thin randwrite 32", the allocated thin ones "full randread
# 128" and so on, the thick ones "thick randread 128").
# Usage: [ROUNDS=3] [CELLS=...] [TURN=1] bench/lvol_vs_spdk.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
ROUNDS=${ROUNDS:-3}
need_spdk examples/bdevperf
cfg() { # NAME CLUSTER_BYTES LVOL_JSON_OR_EMPTY
  local lv=""
  if [ -n "$3" ]; then
    lv=",{\"method\":\"bdev_lvol_create_lvstore\",\"params\":{\"bdev_name\":\"M0\",\"lvs_name\":\"lvs0\",\"cluster_sz\":$2}},
 {\"method\":\"bdev_lvol_create\",\"params\":$3}"
  fi
  cat > "$TMP/$1.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":262144,"block_size":4096}}$lv,
 {"method":"bdev_wait_for_examine"}]}]}
J
}
# ab LVS_BASE THIN: the two-malloc config of the in-process cells (THIN: true or false).
ab() {
  cat > "$TMP/ab_$1_$2.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"MA","num_blocks":262144,"block_size":4096}},
 {"method":"bdev_malloc_create","params":{"name":"MB","num_blocks":262144,"block_size":4096}},
 {"method":"bdev_lvol_create_lvstore","params":{"bdev_name":"$1","lvs_name":"lvs0","cluster_sz":4194304}},
 {"method":"bdev_lvol_create","params":{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":1000,"thin_provision":$2}},
 {"method":"bdev_wait_for_examine"}]}]}
J
}
for b in MA MB; do for t in true false; do ab $b $t; done; done
cfg malloc 0 ""
cfg thick 4194304 '{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":1000}'
cfg thin 1048576 '{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":1000,"thin_provision":true}'
cfg thin4m 4194304 '{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":1000,"thin_provision":true}'
FILL= # "fill": the runs write every block of the bdev under test first (see above)
ferrite_iops() { # CONFIG BDEV WORKLOAD QD
  local res="$TMP/res.json"
  "$FERRITE" perf --json "$1" -T "$2" -q "$4" -o 4096 -w "$3" -t "$T" -m 0x1 "${FERRITE_MEM[@]}" --results-json "$res" \
    ${FILL:+--fill} >/dev/null || fail "ferrite perf on $2 failed"
  json_get "$res" "int(d['total']['iops'])"
}
spdk_iops() { # CONFIG BDEV WORKLOAD QD
  [ -z "$FILL" ] || { spdk_filled_iops "$@"; return; }
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --no-pci "${SPDK_MEM[@]}" -m 0x1 \
    --json "$1" -T "$2" -q "$4" -o 4096 -w "$3" -t "$T" 2>&1 | tr -d '\r' |
    awk '$1 == "Total" { for (i = 1; i <= NF; i++) if ($i == ":") { print int($(i + 1)); exit } }'
}
# perform_tests SOCKET PARAMS_JSON: one bdevperf perform_tests RPC; prints the sum of the jobs'
# IOPS (SPDK's own JSON-RPC client, from its python package).
perform_tests() {
  PYTHONPATH="$SPDK_DIR/python" python3 -c '
import json, sys
from spdk.rpc.client import JSONRPCClient
r = JSONRPCClient(sys.argv[1], timeout=120.0).call("perform_tests", json.loads(sys.argv[2]))
print(int(sum(j["iops"] for j in r["results"])))' "$1" "$2"
}
spdk_filled_iops() { # CONFIG BDEV WORKLOAD QD: bdevperf -z, a fill pass, then the timed run
  local sock="$TMP/bdevperf.sock" pid out
  rm -f "$sock"
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --no-pci "${SPDK_MEM[@]}" -m 0x1 \
    -z -r "$sock" --json "$1" -T "$2" -q "$4" -o 4096 -w "$3" -t "$T" >"$TMP/bdevperf.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
  out=$(perform_tests "$sock" '{"workload_type":"write","io_size":"1048576","queue_depth":8,"time_in_sec":3}' >/dev/null &&
    perform_tests "$sock" "{\"workload_type\":\"$3\",\"io_size\":\"4096\",\"queue_depth\":$4,\"time_in_sec\":$T}") || out=
  kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  echo "$out"
}
median() { python3 -c "import statistics,sys; print(int(statistics.median(float(x) for x in sys.argv[1:])))" "$@"; }
# run_cell LABEL CONFIG BDEV WORKLOAD QD -> F_MED S_MED (Ferrite vs SPDK, alternating)
run_cell() {
  local f=() s=()
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      f+=("$(ferrite_iops "$2" "$3" "$4" "$5")"); s+=("$(spdk_iops "$2" "$3" "$4" "$5")")
    else
      s+=("$(spdk_iops "$2" "$3" "$4" "$5")"); f+=("$(ferrite_iops "$2" "$3" "$4" "$5")")
    fi
    [ -n "${s[-1]}" ] || fail "could not read bdevperf's Total line ($1)"
  done
  F_MED=$(median "${f[@]}"); S_MED=$(median "${s[@]}")
}
# pair_cell KIND WORKLOAD QD (KIND thick, or full: the thin lvol, filled first) -> medians of
# the four tools' IOPS and of the per-round quotients
pair_cell() {
  local fr=() fl=() sr=() sl=() fq=() sq=() fs=() rs=()
  local kind=$1 w=$2 qd=$3 lv="$TMP/thick.json" FILL= # (seen by the functions it calls)
  [ "$kind" = full ] && FILL=fill lv="$TMP/thin4m.json"
  for r in $(seq 1 "$ROUNDS"); do
    local a b c d
    if [ $((r % 2)) = 1 ]; then
      a=$(ferrite_iops "$TMP/malloc.json" M0 "$w" "$qd"); b=$(ferrite_iops "$lv" lvs0/l0 "$w" "$qd")
      c=$(spdk_iops "$TMP/malloc.json" M0 "$w" "$qd"); d=$(spdk_iops "$lv" lvs0/l0 "$w" "$qd")
    else
      d=$(spdk_iops "$lv" lvs0/l0 "$w" "$qd"); c=$(spdk_iops "$TMP/malloc.json" M0 "$w" "$qd")
      b=$(ferrite_iops "$lv" lvs0/l0 "$w" "$qd"); a=$(ferrite_iops "$TMP/malloc.json" M0 "$w" "$qd")
    fi
    [ -n "$c" ] && [ -n "$d" ] || fail "could not read bdevperf's Total line ($w qd$qd)"
    fr+=("$a"); fl+=("$b"); sr+=("$c"); sl+=("$d")
    fq+=("$(python3 -c "print($b/$a)")"); sq+=("$(python3 -c "print($d/$c)")")
    fs+=("$(python3 -c "print($b/$d)")"); rs+=("$(python3 -c "print($a/$c)")")
  done
  local label="thick lvol"
  [ "$kind" = full ] && label="allocated thin lvol"
  printf '%-34s %10s %10s %7.2f %14.3f %14.3f\n' "$label $w 4k qd$qd" "$(median "${fl[@]}")" "$(median "${sl[@]}")" \
    "$(fmedian "${fs[@]}")" "$(fmedian "${fq[@]}")" "$(fmedian "${sq[@]}")"
  printf '%-34s %10s %10s %7.2f   (lvol/malloc per round: %s)\n' "  (malloc raw $w 4k qd$qd)" "$(median "${fr[@]}")" \
    "$(median "${sr[@]}")" "$(fmedian "${rs[@]}")" "$(printf '%.3f ' "${fq[@]}")"
}
fmedian() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
spdk_memory 2048
printf '%-34s %10s %10s %7s %14s %14s\n' cell ferrite spdk ratio ferrite_vs_raw spdk_vs_raw
for kind in thick full; do
  for w in randread randwrite; do
    for qd in 1 128; do
      [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"$kind $w $qd" || continue
      pair_cell $kind $w $qd
    done
  done
done
# inproc_cell KIND WORKLOAD QD (KIND thick, or full: the thin lvol, and the raw bdev, filled
# first): ROUNDS processes of T seconds per bdev, in turns of TURN seconds.
inproc_cell() {
  local qs=() lv=() raw=() r cfgf rawname base other thin=false fill=
  [ "$1" = full ] && thin=true fill=--fill
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then base=MB other=MA; else base=MA other=MB; fi
    cfgf="$TMP/ab_${base}_$thin.json" rawname=$other
    # Reads compare with the lvol's own base, read raw (a claimed bdev may still be read): the
    # same memory, the same pages.
    [ "$2" = randread ] && rawname=$base
    "$FERRITE" perf --json "$cfgf" -T "$rawname" -T lvs0/l0 -q "$3" -o 4096 -w "$2" -t "$T" -m 0x1 \
      --interleave "${TURN:-1}" ${fill:+"$fill"} --results-json "$TMP/ab.json" >/dev/null ||
      fail "ferrite perf --interleave failed"
    raw+=("$(json_get "$TMP/ab.json" "int(d['results'][0]['iops'])")")
    lv+=("$(json_get "$TMP/ab.json" "int(d['results'][1]['iops'])")")
    # shellcheck disable=SC2207
    qs+=($(json_get "$TMP/ab.json" "' '.join(str(t['lvs0/l0'] / t['$rawname']) for t in d['interleave']['rounds'])"))
  done
  python3 - "$1" "$2" "$3" "$(median "${raw[@]}")" "$(median "${lv[@]}")" "${qs[@]}" <<'P'
import statistics, sys
kind, w, qd, raw, lv = sys.argv[1:6]
q = sorted(float(x) for x in sys.argv[6:])
qu = statistics.quantiles(q, n=4)
label = "thick" if kind == "thick" else "alloc. thin"
print(f"{'in-process ' + label + ' ' + w + ' qd' + qd:<34} lvol/malloc median {statistics.median(q):.3f} of {len(q)} turns"
      f" (quartiles {qu[0]:.3f} {qu[2]:.3f}; IOPS medians: lvol {lv}, malloc {raw})")
P
}
for kind in thick full; do
  for w in randread randwrite; do
    for qd in 1 128; do
      [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"inproc $kind $w $qd" || continue
      inproc_cell $kind $w $qd
    done
  done
done
if [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"thin randwrite 32"; then
  run_cell thin "$TMP/thin.json" lvs0/l0 randwrite 32
  printf '%-34s %10s %10s %7.2f\n' "thin first writes randwrite qd32" "$F_MED" "$S_MED" "$(python3 -c "print($F_MED/$S_MED)")"
fi
