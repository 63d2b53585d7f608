#!/usr/bin/env bash
# A Linux guest's virtio-blk driver (Debian's 6.1 kernel under QEMU, ../shared/vm) on a
# vhost-user-blk disk served by Ferrite's vhost target and then by SPDK v26.05's vhost app, in
# this run: fio 4 KiB randread at QD 1 (libaio, O_DIRECT, over the first 64 MiB, written once
# first) for SECONDS. Each target polls on core 0 with a 256 MiB malloc bdev; QEMU (one vCPU,
# so one virtqueue) runs on core 1. QEMU is TCG (software emulation): the guest's own cost per
# I/O dwarfs the target's, so only the ratio of the two targets means anything.
# The guest's memory is a hugetlbfs memfd (2 MiB pages) for both targets: SPDK's vhost needs
# hugepage-backed guest memory (crates/virtio-user/src/shm.rs says why), and both get the same.
# Needs root (hugepages, reserved here and given back), SPDK (../shared/anchors), QEMU and the
# guest image (../shared/vm/build-guest.sh, built here if missing); prints SKIP otherwise.
# The targets run in the order ORDER (default "ferrite spdk spdk ferrite": drift hits both
# alike); medians are reported. The machine may be shared: each run reports how long the target
# and QEMU were runnable but kept off their cores (schedstat), which other work causes.
# Usage: bench/vhost_guest_vs_spdk.sh [SECONDS]   (default 20)
source "$(dirname "$0")/common.sh"
T=${1:-20}
ORDER=${ORDER:-ferrite spdk spdk ferrite}
need_spdk bin/vhost
[ "$(id -u)" = 0 ] || { echo "SKIP: the guest's hugepage memory and SPDK's need root to reserve"; exit 0; }
VM=$(cd "$ROOT/../shared/vm" 2>/dev/null && pwd) || { echo "SKIP: ../shared/vm not found"; exit 0; }
command -v qemu-system-x86_64 >/dev/null || need qemu-system-x86_64 qemu-system-x86
need taskset util-linux
out=$(bash "$VM/build-guest.sh" 2>&1) || { echo "SKIP: the guest could not be built: $(tail -3 <<<"$out")"; exit 0; }
HUGE_BEFORE=$(cat /proc/sys/vm/nr_hugepages)
TPID=
# stop_target: kills the target (SPDK's trace file of a killed app is removed too).
stop_target() {
  stop_pids $TPID
  [ -z "$TPID" ] || rm -f "/dev/shm/vhost_trace.pid$TPID"
  TPID=
}
cleanup() {
  stop_target
  echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages
  rm -rf "$TMP"
}
trap cleanup EXIT
GUEST_MB=512
# The guest's memory (256 pages) and SPDK's vhost: -s 512 and the 256 MiB malloc bdev took 385.
want=$((GUEST_MB / 2 + 512))
[ "$HUGE_BEFORE" -ge $want ] || echo $want >/proc/sys/vm/nr_hugepages
mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }
[ "$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)" -ge "$want" ] || { echo "SKIP: not enough free hugepages"; exit 0; }
export LD_LIBRARY_PATH=$SPDK_DIR/build/lib
RPCPY() { PYTHONPATH=$SPDK_DIR/python python3 "$SPDK_DIR/scripts/rpc.py" "$@"; }
MIB=256

cat >"$TMP/guest.sh" <<EOF
#!/bin/bash
set -e
DEV=/dev/vda
[ -b \$DEV ] || { echo "FAIL: no \$DEV"; exit 1; }
echo "disk: \$(cat /sys/block/vda/size) sectors, queues: \$(ls /sys/block/vda/mq | wc -l)"
dd if=/dev/urandom of=/tmp/src bs=1M count=64 status=none
dd if=/tmp/src of=\$DEV bs=1M oflag=direct status=none
fio --name=rr --filename=\$DEV --rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=1 \
  --runtime=$T --time_based --size=64M --output-format=terse --terse-version=3 --numjobs=1 >/tmp/fio
echo "FIO iops=\$(cut -d';' -f8 /tmp/fio) lat_mean_us=\$(cut -d';' -f40 /tmp/fio)"
# What fio read was what was written: the first 64 MiB read back whole.
cmp /tmp/src <(dd if=\$DEV bs=1M count=64 iflag=direct status=none) && echo "READBACK ok"
EOF

