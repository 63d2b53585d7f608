#!/usr/bin/env bash
# Ferrite's FUSE export vs qemu-storage-daemon's, both in this run, both used the way the host
# uses them: a loop device with direct I/O on the exported file, driven by fio (libaio, O_DIRECT,
# 4 KiB, one job pinned to core 1).
#   ferrite: `ferrite serve -m 0x1` (one reactor on core 0), 256 MiB malloc bdev, fuse_export_add.
#   qsd:     `--export type=fuse` of a 256 MiB file on tmpfs (driver=file; qemu has no RAM disk).
# Both exports are filled with random data first. Matrix: {randread, randwrite} x QD {1, 16};
# per cell: IOPS of each, the ratio, and each server's CPU time per I/O (utime+stime of the
# whole process from /proc/PID/stat around the run, / I/O count).
# Needs root, /dev/fuse and losetup. Usage: bench/fuse_vs_qsd.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
SIZE_MIB=256
QSD_IMG=/dev/shm/ferrite-fuse-qsd-$$.img
declare -A PID DEV

[[ $(id -u) == 0 ]] || fail "needs root (FUSE mounts and loop devices)"
[[ -e /dev/fuse ]] || fail "no /dev/fuse"
need fio fio
need losetup mount
need qemu-storage-daemon qemu-system-common

cleanup() {
  for s in "${!DEV[@]}"; do losetup -d "${DEV[$s]}" 2>/dev/null || true; done
  if [[ -n ${PID[ferrite]:-} ]]; then
    "$FERRITE" rpc -s "$TMP/rpc.sock" fuse_export_remove --path "$TMP/ferrite.img" >/dev/null 2>&1 || true
  fi
  for p in "${PID[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  umount "$TMP/qsd.img" 2>/dev/null || true
  rm -rf "$TMP" "$QSD_IMG"
}
trap cleanup EXIT

wait_for_mount() { # wait_for_mount PATH WHO
  for _ in $(seq 500); do
    grep -q " $1 fuse" /proc/mounts && return
    kill -0 "${PID[$2]}" 2>/dev/null || fail "$2 exited: $(tail -3 "$TMP/$2.log")"
    sleep 0.01
  done
  fail "$2: no FUSE mount at $1 after 5 s"
}

# --- servers --------------------------------------------------------------------------------
"$FERRITE" serve -m 0x1 -r "$TMP/rpc.sock" --log-level warn >"$TMP/ferrite.log" 2>&1 &
PID[ferrite]=$!
for _ in $(seq 500); do "$FERRITE" rpc -s "$TMP/rpc.sock" -t 1 spdk_get_version >/dev/null 2>&1 && break; sleep 0.01; done
"$FERRITE" rpc -s "$TMP/rpc.sock" bdev_malloc_create --name F0 --num-blocks $((SIZE_MIB * 256)) --block-size 4096 >/dev/null
"$FERRITE" rpc -s "$TMP/rpc.sock" fuse_export_add --bdev-name F0 --path "$TMP/ferrite.img" >/dev/null
wait_for_mount "$TMP/ferrite.img" ferrite

truncate -s ${SIZE_MIB}M "$QSD_IMG"
touch "$TMP/qsd.img"
qemu-storage-daemon --blockdev "driver=file,node-name=disk,filename=$QSD_IMG" \
  --export "type=fuse,id=exp0,node-name=disk,mountpoint=$TMP/qsd.img,writable=on" >"$TMP/qsd.log" 2>&1 &
PID[qsd]=$!
wait_for_mount "$TMP/qsd.img" qsd

for s in ferrite qsd; do
  DEV[$s]=$(losetup -f --show --direct-io=on "$TMP/$s.img")
  dd if=/dev/urandom of="${DEV[$s]}" bs=1M count=$SIZE_MIB oflag=direct status=none
done

# --- measurements ---------------------------------------------------------------------------
HZ=$(getconf CLK_TCK)
run() { # run SERVER RW QD: prints "IOPS CPU_US_PER_IO"
  local out="$OUT/fuse_${1}_${2}_qd${3}.json" c0 c1
  c0=$(cpu_ticks "${PID[$1]}")
  fio --name=fuse --filename="${DEV[$1]}" --direct=1 --ioengine=libaio --rw="$2" --bs=4k \
    --iodepth="$3" --runtime="$T" --time_based --cpus_allowed=1 --output-format=json --output="$out" >/dev/null
  c1=$(cpu_ticks "${PID[$1]}")
  python3 - "$out" "$2" "$((c1 - c0))" "$HZ" <<'PY'
import json, sys
out, rw, ticks, hz = sys.argv[1:]
j = json.load(open(out))["jobs"][0]["write" if rw.endswith("write") else "read"]
print(f"{j['iops']:.0f} {int(ticks) / int(hz) * 1e6 / max(j['total_ios'], 1):.1f}")
PY
}

echo "FUSE export through a loop device (direct I/O), fio libaio 4 KiB, 1 job on core 1, $T s per cell"
echo "ferrite: one reactor, malloc bdev | qsd: driver=file on tmpfs | cpu = server CPU us per I/O"
printf '%-10s %3s | %10s %10s | %7s | %8s %8s\n' rw qd ferrite qsd ratio cpu_f cpu_q
for rw in randread randwrite; do
  for qd in 1 16; do
    read -r fi fc < <(run ferrite "$rw" "$qd")
    read -r qi qc < <(run qsd "$rw" "$qd")
    printf '%-10s %3s | %10s %10s | %7.2f | %8s %8s\n' "$rw" "$qd" "$fi" "$qi" "$(python3 -c "print($fi/$qi)")" "$fc" "$qc"
  done
done
