# Guest side of tests/vm/pr-guest.sh (root in the QEMU guest, Debian's 6.1 kernel). The host
# wrapper prepends NVME_PORT, ISCSI_PORT, NQN and IQN: one bdev, as an iSCSI LUN (open-iscsi,
# sg_persist) and as an NVMe namespace (nvme-cli), both at 10.0.2.2.
#   1 both attach; a write through each reads back through the other;
#   2 SCSI registers and takes Write Exclusive: the NVMe host sees it in its Reservation
#     Report, its write is refused and changes nothing, its read works; the holder's write
#     reads back over NVMe; the SCSI release lets the NVMe write through;
#   3 the other way: NVMe registers and acquires Write Exclusive: sg_persist reads it, the SCSI
#     write is refused, the SCSI read works, the holder's write reads back over iSCSI; released,
#     the SCSI write goes through; both unregister and the registry is empty.
set -u
export LC_ALL=C
fail() {
  echo "FAIL: $*"
  echo "--- dmesg (last 40 lines)"; dmesg | tail -n 40
  exit 1
}
ok() { echo "ok: $*"; }

echo "=== 1. attach over both protocols"
modprobe crc32c_generic; modprobe iscsi_tcp; modprobe sd_mod; modprobe sg
modprobe nvme-tcp || fail "modprobe nvme-tcp"
iscsid; sleep 0.5
PORTAL=10.0.2.2:$ISCSI_PORT
iscsiadm -m node -o new -T "$IQN" -p "$PORTAL" >/dev/null || fail "iscsiadm node"
iscsiadm -m node -T "$IQN" -p "$PORTAL" --login >/dev/null || fail "iscsiadm login"
for _ in $(seq 100); do S=$(ls /sys/class/iscsi_session/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$S" ] && break; sleep 0.1; done
[ -n "$S" ] || fail "no iSCSI disk"
SD=/dev/$S
nvme connect -t tcp -a 10.0.2.2 -s "$NVME_PORT" -n "$NQN" >/dev/null || fail "nvme connect"
NV=
for _ in $(seq 100); do
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
    for d in /sys/block/nvme*n1; do [ -b "/dev/${d##*/}" ] && NV=/dev/${d##*/}; done
  done
  [ -n "$NV" ] && break; sleep 0.1
done
[ -n "$NV" ] || fail "no NVMe disk"
echo "iSCSI disk $SD, NVMe disk $NV"
for i in 0 1 2 3 4 5; do dd if=/dev/urandom of=/tmp/r$i bs=4k count=16 status=none; done
# rd DEV: the 64 KiB at offset 0 through DEV, uncached.
rd() { dd if="$1" of=/tmp/rd bs=4k count=16 iflag=direct status=none; }
dd if=/tmp/r0 of="$SD" bs=4k oflag=direct status=none || fail "iSCSI write"
rd "$NV" && cmp -s /tmp/r0 /tmp/rd || fail "NVMe does not read what iSCSI wrote"
dd if=/tmp/r1 of="$NV" bs=4k oflag=direct status=none || fail "NVMe write"
rd "$SD" && cmp -s /tmp/r1 /tmp/rd || fail "iSCSI does not read what NVMe wrote"
ok "one bdev: each protocol reads the other's writes"

echo "=== 2. a SCSI reservation fences the NVMe host"
sg_persist -n --out --register --param-sark=0xa1 "$SD" || fail "sg_persist register"
sg_persist -n --out --reserve --param-rk=0xa1 --prout-type=1 "$SD" || fail "sg_persist reserve Write Exclusive"
sg_persist -n --in --read-reservation "$SD" | tee /tmp/pr
grep -qi "0xa1" /tmp/pr || fail "sg_persist does not read its own reservation"
rep=$(nvme resv-report "$NV" -n 1 --eds 2>&1 || nvme resv-report "$NV" -n 1 --cdw11=1 2>&1); echo "$rep"
echo "$rep" | grep -qiE 'rtype *: *1' || fail "the NVMe Reservation Report shows no Write Exclusive"
if dd if=/tmp/r2 of="$NV" bs=4k oflag=direct status=none 2>/tmp/err; then
  fail "the NVMe write went through the SCSI Write Exclusive"
fi
ok "NVMe write refused: $(tail -n 1 /tmp/err)"
rd "$NV" && cmp -s /tmp/r1 /tmp/rd || fail "the NVMe host cannot read, or its refused write changed the data"
dd if=/tmp/r3 of="$SD" bs=4k oflag=direct status=none || fail "the SCSI holder's write"
rd "$NV" && cmp -s /tmp/r3 /tmp/rd || fail "NVMe does not read the SCSI holder's write"
sg_persist -n --out --release --param-rk=0xa1 --prout-type=1 "$SD" || fail "sg_persist release"
dd if=/tmp/r2 of="$NV" bs=4k oflag=direct status=none || fail "the NVMe write after the SCSI release"
rd "$SD" && cmp -s /tmp/r2 /tmp/rd || fail "iSCSI does not read the NVMe write after the release"
ok "SCSI Write Exclusive: NVMe writes refused, reads served; released, NVMe writes again"

echo "=== 3. an NVMe reservation fences the SCSI initiator"
nvme resv-register "$NV" -n 1 --nrkey=0xb2 --rrega=0 || fail "nvme resv-register"
nvme resv-acquire "$NV" -n 1 --crkey=0xb2 --rtype=1 --racqa=0 || fail "nvme resv-acquire Write Exclusive"
sg_persist -n --in --read-reservation "$SD" | tee /tmp/pr
grep -qi "0xb2" /tmp/pr || fail "sg_persist does not show the NVMe host's reservation key"
grep -qi "Write Exclusive" /tmp/pr || fail "sg_persist does not show Write Exclusive"
sg_persist -n --in --read-keys "$SD" | tee /tmp/keys
grep -qi "0xa1" /tmp/keys && grep -qi "0xb2" /tmp/keys || fail "not both protocols' keys registered"
if dd if=/tmp/r4 of="$SD" bs=4k oflag=direct status=none 2>/tmp/err; then
  fail "the SCSI write went through the NVMe Write Exclusive"
fi
ok "SCSI write refused: $(tail -n 1 /tmp/err)"
rd "$SD" && cmp -s /tmp/r2 /tmp/rd || fail "the SCSI initiator cannot read, or its refused write changed the data"
dd if=/tmp/r5 of="$NV" bs=4k oflag=direct status=none || fail "the NVMe holder's write"
rd "$SD" && cmp -s /tmp/r5 /tmp/rd || fail "iSCSI does not read the NVMe holder's write"
nvme resv-release "$NV" -n 1 --crkey=0xb2 --rtype=1 --rrela=0 || fail "nvme resv-release"
dd if=/tmp/r4 of="$SD" bs=4k oflag=direct status=none || fail "the SCSI write after the NVMe release"
rd "$NV" && cmp -s /tmp/r4 /tmp/rd || fail "NVMe does not read the SCSI write after the release"
nvme resv-register "$NV" -n 1 --crkey=0xb2 --rrega=1 || fail "nvme unregister"
sg_persist -n --out --register --param-rk=0xa1 --param-sark=0 "$SD" || fail "sg_persist unregister"
sg_persist -n --in --read-keys "$SD" | tee /tmp/keys
grep -qi "no registered" /tmp/keys || fail "keys left after both unregistered"
ok "NVMe Write Exclusive: SCSI writes refused, reads served; released, SCSI writes again"

nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout >/dev/null || fail "iscsiadm logout"
echo "PASS: reservations across iSCSI and NVMe/TCP"
