#!/usr/bin/env bash
# Ferrite's vhost-user-blk target vs SPDK v26.05's vhost app, in this run, driven by the same
# client: SPDK's bdevperf with a virtio-user bdev (bdev_virtio_attach_controller, trtype user,
# two virtqueues), 4 KiB, on core 1; the target on core 0, one reactor, polling; a 256 MiB malloc
# bdev written whole before the cells (reads of never-written memory would hit the zero page).
# Cells: randread and randwrite at QD 1 and QD 128: IOPS and mean latency per target, and
# Ferrite's ratio. The targets run one after the other (both poll core 0), in the order
# ORDER (default "ferrite spdk spdk ferrite": drift hits both alike); medians are reported.
# PLOT=DIR (bench/common.sh): each target's first run of each cell also goes into
# DIR/vhost-CELL.svg, the IOPS of each second side by side (bdevperf then runs with -S 1).
# Needs SPDK (../shared/anchors) and 2 MiB hugepages for SPDK's virtio-user (root: reserved here
# and given back); prints SKIP otherwise.
# Usage: [PLOT=DIR] bench/vhost_vs_spdk.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
ORDER=${ORDER:-ferrite spdk spdk ferrite}
need_spdk bin/vhost examples/bdevperf
[ "$(id -u)" = 0 ] || { echo "SKIP: SPDK's virtio-user needs hugepages, which only root can reserve here"; exit 0; }
HUGE_BEFORE=$(cat /proc/sys/vm/nr_hugepages)
trap 'echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages; stop_pids ${TPID:-}' EXIT
[ "$HUGE_BEFORE" -ge 1100 ] || echo 1100 >/proc/sys/vm/nr_hugepages
mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }
[ "$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)" -ge 600 ] || { echo "SKIP: not enough free hugepages"; exit 0; }
export LD_LIBRARY_PATH=$SPDK_DIR/build/lib
RPCPY() { PYTHONPATH=$SPDK_DIR/python python3 "$SPDK_DIR/scripts/rpc.py" "$@"; }
BLOCKS=65536
CELLS="randread:1 randread:128 randwrite:1 randwrite:128"
# A run whose target or client reactor had less than STARVED percent of its core (both poll, so
# they want all of it) is flagged: on a shared machine other threads on core 0 or 1 (every
# Ferrite reactor_0 and SPDK reactor 0 on the machine polls core 0 by default) can take a polled
# core for hundreds of milliseconds, and the run then measures them (docs/perf-log/2026-11-30-vhost-stall.md).
STARVED=${STARVED:-50}
: >"$TMP/records"

# start_target NAME: starts it on core 0 with M0 exported as controller vhost.0 in $TMP/NAME.
start_target() {
  mkdir -p "$TMP/$1"
  rm -f "$TMP/$1/vhost.0" "$TMP/$1.sock"
  case $1 in
    ferrite)
      "$FERRITE" serve -m 0x1 --reactor-mode poll -S "$TMP/$1" -r "$TMP/$1.sock" --log-level warn >"$TMP/$1.log" 2>&1 &
      TPID=$!
      for _ in $(seq 200); do [ -S "$TMP/$1.sock" ] && break; sleep 0.05; done
      "$FERRITE" rpc -s "$TMP/$1.sock" bdev_malloc_create --name M0 --num-blocks $BLOCKS --block-size 4096 >/dev/null
      "$FERRITE" rpc -s "$TMP/$1.sock" vhost_create_blk_controller '{"ctrlr":"vhost.0","dev_name":"M0"}' >/dev/null ;;
    spdk)
      "$SPDK_DIR/build/bin/vhost" -m 0x1 -s 512 --disable-cpumask-locks -S "$TMP/$1" -r "$TMP/$1.sock" >"$TMP/$1.log" 2>&1 &
      TPID=$!
      for _ in $(seq 200); do [ -S "$TMP/$1.sock" ] && break; sleep 0.05; done
      RPCPY -s "$TMP/$1.sock" bdev_malloc_create -b M0 $((BLOCKS * 4096 / 1048576)) 4096 >/dev/null
      RPCPY -s "$TMP/$1.sock" vhost_create_blk_controller vhost.0 M0 >/dev/null ;;
  esac
  [ -S "$TMP/$1/vhost.0" ] || fail "$1: no vhost socket ($(tail -3 "$TMP/$1.log"))"
}

# bdevperf NAME WORKLOAD QD SIZE SECONDS [SERIES]: one client run against NAME; prints
# "IOPS AVG_US TARGET_SHARE CLIENT_SHARE" (the final Total line, then the percentage of its
# core the target's reactor and bdevperf's were given: both poll, so anything under 100 is time
# other threads held their core). With SERIES, bdevperf prints each second (-S 1) and those
# IOPS go into that file.
bdevperf() {
  local periodic=() tt t0 t1 bp sampler
  [ -z "${6:-}" ] || periodic=(-S 1)
  cat >"$TMP/bp.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_virtio_attach_controller","params":{"name":"V","trtype":"user","traddr":"$TMP/$1/vhost.0","dev_type":"blk","vq_count":2,"vq_size":512}}]}]}
