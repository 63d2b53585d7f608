#!/usr/bin/env bash
# One bdev exported over iSCSI and NVMe/TCP at once, and persistent reservations across the two
# protocols (they share the bdev's reservation registry): in a QEMU guest (../shared/vm), the
# Linux kernel's iSCSI initiator (open-iscsi, sg_persist from sg3-utils) and its NVMe/TCP host
# (nvme-cli) reach the same malloc bdev. A SCSI Write Exclusive reservation refuses the NVMe
# host's writes (its reads go on), and an NVMe one the SCSI initiator's; each holder's writes
# read back through the other protocol (tests/vm/guest-pr.sh). Prints SKIP with the reason when
# the guest cannot run.
# Usage: tests/vm/pr-guest.sh [FERRITE_BINARY]; env TMO=300 (seconds).
# The console and the daemon's log are kept in target/pr-guest/.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup pr-guest "${1:-}"

TMP=$(mktemp -d)
LOGS=$ROOT/target/pr-guest
mkdir -p "$LOGS"
SOCK=$TMP/ferrite.sock
NVME_PORT=$(free_port)
ISCSI_PORT=$(free_port)
while [ "$ISCSI_PORT" = "$NVME_PORT" ]; do ISCSI_PORT=$(free_port); done
NQN=nqn.2016-06.io.spdk:ferrite-pr
IQN=iqn.2016-06.io.spdk:shared

"$FERRITE" serve -m 0x3 -r "$SOCK" >"$LOGS/daemon.log" 2>&1 &
PID=$!
cleanup() {
  { kill "$PID" && wait "$PID"; } 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
{
  rpc bdev_malloc_create --name Shared --num-blocks 32768 --block-size 512
  rpc nvmf_create_transport --trtype TCP
  rpc nvmf_create_subsystem "{\"nqn\":\"$NQN\",\"serial_number\":\"FERRITE0000000000077\",\"allow_any_host\":true}"
  rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NQN\",\"namespace\":{\"bdev_name\":\"Shared\",\"nsid\":1}}"
  rpc nvmf_subsystem_add_listener "{\"nqn\":\"$NQN\",\"listen_address\":{\"trtype\":\"tcp\",\"adrfam\":\"ipv4\",\"traddr\":\"127.0.0.1\",\"trsvcid\":\"$NVME_PORT\"}}"
  rpc iscsi_create_portal_group "{\"tag\":1,\"portals\":[{\"host\":\"127.0.0.1\",\"port\":\"$ISCSI_PORT\"}]}"
  rpc iscsi_create_initiator_group '{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}'
  rpc iscsi_create_target_node '{"name":"shared","alias_name":"","luns":[{"bdev_name":"Shared","lun_id":0}],"pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"queue_depth":32}'
} >/dev/null
echo "pr-guest: bdev Shared as $NQN on :$NVME_PORT and $IQN on :$ISCSI_PORT (daemon pid $PID)"

GUEST=$TMP/guest.sh
{
  echo "NVME_PORT=$NVME_PORT ISCSI_PORT=$ISCSI_PORT NQN='$NQN' IQN='$IQN'"
  cat "$ROOT/tests/vm/guest-pr.sh"
} >"$GUEST"
rc=0
"$VM/run-guest.sh" -t "${TMO:-300}" -l "$LOGS/console.log" "$GUEST" || rc=$?
if ! kill -0 "$PID" 2>/dev/null; then
  echo "pr-guest: FAIL: the daemon died; last lines of $LOGS/daemon.log:"
  tail -n 40 "$LOGS/daemon.log"
  exit 1
fi
if [ "$rc" != 0 ]; then
  echo "pr-guest: FAIL (guest rc $rc); last lines of $LOGS/daemon.log:"
  tail -n 40 "$LOGS/daemon.log"
  exit 1
fi
echo "pr-guest: PASS"
