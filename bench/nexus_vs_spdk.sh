#!/usr/bin/env bash
# The nexus against SPDK v26.05's raid1 (../shared/anchors), and the nexus's rebuild.
#   local:  a nexus over 2 malloc children (`ferrite perf`) vs SPDK's raid1 over 2 malloc
#           (bdevperf), 4 KiB randread and randwrite at QD 128, one core each, same run;
#   remote: a nexus over one local malloc and one NVMe/TCP child (a malloc exported by a
#           Ferrite target on its own core, loopback) vs SPDK's raid1 over a malloc and a
#           bdev_nvme namespace of SPDK's own nvmf_tgt (on its own core; each target runs only
#           during its own side's runs: SPDK's would take half of that core from Ferrite's);
#   rebuild: a full rebuild of a 4 GiB malloc child in a daemon, no foreground I/O (GiB/s);
#           then foreground 4 KiB randwrite QD 32 (`ferrite perf` over NVMe/TCP to the published
#           nexus) alone and during a rebuild bounded to REBUILD_MBS MiB/s: the share of its
#           IOPS it keeps.
# Reads of never-written malloc memory would hit the zero page: every bdev under test is written
# whole first (`ferrite perf --fill`; bdevperf -z with a 1 MiB sequential write pass), and the
# rebuild's measured pass copies between children whose memory earlier passes wrote.
# Rounds alternate which side runs first; medians of ROUNDS. Prints the ratio Ferrite/SPDK.
# Usage: [ROUNDS=3] [REBUILD_MBS=200] bench/nexus_vs_spdk.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
ROUNDS=${ROUNDS:-3}
need_spdk examples/bdevperf bin/nvmf_tgt
# Two SPDK programs at once: nvmf_tgt (the remote child) and bdevperf.
spdk_memory 2048 2
MB=512 # malloc children of the IOPS cells
BLKS=$((MB * 256))
NQN=nqn.2016-06.io.spdk:nexus-bench

# --- configs
malloc_json() { echo "{\"method\":\"bdev_malloc_create\",\"params\":{\"name\":\"$1\",\"num_blocks\":$BLKS,\"block_size\":4096}}"; }
cat >"$TMP/f_local.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[$(malloc_json M0),$(malloc_json M1),
 {"method":"nexus_create","params":{"name":"NX","children":["bdev:///M0","bdev:///M1"],"store":"$TMP/store-l.json"}},
 {"method":"bdev_wait_for_examine"}]}]}
J
cat >"$TMP/s_local.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[$(malloc_json M0),$(malloc_json M1),
 {"method":"bdev_raid_create","params":{"name":"R1","raid_level":"raid1","strip_size_kb":0,"base_bdevs":["M0","M1"]}},
 {"method":"bdev_wait_for_examine"}]}]}
J
FPORT=$(free_port)
SPORT=$(free_port)
while [ "$SPORT" = "$FPORT" ]; do SPORT=$(free_port); done
target_json() { # PORT
  cat <<J
{"subsystems":[{"subsystem":"bdev","config":[$(malloc_json T0)]},
 {"subsystem":"nvmf","config":[{"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
  {"method":"nvmf_create_subsystem","params":{"nqn":"$NQN","allow_any_host":true,"serial_number":"NEXUSBENCH1"}},
  {"method":"nvmf_subsystem_add_ns","params":{"nqn":"$NQN","namespace":{"bdev_name":"T0"}}},
  {"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$1"}}}]}]}
J
}
target_json "$FPORT" >"$TMP/f_target.json"
target_json "$SPORT" >"$TMP/s_target.json"
cat >"$TMP/f_remote.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[$(malloc_json M0),
 {"method":"nexus_create","params":{"name":"NX","children":["bdev:///M0","nvmf://127.0.0.1:$FPORT/$NQN"],"local_first":true,"store":"$TMP/store-r.json"}},
 {"method":"bdev_wait_for_examine"}]}]}
J
cat >"$TMP/s_remote.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[$(malloc_json M0),
 {"method":"bdev_nvme_attach_controller","params":{"name":"N0","trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"$SPORT","subnqn":"$NQN"}},
 {"method":"bdev_raid_create","params":{"name":"R1","raid_level":"raid1","strip_size_kb":0,"base_bdevs":["M0","N0n1"]}},
 {"method":"bdev_wait_for_examine"}]}]}
J

