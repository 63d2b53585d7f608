# Guest side of tests/vm/vhost-packed-guest.sh (runs as root in the QEMU guest, Debian's 6.1
# kernel): /dev/vda is Ferrite's vhost-user-blk controller with packed_ring, attached with
# QEMU's packed=on and two queues. Checks, in order: the driver negotiated the packed ring
# (feature bit 34) and the disk has two queues; an ext4 round trip (md5 compared after a
# remount); fio verify with two jobs on two queues; fio verify on both queues across a kill -9
# and restart of the daemon (the host slows the bdev first so that requests are in flight at
# the kill); after it the ring is still packed and a write reads back.
set -u
export LC_ALL=C
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "=== $*"; }
modprobe crc32c_generic; modprobe ext4
[ -b /dev/vda ] || fail "no /dev/vda"
# host REQUEST: asks the host to do something (through the shared folder); fails on an error.
REQ=0
host() {
  REQ=$((REQ + 1))
  echo "$*" >/host/.req-$REQ && mv /host/.req-$REQ /host/req-$REQ
  for _ in $(seq 300); do [ -f /host/ack-$REQ ] && break; sleep 0.1; done
  [ -f /host/ack-$REQ ] || fail "host did not answer request $REQ ($*) within 30 s"
  [ "$(cat /host/ack-$REQ)" = 0 ] || fail "host request $REQ ($*) failed"
}
packed() {
  local f
  f=$(cat /sys/block/vda/device/features)
  echo "${f:34:1}"
}

step "1 packed ring"
echo "vda: $(cat /sys/block/vda/size) sectors, $(ls /sys/block/vda/mq | wc -l) queues, features $(cat /sys/block/vda/device/features)"
[ "$(packed)" = 1 ] || fail "VIRTIO_F_RING_PACKED (bit 34) was not negotiated"
[ "$(ls /sys/block/vda/mq | wc -l)" -ge 2 ] || fail "vda has fewer than 2 queues"
echo "packed ring: bit 34 negotiated"
host stats

step "2 ext4 round trip"
mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 /dev/vda || fail mkfs
mkdir -p /mnt/t && mount /dev/vda /mnt/t || fail mount
dd if=/dev/urandom of=/tmp/src bs=1M count=16 status=none
cp /tmp/src /mnt/t/file && sync
A=$(md5sum </tmp/src | cut -d' ' -f1)
umount /mnt/t; echo 3 >/proc/sys/vm/drop_caches
mount -o ro /dev/vda /mnt/t || fail remount
B=$(md5sum </mnt/t/file | cut -d' ' -f1)
umount /mnt/t
echo "md5 written=$A read=$B"
[ "$A" = "$B" ] || fail "ext4 file read back differs"

step "3 fio verify, two jobs on two queues"
fio --name=v --filename=/dev/vda --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
  --numjobs=2 --size=16M --offset_increment=32M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --cpus_allowed_policy=split --cpus_allowed=0-1 --group_reporting --output-format=terse --terse-version=3 \
  >/tmp/fio.v 2>/tmp/fio.err || { cat /tmp/fio.v /tmp/fio.err; fail "fio verify"; }
T=$(grep '^3;' /tmp/fio.v)
echo "fio verify: errors=$(echo "$T" | cut -d';' -f5) read_ios=$(echo "$T" | cut -d';' -f6)"
[ "$(echo "$T" | cut -d';' -f5)" = 0 ] || fail "fio verify reported errors"

step "4 restart under fio verify, two queues"
host slow
fio --name=r --filename=/dev/vda --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
  --numjobs=2 --size=16M --offset_increment=64M --time_based --runtime="${RUNTIME:-10}" --verify=crc32c \
  --verify_fatal=1 --do_verify=1 --verify_backlog=64 --cpus_allowed_policy=split --cpus_allowed=0-1 \
  --group_reporting --output-format=terse --terse-version=3 >/tmp/fio.r 2>/tmp/fio.rerr &
FIO=$!
sleep 3
host restart
echo "daemon restarted by the host"
wait $FIO; rc=$?
T=$(grep '^3;' /tmp/fio.r)
echo "fio across the restart: rc=$rc errors=$(echo "$T" | cut -d';' -f5) write_ios=$(echo "$T" | cut -d';' -f49)"
[ "$rc" = 0 ] || { cat /tmp/fio.rerr; fail "fio failed across the restart"; }
[ "$(echo "$T" | cut -d';' -f5)" = 0 ] || fail "fio reported errors across the restart"
dmesg | grep -i "I/O error" && fail "the kernel logged I/O errors"

step "5 after the restart"
[ "$(packed)" = 1 ] || fail "the ring is no longer packed"
host stats
dd if=/dev/urandom of=/tmp/blk bs=1M count=4 status=none
dd if=/tmp/blk of=/dev/vda bs=1M seek=200 oflag=direct status=none || fail "write after the restart"
echo 3 >/proc/sys/vm/drop_caches
A=$(md5sum </tmp/blk | cut -d' ' -f1)
B=$(dd if=/dev/vda bs=1M skip=200 count=4 iflag=direct status=none | md5sum | cut -d' ' -f1)
echo "md5 after the restart written=$A read=$B"
[ "$A" = "$B" ] || fail "data written after the restart reads back differently"
echo "PASS: vhost packed guest"
