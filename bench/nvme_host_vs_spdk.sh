#!/usr/bin/env bash
# Ferrite's NVMe/TCP host against SPDK's, side by side in one run: SPDK's nvmf_tgt on core 0
# serves a null namespace (1 GiB, 4 KiB blocks); on core 1, `ferrite perf` and SPDK's bdevperf
# load the same JSON config (bdev_nvme_attach_controller to that target, so each runs its own
# NVMe/TCP host: Ferrite's crates/nvmf-host, SPDK's bdev_nvme) and run the same job. Cells:
# 4 KiB randread QD 1, 32, 128; 4 KiB randwrite QD 32; 128 KiB read QD 32. Each cell runs the
# two hosts back to back ROUNDS times (who goes first alternates between rounds) and prints the
# medians of their IOPS, the ratio of the medians, and the median and range of the per-round
# quotients ferrite/spdk: each quotient compares runs made seconds apart, while this machine's
# speed drifts by 10-20% over minutes, so many short rounds show a small difference better than
# a few long ones (e.g. ROUNDS=10 with 2 s runs).
# CELLS (an extended regular expression) keeps the cells whose "workload size qd" matches.
# TCP_CC (e.g. cubic): the run goes into a network namespace of its own whose loopback uses that
# congestion control (see bench/nvmf_vs_spdk.sh for why it matters on loopback).
# Usage: [ROUNDS=3] [CELLS=regex] [TCP_CC=cubic] bench/nvme_host_vs_spdk.sh [SECONDS]
# Needs SPDK (../shared/anchors/spdk.sh unpacks it); prints SKIP without it.
source "$(dirname "$0")/common.sh"
in_tcp_cc_netns "$@"
T=${1:-4}
ROUNDS=${ROUNDS:-3}
need_spdk bin/nvmf_tgt examples/bdevperf
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib"
say_tcp_cc
NQN=nqn.2016-06.io.spdk:cnode1
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$TMP/target.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":262144,"block_size":4096}}]},
{"subsystem":"nvmf","config":[{"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
{"method":"nvmf_create_subsystem","params":{"nqn":"$NQN","allow_any_host":true,"serial_number":"SPDK001"}},
{"method":"nvmf_subsystem_add_ns","params":{"nqn":"$NQN","namespace":{"bdev_name":"Null0"}}},
{"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$PORT"}}}]}]}
J
cat >"$TMP/host.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller","params":{"name":"Nvme0","trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$PORT","subnqn":"$NQN"}}]}]}
J
"$SPDK_DIR/build/bin/nvmf_tgt" --no-huge -s 1024 -m 0x1 --disable-cpumask-locks -r "$TMP/tgt.sock" \
  --json "$TMP/target.json" >"$TMP/tgt.log" 2>&1 &
TGT=$!
trap 'kill $TGT 2>/dev/null; wait $TGT 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do grep -q "NVMe/TCP Target Listening\|Listening on" "$TMP/tgt.log" 2>/dev/null && break; sleep 0.1; done
sleep 1

# ferrite_iops QD SIZE WORKLOAD
ferrite_iops() {
  local res="$TMP/f.json"
  "$FERRITE" perf --json "$TMP/host.json" -T Nvme0n1 -q "$1" -o "$2" -w "$3" -t "$T" -m 0x2 \
    --results-json "$res" >"$TMP/f.log" 2>&1 || { tail -3 "$TMP/f.log" >&2; fail "ferrite perf failed ($*)"; }
  json_get "$res" "int(d['total']['iops'])"
}

# spdk_iops QD SIZE WORKLOAD: bdevperf's Total line (its report lines start with \r).
spdk_iops() {
  "$SPDK_DIR/build/examples/bdevperf" --json "$TMP/host.json" -q "$1" -o "$2" -w "$3" -t "$T" -m 0x2 \
    --no-pci --no-huge -s 1024 --disable-cpumask-locks 2>/dev/null | tr '\r' '\n' |
    awk '/^ *Total *:/ {printf "%d\n", $3}' | tail -1
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '%-9s %7s %4s %12s %12s %6s %9s %13s\n' workload size qd ferrite spdk ratio "q_median" "q_range"
for cell in "randread 4096 1" "randread 4096 32" "randread 4096 128" "randwrite 4096 32" "read 131072 32"; do
  [[ $cell =~ ${CELLS:-.} ]] || continue
  read -r w size qd <<<"$cell"
  f=() s=() q=()
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      fv=$(ferrite_iops "$qd" "$size" "$w")
      sv=$(spdk_iops "$qd" "$size" "$w")
    else
      sv=$(spdk_iops "$qd" "$size" "$w")
      fv=$(ferrite_iops "$qd" "$size" "$w")
    fi
    [ -n "$sv" ] && [ "$sv" -gt 0 ] || fail "no bdevperf result for $cell"
    f+=("$fv") s+=("$sv") q+=("$(python3 -c "print(f'{$fv/$sv:.3f}')")")
  done
  fm=$(printf '%s\n' "${f[@]}" | median)
  sm=$(printf '%s\n' "${s[@]}" | median)
  qm=$(printf '%s\n' "${q[@]}" | median)
  qr="$(printf '%s\n' "${q[@]}" | sort -g | head -1)-$(printf '%s\n' "${q[@]}" | sort -g | tail -1)"
  printf '%-9s %7s %4s %12s %12s %6.2f %9s %13s\n' "$w" "$size" "$qd" "$fm" "$sm" "$(python3 -c "print($fm/$sm)")" "$qm" "$qr"
done
