# Guest side of tests/vm/vhost-guest.sh (runs as root in the QEMU guest, Debian's 6.1 kernel):
# /dev/vda is Ferrite's vhost-user-blk controller on bdev Guest0, /dev/vdb a read-only
# controller on the same bdev, /dev/vdc a controller on a null bdev that the host grows. Checks, in order: the disks' size, queues, serial and read-only
# flags; an ext4 round trip (md5 compared after a remount); fio verify with two jobs on two
# queues; discard and write zeroes read back as zeroes; the read-only disk refuses a write and
# reads what the writable one wrote (the device's own refusal of writes, which the kernel's
# read-only flag keeps from reaching it, is tested host-side: crates/vhost/tests/vring.rs); the
# null bdev grown by bdev_null_resize, an lvol grown by bdev_lvol_resize (/dev/vdd) and a file
# grown under a uring bdev and rescanned (/dev/vde) show their new sizes in the guest; the
# cache turned to writethrough (CONFIG_WCE) makes the device flush every write.
set -u
export LC_ALL=C
# shellcheck source=guest-lib.sh
. /host/guest-lib.sh
step() { echo "=== $*"; }
modprobe crc32c_generic; modprobe ext4
for d in vda vdb vdc vdd vde; do [ -b /dev/$d ] || fail "no /dev/$d"; done
# grows DISK REQUEST...: asks the host to grow the bdev behind DISK and waits for the new size.
grows() {
  local disk=$1 before after
  shift
  before=$(cat /sys/block/$disk/size)
  host "$@"
  for _ in $(seq 100); do [ "$(cat /sys/block/$disk/size)" != "$before" ] && break; sleep 0.1; done
  after=$(cat /sys/block/$disk/size)
  echo "$disk: $before -> $after sectors"
}

step "1 disks"
echo "vda: $(cat /sys/block/vda/size) sectors, $(ls /sys/block/vda/mq | wc -l) queues, ro=$(cat /sys/block/vda/ro), serial=$(cat /sys/block/vda/serial 2>/dev/null)"
echo "vdb: $(cat /sys/block/vdb/size) sectors, ro=$(cat /sys/block/vdb/ro)"
[ "$(cat /sys/block/vda/size)" = 524288 ] || fail "vda is not 256 MiB"
[ "$(cat /sys/block/vda/queue/logical_block_size)" = 4096 ] || fail "vda's logical block size is not 4096"
[ "$(ls /sys/block/vda/mq | wc -l)" -ge 2 ] || fail "vda has fewer than 2 queues"
[ "$(cat /sys/block/vda/ro)" = 0 ] || fail "vda is read-only"
[ "$(cat /sys/block/vdb/ro)" = 1 ] || fail "vdb (read-only controller) is writable"
[ "$(cat /sys/block/vda/serial 2>/dev/null)" = Guest0 ] || fail "vda's serial is not the bdev's name"

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
  --numjobs=2 --size=24M --offset_increment=32M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --cpus_allowed_policy=split --cpus_allowed=0-1 --group_reporting --output-format=terse --terse-version=3 \
  >/tmp/fio.v 2>/tmp/fio.err || { cat /tmp/fio.v /tmp/fio.err; fail "fio verify"; }
