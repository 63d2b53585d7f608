#!/usr/bin/env bash
# The Linux kernel's NBD client, in a QEMU guest (../shared/vm), against Ferrite's NBD server:
# nbd-client connects to a 256 MiB malloc export, writes 16 MiB raw and through ext4, reads back
# and compares (tests/guest-nbd.sh of the shared VM harness). The host here has no nbd module;
# the guest has one. Prints SKIP with the reason when the guest cannot be built.
# Usage: tests/vm/nbd-guest.sh [FERRITE_BINARY]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VM=$(cd "$ROOT/../shared/vm" 2>/dev/null && pwd) || { echo "SKIP nbd-guest: ../shared/vm not found"; exit 0; }
FERRITE=${1:-$ROOT/target/debug/ferrite}
[ -x "$FERRITE" ] || (cd "$ROOT" && cargo build -q -p ferrite)

if ! command -v qemu-system-x86_64 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null 2>&1 || true
fi
command -v qemu-system-x86_64 >/dev/null || { echo "SKIP nbd-guest: qemu-system-x86_64 not installed"; exit 0; }
if ! out=$(bash "$VM/build-guest.sh" 2>&1); then
  echo "SKIP nbd-guest: the guest could not be built: $(printf '%s' "$out" | tail -n 3)"
  exit 0
fi

TMP=$(mktemp -d)
SOCK=$TMP/ferrite.sock
# A free port (the guest reaches the host's 127.0.0.1 as 10.0.2.2).
PORT=${NBD_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
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
