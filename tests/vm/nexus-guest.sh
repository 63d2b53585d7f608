#!/usr/bin/env bash
# The nexus (Mayastor's replicated volume) under a Linux guest, with two node crashes: three
# daemons on this machine on separate loopback ports. Daemons B and C each export a replica (a
# 64 MiB file through the uring bdev, so that a restarted daemon still holds its data) over
# NVMe/TCP; daemon A runs the nexus over a local child (uring:// file) and the two remote ones
# (nvmf://), fenced with a reservation key, published over NVMe/TCP. The guest (Debian's 6.1
# kernel, nvme-cli, fio; tests/vm/guest-nexus.sh) connects and:
#   1 runs fio randwrite + crc32c verify; B is killed with -9 mid-run: no error reaches the guest
#     (the nexus faults B's child and goes on), and the verify passes;
#   2 B is restarted from its saved config and the nexus brings its child back by itself
#     (auto_online_ms: it probes faulted children and rebuilds one that answers again): a partial
#     rebuild (the segments written while B was away), rate-bounded so that it is still running
#     when
#   3 A (the nexus's daemon) is killed with -9 mid-rebuild and restarted from its saved config and
#     the health store file: the nexus was not shut down cleanly, so it reassembles from one child
#     the store knows as healthy (the local one; C may differ from it where writes were in flight)
#     and rebuilds C and B in full from it (never from B); the guest's kernel
#     reconnects, its write during the outage goes through, and the whole device reads back the
#     same before and after the rebuild ends;
#   4 every child then holds the same bytes (the three files compared block by block) and the
#     same as the guest reads.
# The guest asks the host for the crashes through the shared folder (req-N / ack-N). Prints
# SKIP with the reason when the guest cannot run. Bounded: TMO=180 s for the guest (TCG by
# default; ACCEL=kvm for run-guest.sh where KVM works).
# Usage: tests/vm/nexus-guest.sh [FERRITE_BINARY]. Logs in target/nexus-guest/.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup nexus-guest "${1:-}"

TMP=$(mktemp -d)
SHARE=$TMP/share
mkdir -p "$SHARE"
LOGS=$ROOT/target/nexus-guest
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
PA=$(free_port)
PB=$(free_port)
while [ "$PB" = "$PA" ]; do PB=$(free_port); done
PC=$(free_port)
while [ "$PC" = "$PA" ] || [ "$PC" = "$PB" ]; do PC=$(free_port); done
UUID=5b1e7c2a-9d3f-4e6a-8b0c-1f2e3d4c5b6a
NQN=nqn.2019-05.io.openebs:$UUID
NQNB=nqn.2019-05.io.openebs:replica-b
NQNC=nqn.2019-05.io.openebs:replica-c
MIB=64
for f in a b c; do truncate -s ${MIB}M "$TMP/$f.img"; done
LOCAL="uring://$TMP/a.img?blk_size=512"
RB="nvmf://127.0.0.1:$PB/$NQNB"
RC="nvmf://127.0.0.1:$PC/$NQNC"
SERVER=

# start NAME [ARGS...]: starts daemon NAME (socket $TMP/NAME.sock, pid in $TMP/NAME.pid).
start() {
  local n=$1
  shift
  rm -f "$TMP/$n.sock"
  "$FERRITE" serve -m 0x1 --no-pin --reactor-mode interrupt -r "$TMP/$n.sock" "$@" >>"$LOGS/$n.log" 2>&1 &
  echo $! >"$TMP/$n.pid"
  for _ in $(seq 600); do [ -S "$TMP/$n.sock" ] && return 0; sleep 0.05; done
  echo "nexus-guest: daemon $n did not start"
  return 1
}
# crash NAME: kill -9.
crash() {
  local p
  p=$(cat "$TMP/$1.pid")
  kill -KILL "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  echo "host: daemon $1 (pid $p) killed with -9"
}
rpc() { local n=$1; shift; "$FERRITE" rpc -s "$TMP/$n.sock" "$@"; }
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; fi
  local pids=() p
  for n in a b c; do [ -f "$TMP/$n.pid" ] && pids+=("$(cat "$TMP/$n.pid")"); done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Daemons restarted by the request loop are not this shell's children: wait for them too (a
  # nexus records its clean shutdown in the store file under $TMP as it stops).
  for p in "${pids[@]}"; do
    for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  rm -rf "$TMP" || true
}
trap cleanup EXIT
listener() { echo "{\"trtype\":\"tcp\",\"adrfam\":\"ipv4\",\"traddr\":\"127.0.0.1\",\"trsvcid\":\"$1\"}"; }

# The replicas.
for r in b c; do
  port=$([ $r = b ] && echo "$PB" || echo "$PC")
  nqn=$([ $r = b ] && echo "$NQNB" || echo "$NQNC")
  start $r
  {
    rpc $r bdev_uring_create "{\"name\":\"R$r\",\"filename\":\"$TMP/$r.img\",\"block_size\":512}"
    rpc $r nvmf_create_transport --trtype TCP
    rpc $r nvmf_create_subsystem "{\"nqn\":\"$nqn\",\"serial_number\":\"REPLICA$r\",\"allow_any_host\":true}"
    rpc $r nvmf_subsystem_add_ns "{\"nqn\":\"$nqn\",\"namespace\":{\"bdev_name\":\"R$r\"}}"
    rpc $r nvmf_subsystem_add_listener "{\"nqn\":\"$nqn\",\"listen_address\":$(listener "$port")}"
    rpc $r save_config >"$TMP/$r.json"
  } >/dev/null
