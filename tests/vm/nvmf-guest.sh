#!/usr/bin/env bash
# The Linux kernel's NVMe/TCP host (nvme-cli, Debian's 6.1 kernel in a QEMU guest, ../shared/vm)
# against Ferrite's NVMe-oF target: discovery, connect, identify and log pages, raw and ext4
# round trips, fio verify on several queues, header/data digests, namespace hot add/remove
# (AEN), native multipath across two listeners while ANA states flip, the daemon killed and
# restarted while the guest is connected, an lvol snapshot's namespace read-only and a full
# thin lvol's writes ENOSPC, `nvme reset` during fio verify, and the guest's host NQN removed
# from a subsystem that allows only listed hosts and added back, 100 times, while the kernel
# reconnects, and two hosts fencing each other with reservations (tests/vm/guest-nvmf.sh).
# The guest asks for RPCs through the shared folder: it writes req-N, this script runs the RPC
# and answers ack-N with its exit code. Prints SKIP with the reason when the guest cannot run.
# Usage: tests/vm/nvmf-guest.sh [FERRITE_BINARY]
# env: NVMF_GUEST_STEPS="1 2 3 4 5 6 7 8 9 10 11 12" (which guest steps run; connect always does),
#      NVMF_GUEST_RMHOST_ROUNDS=100 (step 11's rounds),
#      NVMF_GUEST_ANA=1 (0: the subsystem without ANA reporting; no ANA checks or flips),
#      NVMF_GUEST_LOG_LEVEL=debug (the daemon's), TMO=900 (seconds),
#      NVMF_GUEST_TARGET=spdk (SPDK's nvmf_tgt from ../shared/anchors as the target instead, as a
#      reference for the same checks; ferrite is still the RPC client).
# The console and the daemon's log are kept in target/nvmf-guest/.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup nvmf-guest "${1:-}"

TMP=$(mktemp -d)
SHARE=$TMP/share
mkdir -p "$SHARE"
LOGS=$ROOT/target/nvmf-guest
mkdir -p "$LOGS"
SOCK=$TMP/ferrite.sock
PORT=${NVMF_PORT:-$(free_port)}
PORT2=${NVMF_PORT2:-$(free_port)}
while [ "$PORT2" = "$PORT" ]; do PORT2=$(free_port); done
NQN=nqn.2016-06.io.spdk:ferrite-guest
# Step 11's subsystem: listed hosts only.
NQN2=nqn.2016-06.io.spdk:ferrite-guest-hosts
# Step 12's subsystem: one namespace two hosts reserve.
NQN3=nqn.2016-06.io.spdk:ferrite-guest-resv
SN=FERRITE0000000000042
MN="Ferrite guest test"
# ANA reporting (NVMF_GUEST_ANA=0 turns it off, to tell ANA problems from the rest).
ANA=${NVMF_GUEST_ANA:-1}
ANA_JSON=$([ "$ANA" = 0 ] && echo false || echo true)

# Two reactors, so that the admin and I/O queues land on different cores.
if [ "${NVMF_GUEST_TARGET:-ferrite}" = spdk ]; then
  # The reference: SPDK's nvmf_tgt under the same RPCs and guest checks.
  [ -n "${SPDK_DIR:-}" ] || SPDK_DIR=$(bash "$ROOT/../shared/anchors/spdk.sh")
  "$SPDK_DIR/build/bin/nvmf_tgt" --no-huge -s 1024 -m 0x3 --interrupt-mode --disable-cpumask-locks -r "$SOCK" >"$LOGS/daemon.log" 2>&1 &
else
  "$FERRITE" serve -m 0x3 -r "$SOCK" --log-level "${NVMF_GUEST_LOG_LEVEL:-debug}" >"$LOGS/daemon.log" 2>&1 &
fi
PID=$!
# The daemon's PID (step 8 restarts it from the request server, a subshell).
echo "$PID" >"$TMP/pid"
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; fi
  kill "$(cat "$TMP/pid")" 2>/dev/null
  wait "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
