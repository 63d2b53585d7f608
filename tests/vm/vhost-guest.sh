#!/usr/bin/env bash
# The Linux kernel's virtio-blk driver (Debian's 6.1 kernel in a QEMU guest, ../shared/vm)
# against Ferrite's vhost-user-blk target: two controllers on one 256 MiB malloc bdev, one
# read-only, on two reactors; the guest checks sizes, queues, serial and read-only flags, an
# ext4 round trip, fio verify on two queues, discard and write zeroes, and that the read-only
# disk refuses writes, a null bdev grown by bdev_null_resize, an lvol grown by bdev_lvol_resize
# and a grown file rescanned by bdev_uring_rescan show their new sizes in the guest, and the
# cache turned to writethrough flushes every write (tests/vm/guest-vhost.sh); then a second daemon on a file-backed bdev is killed with -9 and
# started again while the guest runs fio verify on it, and fio finishes without an error
# (tests/vm/guest-vhost-restart.sh). Prints SKIP with the reason when the guest
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
rm -f "$LOGS"/*.log
SOCK=$TMP/ferrite.sock
"$FERRITE" serve -m 0x3 -r "$SOCK" -S "$TMP" --log-level info >"$LOGS/daemon.log" 2>&1 &
PID=$!
SERVER=
# Under set -e a failing command in the trap sets the exit status: every step may fail (the
# request server may be gone already).
# The restarted daemon (pid in $TMP/pid2) is not our child: wait until it is gone before its
# folder goes, so that no daemon of this test is left serving when the next test starts.
stop_daemons() {
  { [ -z "$SERVER" ] || kill $SERVER; kill $PID; wait $PID; } 2>/dev/null || true
  local p2
  p2=$(cat "$TMP/pid2" 2>/dev/null) || true
  if [ -n "$p2" ]; then
    kill "$p2" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$p2" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -rf "$TMP"
}
trap stop_daemons EXIT
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@" >/dev/null; }
rpc bdev_malloc_create --name Guest0 --num-blocks 65536 --block-size 4096
rpc vhost_create_blk_controller '{"ctrlr":"vhost.0","dev_name":"Guest0"}'
rpc vhost_create_blk_controller '{"ctrlr":"vhost.ro","dev_name":"Guest0","readonly":true,"cpumask":"0x2"}'
rpc bdev_null_create --name Null0 --num-blocks 16384 --block-size 4096
rpc vhost_create_blk_controller '{"ctrlr":"vhost.null","dev_name":"Null0"}'
rpc bdev_malloc_create --name LvsBase --num-blocks 16384 --block-size 4096
rpc bdev_lvol_create_lvstore '{"bdev_name":"LvsBase","lvs_name":"lvs0"}'
rpc bdev_lvol_create '{"lvol_name":"lv0","size_in_mib":16,"lvs_name":"lvs0"}'
rpc vhost_create_blk_controller '{"ctrlr":"vhost.lvol","dev_name":"lvs0/lv0"}'
truncate -s 32M "$TMP/grow.img"
rpc bdev_uring_create '{"name":"Grow0","filename":"'"$TMP/grow.img"'","block_size":4096}'
rpc vhost_create_blk_controller '{"ctrlr":"vhost.file","dev_name":"Grow0"}'
# The guest's requests (tests/vm/guest-lib.sh's `host`).
on_request() {
  local n=$1 m=$2 a=${3:-} b=${4:-}
  case $m in
    bdev_null_resize) "$FERRITE" rpc -s "$SOCK" bdev_null_resize "{\"name\":\"$a\",\"new_size\":$b}" >>"$LOGS/rpc.log" 2>&1 ;;
    bdev_lvol_resize) "$FERRITE" rpc -s "$SOCK" bdev_lvol_resize "{\"name\":\"$a\",\"size_in_mib\":$b}" >>"$LOGS/rpc.log" 2>&1 ;;
    grow_file) { truncate -s "${b}M" "$TMP/grow.img" && "$FERRITE" rpc -s "$SOCK" bdev_uring_rescan "{\"name\":\"$a\"}"; } >>"$LOGS/rpc.log" 2>&1 ;;
    flushes) "$FERRITE" rpc -s "$SOCK" bdev_get_iostat "{\"name\":\"$a\"}" 2>>"$LOGS/rpc.log" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["bdevs"][0]["num_flush_ops"])' >"$SHARE/out-$n" ;;
    *) return 99 ;;
  esac
}
serve_guest_requests "$SHARE" on_request
rc=0
bash "$VM/run-guest.sh" -t "${TMO:-300}" -b "$TMP/vhost.0" -b "$TMP/vhost.ro" -b "$TMP/vhost.null" -b "$TMP/vhost.lvol" -b "$TMP/vhost.file" \
  -s "$SHARE" -l "$LOGS/console.log" \
  "$ROOT/tests/vm/guest-vhost.sh" >/dev/null || rc=$?
grep -E "^(===|FAIL|PASS|vd[a-e]:|md5|fio|queue|discard|write to|vdb reads|cache|flushes)" "$LOGS/console.log" || true
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

# Phase 2: the daemon killed with -9 and started again under fio verify. A second daemon
# serves a file-backed bdev (its data outlives the process) behind a delay bdev of 20 ms (so that
# requests are in flight at the kill) from a JSON config; QEMU's chardev reconnects; the new
# daemon resubmits what was in flight; the guest sees no error.
IMG=$TMP/guest1.img
truncate -s 128M "$IMG"
SOCK2=$TMP/ferrite2.sock
cat >"$TMP/restart.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_uring_create","params":{"name":"Guest1File","filename":"$IMG","block_size":4096}},
 {"method":"bdev_delay_create","params":{"base_bdev_name":"Guest1File","name":"Guest1","avg_read_latency":20000,"p99_read_latency":20000,"avg_write_latency":20000,"p99_write_latency":20000}}]},
 {"subsystem":"vhost_blk","config":[{"method":"vhost_create_blk_controller","params":{"ctrlr":"vhost.rc","dev_name":"Guest1"}}]}]}
J
start2() { "$FERRITE" serve -m 0x3 -r "$SOCK2" -S "$TMP" -c "$TMP/restart.json" --log-level info >>"$LOGS/daemon2.log" 2>&1 & echo $! >"$TMP/pid2"; }
: >"$LOGS/daemon2.log"
start2
for _ in $(seq 600); do [ -S "$TMP/vhost.rc" ] && break; sleep 0.05; done
kill "$SERVER" 2>/dev/null
on_restart() {
  case $2 in
    restart)
      # Killed at an instant when the daemon has requests in flight (it says so).
      for _ in $(seq 200); do
        "$FERRITE" rpc -s "$SOCK2" vhost_get_controllers 2>/dev/null |
          python3 -c 'import json,sys; sys.exit(0 if any(q["in_flight"] > 0 for c in json.load(sys.stdin) for q in c["queues"]) else 1)' && break
        sleep 0.01
      done
      kill -9 "$(cat "$TMP/pid2")"; sleep 0.5; echo "=== killed" >>"$LOGS/daemon2.log"; start2
      for _ in $(seq 600); do [ -S "$TMP/vhost.rc" ] && "$FERRITE" rpc -s "$SOCK2" vhost_get_controllers >/dev/null 2>&1 && break; sleep 0.05; done ;;
    *) return 99 ;;
  esac
}
serve_guest_requests "$SHARE" on_restart
rc=0
bash "$VM/run-guest.sh" -t "${TMO:-300}" -s "$SHARE" -l "$LOGS/console2.log" \
  -q -chardev -q "socket,id=rc0,path=$TMP/vhost.rc,reconnect=1" -q -device -q "vhost-user-blk-pci,chardev=rc0,num-queues=2" \
  "$ROOT/tests/vm/guest-vhost-restart.sh" >/dev/null || rc=$?
kill "$SERVER" 2>/dev/null
kill "$(cat "$TMP/pid2")" 2>/dev/null
grep -E "^(===|FAIL|PASS|fio|daemon)" "$LOGS/console2.log" || true
if [ "$rc" != 0 ]; then
  echo "vhost-guest: FAIL in the restart phase (guest exit $rc; console2 and daemon2 logs in $LOGS)"
  exit 1
fi
if ! grep -q "in flight before the restart go again" "$LOGS/daemon2.log"; then
  echo "vhost-guest: FAIL: the restarted daemon resubmitted nothing (with 20 ms per request, some were in flight)"
  exit 1
fi
grep -h "go again" "$LOGS/daemon2.log" | sed 's/^\[[^]]*\] //'

echo "vhost-guest: PASS"
