#!/usr/bin/env bash
# The Linux kernel's iSCSI initiator (open-iscsi's iscsid/iscsiadm and iscsi_tcp, Debian's 6.1
# kernel in a QEMU guest, ../shared/vm) against Ferrite's iSCSI target, `ferrite serve` started
# from a JSON config (tests/vm/guest-iscsi.sh has the guest's steps):
#   1 SendTargets discovery, open, then with one-way and mutual CHAP once
#     iscsi_set_discovery_auth requires it (without CHAP and with a wrong secret: refused);
#   2 logins without CHAP, with one-way CHAP, with mutual CHAP (also after
#     iscsi_target_node_set_auth turned a one-way node mutual), a login redirected
#     (iscsi_target_node_set_redirect) to a private portal group; refused: a wrong secret (the
#     target's check and the initiator's check of the target), an unknown user, no CHAP or
#     one-way CHAP to a node that requires more: iscsiadm fails, no disk appears, and the
#     daemon keeps serving;
#   3 mkfs.ext4 on a malloc LUN, several MiB of random files, fstrim (UNMAP), sync, unmount,
#     drop caches, logout and login again, fsck, mount, checksums compared; the host then
#     reads the LUN through libiscsi (qemu-img) and compares the files (debugfs) with the
#     guest's checksums;
#   4 a uring-on-file LUN behind a 10 ms delay bdev (commands are in flight whatever happens),
#     with header and data digests (CRC32C), while fio writes and verifies it: the guest's
#     link down for 6 s (NOP-Out timeout, reconnect; the target reinstates the session if it
#     still has the old connection), iscsi_target_node_request_logout (the initiator logs out
#     and in again), and the daemon killed with -9 and started again from the same config on
#     the same port: each time the session comes back (replacement_timeout 60 s) and fio ends
#     without an error; and a command that outlives a 2 s disk timeout: the kernel aborts it
#     (ABORT TASK), the target answers, the command is retried on the same connection;
#   5 raw data the guest wrote to that LUN is read back from the file on the host.
# All along the daemon pings with NOP-Ins every 2 s (the guest must answer each).
# The guest asks for RPCs through the shared folder (tests/vm/guest-lib.sh's `host`). Prints
# SKIP with the reason when the guest cannot run. The console and daemon logs are kept in
# target/iscsi-guest/.
# Usage: tests/vm/iscsi-guest.sh [FERRITE_BINARY]
# env: TMO=220 (seconds; a run takes about 100 s on an idle 2-core host), ISCSI_PORT,
#      ISCSI_GUEST_STEPS="1 2 3" (which of guest steps 1-3 run; 4 and 5 always do),
#      ISCSI_GUEST_LOG_LEVEL=info (the daemon's).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup iscsi-guest "${1:-}"