# start_target NAME: starts it on core 0 with a 256 MiB malloc bdev exported at $TMP/NAME/vhost.0.
start_target() {
  mkdir -p "$TMP/$1"
  rm -f "$TMP/$1/vhost.0" "$TMP/$1.sock" # a killed target's sockets stay behind
  case $1 in
    ferrite)
      "$FERRITE" serve -m 0x1 --reactor-mode poll -S "$TMP/$1" -r "$TMP/$1.sock" --log-level warn >"$TMP/$1.log" 2>&1 &
      TPID=$!
      for _ in $(seq 200); do [ -S "$TMP/$1.sock" ] && break; sleep 0.05; done
      "$FERRITE" rpc -s "$TMP/$1.sock" bdev_malloc_create --name M0 --num-blocks $((MIB * 256)) --block-size 4096 >/dev/null
      "$FERRITE" rpc -s "$TMP/$1.sock" vhost_create_blk_controller '{"ctrlr":"vhost.0","dev_name":"M0"}' >/dev/null ;;
    spdk)
      "$SPDK_DIR/build/bin/vhost" -m 0x1 -s 512 --disable-cpumask-locks -S "$TMP/$1" -r "$TMP/$1.sock" >"$TMP/$1.log" 2>&1 &
      TPID=$!
      for _ in $(seq 200); do [ -S "$TMP/$1.sock" ] && break; sleep 0.05; done
      RPCPY -s "$TMP/$1.sock" bdev_malloc_create -b M0 "$MIB" 4096 >/dev/null
      RPCPY -s "$TMP/$1.sock" vhost_create_blk_controller vhost.0 M0 >/dev/null ;;
  esac
  [ -S "$TMP/$1/vhost.0" ] || fail "$1: no vhost socket ($(tail -3 "$TMP/$1.log"))"
}

# run_delay_ms PID...: how long the threads of PIDs were runnable but waited for a CPU, in ms
# (second field of /proc/PID/task/*/schedstat, ns).
run_delay_ms() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done | awk '{ns += $2} END {printf "%d", ns / 1e6}'
}

# tree PID: PID and its descendants.
tree() {
  local c
  echo "$1"
  for c in $(pgrep -P "$1" || true); do tree "$c"; done
}

echo "guest fio 4 KiB randread QD 1, ${T}s, TCG guest (1 vCPU, core 1), target polling on core 0, malloc"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$TMP/records"
for who in $ORDER; do
  start_target "$who"
  rc=0
  before=$(run_delay_ms "$TPID")
  # The guest's memory: a hugetlbfs memfd in place of run-guest.sh's plain one (the machine
  # option given last wins; the plain one stays unused).
  taskset -c 1 bash "$VM/run-guest.sh" -c 1 -m ${GUEST_MB}M -t $((T + 120)) -b "$TMP/$who/vhost.0" -l "$TMP/$who.console" \
    -q -object -q "memory-backend-memfd,id=hmem,size=${GUEST_MB}M,share=on,hugetlb=on,hugetlbsize=2M" \
    -q -machine -q memory-backend=hmem "$TMP/guest.sh" >/dev/null 2>&1 &
  gpid=$!
  # QEMU's wait, sampled every 0.5 s while it runs (the last sample of each process counts).
  declare -A qwait=()
  while kill -0 "$gpid" 2>/dev/null; do
    for p in $(tree "$gpid"); do
      d=$(run_delay_ms "$p")
      [ "${d:-0}" -gt "${qwait[$p]:-0}" ] && qwait[$p]=$d
    done
    sleep 0.5
  done
  wait "$gpid" || rc=$?
  twait=$(($(run_delay_ms "$TPID") - before))
  gwait=0
  for p in "${!qwait[@]}"; do gwait=$((gwait + qwait[$p])); done
  unset qwait
  kill -0 "$TPID" 2>/dev/null || fail "$who exited during the guest's run: $(tail -5 "$TMP/$who.log")"
  stop_target
  line=$(grep -a "^FIO " "$TMP/$who.console" || true)
  [ "$rc" = 0 ] && [ -n "$line" ] || fail "$who: guest exit $rc; console ends: $(tail -8 "$TMP/$who.console"); target log: $(tail -5 "$TMP/$who.log")"
  grep -aq "^READBACK ok" "$TMP/$who.console" || fail "$who: the guest read back other data than it wrote"
  iops=$(sed -n 's/.*iops=\([0-9]*\).*/\1/p' <<<"$line")
  lat=$(sed -n 's/.*lat_mean_us=\([0-9.]*\).*/\1/p' <<<"$line")
  echo "$who $iops $lat" >>"$TMP/records"
  echo "  $who: $iops IOPS, mean latency ${lat} us ($(grep -a '^disk:' "$TMP/$who.console"));" \
    "off-CPU while runnable over the guest's life: target ${twait} ms, QEMU ${gwait} ms"
done
python3 - "$TMP/records" <<'P'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
def med(who, i):
    v = [float(r[i]) for r in rows if r[0] == who]
    return statistics.median(v) if v else float("nan")
f, s = med("ferrite", 1), med("spdk", 1)
print(f"ferrite {f:.0f} IOPS, spdk {s:.0f} IOPS: Ferrite/SPDK {f / s:.2f} (goal >= 1)")
P
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
