#!/usr/bin/env bash
# uring bdev vs fio (io_uring, O_DIRECT) on the same 1 GiB file in /dev/shm, 4 KiB randread, one
# core, QD 1 and 32, both in this run. Usage: bench/uring_vs_fio.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
need fio fio
FILE=/dev/shm/ferrite-bench-$$
trap 'rm -rf "$TMP" "$FILE"' EXIT
dd if=/dev/urandom of="$FILE" bs=1M count=1024 status=none
cat > "$TMP/uring.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_uring_create","params":{"name":"Uring0","filename":"$FILE","block_size":4096}}]}]}
J
printf '%4s %14s %14s %7s\n' qd ferrite_iops fio_iops ratio
for qd in 1 32; do
  res="$OUT/uring_qd${qd}.json"
  "$FERRITE" perf --json "$TMP/uring.json" -q "$qd" -o 4096 -w randread -t "$T" -m 0x1 --results-json "$res" >/dev/null
  iops=$(json_get "$res" "int(d['total']['iops'])")
  fio --name=peer --filename="$FILE" --ioengine=io_uring --direct=1 --rw=randread --bs=4k \
    --iodepth="$qd" --runtime="$T" --time_based --cpus_allowed=0 --output-format=json \
    --output="$OUT/fio_qd${qd}.json" >/dev/null
  fio_iops=$(json_get "$OUT/fio_qd${qd}.json" "int(d['jobs'][0]['read']['iops'])")
  printf '%4s %14s %14s %7.2f\n' "$qd" "$iops" "$fio_iops" "$(python3 -c "print($iops/$fio_iops)")"
done