# --- runners
ferrite_iops() { # CONFIG BDEV WORKLOAD QD
  local res="$TMP/res.json"
  "$FERRITE" perf --json "$1" -T "$2" -q "$4" -o 4096 -w "$3" -t "$T" -m 0x1 "${FERRITE_MEM[@]}" --results-json "$res" \
    --fill >/dev/null 2>"$TMP/perf.err" || { tail -5 "$TMP/perf.err" >&2; fail "ferrite perf on $2 failed"; }
  json_get "$res" "int(d['total']['iops'])"
}
perform_tests() { # SOCKET PARAMS_JSON -> IOPS
  PYTHONPATH="$SPDK_DIR/python" python3 -c '
import json, sys
from spdk.rpc.client import JSONRPCClient
r = JSONRPCClient(sys.argv[1], timeout=300.0).call("perform_tests", json.loads(sys.argv[2]))
print(int(sum(j["iops"] for j in r["results"])))' "$1" "$2"
}
spdk_iops() { # CONFIG BDEV WORKLOAD QD: bdevperf -z, a fill pass, then the timed run
  local sock="$TMP/bdevperf.sock" pid out
  rm -f "$sock"
  LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" --no-pci "${SPDK_MEM[@]}" -m 0x1 \
    -z -r "$sock" --json "$1" -T "$2" -q "$4" -o 4096 -w "$3" -t "$T" >"$TMP/bdevperf.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
  out=$(perform_tests "$sock" "{\"workload_type\":\"write\",\"io_size\":\"1048576\",\"queue_depth\":8,\"time_in_sec\":$((MB / 256 + 2))}" >/dev/null &&
    perform_tests "$sock" "{\"workload_type\":\"$3\",\"io_size\":\"4096\",\"queue_depth\":$4,\"time_in_sec\":$T}") || out=
  kill -INT "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
  [ -n "$out" ] || { tail -5 "$TMP/bdevperf.log" >&2; fail "bdevperf on $2 failed"; }
  echo "$out"
}
median() { python3 -c "import statistics,sys; print(int(statistics.median(float(x) for x in sys.argv[1:])))" "$@"; }
# The remote child's target, on core 1 (the clients on core 0): Ferrite's for Ferrite's runs,
# SPDK's nvmf_tgt for SPDK's, each running only during its side's remote runs (SPDK's polls
# its core all the time: left running, it would take half of core 1 from Ferrite's target).
TGT=
trap 'stop_pids ${TGT:-} ${RD:-}; rm -rf "$TMP"; [ -z "$HUGE_RESTORE" ] || echo "$HUGE_RESTORE" >/proc/sys/vm/nr_hugepages' EXIT
start_target() { # f|s
  local port=$FPORT
  if [ "$1" = f ]; then
    "$FERRITE" serve -m 0x2 -r "$TMP/ft.sock" --json "$TMP/f_target.json" "${FERRITE_MEM[@]}" >>"$TMP/ft.log" 2>&1 &
  else
    port=$SPORT
    LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/bin/nvmf_tgt" -m 0x2 "${SPDK_MEM[@]}" -r "$TMP/st.sock" \
      --json "$TMP/s_target.json" >>"$TMP/st.log" 2>&1 &
  fi
  TGT=$!
  for _ in $(seq 200); do
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()' "$port" 2>/dev/null && return
    kill -0 "$TGT" 2>/dev/null || break
    sleep 0.05
  done
  fail "the $1 target did not listen on $port (logs: $(tail -3 "$TMP/ft.log" "$TMP/st.log" 2>/dev/null))"
}
stop_target() { # SIGINT: SPDK gives its hugepages back as it exits
  kill -INT "$TGT" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$TGT" 2>/dev/null || break; sleep 0.05; done
  stop_pids "$TGT"
  TGT=
}
# side_iops f|s CELL WORKLOAD: one run of that side, with its target for the remote cell.
side_iops() {
  local out
  [ "$2" = local ] || start_target "$1"
  if [ "$1" = f ]; then out=$(ferrite_iops "$TMP/f_$2.json" NX "$3" 128); else out=$(spdk_iops "$TMP/s_$2.json" R1 "$3" 128); fi
  [ "$2" = local ] || stop_target
  echo "$out"
}

printf '%-8s %-10s %4s %12s %12s %7s\n' cell workload qd ferrite spdk ratio
for cell in local remote; do
  for w in randread randwrite; do
    f=() s=()
    for r in $(seq 1 "$ROUNDS"); do
      if [ $((r % 2)) = 1 ]; then
        f+=("$(side_iops f $cell $w)"); s+=("$(side_iops s $cell $w)")
      else
        s+=("$(side_iops s $cell $w)"); f+=("$(side_iops f $cell $w)")
      fi
    done
    fm=$(median "${f[@]}"); sm=$(median "${s[@]}")
    printf '%-8s %-10s %4s %12s %12s %7.2f   (ferrite %s; spdk %s)\n' "$cell" $w 128 "$fm" "$sm" \
      "$(python3 -c "print($fm/$sm)")" "${f[*]}" "${s[*]}"
  done
done