TMP=$(mktemp -d)
SHARE=$TMP/share
mkdir -p "$SHARE"
LOGS=$ROOT/target/iscsi-guest
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
SOCK=$TMP/ferrite.sock
PORT=${ISCSI_PORT:-$(free_port)}
# Portal group 2 (private): where logins to the redir node through portal group 1 are sent.
PORT2=$(free_port)
while [ "$PORT2" = "$PORT" ]; do PORT2=$(free_port); done
BASE=iqn.2016-06.io.spdk
IMG=$TMP/file0.img
truncate -s 64M "$IMG"
# CHAP names and secrets (auth group 1: the nodes'; 2: discovery's).
U1=guest1 S1=guest1-secret-01
U2=guest2 S2=guest2-secret-02 MU=ferrite-tgt MS=ferrite-target-secret
DU=disc-user DS=discovery-secret-03 DMU=ferrite-disc DMS=ferrite-disc-secret
CONFIG=$TMP/config.json
node() { # node NAME BDEV EXTRA-JSON
  printf '{"method":"iscsi_create_target_node","params":{"name":"%s","alias_name":"%s","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"%s","lun_id":0}],"queue_depth":32%s}}' \
    "$1" "$1" "$2" "$3"
}
cat >"$CONFIG" <<J
{"subsystems":[
 {"subsystem":"bdev","config":[
  {"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":131072,"block_size":512}},
  {"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":8192,"block_size":512}},
  {"method":"bdev_malloc_create","params":{"name":"Malloc2","num_blocks":2048,"block_size":4096}},
  {"method":"bdev_malloc_create","params":{"name":"Malloc3","num_blocks":4096,"block_size":512}},
  {"method":"bdev_uring_create","params":{"name":"File0","filename":"$IMG","block_size":4096}},
  {"method":"bdev_delay_create","params":{"base_bdev_name":"File0","name":"Slow0","avg_read_latency":10000,"p99_read_latency":10000,"avg_write_latency":10000,"p99_write_latency":10000}}]},
 {"subsystem":"iscsi","config":[
  {"method":"iscsi_set_options","params":{"nop_in_interval":2,"nop_timeout":20}},
  {"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"127.0.0.1","port":"$PORT"}]}},
  {"method":"iscsi_create_portal_group","params":{"tag":2,"portals":[{"host":"127.0.0.1","port":"$PORT2"}],"private":true}},
  {"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
  {"method":"iscsi_create_auth_group","params":{"tag":1,"secrets":[{"user":"$U1","secret":"$S1"},{"user":"$U2","secret":"$S2","muser":"$MU","msecret":"$MS"}]}},
  {"method":"iscsi_create_auth_group","params":{"tag":2,"secrets":[{"user":"$DU","secret":"$DS","muser":"$DMU","msecret":"$DMS"}]}},
  $(node plain Malloc0 ',"disable_chap":true'),
  $(node chap Malloc1 ',"require_chap":true,"chap_group":1'),
  $(node mutual Malloc2 ',"require_chap":true,"mutual_chap":true,"chap_group":1'),
  $(node file Slow0 ',"header_digest":true,"data_digest":true'),
  {"method":"iscsi_create_target_node","params":{"name":"redir","pg_ig_maps":[{"pg_tag":1,"ig_tag":1},{"pg_tag":2,"ig_tag":1}],"luns":[{"bdev_name":"Malloc3","lun_id":0}],"queue_depth":32,"disable_chap":true}}]}]}
J
# start_daemon: `ferrite serve` from CONFIG, its pid in $TMP/pid (started in a subshell: not a
# job of this shell, which reports a job's kill -9).
start_daemon() {
  ("$FERRITE" serve -m 0x3 -r "$SOCK" -c "$CONFIG" --log-level "${ISCSI_GUEST_LOG_LEVEL:-info}" >>"$LOGS/daemon.log" 2>&1 &
    echo $! >"$TMP/pid")
}
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
# wait_ready: the RPC socket answers and the portal listens.
wait_ready() {
  for _ in $(seq 600); do
    [ -S "$SOCK" ] && rpc iscsi_get_portal_groups >/dev/null 2>&1 &&
      python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1).close()" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
start_daemon
SERVER=
# Under set -e a failing command in the trap sets the exit status: every step may fail.
cleanup() {
  { [ -z "$SERVER" ] || kill "$SERVER"; } 2>/dev/null || true
  local pid
  pid=$(cat "$TMP/pid" 2>/dev/null) || pid=
  if [ -n "$pid" ]; then
    { kill "$pid"; } 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    { kill -KILL "$pid"; } 2>/dev/null || true
  fi
  { wait; } 2>/dev/null || true
  rm -rf "$TMP" 2>/dev/null || true
}
trap cleanup EXIT
wait_ready || { echo "iscsi-guest: FAIL: the daemon did not come up"; tail -n 30 "$LOGS/daemon.log"; exit 1; }
echo "iscsi-guest: $BASE:{plain,chap,mutual,file,redir} on 127.0.0.1:$PORT and :$PORT2 (private) (daemon pid $(cat "$TMP/pid"), log $LOGS/daemon.log)"

