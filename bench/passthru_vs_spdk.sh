#!/usr/bin/env bash
# Cost of a passthru bdev per I/O: ferrite perf (release) on null and on passthru-over-null,
# 4 KiB randread, QD 128, one core, ROUNDS rounds each (alternating), and SPDK's bdevperf on the
# same two configs in the same run when SPDK_DIR is set (SPDK_DIR=$(bash ../shared/anchors/spdk.sh)).
# Prints IOPS per round, the median ns/I/O of each config, the passthru's extra ns/I/O, and the
# ratio Ferrite/SPDK of that extra cost.
# Usage: bench/passthru_vs_spdk.sh [SECONDS] [ROUNDS]
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
ferrite_iops() { # CONFIG BDEV
  local res="$TMP/res.json"
  "$FERRITE" perf --json "$1" -T "$2" -q 128 -o 4096 -w randread -t "$T" -m 0x1 --results-json "$res" >/dev/null ||
    fail "ferrite perf on $2 failed"
  json_get "$res" "int(d['total']['iops'])"
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
  F_NULL+=("$(ferrite_iops "$TMP/null.json" Null0)")
  F_PT+=("$(ferrite_iops "$TMP/pt.json" PT0)")
  printf '%-6s %-8s %12s %12s\n' "$r" ferrite "${F_NULL[-1]}" "${F_PT[-1]}"
  if [ -n "${SPDK_DIR:-}" ]; then
    S_NULL+=("$(spdk_iops "$TMP/null.json" Null0)")
    S_PT+=("$(spdk_iops "$TMP/pt.json" PT0)")
    [ -n "${S_NULL[-1]}" ] && [ -n "${S_PT[-1]}" ] || fail "could not read bdevperf's Total line"
    printf '%-6s %-8s %12s %12s\n' "$r" spdk "${S_NULL[-1]}" "${S_PT[-1]}"
  fi
done
fn=$(median "${F_NULL[@]}"); fp=$(median "${F_PT[@]}")
fcost=$(python3 -c "print(1e9/$fp - 1e9/$fn)")
printf 'ferrite: null %.1f ns/IO, passthru %.1f ns/IO, passthru costs %.1f ns/IO\n' \
  "$(python3 -c "print(1e9/$fn)")" "$(python3 -c "print(1e9/$fp)")" "$fcost"
if [ -n "${SPDK_DIR:-}" ]; then
  sn=$(median "${S_NULL[@]}"); sp=$(median "${S_PT[@]}")
  scost=$(python3 -c "print(1e9/$sp - 1e9/$sn)")
  printf 'spdk:    null %.1f ns/IO, passthru %.1f ns/IO, passthru costs %.1f ns/IO\n' \
    "$(python3 -c "print(1e9/$sn)")" "$(python3 -c "print(1e9/$sp)")" "$scost"
  printf 'ratio (ferrite passthru cost / spdk passthru cost): %.2f\n' "$(python3 -c "print($fcost/$scost)")"
else
  echo "SKIP spdk: SPDK_DIR is not set (SPDK_DIR=\$(bash ../shared/anchors/spdk.sh))"
fi
