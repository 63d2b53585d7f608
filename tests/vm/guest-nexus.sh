# Guest side of tests/vm/nexus-guest.sh (runs as root in the QEMU guest, Debian's 6.1 kernel).
# The host wrapper prepends PORT, NQN and MIB. The kernel's NVMe/TCP host (nvme-cli) against the
# published nexus at 10.0.2.2 (the host's 127.0.0.1); asks the host for the crashes through the
# shared folder (tests/vm/guest-lib.sh's `host`).
set -u
# shellcheck source=guest-lib.sh
. /host/guest-lib.sh
export LC_ALL=C
T0=$(cut -d' ' -f1 /proc/uptime)
step() { echo "=== [+$(awk -v t0="$T0" '{printf "%.1f", $1 - t0}' /proc/uptime)s] $*"; }
ok() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  echo "--- dmesg (last 40 lines)"; dmesg | tail -n 40
  exit 1
}

modprobe nvme-tcp 2>/dev/null
step "connect to $NQN at 10.0.2.2:$PORT"
nvme connect -t tcp -a 10.0.2.2 -s "$PORT" -n "$NQN" --reconnect-delay=1 --ctrl-loss-tmo=120 ||
  fail "nvme connect"
D=
for _ in $(seq 100); do
  for b in /sys/block/nvme*n*; do
    [[ ${b##*/} =~ ^nvme[0-9]+n[0-9]+$ ]] && D=/dev/${b##*/}
  done
  [ -n "$D" ] && [ -b "$D" ] && break
  sleep 0.1
done
[ -b "$D" ] || fail "no namespace device"
size=$(blockdev --getsize64 "$D")
[ "$size" = $((MIB << 20)) ] || fail "$D is $size bytes, not $MIB MiB"
ok "$D, $MIB MiB"

# ------------------------------------------------------------------ 1. fio verify, B killed
step "1. fio randwrite + crc32c verify over the whole device; replica B killed with -9 mid-run"
fio --name=nexus --filename="$D" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=32 \
  --size=${MIB}M --rate_iops=4000 --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1 \
  --output=/tmp/fio.out &
FIO=$!
sleep 1
host kill_b
kill -0 $FIO 2>/dev/null || fail "fio ended before B was killed (not mid-run)"
wait $FIO
rc=$?
[ $rc = 0 ] || { cat /tmp/fio.out; fail "fio exited $rc"; }
grep -q ' err= 0' /tmp/fio.out || { cat /tmp/fio.out; fail "fio reported errors"; }
grep -E 'write: IOPS|read: IOPS' /tmp/fio.out
ok "fio wrote and verified $MIB MiB with no error while B died"
dmesg | grep -iE 'nvme.*(error|I/O)' | tail -n 3

# ------------------------------------------------------------------ 2. B back, partial rebuild
step "2. B restarted; its child brought back (nexus_online_child), partially rebuilt, rate-bounded"
host restart_b
ok "B's partial rebuild is running"

# ------------------------------------------------------------------ 3. A killed mid-rebuild
step "3. A (the nexus's daemon) killed with -9 mid-rebuild and restarted from its config and store"
host crash_a
ok "the nexus reassembled from the healthy children; B is rebuilt in full from them"
dd if=/dev/urandom of=/tmp/src bs=1M count=4 status=none
timeout 90 dd if=/tmp/src of="$D" bs=1M seek=8 oflag=direct status=none || fail "write after A's restart"
timeout 30 dd if="$D" of=/tmp/rd bs=1M skip=8 count=4 iflag=direct status=none || fail "read after A's restart"
cmp -s /tmp/src /tmp/rd || fail "what was written after A's restart reads back different"
dmesg | grep -qiE 'Successfully reconnected' || fail "the kernel did not report a reconnection"
ok "the kernel reconnected; a 4 MiB write reads back"
m1=$(dd if="$D" bs=1M iflag=direct status=none | md5sum | cut -d' ' -f1)

# ------------------------------------------------------------------ 4. same data everywhere
step "4. the rebuild ends: every child holds the same bytes, as the guest reads them"
host finish
m2=$(dd if="$D" bs=1M iflag=direct status=none | md5sum | cut -d' ' -f1)
[ "$m1" = "$m2" ] || fail "the device read $m1 during the rebuild and $m2 after"
[ "$m2" = "$(cat /host/out-$REQ)" ] || fail "the guest reads $m2, the children hold $(cat /host/out-$REQ)"
ok "device md5 $m2 = each child's"
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
echo "PASS"