listener() { echo "{\"trtype\":\"tcp\",\"adrfam\":\"ipv4\",\"traddr\":\"127.0.0.1\",\"trsvcid\":\"$1\"}"; }
{
  rpc bdev_malloc_create --name Nvmf512 --num-blocks 131072 --block-size 512
  rpc bdev_malloc_create --name Nvmf4k --num-blocks 16384 --block-size 4096
  rpc bdev_malloc_create --name NvmfHot --num-blocks 32768 --block-size 512
  rpc nvmf_create_transport --trtype TCP
  rpc nvmf_create_subsystem "{\"nqn\":\"$NQN\",\"serial_number\":\"$SN\",\"model_number\":\"$MN\",\"allow_any_host\":true,\"ana_reporting\":$ANA_JSON}"
  rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"Nvmf512\",\"nsid\":1}}"
  rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"Nvmf4k\",\"nsid\":2}}"
  rpc nvmf_subsystem_add_listener "{\"nqn\":\"$NQN\",\"listen_address\":$(listener "$PORT")}"
  rpc nvmf_subsystem_add_listener "{\"nqn\":\"$NQN\",\"listen_address\":$(listener "$PORT2")}"
  rpc bdev_malloc_create --name NvmfHosts --num-blocks 2048 --block-size 4096
  rpc nvmf_create_subsystem "{\"nqn\":\"$NQN2\",\"serial_number\":\"FERRITE0000000000043\",\"allow_any_host\":false}"
  rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN2\",\"namespace\":{\"bdev_name\":\"NvmfHosts\",\"nsid\":1}}"
  rpc nvmf_subsystem_add_listener "{\"nqn\":\"$NQN2\",\"listen_address\":$(listener "$PORT")}"
  rpc bdev_malloc_create --name NvmfResv --num-blocks 8192 --block-size 512
  rpc nvmf_create_subsystem "{\"nqn\":\"$NQN3\",\"serial_number\":\"FERRITE0000000000044\",\"allow_any_host\":true}"
  rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN3\",\"namespace\":{\"bdev_name\":\"NvmfResv\",\"nsid\":1}}"
  rpc nvmf_subsystem_add_listener "{\"nqn\":\"$NQN3\",\"listen_address\":$(listener "$PORT")}"
} >/dev/null
echo "nvmf-guest: $NQN on 127.0.0.1:$PORT and :$PORT2 (daemon pid $PID, log $LOGS/daemon.log)"

# The guest's requests (tests/vm/guest-lib.sh's `host`).
on_request() {
  local n=$1 cmd=$2 a=${3:-} b=${4:-} rc
  echo "host: request $n: $cmd $a $b"
  case $cmd in
    qpairs)
      rpc nvmf_subsystem_get_qpairs --nqn "$NQN" | python3 -c 'import json, sys
