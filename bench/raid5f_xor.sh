#!/usr/bin/env bash
# raid5f parity XOR: Ferrite's (crates/raid/src/xor.rs) against ISA-L's xor_gen (Debian
# libisal-dev; what SPDK's accel software path runs), same sizes, same method, this CPU.
#   bash bench/raid5f_xor.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -e /usr/include/isa-l/raid.h ] || apt-get install -y -qq libisal-dev >/dev/null
cc -O2 -o "$TMP/xor_isal" "$ROOT/bench/raid5f_xor/xor_isal.c" -lisal
(cd "$ROOT" && cargo bench -q -p ferrite-raid --bench xor --no-run 2>/dev/null)
BIN=$(ls -t "$ROOT"/target/release/deps/xor-* | grep -v '\.d$' | head -1)
grep -m1 'model name' /proc/cpuinfo
# SRCS LEN SETS: 2 and 3 data strips of 64 KiB (3- and 4-member raid5f), 4 of 128 KiB, and a
# working set beyond the caches (16 stripes of 2 × 1 MiB).
for a in "2 65536 1" "2 65536 64" "3 65536 1" "4 131072 1" "2 1048576 16"; do
  # shellcheck disable=SC2086
  f=$("$BIN" $a | awk '{print $(NF-1)}')
  # shellcheck disable=SC2086
  i=$("$TMP/xor_isal" $a | awk '{print $(NF-1)}')
  printf 'srcs/len/sets %-14s ferrite %6s GB/s  isa-l %6s GB/s  ratio %s\n' "$a" "$f" "$i" \
    "$(python3 -c "print(f'{$f/$i:.2f}')")"
done
