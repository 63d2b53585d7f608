#!/usr/bin/env bash
# ferrite perf on null and malloc bdevs, one core, 4 KiB randread, QD 1 and 128, no hugepages.
# The peer is SPDK v24.01 bdevperf; SPDK cannot be built on this machine kind (no package, no
# network beyond package registries), so its figures are the ones measured on this machine kind
# and given in issue 2. Usage: bench/perf_null_malloc.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
declare -A SPDK=([null_1]=4200000 [null_128]=8900000 [malloc_1]=970000 [malloc_128]=1200000)
cat > "$TMP/null.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]}]}
J
cat > "$TMP/malloc.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":262144,"block_size":4096}}]}]}
J
printf '%-8s %4s %14s %14s %7s\n' bdev qd ferrite_iops spdk_iops ratio
for kind in null malloc; do
  for qd in 1 128; do
    res="$OUT/perf_${kind}_qd${qd}.json"
    "$FERRITE" perf --json "$TMP/$kind.json" -q "$qd" -o 4096 -w randread -t "$T" -m 0x1 --results-json "$res" >/dev/null
    iops=$(json_get "$res" "int(d['total']['iops'])")
    peer=${SPDK[${kind}_${qd}]}
    printf '%-8s %4s %14s %14s %7.2f\n' "$kind" "$qd" "$iops" "$peer" "$(python3 -c "print($iops/$peer)")"
  done
done