J
  tt=$(thread_of "$TPID" reactor_0)
  t0=$(sched_ns "$TPID" "${tt:-0}")
  "$SPDK_DIR/build/examples/bdevperf" --json "$TMP/bp.json" -w "$2" -q "$3" -o "$4" -t "$5" -m 0x2 -g -s 512 \
    --no-pci --disable-cpumask-locks -r "$TMP/bp.sock" "${periodic[@]}" >"$TMP/bp.out" 2>&1 &
  bp=$!
  # The client's reactor, sampled until it exits (its last 0.2 s are not counted).
  echo "0 0" >"$TMP/bp.sched"
  (
    bt=
    while kill -0 "$bp" 2>/dev/null; do
      [ -n "$bt" ] || bt=$(thread_of "$bp" reactor_1)
      [ -z "$bt" ] || { s=$(sched_ns "$bp" "$bt"); [ "$s" = "0 0" ] || echo "$s" >"$TMP/bp.sched"; }
      sleep 0.2
    done
  ) &
  sampler=$!
  wait "$bp" || fail "bdevperf $*: $(tail -3 "$TMP/bp.out")"
  wait "$sampler"
  t1=$(sched_ns "$TPID" "${tt:-0}")
  [ -z "${6:-}" ] || bdevperf_series <"$TMP/bp.out" >"$6"
  echo "$(tr '\r' '\n' <"$TMP/bp.out" | awk '$1 == "Total" {print $3, $7}' | tail -1)" \
    "$(core_share $t0 $t1)" "$(core_share 0 0 $(cat "$TMP/bp.sched"))"
}

for who in $ORDER; do
  start_target "$who"
  bdevperf "$who" write 32 131072 3 >/dev/null   # every block written once
  for c in $CELLS; do
    series=''
    [ -z "$PLOT" ] || [ -e "$TMP/series-$who-$c" ] || series="$TMP/series-$who-$c" # the first run's
    r=$(bdevperf "$who" "${c%%:*}" "${c##*:}" 4096 "$T" "$series")
    echo "$who $c $r" >>"$TMP/records"
    read -r iops lat ts cs <<<"$r"
    note=
    [ "$ts" -ge "$STARVED" ] && [ "$cs" -ge "$STARVED" ] ||
      note="  STARVED: other threads held the target's core $((100 - ts))% of the run, the client's $((100 - cs))% (a measure of the machine, not the target)"
    echo "  $who ${c%%:*} QD ${c##*:}: $iops $lat (IOPS, mean us); core given to target $ts%, client $cs%$note"
  done
  stop_pids "$TPID"
  TPID=
done

echo
echo "vhost-user-blk, malloc 4 KiB, target on core 0 (polling), SPDK bdevperf virtio-user on core 1, ${T}s per cell, medians:"
printf '%-10s %4s %12s %12s %10s %10s %8s %8s\n' workload QD ferrite spdk "f_lat_us" "s_lat_us" "IOPS x" "lat x"
for c in $CELLS; do
  python3 - "$TMP/records" "$c" <<'P'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
c = sys.argv[2]
def med(who, i):
    v = [float(r[2 + i]) for r in rows if r[0] == who and r[1] == c]
    return statistics.median(v) if v else float("nan")
fi, si, fl, sl = med("ferrite", 0), med("spdk", 0), med("ferrite", 1), med("spdk", 1)
w, qd = c.split(":")
print(f"{w:<10} {qd:>4} {fi:12.0f} {si:12.0f} {fl:10.2f} {sl:10.2f} {fi / si:8.2f} {sl / fl:8.2f}")
P
done
echo "(IOPS x = Ferrite / SPDK; lat x = SPDK's mean latency / Ferrite's: above 1, Ferrite is better)"
starved=$(awk -v s="$STARVED" '$5 < s || $6 < s' "$TMP/records" | wc -l)
[ "$starved" = 0 ] || echo "$starved of $(wc -l <"$TMP/records") runs were STARVED (marked above): other threads held a polled core; their cells measure the machine's load as much as the targets"
for c in $CELLS; do
  [ -e "$TMP/series-ferrite-$c" ] && [ -e "$TMP/series-spdk-$c" ] || continue
  plot_cell "vhost-${c%%:*}-qd${c##*:}" "vhost-user-blk malloc ${c%%:*} 4 KiB QD ${c##*:} (bdevperf virtio-user client)" \
    "$TMP/series-ferrite-$c" spdk-vhost "$TMP/series-spdk-$c"
done
