#!/usr/bin/env bash
# Every test Ferrite has: format, lints, unit/property/integration tests (which start the real
# daemon), and a short fuzz run of each parser. Works on a fresh Debian machine with Rust
# (rustup) installed; installs what else it needs. FUZZ_SECONDS=0 skips fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
if ! command -v python3 >/dev/null && command -v apt-get >/dev/null; then
  apt-get install -y -qq python3 >/dev/null
fi

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
if [ "${FUZZ_SECONDS:-30}" != 0 ]; then
  echo "== fuzz"
  bash fuzz/run.sh "${FUZZ_SECONDS:-30}"
fi
echo "== all tests passed"
