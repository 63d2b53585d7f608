# shellcheck shell=bash
# Sourced by the guest scripts from the host share (/host/guest-lib.sh, copied there by
# serve_guest_requests in tests/vm/common.sh): failing with a message, and asking the host.

# fail MESSAGE: the test fails.
fail() { echo "FAIL: $*"; exit 1; }

REQ=0
# host WORDS...: the host runs the request WORDS; fails unless it answers 0 within 30 s. What the
# request answers with (if anything) is in /host/out-$REQ afterwards.
host() {
  REQ=$((REQ + 1))
  echo "$*" >/host/.req-$REQ && mv /host/.req-$REQ /host/req-$REQ
  for _ in $(seq 300); do [ -f /host/ack-$REQ ] && break; sleep 0.1; done
  [ -f /host/ack-$REQ ] || fail "host did not answer request $REQ ($*) within 30 s"
  local rc
  rc=$(cat /host/ack-$REQ)
  [ "$rc" = 0 ] || fail "host request $REQ ($*) failed (rc $rc)"
}
