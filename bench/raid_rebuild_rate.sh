#!/usr/bin/env bash
# raid1 rebuild rate: a 4 GiB malloc member (4 KiB blocks) rebuilt (bdev_raid_remove_base_bdev,
# then bdev_raid_add_base_bdev of the same bdev: a full rebuild) (a) with no foreground I/O, in
# GiB/s, and (b) with foreground 4 KiB randrw (50% reads) at QD 32 on the RAID and the rebuild
# bounded by bdev_raid_set_options process_max_bandwidth_mb_sec (BW, default 200): the
# foreground's IOPS during the rebuild against before it (the goal: at least 80%).
# One `ferrite perf` process (release), one core, RPC socket open: the RAID R and a null bdev N
# take turns of TURN s (--interleave; R, N | N, R | R, N), after --fill wrote every block of R
# (so the rebuild reads real memory, not the zero page). Rebuild (a) runs in N's double turn
# (nothing on R), rebuild (b) starts as R's double turn does; R's IOPS of round 1 are "before",
# of rounds 2 and 3 "during".
# Usage: [TURN=10] [BW=200] bench/raid_rebuild_rate.sh
source "$(dirname "$0")/common.sh"
TURN=${TURN:-10}
BW=${BW:-200}
cat >"$TMP/r.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":1048576,"block_size":4096}},
 {"method":"bdev_malloc_create","params":{"name":"M1","num_blocks":1048576,"block_size":4096}},
 {"method":"bdev_raid_create","params":{"name":"R","raid_level":"raid1","base_bdevs":["M0","M1"]}},
 {"method":"bdev_null_create","params":{"name":"N","num_blocks":262144,"block_size":4096}},
 {"method":"bdev_wait_for_examine"}]}]}
J
SOCK="$TMP/rpc.sock"
rpc() { # METHOD [PARAMS_JSON]
  python3 - "$SOCK" "$1" "${2:-}" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
req = {"jsonrpc": "2.0", "id": 1, "method": sys.argv[2]}
if sys.argv[3]: req["params"] = json.loads(sys.argv[3])
s.sendall(json.dumps(req).encode())
buf = b""
while True:
    buf += s.recv(65536)
    try: r = json.loads(buf); break
    except ValueError: continue
if "error" in r: sys.exit(f"rpc {sys.argv[2]}: {r['error']}")
print(json.dumps(r["result"]))
PY
}
reads() { rpc bdev_get_iostat "{\"name\":\"$1\"}" | python3 -c "import json,sys; print(json.load(sys.stdin)['bdevs'][0]['num_read_ops'])"; }
rebuilding() { rpc bdev_raid_get_bdevs '{"category":"all"}' | python3 -c "import json,sys; print(int(any('process' in r for r in json.load(sys.stdin))))"; }
# wait_busy BDEV: until BDEV's read count moves (its turn has begun).
wait_busy() {
  local a b
  a=$(reads "$1")
  while :; do sleep 0.05; b=$(reads "$1"); [ "$b" = "$a" ] || return 0; done
}
rebuild() { # BW_MB: a full rebuild of M1; prints its seconds
  rpc bdev_raid_set_options "{\"process_max_bandwidth_mb_sec\":$1}" >/dev/null
  rpc bdev_raid_remove_base_bdev '{"name":"M1"}' >/dev/null
  local t0
  t0=$(date +%s.%N)
  rpc bdev_raid_add_base_bdev '{"raid_bdev":"R","base_bdev":"M1"}' >/dev/null
  echo "$t0"
}
"$FERRITE" perf --json "$TMP/r.json" -T R -T N -q 32 -o 4096 -w randrw -M 50 -t $((3 * TURN)) -m 0x1 --fill \
  --interleave "$TURN" -r "$SOCK" --results-json "$TMP/res.json" >"$TMP/perf.out" 2>&1 &
PERF=$!
while [ ! -S "$SOCK" ]; do sleep 0.1; done
wait_busy R # round 1, R's turn: "before"
wait_busy N # N's double turn: nothing on R
r0=$(reads R)
t0=$(rebuild 0)
while [ "$(rebuilding)" = 1 ]; do sleep 0.02; done
t1=$(date +%s.%N)
[ "$(reads R)" = "$r0" ] || echo "warning: R had foreground I/O during rebuild (a)"
wait_busy R # R's double turn: rebuild (b), bounded
t2=$(rebuild "$BW")
sleep $((2 * TURN - 1))
still=$(rebuilding)
wait "$PERF" || { cat "$TMP/perf.out"; fail "ferrite perf failed"; }
python3 - "$TMP/res.json" "$t0" "$t1" "$still" "$BW" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rounds = d["interleave"]["rounds"]
secs = float(sys.argv[3]) - float(sys.argv[2])
print(f"(a) no foreground I/O: 4 GiB rebuilt in {secs:.2f} s = {4 / secs:.2f} GiB/s")
before = rounds[0]["R"]
during = (rounds[1]["R"] + rounds[2]["R"]) / 2
print(f"(b) randrw QD 32, rebuild bounded at {sys.argv[5]} MB/s (still rebuilding at the end of R's turns: {sys.argv[4] == '1'}):")
print(f"    foreground IOPS before {before:,.0f}, during {during:,.0f}: {during / before:.2f} of before")
PY
