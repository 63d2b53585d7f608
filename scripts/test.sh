#!/usr/bin/env bash
# Every test Ferrite has: format, lints, unit/property/integration tests (which start the real
# daemon and use real clients), the user guides' commands (docs/guide), the guest-kernel NBD,
# NVMe/TCP, lvol, vhost-user-blk and iSCSI tests (and reservations across iSCSI and NVMe/TCP,
# and the nexus with two node crashes under a guest's fio), and a short fuzz run of each parser.
# Works on a fresh Debian machine with Rust (rustup) installed; installs what else it needs.
# FUZZ_SECONDS=0 skips fuzzing, VM_TESTS=0 the guest kernel tests.
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

# Real clients of the targets (NBD: nbdinfo/nbdcopy, qemu-img/qemu-io, fio's nbd engine; iSCSI).
need_pkgs=()
command -v nbdinfo >/dev/null || need_pkgs+=(libnbd-bin)
command -v qemu-io >/dev/null || need_pkgs+=(qemu-utils)
command -v fio >/dev/null || need_pkgs+=(fio)
# iSCSI: libiscsi's tools and conformance suite, qemu-img's libiscsi driver.
command -v iscsi-test-cu >/dev/null || need_pkgs+=(libiscsi-bin)
compgen -G "/usr/lib/*/qemu/block-iscsi.so" >/dev/null || need_pkgs+=(qemu-block-extra)
# tgt's target daemon, the iSCSI initiator bdev's second peer (crates/ferrite/tests/iscsi_host.rs).
command -v tgtd >/dev/null || need_pkgs+=(tgt)
# etcd, the nexus's health store (crates/ferrite/tests/nexus.rs starts its own on loopback ports).
command -v etcd >/dev/null || need_pkgs+=(etcd-server)
# Prometheus and its promtool (crates/ferrite/tests/metrics.rs scrapes the daemon with both).
command -v prometheus >/dev/null || need_pkgs+=(prometheus)
# tmux, the terminal `ferrite top` is read from (crates/ferrite/tests/top.rs, docs/guide/observe.md).
command -v tmux >/dev/null || need_pkgs+=(tmux)
# curl, the user guides' Prometheus scrape (docs/guide/observe.md, run by scripts/guide-test.py).
command -v curl >/dev/null || need_pkgs+=(curl)
# Headless Chromium renders `ferrite perf --plot FILE.html` (crates/ferrite/tests/perf_plot.rs).
command -v chromium >/dev/null || need_pkgs+=(chromium)
# groff renders `ferrite man`, systemd-analyze checks contrib/systemd/ferrite.service
# (crates/ferrite/tests/packaging.rs).
command -v groff >/dev/null || need_pkgs+=(groff-base)
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
if [ ${#need_pkgs[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "== installing ${need_pkgs[*]}"
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null; } ||
    echo "could not install ${need_pkgs[*]}: tests that need them will say SKIP"
fi

# SPDK's own rpc.py (PyPI package "spdk", command spdk-rpc) for the compatibility test.
venv=target/spdk-venv
if [ ! -x "$venv/bin/spdk-rpc" ]; then
  echo "== installing SPDK's rpc.py (pip: spdk==26.9) into $venv"
  mkdir -p target
  if ! python3 -m venv "$venv" 2>/dev/null; then
    command -v apt-get >/dev/null && apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
    python3 -m venv "$venv" || true
  fi
  "$venv/bin/pip" install -q spdk==26.9 || echo "could not install spdk-rpc: its test will say SKIP"
fi
if [ -x "$venv/bin/spdk-rpc" ]; then
  export SPDK_RPC="$PWD/$venv/bin/spdk-rpc"
fi

# SPDK v26.05 (../shared/anchors) for the tests that run spdk_tgt and its own rpc.py.
if [ -z "${SPDK_DIR:-}" ] && [ -f ../shared/anchors/spdk.sh ]; then
  echo "== unpacking SPDK v26.05 (../shared/anchors/spdk.sh)"
  if dir=$(bash ../shared/anchors/spdk.sh); then
    export SPDK_DIR="$dir"
  else
    echo "could not set up SPDK: its tests will say SKIP"
  fi
fi
# A build made for a CPU with AVX-512 dies of SIGILL before main on one without: say so here
# (the tests that run SPDK's programs check the same and say SKIP; its rpc.py still serves).
if [ -n "${SPDK_DIR:-}" ]; then
  rc=0
  # (the "; exit" keeps the subshell, whose own report of the signal goes to /dev/null)
  (LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/bin/spdk_tgt" --help >/dev/null 2>&1; exit $?) 2>/dev/null || rc=$?
  if [ "$rc" -ge 128 ]; then
    echo "SPDK's programs do not run on this CPU (spdk_tgt --help killed by signal $((rc - 128)): built for" \
      "instructions it lacks, e.g. AVX-512): the tests that run them will say SKIP"
  fi
fi

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
# The user guides, every command as a user types it, against the binary cargo test just built
# (one guide at a time; each on ports of its own).
echo "== user guides (docs/guide)"
FERRITE_BIN=target/debug/ferrite python3 scripts/guide-test.py
if [ "${VM_TESTS:-1}" != 0 ]; then
  echo "== guest kernel tests (QEMU, ../shared/vm)"
  bash tests/vm/nbd-guest.sh
  bash tests/vm/nvmf-guest.sh
  bash tests/vm/lvol-guest.sh
  bash tests/vm/vhost-guest.sh
  bash tests/vm/vhost-migrate.sh
  bash tests/vm/vhost-packed-guest.sh
  bash tests/vm/iscsi-guest.sh
  bash tests/vm/pr-guest.sh
  bash tests/vm/nexus-guest.sh
fi
if [ "${FUZZ_SECONDS:-30}" != 0 ]; then
  echo "== fuzz"
  bash fuzz/run.sh "${FUZZ_SECONDS:-30}"
fi
echo "== all tests passed"