done
# The nexus.
start a
{
  rpc a nexus_create "{\"name\":\"vol\",\"uuid\":\"$UUID\",\"children\":[\"$LOCAL\",\"$RB\",\"$RC\"],
    \"local_first\":true,\"resv_key\":$((0xa1)),\"store\":\"$TMP/store.json\",\"auto_online_ms\":500}"
  rpc a nexus_publish "{\"name\":\"vol\",\"trsvcid\":\"$PA\"}"
  rpc a save_config >"$TMP/a.json"
} >/dev/null
echo "nexus-guest: nexus vol on :$PA over $LOCAL, $RB, $RC (logs in $LOGS)"

# child_state URI: the state of child URI of nexus vol.
child_state() {
  rpc a nexus_get_nexuses '{"name":"vol"}' |
    python3 -c 'import json, sys; n = json.load(sys.stdin)[0]; print(next(c["state"] for c in n["children"] if c["uri"] == sys.argv[1]))' "$1"
}
nexus_json() { rpc a nexus_get_nexuses '{"name":"vol"}'; }

# The guest's requests (tests/vm/guest-lib.sh's `host`).
on_request() {
  local n=$1 cmd=$2 rc=0 s
  echo "host: request $n: $cmd"
  case $cmd in
    kill_b)
      crash b
      # The nexus faults B's child (its I/O fails, its controller is lost).
      for _ in $(seq 100); do [ "$(child_state "$RB")" = faulted ] && break; sleep 0.1; done
      s=$(child_state "$RB")
      echo "host: B's child is $s"
      [ "$s" = faulted ] || rc=1;;
    restart_b)
      # Bounded, so that the rebuild is still running when A is killed.
      rpc a nexus_set_rebuild_rate '{"name":"vol","max_mb_sec":4}' >/dev/null || return 1
      start b --json "$TMP/b.json" || return 1
      # Nobody asks: the nexus finds B answering again (within its probe back-off, at most 5 s).
      for _ in $(seq 150); do [ "$(child_state "$RB")" = rebuilding ] && break; sleep 0.1; done
      echo "host: B's child is $(child_state "$RB") after B's restart"
      sleep 1
      s=$(rpc a nexus_rebuild_get_stats "{\"name\":\"vol\",\"uri\":\"$RB\"}")
      echo "host: rebuild of B: $s"
      python3 -c 'import json, sys; s = json.loads(sys.argv[1])
assert s["state"] == "running" and s["is_partial"] is True and 0 < s["blocks_recovered"] < s["blocks_total"], s' "$s" || rc=1;;
    crash_a)
      crash a
      start a --json "$TMP/a.json" || return 1
      nexus_json >"$TMP/after.json"
      echo "host: nexus after the restart: $(cat "$TMP/after.json")"
      # Reassembled from one healthy child (a crash: the first the store holds healthy, the
      # local one), the others rebuilt from it; B is never a source.
      python3 - "$TMP/after.json" "$RB" "$LOCAL" <<'EOF' || rc=1
import json, sys
n = json.load(open(sys.argv[1]))[0]
st = {c["uri"]: c["state"] for c in n["children"]}
assert st[sys.argv[2]] in ("rebuilding", "faulted"), st
assert [u for u, s in st.items() if s == "online"] == [sys.argv[3]], st
EOF
      s=$(rpc a nexus_rebuild_get_stats "{\"name\":\"vol\",\"uri\":\"$RB\"}")
      echo "host: rebuild of B after the restart: $s"
      python3 -c 'import json, sys; s = json.loads(sys.argv[1])
assert s["source"] != sys.argv[2] and s["is_partial"] is False, s' "$s" "$RB" || rc=1;;
    finish)
      # The rebuild ends; every child holds the same bytes.
      for _ in $(seq 600); do
        nexus_json | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)[0]["state"] != "online")' && break
        sleep 0.1
      done
      s=$(nexus_json)
      echo "host: nexus at the end: $s"
      python3 -c 'import json, sys; n = json.loads(sys.argv[1])[0]; assert n["state"] == "online", n' "$s" || return 1
      rpc a bdev_flush '{"name":"vol"}' >/dev/null 2>&1 || true
      cmp "$TMP/a.img" "$TMP/b.img" || { echo "host: children A and B differ"; return 1; }
      cmp "$TMP/a.img" "$TMP/c.img" || { echo "host: children A and C differ"; return 1; }
      echo "host: the three children hold the same $MIB MiB"
      md5sum <"$TMP/a.img" | cut -d' ' -f1 >"$SHARE/out-$n";;
    *) echo "host: unknown request '$cmd'"; rc=99;;
  esac
  return $rc
}
serve_guest_requests "$SHARE" on_request

GUEST=$TMP/guest.sh
{
  echo "PORT=$PA NQN='$NQN' MIB=$MIB"
  cat "$ROOT/tests/vm/guest-nexus.sh"
} >"$GUEST"
rc=0
"$VM/run-guest.sh" -t "${TMO:-180}" -s "$SHARE" -l "$LOGS/console.log" "$GUEST" || rc=$?
for n in a b c; do
  if ! kill -0 "$(cat "$TMP/$n.pid")" 2>/dev/null; then
    echo "nexus-guest: FAIL: daemon $n died; last lines of $LOGS/$n.log:"
    tail -n 40 "$LOGS/$n.log"
    exit 1
  fi
done
if [ "$rc" != 0 ]; then
  echo "nexus-guest: FAIL (guest rc $rc); last lines of $LOGS/a.log:"
  tail -n 60 "$LOGS/a.log"
  exit 1
fi
echo "nexus-guest: PASS"
