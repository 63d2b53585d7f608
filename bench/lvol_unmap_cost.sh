#!/usr/bin/env bash
# What releasing a cluster costs an unmap (issue: thin lvols give space back on unmap). In one
# daemon (`ferrite serve -m 0x1`, core 0), an lvstore with 1 MiB clusters on BASE (malloc, or
# uring: a file in $TMP) holds a thin lvol and a thick one of CLUSTERS MiB, both exported over
# NBD. qemu-io (core 1) writes each cluster whole, then discards it whole, cluster after cluster:
# on the thin lvol every discard releases its cluster (metadata written, then the map entry
# cleared; the cluster is free after a quiesce, off the discard's path), on the thick one the same
# discard goes to the base and nothing else happens. The two alternate ROUNDS times. Reported, as
# the bdev layer timed them (bdev_get_iostat of each lvol before and after a round: the daemon's
# time, not qemu-io's, whose own round trip is milliseconds): the median over rounds of a discard's
# mean time, thin and thick, their quotient (thin/thick: what a release adds), the writes likewise
# (a thin write after a release allocates its cluster again), the longest discard, and the
# clusters each lvol holds at the end (thin 0: every discard released; thick CLUSTERS).
#
# SPDK is not run: v26.05 has no NBD server over a socket and none of its clients alternates
# writes and unmaps of one cluster, so the peer here is Ferrite's own unmap that releases nothing,
# in the same run.
# Usage: [ROUNDS=5] [CLUSTERS=256] [BASE=malloc|uring] bash bench/lvol_unmap_cost.sh
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-5}
CLUSTERS=${CLUSTERS:-256}
BASE=${BASE:-malloc}
need qemu-io qemu-utils

SOCK=$TMP/f.sock
PORT=$(free_port)
taskset -c 0 "$FERRITE" serve -m 0x1 -r "$SOCK" --log-level warn &
PID=$!
trap 'kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@" >/dev/null; }
MIB=$((CLUSTERS * 2 + 64))
case $BASE in
  malloc) rpc bdev_malloc_create --name B0 --num-blocks $((MIB * 256)) --block-size 4096 ;;
  uring) truncate -s "${MIB}M" "$TMP/base.img"
    rpc bdev_uring_create "{\"name\":\"B0\",\"filename\":\"$TMP/base.img\",\"block_size\":4096}" ;;
  *) fail "BASE is malloc or uring" ;;
esac
rpc bdev_lvol_create_lvstore '{"bdev_name":"B0","lvs_name":"lvs0","cluster_sz":1048576}'
rpc bdev_lvol_create "{\"lvs_name\":\"lvs0\",\"lvol_name\":\"thin\",\"size_in_mib\":$CLUSTERS,\"thin_provision\":true}"
rpc bdev_lvol_create "{\"lvs_name\":\"lvs0\",\"lvol_name\":\"thick\",\"size_in_mib\":$CLUSTERS}"
rpc nbd_server_start --address "127.0.0.1:$PORT"
rpc nbd_server_add_export --bdev-name lvs0/thin --name thin
rpc nbd_server_add_export --bdev-name lvs0/thick --name thick

# stat LVOL: "unmap_ops unmap_ticks write_ops write_ticks max_unmap_ticks tick_rate" of its bdev
# (the bdev layer's own clock: the time the daemon took, not the client's).
stat() {
  "$FERRITE" rpc -s "$SOCK" bdev_get_iostat --name "lvs0/$1" | python3 -c 'import json,sys
d=json.load(sys.stdin); b=d["bdevs"][0]
print(b["num_unmap_ops"], b["unmap_latency_ticks"], b["num_write_ops"], b["write_latency_ticks"], b["max_unmap_latency_ticks"], d["tick_rate"])'
}
# run LVOL: one qemu-io of CLUSTERS (write, discard) pairs; appends the round's mean discard and
# write times and the longest discard (us, from the bdev's statistics) to $TMP/LVOL.times.
run() {
  local args=(-f raw) c before after
  for c in $(seq 0 $((CLUSTERS - 1))); do
    args+=(-c "write -P $((c % 250 + 1)) ${c}M 1M" -c "discard ${c}M 1M")
  done
  before=$(stat "$1")
  taskset -c 1 qemu-io "${args[@]}" "nbd://127.0.0.1:$PORT/$1" >"$TMP/qemu-io.out" || fail "qemu-io on $1"
  if grep -q "failed" "$TMP/qemu-io.out"; then fail "qemu-io on $1: $(grep failed "$TMP/qemu-io.out" | head -1)"; fi
  after=$(stat "$1")
  python3 -c '
import sys
b, a = [list(map(int, x.split())) for x in sys.argv[1:3]]
us = 1e6 / a[5]
print((a[1] - b[1]) / (a[0] - b[0]) * us, (a[3] - b[3]) / (a[2] - b[2]) * us, a[4] * us)' "$before" "$after" >>"$TMP/$1.times"
}
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run thin; run thick; else run thick; run thin; fi
done
alloc() { "$FERRITE" rpc -s "$SOCK" bdev_lvol_get_lvols | python3 -c 'import json,sys; print([l for l in json.load(sys.stdin) if l["name"]=="'"$1"'"][0]["num_allocated_clusters"])'; }
python3 - "$TMP/thin.times" "$TMP/thick.times" "$(alloc thin)" "$(alloc thick)" "$BASE" "$CLUSTERS" "$ROUNDS" <<'EOF'
import sys, statistics
def load(p):
    rows = [list(map(float, l.split())) for l in open(p)]
    return [r[0] for r in rows], [r[1] for r in rows], max(r[2] for r in rows)
tu, tw, tmax = load(sys.argv[1])
ku, kw, kmax = load(sys.argv[2])
m = statistics.median
print(f"BASE={sys.argv[5]} CLUSTERS={sys.argv[6]} ROUNDS={sys.argv[7]}: clusters held at the end: thin {sys.argv[3]}, thick {sys.argv[4]}")
print("mean us per request in a round, as the bdev layer timed it; median over the rounds")
print(f"{'op':8} {'thin':>9} {'thick':>9} {'thin/thick':>11}")
print(f"{'discard':8} {m(tu):9.1f} {m(ku):9.1f} {m(tu) / m(ku):11.2f}")
print(f"{'write':8} {m(tw):9.1f} {m(kw):9.1f} {m(tw) / m(kw):11.2f}")
print(f"longest discard: thin {tmax:.1f} us, thick {kmax:.1f} us")
EOF
