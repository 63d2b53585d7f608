#!/usr/bin/env bash
# Logical volumes with real clients, ending in a Linux guest (../shared/vm): a disk image is
# converted into a thin lvol over NBD with qemu-img, snapshotted and cloned; the guest kernel's
# NBD client writes the clone raw, makes ext4 on it, mounts it and compares (tests/guest-nbd.sh of
# the shared harness); then the original lvol and the snapshot still compare equal to the image
# (qemu-img compare); a guest file system on another thin lvol gives its clusters back with fstrim;
# and after a clean shutdown `ferrite blobstore check` passes on the file.
# Prints SKIP with the reason when the guest cannot be built.
# Usage: tests/vm/lvol-guest.sh [FERRITE_BINARY]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup lvol-guest "${1:-}" qemu-img qemu-io

TMP=$(mktemp -d)
SOCK=$TMP/ferrite.sock
PORT=${NBD_PORT:-$(free_port)}
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
fail() { echo "FAIL lvol-guest: $*"; exit 1; }
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
start() {
  "$FERRITE" serve -m 0x1 -r "$SOCK" --log-level warn &
  PID=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
  rpc bdev_uring_create --name U0 --filename "$TMP/store.img" --block-size 4096 >/dev/null
  rpc bdev_wait_for_examine >/dev/null
}

# The disk image to import: 64 MiB qcow2 with data at both ends and in the middle.
qemu-img create -q -f qcow2 "$TMP/src.qcow2" 64M
qemu-io -f qcow2 -c "write -P 0x5a 0 4M" -c "write -P 0xa5 30M 3M" -c "write -P 0x3c 60M 4M" "$TMP/src.qcow2" >/dev/null

truncate -s 512M "$TMP/store.img"
start
rpc bdev_lvol_create_lvstore --bdev-name U0 --lvs-name lvs0 --cluster-sz 1048576 >/dev/null
rpc bdev_lvol_create --lvs-name lvs0 --lvol-name vol --size-in-mib 64 --thin-provision true >/dev/null
rpc nbd_server_start --address "127.0.0.1:$PORT" >/dev/null
rpc nbd_server_add_export --bdev-name lvs0/vol --name vol >/dev/null
U=nbd://127.0.0.1:$PORT
qemu-img convert -n -f qcow2 -O raw "$TMP/src.qcow2" "$U/vol" || fail "qemu-img convert into the lvol"
qemu-img compare -f qcow2 -F raw "$TMP/src.qcow2" "$U/vol" >/dev/null || fail "the lvol differs from the image"
ALLOC=$(rpc bdev_lvol_get_lvols | python3 -c 'import json,sys; print([l for l in json.load(sys.stdin) if l["name"]=="vol"][0]["num_allocated_clusters"])')
echo "lvol-guest: imported; the thin lvol holds $ALLOC of its 64 clusters"
[ "$ALLOC" -lt 64 ] || fail "the import allocated every cluster (zeroes were written)"
rpc bdev_lvol_snapshot --lvol-name lvs0/vol --snapshot-name snap >/dev/null
rpc bdev_lvol_clone --snapshot-name lvs0/snap --clone-name cl >/dev/null
rpc nbd_server_add_export --bdev-name lvs0/cl --name cl >/dev/null
rpc nbd_server_add_export --bdev-name lvs0/snap --name snap >/dev/null
qemu-img compare -f raw -F qcow2 "$U/cl" "$TMP/src.qcow2" >/dev/null || fail "the clone differs from the image"

# The guest writes the clone raw, makes ext4 on it, mounts it and compares.
NBD_PORT=$PORT bash "$VM/tests/run-nbd.sh" cl || fail "the guest test on the clone"

# The original and the snapshot are unchanged; the clone is not the image any more.
qemu-img compare -f qcow2 -F raw "$TMP/src.qcow2" "$U/vol" >/dev/null || fail "the original lvol changed"
qemu-img compare -f qcow2 -F raw "$TMP/src.qcow2" "$U/snap" >/dev/null || fail "the snapshot changed"
if qemu-img compare -f qcow2 -F raw "$TMP/src.qcow2" "$U/cl" >/dev/null 2>&1; then fail "the clone kept the image"; fi

# fstrim gives space back: the guest fills a file system on a thin lvol, deletes the file and
# trims; the whole clusters it unmapped go back to the lvstore.
alloc() { rpc bdev_lvol_get_lvols | python3 -c 'import json,sys; print([l for l in json.load(sys.stdin) if l["name"]=="'"$1"'"][0]["num_allocated_clusters"])'; }
rpc bdev_lvol_create --lvs-name lvs0 --lvol-name trim --size-in-mib 128 --thin-provision true >/dev/null
rpc nbd_server_add_export --bdev-name lvs0/trim --name trim >/dev/null
FREE0=$(rpc bdev_lvol_get_lvstores | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["free_clusters"])')
G=$TMP/guest-trim.sh
cat >"$G" <<EOS
set -e
modprobe nbd nbds_max=2
nbd-client 10.0.2.2 $PORT /dev/nbd0 -N trim -b 4096
for i in \$(seq 50); do [ "\$(cat /sys/block/nbd0/size)" != 0 ] && break; sleep 0.1; done
echo "nbd0 discard granularity: \$(cat /sys/block/nbd0/queue/discard_granularity)"
modprobe crc32c_generic; modprobe ext4
mkfs.ext4 -q -F -E nodiscard /dev/nbd0
mkdir -p /mnt/t && mount /dev/nbd0 /mnt/t
dd if=/dev/urandom of=/mnt/t/f bs=1M count=64 status=none; sync
echo "written: \$(df -k /mnt/t | tail -1)"
echo FILLED; sleep 4
rm /mnt/t/f; sync
fstrim -v /mnt/t
umount /mnt/t; nbd-client -d /dev/nbd0
echo "PASS: fstrim"
EOS
bash "$VM/run-guest.sh" -t "${TMO:-300}" "$G" >"$TMP/trim.log" 2>&1 &
GUEST=$!
for _ in $(seq 600); do grep -q FILLED "$TMP/trim.log" && break; sleep 0.5; done
FULL=$(alloc trim)
wait $GUEST || { cat "$TMP/trim.log"; fail "the guest's fstrim run"; }
grep -E "fstrim|granularity|PASS" "$TMP/trim.log" || true
sleep 1
AFTER=$(alloc trim)
FREE1=$(rpc bdev_lvol_get_lvstores | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["free_clusters"])')
echo "lvol-guest: the thin lvol held $FULL clusters after the file was written, $AFTER after fstrim; free clusters $FREE0 -> $FREE1"
[ "$FULL" -ge 64 ] || fail "the 64 MiB file allocated only $FULL clusters"
[ "$AFTER" -le $((FULL - 56)) ] || fail "fstrim gave back only $((FULL - AFTER)) of the file's 64 clusters"
[ "$FREE1" -ge $((FREE0 - AFTER)) ] || fail "the lvstore's free clusters did not come back ($FREE0 -> $FREE1)"
rpc spdk_kill_instance --sig-name SIGTERM >/dev/null
wait $PID || true
PID=
"$FERRITE" blobstore check "$TMP/store.img" || fail "blobstore check after a clean shutdown"
echo "lvol-guest: PASS"
