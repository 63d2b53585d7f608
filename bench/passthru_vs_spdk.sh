#!/usr/bin/env bash
# Cost of a passthru bdev per I/O: ferrite perf (release) on null and on passthru-over-null,
# 4 KiB randread, QD 128, one core, and SPDK's bdevperf on the same two configs in the same run
# when SPDK_DIR is set (SPDK_DIR=$(bash ../shared/anchors/spdk.sh)).
# Ferrite runs both bdevs in one process per round, in turns of TURN s (0.1, `--interleave`):
# this machine's speed drifts by up to 2x between spells of a few seconds, more than the cost
# measured, so the cost is taken per pair of adjacent turns (ns/I/O of the passthru's turn minus
# the null's) and the median of all pairs is reported. SPDK's bdevperf cannot take turns: it
# alternates processes of SECONDS s, ROUNDS times, and its cost is the difference of medians.
# Prints IOPS per round, each side's ns/I/O and cost, and the ratio Ferrite/SPDK of the costs.
# Usage: [TURN=0.1] bench/passthru_vs_spdk.sh [SECONDS] [ROUNDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
ROUNDS=${2:-3}
cat > "$TMP/null.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}},
 {"method":"bdev_wait_for_examine"}]}]}
J
cat > "$TMP/pt.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}},
 {"method":"bdev_passthru_create","params":{"base_bdev_name":"Null0","name":"PT0"}},
 {"method":"bdev_wait_for_examine"}]}]}
J
# ferrite_round: one process, Null0 and PT0 in turns; appends each turn pair's cost (ns/I/O)
# to $TMP/costs and prints the round's median IOPS of each bdev.
ferrite_round() {
  local res="$TMP/res.json"
  "$FERRITE" perf --json "$TMP/pt.json" -T Null0 -T PT0 -q 128 -o 4096 -w randread -t "$T" -m 0x1 \
    --interleave "${TURN:-0.1}" --results-json "$res" >/dev/null || fail "ferrite perf --interleave failed"
  python3 - "$res" "$TMP/costs" <<'PY'
import json, statistics, sys
rounds = json.load(open(sys.argv[1]))["interleave"]["rounds"]
with open(sys.argv[2], "a") as out:
    for t in rounds:
        out.write(f"{1e9 / t['PT0'] - 1e9 / t['Null0']}\n")
print(int(statistics.median(t["Null0"] for t in rounds)), int(statistics.median(t["PT0"] for t in rounds)))
PY
}
spdk_iops() { # CONFIG BDEV
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --no-pci --no-huge -s 1536 -m 0x1 \
    --json "$1" -T "$2" -q 128 -o 4096 -w randread -t "$T" 2>&1 | tr -d '\r' |
    awk '$1 == "Total" { for (i = 1; i <= NF; i++) if ($i == ":") { print int($(i + 1)); exit } }'
}
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
declare -a F_NULL F_PT S_NULL S_PT
printf '%-6s %-8s %12s %12s\n' round tool null_iops pt_iops
for r in $(seq 1 "$ROUNDS"); do
  read -r fnull fpt <<<"$(ferrite_round)"
  F_NULL+=("$fnull") F_PT+=("$fpt")
  printf '%-6s %-8s %12s %12s\n' "$r" ferrite "${F_NULL[-1]}" "${F_PT[-1]}"
  if [ -n "${SPDK_DIR:-}" ]; then
    S_NULL+=("$(spdk_iops "$TMP/null.json" Null0)")
    S_PT+=("$(spdk_iops "$TMP/pt.json" PT0)")
    [ -n "${S_NULL[-1]}" ] && [ -n "${S_PT[-1]}" ] || fail "could not read bdevperf's Total line"
    printf '%-6s %-8s %12s %12s\n' "$r" spdk "${S_NULL[-1]}" "${S_PT[-1]}"
  fi
done
fn=$(median "${F_NULL[@]}"); fp=$(median "${F_PT[@]}")
fcost=$(python3 -c "import statistics; print(statistics.median(float(x) for x in open('$TMP/costs')))")
printf 'ferrite: null %.1f ns/IO, passthru %.1f ns/IO (medians of turns), passthru costs %.1f ns/IO (median of %d turn pairs)\n' \
  "$(python3 -c "print(1e9/$fn)")" "$(python3 -c "print(1e9/$fp)")" "$fcost" "$(wc -l <"$TMP/costs")"
if [ -n "${SPDK_DIR:-}" ]; then
  sn=$(median "${S_NULL[@]}"); sp=$(median "${S_PT[@]}")
  scost=$(python3 -c "print(1e9/$sp - 1e9/$sn)")
  printf 'spdk:    null %.1f ns/IO, passthru %.1f ns/IO, passthru costs %.1f ns/IO\n' \
    "$(python3 -c "print(1e9/$sn)")" "$(python3 -c "print(1e9/$sp)")" "$scost"
  printf 'ratio (ferrite passthru cost / spdk passthru cost): %.2f\n' "$(python3 -c "print($fcost/$scost)")"
else
  echo "SKIP spdk: SPDK_DIR is not set (SPDK_DIR=\$(bash ../shared/anchors/spdk.sh))"
fi
