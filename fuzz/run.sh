#!/usr/bin/env bash
# Fuzzes Ferrite's parsers with cargo-fuzz (libFuzzer), one target after the other:
#   rpc_request  - the JSON-RPC stream codec
#   nbd_parsers  - the NBD handshake and transmission codec
#   nvmf_tcp_pdu - the NVMe/TCP PDU decoder (and, through its checks, the encoder)
#   nvmf_target  - the NVMe/TCP target's command handlers, an in-process engine fed each input
#                  over a socket after a valid ICReq and Connect
#   blob_md      - the blobstore on-disk format codec (super block, md pages, masks) and the
#                  offline checker on whole images
#   blob_load    - the runtime blobstore load on valid images with metadata pages (super block,
#                  masks, md region) overwritten: no panic, no hang, nothing written on failure
#   vhost_chain  - the vhost-user-blk request path short of the bdev: split rings in guest memory
#                  walked as a queue does, chains laid out as virtio-blk requests, headers,
#                  discard segments and configuration reads decoded
#   vhost_packed - the same for packed rings: chains taken and walked (indirect tables too),
#                  laid out, used in a fuzzed order, kept in a packed inflight area that a
#                  restart's view must agree with
#   scsi_cdb     - the SCSI CDB decoder: any bytes decode to a command within its opcode's usage
#                  data or to a fault whose sense data encodes in both formats
#   iscsi_pdu    - the iSCSI PDU decoder in random chunkings, the framing helper, the one-shot
#                  decoder (and, through re-encoding, the encoder)
#   iscsi_login_keys - the iSCSI text key parser (whole and continued), the key negotiation,
#                  and a target's login fed the input as successive Login Requests
#
# Usage: fuzz/run.sh [SECONDS]    (default 30; each target runs that long)
#
# Needs a nightly toolchain (installed with rustup if missing; skipped with exit 0 if that is
# impossible) and cargo-fuzz (installed if missing). Each target starts from a fresh corpus made
# of fuzz/seeds/TARGET; crashes land in fuzz/artifacts/TARGET. Every target runs even if an
# earlier one failed; each prints an OK or FAIL line, and any FAIL makes this exit non-zero.
set -euo pipefail

TARGETS=(rpc_request nbd_parsers nvmf_tcp_pdu nvmf_target blob_md blob_load vhost_chain vhost_packed scsi_cdb iscsi_pdu iscsi_login_keys)

SECONDS_TO_RUN="${1:-30}"
if ! [[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ ]] || [ "$SECONDS_TO_RUN" -eq 0 ]; then
    echo "usage: $0 [SECONDS]   (SECONDS a positive integer, default 30)" >&2
    exit 2
fi

FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "no nightly toolchain; trying: rustup toolchain install nightly --profile minimal" >&2
    if ! reason="$(rustup toolchain install nightly --profile minimal 2>&1)"; then
        echo "SKIP fuzz: no nightly toolchain ($(printf '%s' "$reason" | tail -n 1))"
        exit 0
    fi
    if ! reason="$(cargo +nightly --version 2>&1)"; then
        echo "SKIP fuzz: no nightly toolchain ($(printf '%s' "$reason" | tail -n 1))"
        exit 0
    fi
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cd "$FUZZ_DIR"

LOG="$(mktemp "${TMPDIR:-/tmp}/ferrite-fuzz.XXXXXX")"
trap 'rm -f "$LOG"' EXIT

# Fuzzes one target for SECONDS_TO_RUN, prints its summary line and keeps it in RESULT; returns
# non-zero on a crash (or when the target cannot be set up).
RESULT=""
fuzz_target() {
    local target="$1"
    local corpus="corpus/$target"
    local artifacts="artifacts/$target"
    rm -rf "$corpus"
    mkdir -p "$corpus" "$artifacts"
    if ! cp seeds/"$target"/* "$corpus"/; then
        RESULT="FAIL fuzz $target: no seeds in fuzz/seeds/$target"
        echo "$RESULT"
        return 1
    fi
    local crashes_before
    crashes_before=$(find "$artifacts" -type f | wc -l)

    local status
    set +e
    cargo +nightly fuzz run "$target" "$corpus" -- \
        -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 2>&1 | tee "$LOG"
    status=${PIPESTATUS[0]}
    set -e

    local execs corpus_files crashes
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)
    corpus_files=$(find "$corpus" -type f | wc -l)
    crashes=$(( $(find "$artifacts" -type f | wc -l) - crashes_before ))

    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        RESULT="FAIL fuzz $target: exit $status after ${execs:-?} execs, $crashes new artifact(s) in fuzz/$artifacts"
        echo "$RESULT"
        return 1
    fi
    RESULT="OK fuzz $target: ${execs:-?} execs in ${SECONDS_TO_RUN}s, corpus $corpus_files files, no crashes"
    echo "$RESULT"
}

summary=()
failed=0
for target in "${TARGETS[@]}"; do
    fuzz_target "$target" || failed=1
    summary+=("$RESULT")
done

# Repeat the per-target lines together, since each was followed by the next target's log.
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