T=$(grep '^3;' /tmp/fio.v)
echo "fio verify: errors=$(echo "$T" | cut -d';' -f5) read_ios=$(echo "$T" | cut -d';' -f6)"
[ "$(echo "$T" | cut -d';' -f5)" = 0 ] || fail "fio verify reported errors"
for q in /sys/block/vda/mq/*; do echo "queue $(basename "$q"): cpu_list=$(cat "$q"/cpu_list)"; done

step "4 discard and write zeroes"
dd if=/dev/urandom of=/dev/vda bs=1M count=4 seek=100 oflag=direct status=none || fail "write before discard"
blkdiscard -o $((100 << 20)) -l $((2 << 20)) /dev/vda || fail blkdiscard
blkdiscard -z -o $((102 << 20)) -l $((2 << 20)) /dev/vda || fail "blkdiscard -z"
Z=$(dd if=/dev/vda bs=1M count=4 skip=100 iflag=direct status=none | tr -d '\0' | wc -c)
[ "$Z" = 0 ] || fail "discarded and zeroed blocks read back $Z non-zero bytes"
echo "discard + write zeroes: 4 MiB read back as zeroes"

step "5 read-only controller"
if dd if=/dev/urandom of=/dev/vdb bs=4k count=1 oflag=direct status=none 2>/tmp/ro.err; then
  fail "a write to the read-only disk succeeded"
fi
echo "write to vdb refused: $(head -1 /tmp/ro.err)"
A=$(dd if=/dev/vda bs=1M count=16 iflag=direct status=none | md5sum | cut -d' ' -f1)
B=$(dd if=/dev/vdb bs=1M count=16 iflag=direct status=none | md5sum | cut -d' ' -f1)
[ "$A" = "$B" ] || fail "the read-only disk reads other data than the writable one"
echo "vdb reads what vda wrote ($A)"
step "6 live resize"
grows vdc bdev_null_resize Null0 128
[ "$(cat /sys/block/vdc/size)" = 262144 ] || fail "the guest did not see the null bdev grow from 64 to 128 MiB"
dd if=/dev/vdc of=/dev/null bs=1M skip=100 count=8 iflag=direct status=none || fail "read past the old end"
dd if=/dev/urandom of=/tmp/lv bs=1M count=16 status=none
dd if=/tmp/lv of=/dev/vdd bs=1M oflag=direct status=none || fail "write to the lvol"
grows vdd bdev_lvol_resize lvs0/lv0 32
[ "$(cat /sys/block/vdd/size)" = 65536 ] || fail "the guest did not see the lvol grow from 16 to 32 MiB"
dd if=/tmp/lv of=/dev/vdd bs=1M seek=16 oflag=direct status=none || fail "write past the lvol's old end"
A=$(cat /tmp/lv /tmp/lv | md5sum | cut -d' ' -f1)
B=$(dd if=/dev/vdd bs=1M count=32 iflag=direct status=none | md5sum | cut -d' ' -f1)
[ "$A" = "$B" ] || fail "the grown lvol reads back other data"
echo "vdd: 32 MiB read back after the resize ($B)"
grows vde grow_file Grow0 64
[ "$(cat /sys/block/vde/size)" = 131072 ] || fail "the guest did not see the file grow from 32 to 64 MiB"
dd if=/tmp/lv of=/dev/vde bs=1M seek=48 oflag=direct status=none || fail "write past the file's old end"
B=$(dd if=/dev/vde bs=1M skip=48 count=16 iflag=direct status=none | md5sum | cut -d' ' -f1)
[ "$(md5sum </tmp/lv | cut -d' ' -f1)" = "$B" ] || fail "the grown file reads back other data"
echo "vde: written past the old end and read back ($B)"

step "7 writethrough cache (CONFIG_WCE)"
echo "cache: $(cat /sys/block/vda/cache_type)"
[ "$(cat /sys/block/vda/cache_type)" = "write back" ] || fail "vda's cache is not writeback at first"
echo "write through" >/sys/block/vda/cache_type || fail "the cache mode cannot be set"
[ "$(cat /sys/block/vda/cache_type)" = "write through" ] || fail "the device kept its writeback cache"
host flushes Guest0; f0=$(cat /host/out-$REQ)
dd if=/dev/urandom of=/dev/vda bs=4k count=32 seek=20000 oflag=direct status=none || fail "writes in writethrough mode"
host flushes Guest0; f1=$(cat /host/out-$REQ)
echo "flushes for 32 writes in writethrough mode: $((f1 - f0))"
[ $((f1 - f0)) -ge 32 ] || fail "the device did not flush each write in writethrough mode"
echo "write back" >/sys/block/vda/cache_type
echo "PASS: vhost guest"
