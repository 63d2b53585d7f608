# Guest side of tests/vm/vhost-migrate.sh: fio verify writes and checks the vhost-user-blk disk
# (serial Mig0) while the host migrates this guest to a second QEMU whose disk is a second
# controller of the same bdev. It has no host share (a 9p share blocks migration): the host
# starts the migration when it reads "=== migrate now" on the console, and reads the rest of
# this script's output on the destination's console.
set -u
export LC_ALL=C
fail() { echo "FAIL: $*"; exit 1; }
DEV=
for s in /sys/block/vd*; do [ "$(cat "$s/serial" 2>/dev/null)" = Mig0 ] && DEV=/dev/$(basename "$s"); done
[ -n "$DEV" ] || fail "no disk with serial Mig0"
echo "=== fio verify across a live migration ($DEV)"
# The second 64 MiB is written first with fio's checksummed blocks: the reader job checks every
# block it reads into guest memory, so a read whose pages the dirty log missed arrives in the
# destination with another block's data.
fio --name=fill --filename="$DEV" --offset=64M --size=64M --rw=write --bs=64k --direct=1 --ioengine=libaio \
  --iodepth=8 --verify=crc32c --verify_interval=4k --do_verify=0 --output-format=terse >/dev/null 2>/tmp/fio.ferr ||
  { cat /tmp/fio.ferr; fail "fio could not fill the read area"; }
fio --output-format=terse --terse-version=3 \
  --name=w --filename="$DEV" --size=64M --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
  --time_based --runtime=${RUNTIME:-45} --verify=crc32c --verify_fatal=1 --do_verify=1 --verify_backlog=64 \
  >/tmp/fio.w 2>/tmp/fio.werr &
W=$!
# fio reads and checks a written area once per run: run it again until the writer is done.
(
  n=0
  while kill -0 $W 2>/dev/null; do
    n=$((n + 1))
    fio --output-format=terse --terse-version=3 --name=r --filename="$DEV" --offset=64M --size=64M --rw=randread \
      --bs=4k --direct=1 --ioengine=libaio --iodepth=16 --verify=crc32c --verify_fatal=1 \
      >/tmp/fio.r 2>/tmp/fio.rerr || { echo "read pass $n: $(cat /tmp/fio.rerr | head -3)"; exit 1; }
  done
  echo "read passes: $n"
) &
R=$!
sleep 2
echo "=== migrate now"
wait $W; wrc=$?
wait $R; rrc=$?
T=$(grep '^3;' /tmp/fio.w)
echo "fio writer across the migration: rc=$wrc errors=$(echo "$T" | cut -d';' -f5); reader rc=$rrc"
[ "$wrc" = 0 ] || { cat /tmp/fio.werr; fail "fio's writer failed across the migration"; }
[ "$(echo "$T" | cut -d';' -f5)" = 0 ] || fail "fio's writer reported errors across the migration"
[ "$rrc" = 0 ] || fail "fio's reader found wrong data after the migration"
dmesg | grep -i "I/O error" && fail "the kernel logged I/O errors"
echo "PASS: vhost migration"