# The guest's requests (tests/vm/guest-lib.sh's `host`).
on_request() {
  local n=$1 cmd=$2 a=${3:-} b=${4:-} c=${5:-} rc=0
  echo "host: request $n: $cmd $a $b $c" >>"$LOGS/requests.log"
  case $cmd in
    disc_auth)
      # Discovery sessions: none, chap (one-way) or mutual CHAP from auth group 2.
      case $a in
        none) p='{"disable_chap":true}' ;;
        chap) p='{"require_chap":true,"chap_group":2}' ;;
        mutual) p='{"require_chap":true,"mutual_chap":true,"chap_group":2}' ;;
        *) return 98 ;;
      esac
      rpc iscsi_set_discovery_auth "$p" >>"$LOGS/requests.log" 2>&1 || rc=$?
      ;;
    alive)
      # The daemon runs and answers; its connections to the guest's node $a (if given).
      kill -0 "$(cat "$TMP/pid")" || return 1
      rpc iscsi_get_connections >"$TMP/conns.json" || return 1
      python3 - "$TMP/conns.json" "$a" >"$SHARE/out-$n" <<'P' || rc=$?
import json, sys
conns = json.load(open(sys.argv[1]))
want = sys.argv[2]
ids = sorted(c["id"] for c in conns if not want or c.get("target_node_name") == want)
print(len(ids), " ".join(map(str, ids)))
P
      ;;
    request_logout)
      rpc iscsi_target_node_request_logout "{\"name\":\"$BASE:file\"}" >>"$LOGS/requests.log" 2>&1 || rc=$?
      ;;
    set_auth)
      # Node $a's CHAP: mutual or one-way (auth group 1).
      case $b in
        mutual) p=',"require_chap":true,"mutual_chap":true' ;;
        oneway) p=',"require_chap":true' ;;
        *) return 98 ;;
      esac
      rpc iscsi_target_node_set_auth "{\"name\":\"$BASE:$a\",\"chap_group\":1$p}" >>"$LOGS/requests.log" 2>&1 || rc=$?
      ;;
    redirect)
      # Logins to node redir through portal group 1 go to portal group 2 (the guest's address).
      rpc iscsi_target_node_set_redirect \
        "{\"name\":\"$BASE:redir\",\"pg_tag\":1,\"redirect_host\":\"10.0.2.2\",\"redirect_port\":\"$PORT2\"}" \
        >>"$LOGS/requests.log" 2>&1 || rc=$?
      ;;
    latency)
      # The file LUN's delay bdev: new I/O takes $a µs.
      for t in avg_read p99_read avg_write p99_write; do
        rpc bdev_delay_update_latency "{\"delay_bdev_name\":\"Slow0\",\"latency_type\":\"$t\",\"latency_us\":$a}" \
          >>"$LOGS/requests.log" 2>&1 || rc=$?
      done
      ;;
    verify_plain)
      # The malloc LUN read by another client (libiscsi through qemu-img) and the guest's
      # files taken out of its ext4 with debugfs: same checksums as in the guest.
      if ! command -v debugfs >/dev/null || ! qemu-img --help 2>/dev/null | grep -q ' iscsi '; then
        echo "SKIP: no debugfs, or no qemu-img with an iscsi driver (qemu-block-extra)" >"$SHARE/out-$n"
        return 0
      fi
      rm -f "$TMP/plain.img"
      timeout 60 qemu-img convert -f raw -O raw "iscsi://127.0.0.1:$PORT/$BASE:plain/0" "$TMP/plain.img" \
        >>"$LOGS/requests.log" 2>&1 || return 1
      (
        cd "$TMP" || exit 1
        while read -r sum f; do
          debugfs -R "dump $f $TMP/x" "$TMP/plain.img" >/dev/null 2>&1 || { echo "host: debugfs dump $f failed"; exit 1; }
          got=$(md5sum <"$TMP/x" | cut -d' ' -f1)
          [ "$got" = "$sum" ] || { echo "host: $f: md5 $got on the LUN, $sum in the guest"; exit 1; }
          echo "host: $f $got"
        done <"$SHARE/plain.sums"
      ) >"$SHARE/out-$n" 2>&1 || rc=1
      rm -f "$TMP/plain.img" "$TMP/x"
      ;;
    restart)
      # A crash while the guest's fio runs, and a restart from the same config, same port.
      old=$(cat "$TMP/pid")
      kill -KILL "$old"
      for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.05; done
      echo "=== killed (pid $old) ===" >>"$LOGS/daemon.log"
      rm -f "$SOCK"
      start_daemon
      wait_ready || rc=1
      echo "host: daemon restarted (pid $(cat "$TMP/pid"), rc $rc)" >>"$LOGS/requests.log"
      ;;
    verify_file)
      # MIB MiB at MiB offset $a of the LUN's file hold what the guest wrote (md5 $c).
      got=$(dd if="$IMG" bs=1M skip="$a" count="$b" status=none | md5sum | cut -d' ' -f1)
      echo "host: $IMG at $a MiB, $b MiB: md5 $got (guest: $c)" >"$SHARE/out-$n"
      [ "$got" = "$c" ] || rc=1
      ;;
    *) echo "host: unknown request '$cmd'" >>"$LOGS/requests.log"; rc=99 ;;
  esac
  return $rc
}
serve_guest_requests "$SHARE" on_request

