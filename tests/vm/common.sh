# shellcheck shell=bash
# Sourced by the guest tests (tests/vm/*-guest.sh): what each needs before its own steps.
# Sets ROOT; defines free_port and guest_setup.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# free_port: a free TCP port on 127.0.0.1 (the guest reaches the host's 127.0.0.1 as 10.0.2.2).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# guest_setup NAME BINARY [TOOL...]: sets VM (../shared/vm) and FERRITE (BINARY, or the debug
# build, built if missing), installs QEMU with apt-get when it is missing and this is root, checks
# the host TOOLs, and builds the guest. Anything missing prints "SKIP NAME: why" and exits 0.
guest_setup() {
  local name=$1 bin=$2 t out
  shift 2
  VM=$(cd "$ROOT/../shared/vm" 2>/dev/null && pwd) || { echo "SKIP $name: ../shared/vm not found"; exit 0; }
  FERRITE=${bin:-$ROOT/target/debug/ferrite}
  [ -x "$FERRITE" ] || (cd "$ROOT" && cargo build -q -p ferrite)
  if ! command -v qemu-system-x86_64 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null 2>&1 || true
  fi
  for t in qemu-system-x86_64 "$@"; do
    command -v "$t" >/dev/null || { echo "SKIP $name: $t not installed"; exit 0; }
  done
  if ! out=$(bash "$VM/build-guest.sh" 2>&1); then
    echo "SKIP $name: the guest could not be built: $(printf '%s' "$out" | tail -n 3)"
    exit 0
  fi
}

# serve_guest_requests SHARE HANDLER: answers the guest's requests in the background and sets
# SERVER to the server's pid. The guest (tests/vm/guest-lib.sh's `host`) leaves SHARE/req-N
# holding words; the server runs `HANDLER N WORDS...` (N, for answers with data: SHARE/out-N)
# and writes its exit code to SHARE/ack-N. It also copies guest-lib.sh into SHARE for the guest
# script to source.
serve_guest_requests() {
  local share=$1 handler=$2
  cp "$ROOT/tests/vm/guest-lib.sh" "$share/guest-lib.sh"
  rm -f "$share"/req-* "$share"/ack-* "$share"/out-*
  (
    set +e # a failed request is answered, not fatal
    n=1
    while :; do
      if [ -f "$share/req-$n" ]; then
        read -r -a words <"$share/req-$n"
        "$handler" "$n" "${words[@]}"
        echo "$?" >"$share/.ack" && mv "$share/.ack" "$share/ack-$n"
        n=$((n + 1))
      else
        sleep 0.05
      fi
    done
  ) &
  SERVER=$!
}
