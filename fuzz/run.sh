#!/usr/bin/env bash
# Fuzzes the JSON-RPC request parser with cargo-fuzz (libFuzzer).
#
# Usage: fuzz/run.sh [SECONDS]    (default 30)
#
# Needs a nightly toolchain (installed with rustup if missing; skipped with exit 0 if that is
# impossible) and cargo-fuzz (installed if missing). Starts from a fresh corpus made of
# fuzz/seeds/rpc_request; crashes land in fuzz/artifacts/rpc_request and make this exit non-zero.
set -euo pipefail

SECONDS_TO_RUN="${1:-30}"
if ! [[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ ]] || [ "$SECONDS_TO_RUN" -eq 0 ]; then
    echo "usage: $0 [SECONDS]   (SECONDS a positive integer, default 30)" >&2
    exit 2
fi

FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET=rpc_request

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
CORPUS="corpus/$TARGET"
ARTIFACTS="artifacts/$TARGET"
rm -rf "$CORPUS"
mkdir -p "$CORPUS" "$ARTIFACTS"
cp seeds/"$TARGET"/* "$CORPUS"/
crashes_before=$(find "$ARTIFACTS" -type f | wc -l)

LOG="$(mktemp "${TMPDIR:-/tmp}/ferrite-fuzz.XXXXXX")"
trap 'rm -f "$LOG"' EXIT

set +e
cargo +nightly fuzz run "$TARGET" "$CORPUS" -- \
    -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)
corpus_files=$(find "$CORPUS" -type f | wc -l)
crashes=$(( $(find "$ARTIFACTS" -type f | wc -l) - crashes_before ))

if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    echo "FAIL fuzz $TARGET: exit $status after ${execs:-?} execs, $crashes new artifact(s) in fuzz/$ARTIFACTS"
    exit 1
fi
echo "OK fuzz $TARGET: ${execs:-?} execs in ${SECONDS_TO_RUN}s, corpus $corpus_files files, no crashes"