GUEST=$TMP/guest.sh
{
  echo "PORT=$PORT PORT2=$PORT2 BASE=$BASE STEPS='${ISCSI_GUEST_STEPS:-1 2 3}'"
  echo "U1=$U1 S1=$S1 U2=$U2 S2=$S2 MU=$MU MS=$MS DU=$DU DS=$DS DMU=$DMU DMS=$DMS"
  cat "$ROOT/tests/vm/guest-iscsi.sh"
} >"$GUEST"
T0=$SECONDS
rc=0
"$VM/run-guest.sh" -t "${TMO:-220}" -s "$SHARE" -l "$LOGS/console.log" "$GUEST" >/dev/null || rc=$?
grep -E "^(===|ok:|FAIL|PASS|host:|HARNESS: host)" "$LOGS/console.log" || true
{ cp "$SHARE/dmesg.txt" "$LOGS/dmesg.log"; } 2>/dev/null || true
if ! kill -0 "$(cat "$TMP/pid")" 2>/dev/null; then
  echo "iscsi-guest: FAIL: the daemon died; last lines of $LOGS/daemon.log:"
  tail -n 40 "$LOGS/daemon.log"
  exit 1
fi
if [ "$rc" != 0 ]; then
  echo "iscsi-guest: FAIL (guest rc $rc, console and daemon log in $LOGS); last lines of the daemon's log:"
  tail -n 30 "$LOGS/daemon.log"
  exit 1
fi
# The restarted daemon took the guest's session again (a login to the file node after the kill).
if ! sed -n '/=== killed/,$p' "$LOGS/daemon.log" | grep -q "logged in to $BASE:file"; then
  echo "iscsi-guest: FAIL: no login to $BASE:file after the restart in $LOGS/daemon.log"
  exit 1
fi
# The guest answered every NOP-In (the daemon pings every 2 s; no answer in 20 s closes).
if grep -q "no answer to a NOP-In" "$LOGS/daemon.log"; then
  echo "iscsi-guest: FAIL: NOP-Ins went unanswered:"
  grep "no answer to a NOP-In" "$LOGS/daemon.log" | head -n 5
  exit 1
fi
if grep -qE "panicked| ERROR " "$LOGS/daemon.log"; then
  echo "iscsi-guest: FAIL: errors in $LOGS/daemon.log:"
  grep -E "panicked| ERROR " "$LOGS/daemon.log" | head -n 10
  exit 1
fi
echo "iscsi-guest: PASS ($((SECONDS - T0)) s in the guest)"
