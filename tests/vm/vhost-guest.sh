#!/usr/bin/env bash
# The Linux kernel's virtio-blk driver (Debian's 6.1 kernel in a QEMU guest, ../shared/vm)
# against Ferrite's vhost-user-blk target: two controllers on one 256 MiB malloc bdev, one
# read-only, on two reactors; the guest checks sizes, queues, serial and read-only flags, an
# ext4 round trip, fio verify on two queues, discard and write zeroes, and that the read-only
# disk refuses writes, and a null bdev grown by bdev_null_resize shows its new size in the guest
# (tests/vm/guest-vhost.sh). Prints SKIP with the reason when the guest
# cannot run. The console and the daemon's log are kept in target/vhost-guest/.
# Usage: tests/vm/vhost-guest.sh [FERRITE_BINARY]   (env: TMO=300 seconds)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup vhost-guest "${1:-}"

TMP=$(mktemp -d)
SHARE=$TMP/share
mkdir -p "$SHARE"
LOGS=$ROOT/target/vhost-guest
mkdir -p "$LOGS"
SOCK=$TMP/ferrite.sock
"$FERRITE" serve -m 0x3 -r "$SOCK" -S "$TMP" --log-level info >"$LOGS/daemon.log" 2>&1 &
PID=$!
SERVER=
trap '[ -n "$SERVER" ] && kill $SERVER 2>/dev/null; kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@" >/dev/null; }
rpc bdev_malloc_create --name Guest0 --num-blocks 65536 --block-size 4096
rpc vhost_create_blk_controller '{"ctrlr":"vhost.0","dev_name":"Guest0"}'
rpc vhost_create_blk_controller '{"ctrlr":"vhost.ro","dev_name":"Guest0","readonly":true,"cpumask":"0x2"}'
rpc bdev_null_create --name Null0 --num-blocks 16384 --block-size 4096
rpc vhost_create_blk_controller '{"ctrlr":"vhost.null","dev_name":"Null0"}'
# The guest's requests for RPCs: req-N holds "METHOD ARGS", ack-N gets the exit code.
(
  n=1
  while :; do
    if [ -f "$SHARE/req-$n" ]; then
      read -r m a b <"$SHARE/req-$n" || true
      rc=0
      case $m in
        bdev_null_resize) "$FERRITE" rpc -s "$SOCK" bdev_null_resize "{\"name\":\"$a\",\"new_size\":$b}" >>"$LOGS/rpc.log" 2>&1 || rc=$? ;;
        *) rc=99 ;;
      esac
      echo "$rc" >"$SHARE/.ack" && mv "$SHARE/.ack" "$SHARE/ack-$n"
      n=$((n + 1))
    fi
    sleep 0.05
  done
) &
SERVER=$!
rc=0
bash "$VM/run-guest.sh" -t "${TMO:-300}" -b "$TMP/vhost.0" -b "$TMP/vhost.ro" -b "$TMP/vhost.null" -s "$SHARE" -l "$LOGS/console.log" \
  "$ROOT/tests/vm/guest-vhost.sh" >/dev/null || rc=$?
grep -E "^(===|FAIL|PASS|vd[abc]:|md5|fio|queue|discard|write to|vdb reads)" "$LOGS/console.log" || true
# The daemon saw both front ends and served the writable disk's queues on both reactors.
"$FERRITE" rpc -s "$SOCK" vhost_get_controllers >"$LOGS/controllers.json"
if [ "$rc" != 0 ]; then
  echo "vhost-guest: FAIL (guest exit $rc; console and daemon log in $LOGS)"
  exit 1
fi
grep -q "front end gone" "$LOGS/daemon.log" || { echo "vhost-guest: FAIL: the daemon did not see the guest go"; exit 1; }
# Both queues of the writable disk (one per reactor) served requests.
for q in 0 1; do
  n=$(sed -n "s/.*vhost controller vhost.0: queue $q stopped after \([0-9]*\) requests.*/\1/p" "$LOGS/daemon.log" | tail -1)
  echo "vhost.0 queue $q: ${n:-no} requests"
  [ "${n:-0}" -gt 0 ] || { echo "vhost-guest: FAIL: queue $q of vhost.0 served no request"; exit 1; }
done
echo "vhost-guest: PASS"
