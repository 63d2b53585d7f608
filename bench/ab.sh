#!/usr/bin/env bash
# An A/B of two builds on one bench script, in one run: the script runs with build A, then B,
# then B, then A (the machine drifts; the order evens it out), each with its own peer run where
# the script has one, and every output is printed under a header naming the build. Compare
# Ferrite's figures (or its ratio to the peer of the same run) between A and B.
# ORDER (default "A B B A") sets the runs, e.g. ORDER="A B" for one each.
# Usage: [ORDER=...] bench/ab.sh A_BIN B_BIN SCRIPT [ARGS...]   e.g.
#   bench/ab.sh /tmp/old/ferrite target/release/ferrite bench/perf_vs_spdk.sh 5
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 A_BIN B_BIN SCRIPT [ARGS...]" >&2; exit 2; }
A=$(realpath "$1")
B=$(realpath "$2")
SCRIPT=$3
shift 3
for bin in "$A" "$B"; do
  [ -x "$bin" ] || { echo "ab: $bin is not an executable" >&2; exit 2; }
done
for name in ${ORDER:-A B B A}; do
  case $name in
    A) bin=$A ;;
    B) bin=$B ;;
    *) echo "ab: ORDER names builds A and B only, not $name" >&2; exit 2 ;;
  esac
  echo "===== build $name: $bin ($(date -u +%H:%M:%S))"
  FERRITE_BIN="$bin" bash "$SCRIPT" "$@"
done
