#!/usr/bin/env bash
# An A/B of two builds on one bench script, in one run: the script runs with build A, then B,
# then B, then A (the machine drifts; the order evens it out), each with its own peer run where
# the script has one, and every output is printed under a header naming the build. Compare
# Ferrite's figures (or its ratio to the peer of the same run) between A and B.
# Usage: bench/ab.sh A_BIN B_BIN SCRIPT [ARGS...]   e.g.
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
for run in "A $A" "B $B" "B $B" "A $A"; do
  set -- $run "$@"
  name=$1 bin=$2
  shift 2
  echo "===== build $name: $bin ($(date -u +%H:%M:%S))"
  FERRITE_BIN="$bin" bash "$SCRIPT" "$@"
done
