#!/usr/bin/env bash
# Live migration of a Linux guest (Debian's 6.1 kernel under QEMU, ../shared/vm) whose
# vhost-user-blk disk Ferrite serves: the source QEMU's disk is controller vhost.src, the
# destination QEMU (started with -incoming) has controller vhost.dst of the same malloc bdev.
# While the guest runs fio verify on the disk, the host migrates it over TCP on 127.0.0.1; the
# daemon keeps the dirty log of what it writes into guest memory (VHOST_F_LOG_ALL with
# LOG_SHMFD), hands the rings over (GET_VRING_BASE after the requests in flight complete), and
# fio goes on in the destination and finishes without an error. Without the dirty log QEMU
# refuses to migrate; without logging the pages reads fill, fio's verify finds stale data.
# Prints SKIP with the reason when the guest cannot run. Logs are kept in target/vhost-migrate/.
# Usage: tests/vm/vhost-migrate.sh [FERRITE_BINARY]   (env: TMO=300 seconds)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup vhost-migrate "${1:-}" python3

TMP=$(mktemp -d)
LOGS=$ROOT/target/vhost-migrate
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
SOCK=$TMP/ferrite.sock
"$FERRITE" serve -m 0x3 -r "$SOCK" -S "$TMP" --log-level info >"$LOGS/daemon.log" 2>&1 &
PID=$!
SRC= DST=
cleanup() {
  for p in $SRC $DST; do kill "$p" 2>/dev/null || true; done
  pkill -f "qemu-system-x86_64.*$TMP" 2>/dev/null || true
  { kill $PID; wait $PID; } 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@" >/dev/null; }
rpc bdev_malloc_create --name Mig0 --num-blocks 65536 --block-size 4096
rpc vhost_create_blk_controller '{"ctrlr":"vhost.src","dev_name":"Mig0","cpumask":"0x1"}'
rpc vhost_create_blk_controller '{"ctrlr":"vhost.dst","dev_name":"Mig0","cpumask":"0x2"}'
qmp() { python3 "$ROOT/tests/vm/qmp.py" "$@"; }
PORT=$(free_port)
GUEST=$ROOT/tests/vm/guest-vhost-migrate.sh
# The same machine twice; the destination waits for the migration stream.
bash "$VM/run-guest.sh" -m 512M -t "${TMO:-300}" -b "$TMP/vhost.src" -q -qmp -q "unix:$TMP/src.qmp,server=on,wait=off" \
  -l "$LOGS/console-src.log" "$GUEST" >/dev/null 2>&1 &
SRC=$!
bash "$VM/run-guest.sh" -m 512M -t "${TMO:-300}" -b "$TMP/vhost.dst" -q -qmp -q "unix:$TMP/dst.qmp,server=on,wait=off" \
  -q -incoming -q "tcp:127.0.0.1:$PORT" -l "$LOGS/console-dst.log" "$GUEST" >/dev/null 2>&1 &
DST=$!
fail() {
  echo "vhost-migrate: FAIL: $* (consoles and daemon log in $LOGS)"
  echo "--- last lines of the source's console:"
  tail -n 15 "$LOGS/console-src.log" 2>/dev/null || true
  echo "--- last lines of the daemon's log:"
  tail -n 10 "$LOGS/daemon.log" 2>/dev/null || true
  exit 1
}
# Under emulation (no KVM) the boot and the 64 MiB fill take minutes: wait as long as the guest
# may run, and stop waiting as soon as the source QEMU is gone.
WAIT=${TMO:-300}
for _ in $(seq $((WAIT * 10))); do
  grep -q "=== migrate now" "$LOGS/console-src.log" 2>/dev/null && break
  kill -0 "$SRC" 2>/dev/null || break
  sleep 0.1
done
grep -q "=== migrate now" "$LOGS/console-src.log" || fail "the guest did not start fio within $WAIT s"
qmp "$TMP/src.qmp" migrate-set-parameters '{"max-bandwidth": 1073741824}' >/dev/null
T0=$EPOCHREALTIME
qmp "$TMP/src.qmp" migrate "{\"uri\":\"tcp:127.0.0.1:$PORT\"}" >/dev/null || fail "QEMU refused to migrate"
status=
for _ in $(seq 1200); do
  status=$(qmp "$TMP/src.qmp" query-migrate | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",""))')
  case $status in completed | failed | cancelled) break ;; esac
  sleep 0.1
done
printf 'migration: %s in %.1f s\n' "$status" "$(echo "$EPOCHREALTIME - $T0" | bc -l)"
[ "$status" = completed ] || fail "migration ended $status"
grep -q "vhost.src: dirty page logging starts" "$LOGS/daemon.log" || fail "the daemon never logged dirty pages"
qmp "$TMP/src.qmp" quit >/dev/null 2>&1 || true
rc=0
wait $DST || rc=$?
grep -E "^(===|FAIL|PASS|fio|read)" "$LOGS/console-dst.log" || true
[ "$rc" = 0 ] || fail "the guest failed after the migration (exit $rc)"
# The destination's disk served the rest of fio's requests.
n=$(sed -n "s/.*vhost controller vhost.dst: queue [0-9]* stopped after \([0-9]*\) requests.*/\1/p" "$LOGS/daemon.log" | sort -n | tail -1)
echo "vhost.dst: ${n:-no} requests after the migration"
[ "${n:-0}" -gt 0 ] || fail "the destination's controller served no request"
echo "vhost-migrate: PASS"