# --- rebuild of a 4 GiB malloc child
GIB=${REBUILD_GIB:-4}
RS=$TMP/rd.sock
"$FERRITE" serve -m 0x1 -r "$RS" "${FERRITE_MEM[@]}" >"$TMP/rd.log" 2>&1 &
RD=$!
for _ in $(seq 200); do [ -S "$RS" ] && break; sleep 0.05; done
rpc() { "$FERRITE" rpc -s "$RS" "$@"; }
for m in A B; do rpc bdev_malloc_create "{\"name\":\"$m\",\"num_blocks\":$((GIB * 262144)),\"block_size\":4096}" >/dev/null; done
rpc nexus_create "{\"name\":\"NR\",\"children\":[\"bdev:///A\"],\"store\":\"$TMP/store-rb.json\",\"rebuild_window_kb\":1024}" >/dev/null
# rebuild_pass FROM TO: TO leaves the nexus and comes back, rebuilt in full from FROM; prints
# GiB/s (blocks over the job's elapsed time).
rebuild_pass() {
  rpc nexus_remove_child "{\"name\":\"NR\",\"uri\":\"bdev:///$2\"}" >/dev/null 2>&1 || true
  rpc nexus_add_child "{\"name\":\"NR\",\"uri\":\"bdev:///$2\"}" >/dev/null
  local s
  while :; do
    s=$(rpc nexus_rebuild_get_stats "{\"name\":\"NR\",\"uri\":\"bdev:///$2\"}")
    [ "$(json_get <(echo "$s") "d['state']")" = running ] || break
    sleep 0.2
  done
  python3 -c 'import json, sys; s = json.loads(sys.argv[1]); assert s["state"] == "completed", s
print("%.2f" % (s["blocks_total"] * s["block_size"] / (s["elapsed_ms"] / 1e3) / 2**30))' "$s"
}
# Pass 1 writes B (A's memory is then read but never written); pass 2 writes A; from pass 3
# on, both children's memory has been written: those are the measured ones.
rebuild_pass A B >/dev/null
rpc nexus_remove_child '{"name":"NR","uri":"bdev:///A"}' >/dev/null
rebuild_pass B A >/dev/null
rates=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then rates+=("$(rebuild_pass A B)"); else rates+=("$(rebuild_pass B A)"); fi
done
echo "rebuild of a $GIB GiB malloc child, no foreground I/O: median $(python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "${rates[@]}") GiB/s (${rates[*]})"

# --- foreground QD 32 randwrite over NVMe/TCP, alone and during a bounded rebuild
PPORT=$(free_port)
rpc nexus_publish "{\"name\":\"NR\",\"trsvcid\":\"$PPORT\"}" >/dev/null
PNQN=$(rpc nexus_get_nexuses '{"name":"NR"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["published"][0].rsplit("/",1)[1])')
cat >"$TMP/fg.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_nvme_attach_controller","params":{"name":"F","trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"$PPORT","subnqn":"$PNQN"}},
 {"method":"bdev_wait_for_examine"}]}]}
J
fg_iops() {
  "$FERRITE" perf --json "$TMP/fg.json" -T Fn1 -q 32 -o 4096 -w randwrite -t "$T" -m 0x2 --results-json "$TMP/fg.res" \
    >/dev/null 2>"$TMP/fg.err" || { tail -5 "$TMP/fg.err" >&2; fail "foreground perf failed"; }
  json_get "$TMP/fg.res" "int(d['total']['iops'])"
}
MBS=${REBUILD_MBS:-200}
alone=() during=()
for r in $(seq 1 "$ROUNDS"); do
  alone+=("$(fg_iops)")
  rpc nexus_remove_child '{"name":"NR","uri":"bdev:///B"}' >/dev/null
  rpc nexus_set_rebuild_rate "{\"name\":\"NR\",\"max_mb_sec\":$MBS}" >/dev/null
  rpc nexus_add_child '{"name":"NR","uri":"bdev:///B"}' >/dev/null
  during+=("$(fg_iops)")
  st=$(rpc nexus_rebuild_get_stats '{"name":"NR","uri":"bdev:///B"}')
  [ "$(json_get <(echo "$st") "d['state']")" = running ] || fail "the rebuild ended before the foreground run did: $st"
  rpc nexus_rebuild_stop '{"name":"NR","uri":"bdev:///B"}' >/dev/null
  rpc nexus_set_rebuild_rate '{"name":"NR","max_mb_sec":0}' >/dev/null
  rpc nexus_online_child '{"name":"NR","uri":"bdev:///B"}' >/dev/null 2>&1 || true
  while [ "$(rpc nexus_get_nexuses '{"name":"NR"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["state"])')" != online ]; do sleep 0.2; done
done
am=$(median "${alone[@]}"); dm=$(median "${during[@]}")
printf 'foreground randwrite QD 32 over NVMe/TCP: alone %s IOPS, during a rebuild bounded to %s MiB/s %s IOPS: keeps %.0f%% (alone %s; during %s)\n' \
  "$am" "$MBS" "$dm" "$(python3 -c "print(100*$dm/$am)")" "${alone[*]}" "${during[*]}"
