#!/usr/bin/env bash
# The Linux kernel's NBD client, in a QEMU guest (../shared/vm), against Ferrite's NBD server:
# nbd-client connects to a 256 MiB malloc export, writes 16 MiB raw and through ext4, reads back
# and compares (tests/guest-nbd.sh of the shared VM harness). The host here has no nbd module;
# the guest has one. Prints SKIP with the reason when the guest cannot be built.
# Usage: tests/vm/nbd-guest.sh [FERRITE_BINARY]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
guest_setup nbd-guest "${1:-}"

TMP=$(mktemp -d)
SOCK=$TMP/ferrite.sock
PORT=${NBD_PORT:-$(free_port)}
"$FERRITE" serve -m 0x1 -r "$SOCK" --log-level warn &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@" >/dev/null; }
rpc bdev_malloc_create --name Guest0 --num-blocks 65536 --block-size 4096
rpc nbd_server_start --address "127.0.0.1:$PORT"
rpc nbd_server_add_export --bdev-name Guest0 --name guest
NBD_PORT=$PORT bash "$VM/tests/run-nbd.sh" guest
echo "nbd-guest: PASS"
