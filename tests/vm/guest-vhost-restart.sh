# Guest side of the restart phase of tests/vm/vhost-guest.sh: the disk whose serial is Guest1
# is served by a daemon that the host kills with -9 and starts again while fio verify writes
# and checks it; QEMU reconnects (reconnect=1 on its chardev), the new daemon takes the
# requests that were in flight from the inflight area QEMU kept, and fio finishes without an
# error.
set -u
export LC_ALL=C
# shellcheck source=guest-lib.sh
. /host/guest-lib.sh
DEV=
for s in /sys/block/vd*; do [ "$(cat "$s/serial" 2>/dev/null)" = Guest1 ] && DEV=/dev/$(basename "$s"); done
[ -n "$DEV" ] || fail "no disk with serial Guest1"
echo "=== 7 restart under fio verify ($DEV)"
fio --name=r --filename="$DEV" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 --numjobs=1 \
  --size=32M --time_based --runtime=${RUNTIME:-12} --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --verify_backlog=64 --output-format=terse --terse-version=3 >/tmp/fio.r 2>/tmp/fio.rerr &
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
echo "PASS: vhost restart"
