#!/usr/bin/env bash
# Logical volumes with real clients, ending in a Linux guest (../shared/vm): a disk image is
# converted into a thin lvol over NBD with qemu-img, snapshotted and cloned; the guest kernel's
# NBD client writes the clone raw, makes ext4 on it, mounts it and compares (tests/guest-nbd.sh of
# the shared harness); then the original lvol and the snapshot still compare equal to the image
# (qemu-img compare), and after a clean shutdown `ferrite blobstore check` passes on the file.
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
rpc spdk_kill_instance --sig-name SIGTERM >/dev/null
wait $PID || true
PID=
"$FERRITE" blobstore check "$TMP/store.img" || fail "blobstore check after a clean shutdown"
echo "lvol-guest: PASS"