q = json.load(sys.stdin)
print("host: qpairs (cntlid, qid, poll group):", sorted((x["cntlid"], x["qid"], x["thread"][-1]) for x in q))'
      rc=$?;;
    add_ns)
      rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"NvmfHot\",\"nsid\":3}}" >/dev/null
      rc=$?;;
    remove_ns)
      rpc nvmf_subsystem_remove_ns "{\"nqn\":\"$NQN\",\"nsid\":3}" >/dev/null
      rc=$?;;
    lvol)
      # A thin lvol of 8 MiB on an lvstore of fewer clusters (an 8 MiB malloc), as nsid 4.
      {
        rpc bdev_malloc_create --name LvBase --num-blocks 2048 --block-size 4096 &&
          rpc bdev_lvol_create_lvstore --bdev-name LvBase --lvs-name lvs0 --cluster-sz 1048576 &&
          rpc bdev_lvol_create --lvs-name lvs0 --lvol-name thin --size-in-mib 8 --thin-provision true &&
          rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"lvs0/thin\",\"nsid\":4}}"
      } >/dev/null
      rc=$?;;
    snap)
      # Its snapshot, as nsid 5.
      {
        rpc bdev_lvol_snapshot --lvol-name lvs0/thin --snapshot-name snap &&
          rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"lvs0/snap\",\"nsid\":5}}"
      } >/dev/null
      rc=$?;;
    ro)
      # The thin lvol made read-only while the guest has it.
      rpc bdev_lvol_set_read_only --name lvs0/thin >/dev/null
      rc=$?;;
    add_host)
      rpc nvmf_subsystem_add_host "{\"nqn\":\"$NQN2\",\"host\":\"$a\"}" >/dev/null
      rc=$?;;
    remove_host)
      # The host goes, and with it its controllers: none may be left (within 10 s).
      rpc nvmf_subsystem_remove_host "{\"nqn\":\"$NQN2\",\"host\":\"$a\"}" >/dev/null
      rc=$?
      if [ $rc = 0 ]; then
        rc=1
        for _ in $(seq 100); do
          left=$(rpc nvmf_subsystem_get_controllers --nqn "$NQN2" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')
          [ "$left" = 0 ] && { rc=0; break; }
          sleep 0.1
        done
        [ $rc = 0 ] || echo "host: $left controllers of $NQN2 left 10 s after nvmf_subsystem_remove_host"
      fi;;
    ana)
      rpc nvmf_subsystem_listener_set_ana_state \
        "{\"nqn\":\"$NQN\",\"listen_address\":$(listener "$a"),\"ana_state\":\"$b\"}" >/dev/null
      rc=$?;;
    restart)
      # A crash and a restart from the saved config while the guest is connected.
      rpc save_config >"$TMP/saved.json"
      old=$(cat "$TMP/pid")
      kill -KILL "$old"
      for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
      rm -f "$SOCK"
      "$FERRITE" serve -m 0x3 -r "$SOCK" --log-level "${NVMF_GUEST_LOG_LEVEL:-debug}" \
        --json "$TMP/saved.json" >>"$LOGS/daemon.log" 2>&1 &
      echo $! >"$TMP/pid"
      for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
      [ -S "$SOCK" ]
      rc=$?
      echo "host: daemon restarted (pid $(cat "$TMP/pid"))";;
    *) echo "host: unknown request '$cmd'"; rc=99;;
  esac
  return $rc
}
serve_guest_requests "$SHARE" on_request

GUEST=$TMP/guest.sh
{
  echo "PORT=$PORT PORT2=$PORT2 NQN='$NQN' NQN2='$NQN2' NQN3='$NQN3' SN='$SN' MN='$MN' RMHOST_ROUNDS=${NVMF_GUEST_RMHOST_ROUNDS:-100}"
  # Steps 8 (a daemon restart) and 9 (the statuses of a full and a read-only lvol) are
  # Ferrite's only.
  default_steps="1 2 3 4 5 6 7$([ "${NVMF_GUEST_TARGET:-ferrite}" = spdk ] || echo " 8 9") 10 11 12"
  echo "STEPS='${NVMF_GUEST_STEPS:-$default_steps}' ANA=$ANA"
  cat "$ROOT/tests/vm/guest-nvmf.sh"
} >"$GUEST"
rc=0
"$VM/run-guest.sh" -t "${TMO:-900}" -s "$SHARE" -l "$LOGS/console.log" "$GUEST" || rc=$?
if ! kill -0 "$(cat "$TMP/pid")" 2>/dev/null; then
  echo "nvmf-guest: FAIL: the daemon died; last lines of $LOGS/daemon.log:"
  tail -n 40 "$LOGS/daemon.log"
  exit 1
fi
if [ "$rc" != 0 ]; then
  echo "nvmf-guest: FAIL (guest rc $rc); last lines of $LOGS/daemon.log:"
  tail -n 40 "$LOGS/daemon.log"
  exit 1
fi
# Step 5b's --disable-sqflow reached the target (its admin Connect asked for it).
case " ${NVMF_GUEST_STEPS:-5} " in
  *" 5 "*)
    if [ "${NVMF_GUEST_TARGET:-ferrite}" = ferrite ] && ! grep -q "SQ flow control off" "$LOGS/daemon.log"; then
      echo "nvmf-guest: FAIL: no controller with SQ flow control off in $LOGS/daemon.log (step 5b)"
      exit 1
    fi
    ;;
esac
echo "nvmf-guest: PASS"
