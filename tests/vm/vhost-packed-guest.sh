#!/usr/bin/env bash
# The Linux kernel's virtio-blk driver on a packed virtqueue (Debian's 6.1 kernel in a QEMU
# guest, ../shared/vm; QEMU's packed=on, two queues) against Ferrite's vhost-user-blk target: a
# controller made with packed_ring on a file-backed bdev behind a delay bdev (no delay until
# the guest asks), from a JSON config. The guest checks that bit 34 was negotiated, an ext4
# round trip, fio verify on two queues, and fio verify on both queues across a kill -9 and
# restart of the daemon (tests/vm/guest-vhost-packed.sh); the host checks that both queues
# ran packed rings before and after, and that the restarted daemon took the ring's positions
# from the packed inflight area and resubmitted what was in flight. Prints SKIP with the reason
# when the guest cannot run. The console and the daemon's log are kept in
# target/vhost-packed-guest/.
# Usage: tests/vm/vhost-packed-guest.sh [FERRITE_BINARY]   (env: TMO=240 seconds)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup vhost-packed-guest "${1:-}"

TMP=$(mktemp -d)
SHARE=$TMP/share
mkdir -p "$SHARE"
LOGS=$ROOT/target/vhost-packed-guest
mkdir -p "$LOGS"
SOCK=$TMP/ferrite.sock
IMG=$TMP/packed.img
truncate -s 256M "$IMG"
cat >"$TMP/config.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_uring_create","params":{"name":"PackedFile","filename":"$IMG","block_size":4096}},
 {"method":"bdev_delay_create","params":{"base_bdev_name":"PackedFile","name":"Packed0","avg_read_latency":0,"p99_read_latency":0,"avg_write_latency":0,"p99_write_latency":0}}]},
 {"subsystem":"vhost_blk","config":[{"method":"vhost_create_blk_controller","params":{"ctrlr":"vhost.packed","dev_name":"Packed0","packed_ring":true}}]}]}
J
: >"$LOGS/daemon.log"
: >"$LOGS/stats.log"
start() { "$FERRITE" serve -m 0x3 -r "$SOCK" -S "$TMP" -c "$TMP/config.json" --log-level info >>"$LOGS/daemon.log" 2>&1 & echo $! >"$TMP/pid"; }
SERVER=
# Under set -e a failing command in the trap sets the exit status: every step may fail.
trap '{ [ -z "$SERVER" ] || kill $SERVER; kill "$(cat "$TMP/pid")"; } 2>/dev/null || true; rm -rf "$TMP"' EXIT
start
for _ in $(seq 600); do [ -S "$TMP/vhost.packed" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
# Both queues run, and run packed rings.
packed_queues() {
  rpc vhost_get_controllers | tee -a "$LOGS/stats.log" |
    python3 -c 'import json,sys; q=[q for c in json.load(sys.stdin) for q in c["queues"]]; sys.exit(0 if len(q) >= 2 and all(x["packed"] for x in q) else 1)'
}
# The guest's requests: req-N holds a word, ack-N gets the exit code.
(
  n=1
  while :; do
    if [ -f "$SHARE/req-$n" ]; then
      rc=0
      case $(cat "$SHARE/req-$n") in
        stats) packed_queues >/dev/null || rc=1 ;;
        slow)
          # 20 ms per request: some are in flight whenever the daemon is killed.
          for t in avg_read p99_read avg_write p99_write; do
            rpc bdev_delay_update_latency "{\"delay_bdev_name\":\"Packed0\",\"latency_type\":\"$t\",\"latency_us\":20000}" >/dev/null || rc=1
          done ;;
        restart)
          for _ in $(seq 200); do
            rpc vhost_get_controllers 2>/dev/null |
              python3 -c 'import json,sys; sys.exit(0 if any(q["in_flight"] > 0 for c in json.load(sys.stdin) for q in c["queues"]) else 1)' && break
            sleep 0.01
          done
          kill -9 "$(cat "$TMP/pid")"; sleep 0.5; echo "=== killed" >>"$LOGS/daemon.log"; start
          for _ in $(seq 600); do [ -S "$TMP/vhost.packed" ] && rpc vhost_get_controllers >/dev/null 2>&1 && break; sleep 0.05; done ;;
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
bash "$VM/run-guest.sh" -t "${TMO:-240}" -s "$SHARE" -l "$LOGS/console.log" \
  -q -chardev -q "socket,id=pk0,path=$TMP/vhost.packed,reconnect=1" \
  -q -device -q "vhost-user-blk-pci,chardev=pk0,num-queues=2,packed=on" \
  "$ROOT/tests/vm/guest-vhost-packed.sh" >/dev/null || rc=$?
kill "$SERVER" 2>/dev/null || true
grep -E "^(===|FAIL|PASS|vda:|md5|fio|packed|daemon)" "$LOGS/console.log" || true
if [ "$rc" != 0 ]; then
  echo "vhost-packed-guest: FAIL (guest exit $rc; console and daemon log in $LOGS)"
  exit 1
fi
grep -q "inflight area for .* packed queues" "$LOGS/daemon.log" ||
  { echo "vhost-packed-guest: FAIL: no packed inflight area was made"; exit 1; }
if ! grep -q "in flight before the restart go again" "$LOGS/daemon.log"; then
  echo "vhost-packed-guest: FAIL: the restarted daemon resubmitted nothing (with 20 ms per request, some were in flight)"
  exit 1
fi
grep -h "go again\|as the inflight area says" "$LOGS/daemon.log" | sed 's/^\[[0-9.]*\] //'
echo "vhost-packed-guest: PASS"
