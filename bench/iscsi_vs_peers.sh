#!/usr/bin/env bash
# Ferrite's iSCSI target vs SPDK v26.05's iscsi_tgt vs tgt (Linux SCSI target framework, Debian's
# `tgt`), all three in this run, driven by the same libiscsi clients, 4 KiB, on loopback TCP.
#   ferrite: `ferrite serve -m MASK --wait-for-rpc`, configured over its RPC socket with SPDK's
#            names: iscsi_set_options {max_queue_depth 128}, framework_start_init,
#            bdev_malloc_create (1 GiB of 4 KiB blocks), iscsi_create_portal_group (127.0.0.1,
#            a free port), iscsi_create_initiator_group (ANY/ANY), iscsi_create_target_node
#            (LUN 0 = the malloc bdev, queue_depth 128).
#   spdk:    SPDK's build/bin/iscsi_tgt -m MASK --wait-for-rpc, the same RPCs through SPDK's own
#            scripts/rpc.py (one batch on its stdin), the malloc bdev in SPDK's memory (-s 2048:
#            2 MiB hugepages where root can reserve them, reset at exit; see spdk_memory).
#   tgt:     a private tgtd (its own control port and portal), one LUN (LUN 1; tgt's LUN 0 is its
#            controller) on a 1 GiB file in /dev/shm with 4 KiB blocks (--blocksize 4096),
#            written whole from /dev/urandom first, pinned with taskset; as configured by default
#            otherwise (its I/O thread pool, MaxQueueCmd 128).
# The malloc LUNs are written whole before each measured run (`iscsi_rw -w fill`, 256 KiB
# writes): a read of never-written malloc memory could be served from the zero page.
# Clients (the targets listen on 127.0.0.1; each run a new session):
#   reads:  libiscsi's iscsi-perf (Debian libiscsi-bin) -r -b 1 -m QD -t SECONDS: random 4 KiB
#           READ(16). iscsi-perf 1.19 has no write mode, so
#   writes: bench/iscsi_rw.c (built here with cc against libiscsi-dev): the same libiscsi, the
#           same single-threaded poll() loop, WRITE(16) of 4 KiB at random LBAs, immediate data.
#           Its randread is cell "rw-randread", a check that the two clients cost the same.
#   fp-*:   `ferrite perf` (Ferrite's bdevperf) over a bdev_iscsi_create bdev: Ferrite's own
#           initiator (crates/iscsi-host), one reactor (--reactor-mode FP_MODE, adaptive), -q QD
#           -o 4096 -w randread|randwrite: a client that costs far less per I/O than libiscsi's,
#           so that from QD 32 up the targets, not the client, are measured.
# Cells:
#   randread / randwrite at QD 1, 32, 128: one session; the target on core 0 (ferrite and spdk
#     -m 0x1; tgtd under taskset -c 0), the client on core 1 (taskset -c 1).
#   64s-2core: SESSIONS (64) iscsi-perf processes at once, QD SESSION_QD (8) each, random 4 KiB
#     reads, each with its own initiator name; the target given both cores (ferrite and spdk
#     -m 0x3, tgtd under taskset -c 0,1) and the clients too (there are only two): everything
#     shares the machine. IOPS = the sum of the processes' averages. (iscsi-perf seeds rand()
#     with time(NULL), so processes started in the same second read the same LBA sequence.)
#   64s-1core: the same sessions, the target on core 0 (-m 0x1), the clients on core 1.
#   fp-randread / fp-randwrite at QD 1, 32, 128: as randread / randwrite, the client `ferrite perf`.
# Columns: IOPS per target (median over ROUNDS), ratios ferrite/spdk and ferrite/tgt, the
# client's CPU (utime+stime, % of one core, summed over processes) and the target's (all its
# threads), and other%: the most CPU (% of one core) anything else on the machine (and steal)
# took during any of the cell's runs: the machine is shared, above ~10 the cell is noise.
# In each round every cell runs the three targets back to back (who goes first rotates), so that
# drift of the machine hits all three alike. The three targets of a round are started (and
# their LUNs filled) once per core mask; each is stopped with SIGSTOP while the others are
# measured (SPDK's reactor polls even when idle, and all three share core 0).
# The machine is shared: before each run the script waits (QUIET_WAIT, 120 s at most) until the
# rest of the machine uses less than QUIET (25) % of one core over a second.
# Environment: ROUNDS (3), CELLS (an extended regular expression on the cell names, e.g.
# 'randread qd32|64s'), SESSIONS (64), SESSION_QD (8), FERRITE_MODE (reactor mode, adaptive),
# FERRITE_BIN (another build), TARGETS ("ferrite spdk tgt"; ferrite-MODE is one more Ferrite
# with --reactor-mode MODE, e.g. "ferrite ferrite-poll spdk"), LOAD ("BUSY_US:SLEEP_US[:CORES]":
# during each measured run a bench/cpu_hog.c on CORES (0) spins BUSY_US and sleeps SLEEP_US in
# turn, the rest of a shared machine made repeatable; "1000000:0" is a CPU-bound thread; its CPU
# shows in other%). Needs root for tgtd's control socket
# and hugepages; SPDK (../shared/anchors/spdk.sh), else SKIP.
# Usage: [ROUNDS=3] bench/iscsi_vs_peers.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-10}
ROUNDS=${ROUNDS:-3}
SESSIONS=${SESSIONS:-64}
SESSION_QD=${SESSION_QD:-8}
FERRITE_MODE=${FERRITE_MODE:-adaptive}
FP_MODE=${FP_MODE:-adaptive}
QUIET=${QUIET:-25}
QUIET_WAIT=${QUIET_WAIT:-120}
read -r -a TARGETS <<<"${TARGETS:-ferrite spdk tgt}"
need_spdk bin/iscsi_tgt
[ "$(id -u)" = 0 ] || fail "needs root (tgtd's control socket, hugepages)"
need iscsi-perf libiscsi-bin
need tgtd tgt
need tgtadm tgt
need cc gcc
[ -f /usr/include/iscsi/iscsi.h ] || apt-get install -y -qq libiscsi-dev >/dev/null 2>&1 || true
[ -f /usr/include/iscsi/iscsi.h ] || fail "libiscsi's headers (package libiscsi-dev) are missing"
[ -x /usr/bin/time ] || apt-get install -y -qq time >/dev/null 2>&1 || true
[ -x /usr/bin/time ] || fail "/usr/bin/time (package time) is missing"
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib"
HZ=$(getconf CLK_TCK)
IQN=iqn.2016-06.io.spdk:disk1
BLOCKS=262144 # 1 GiB of 4 KiB blocks
LUN_FILE=/dev/shm/ferrite-iscsi-bench-$$.raw
TGT_CTL=$((1000 + $$ % 20000)) # tgtd's control "port": a unix socket /var/run/tgtd/socket.N
RW="$TMP/iscsi_rw"
RECORDS="$TMP/records"
: >"$RECORDS"
cc -O2 -o "$RW" "$ROOT/bench/iscsi_rw.c" -liscsi || fail "cannot build bench/iscsi_rw.c"
HOG="$TMP/cpu_hog"
HOG_PID=
if [ -n "${LOAD:-}" ]; then
  cc -O2 -o "$HOG" "$ROOT/bench/cpu_hog.c" || fail "cannot build bench/cpu_hog.c"
  IFS=: read -r HOG_BUSY HOG_SLEEP HOG_CORES <<<"$LOAD"
  HOG_CORES=${HOG_CORES:-0}
fi

# --- processes: everything started here is killed on exit ---------------------------------
declare -A TPID URL # per target: its pid and libiscsi's URL of its LUN
CPIDS=()            # running clients
cleanup() {
  stop_clients
  [ -z "$HOG_PID" ] || stop_pids "$HOG_PID"
  stop_targets
  rm -rf "$TMP" "$LUN_FILE"
  [ -z "$HUGE_RESTORE" ] || echo "$HUGE_RESTORE" >/proc/sys/vm/nr_hugepages
}
trap cleanup EXIT

# stop_clients: the running clients, and /usr/bin/time around each.
stop_clients() {
  local p
  for p in "${CPIDS[@]}"; do
    stop_pids $(pgrep -P "$p") "$p"
  done
  CPIDS=()
}

spdk_rpc() { PYTHONPATH="$SPDK_DIR/python" python3 "$SPDK_DIR/scripts/rpc.py" -s "$TMP/spdk.sock" "$@"; }
# frpc WHO METHOD ARGS...: an RPC to the Ferrite target WHO (ferrite, ferrite-MODE).
frpc() {
  local who=$1
  shift
  "$FERRITE" rpc -s "$TMP/$who.sock" "$@" >/dev/null
}

# wait_for WHO WHAT CMD...: polls CMD for up to 60 s while target WHO lives.
wait_for() {
  local who=$1 what=$2
  shift 2
  for _ in $(seq 600); do
    "$@" >/dev/null 2>&1 && return
    kill -0 "${TPID[$who]}" 2>/dev/null || fail "$who exited while starting; its log: $(tail -5 "$TMP/$who.log")"
    sleep 0.1
  done
  fail "$who: $what not ready after 60 s; its log: $(tail -5 "$TMP/$who.log")"
}

# start_target WHO MASK: starts WHO with its cores in MASK (0x1: core 0; 0x3: both), the LUN
# exported on 127.0.0.1 and a free port, every block of a malloc LUN written once; then stops
# it (SIGSTOP) until its turn. Sets TPID[WHO] and URL[WHO].
start_target() {
  local who=$1 cores=0 port
  [ "$2" = 0x3 ] && cores=0,1
  port=$(free_port)
  case $who in
    ferrite | ferrite-*)
      local mode=$FERRITE_MODE
      [ "$who" = ferrite ] || mode=${who#ferrite-}
      rm -f "$TMP/$who.sock"
      taskset -c "$cores" "$FERRITE" serve -m "$2" -r "$TMP/$who.sock" --wait-for-rpc \
        --reactor-mode "$mode" --log-level warn "${FERRITE_MEM[@]}" >"$TMP/$who.log" 2>&1 &
      TPID[$who]=$!
      wait_for "$who" "RPC socket" "$FERRITE" rpc -s "$TMP/$who.sock" -t 1 spdk_get_version
      frpc "$who" iscsi_set_options '{"max_queue_depth":128}'
      frpc "$who" framework_start_init
      frpc "$who" bdev_malloc_create --name M0 --num-blocks "$BLOCKS" --block-size 4096
      frpc "$who" iscsi_create_portal_group "{\"tag\":1,\"portals\":[{\"host\":\"127.0.0.1\",\"port\":\"$port\"}]}"
      frpc "$who" iscsi_create_initiator_group '{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}'
      frpc "$who" iscsi_create_target_node '{"name":"disk1","alias_name":"","luns":[{"bdev_name":"M0","lun_id":0}],"pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"queue_depth":128}'
      URL[$who]="iscsi://127.0.0.1:$port/$IQN/0"
      ;;
    spdk)
      rm -f "$TMP/spdk.sock"
      taskset -c "$cores" "$SPDK_DIR/build/bin/iscsi_tgt" -m "$2" "${SPDK_MEM[@]}" --disable-cpumask-locks \
        -r "$TMP/spdk.sock" --wait-for-rpc >"$TMP/spdk.log" 2>&1 &
      TPID[$who]=$!
      wait_for "$who" "RPC socket" spdk_rpc -t 1 spdk_get_version
      # rpc.py runs one command per line of its stdin, in order, each after the last answered.
      spdk_rpc >"$TMP/spdk-rpc.log" 2>&1 <<R || fail "spdk: configuring iscsi_tgt failed: $(tail -5 "$TMP/spdk-rpc.log")"
iscsi_set_options -q 128
framework_start_init
bdev_malloc_create -b M0 $((BLOCKS * 4096 / 1048576)) 4096
iscsi_create_portal_group 1 127.0.0.1:$port
iscsi_create_initiator_group 1 ANY ANY
iscsi_create_target_node disk1 "" "M0:0" "1:1" 128 -d
R
      URL[$who]="iscsi://127.0.0.1:$port/$IQN/0"
      ;;
    tgt)
      taskset -c "$cores" tgtd -f -C "$TGT_CTL" --iscsi "portal=127.0.0.1:$port" >"$TMP/tgt.log" 2>&1 &
      TPID[$who]=$!
      wait_for "$who" "control socket" tgtadm -C "$TGT_CTL" --lld iscsi --op show --mode sys
      tgtadm -C "$TGT_CTL" --lld iscsi --op new --mode target --tid 1 -T "$IQN"
      tgtadm -C "$TGT_CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$LUN_FILE" --blocksize=4096
      tgtadm -C "$TGT_CTL" --lld iscsi --op bind --mode target --tid 1 -I ALL
      URL[$who]="iscsi://127.0.0.1:$port/$IQN/1"
      ;;
  esac
  wait_for "$who" "portal" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
  # Every block of a malloc LUN written once (tgt's file was written whole at the start).
  if [ "$who" != tgt ]; then
    taskset -c 1 "$RW" -w fill -q 8 -o 262144 "${URL[$who]}" >"$TMP/fill.out" 2>&1 ||
      fail "$who: filling the LUN failed: $(tail -3 "$TMP/fill.out")"
  fi
  kill -STOP "${TPID[$who]}"
}

# stop_targets: all of them (SIGTERM; tgtd, which ignores it, through its control socket; up to
# 5 s, then SIGKILL).
stop_targets() {
  local who p
  for who in "${!TPID[@]}"; do
    p=${TPID[$who]}
    kill -CONT "$p" 2>/dev/null || true
    if [ "$who" = tgt ]; then
      tgtadm -C "$TGT_CTL" --lld iscsi --op delete --mode system >/dev/null 2>&1 || true
    else
      kill -TERM "$p" 2>/dev/null || true
    fi
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    stop_pids "$p"
    unset "TPID[$who]"
    rm -f "/dev/shm/iscsi_trace.pid$p" # SPDK's trace file
  done
}

busy_jiffies() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# wait_quiet: before a run (its target still stopped, no client), waits until the rest of the
# machine uses less than QUIET % of one core over a second, for up to QUIET_WAIT seconds;
# then the run goes ahead anyway (its other% column tells).
wait_quiet() {
  local t0 b0 b1 busy
  t0=$(date +%s)
  while :; do
    b0=$(busy_jiffies)
    sleep 1
    b1=$(busy_jiffies)
    busy=$((100 * (b1 - b0) / HZ))
    [ "$busy" -lt "$QUIET" ] && return
    [ $(($(date +%s) - t0)) -lt "$QUIET_WAIT" ] || return 0
  done
}

# client N KIND QD OUT URL: starts N clients (KIND randread: iscsi-perf; randwrite, rw-randread:
# iscsi_rw) on the cores of CLIENT_CORES in the background, each under /usr/bin/time, output in
# OUT.k and OUT.k.time.
client() {
  local n=$1 kind=$2 qd=$3 out=$4 url=$5 k
  CPIDS=()
  for k in $(seq "$n"); do
    case $kind in
      randread)
        # iscsi-perf stops when a once-a-second check finds exactly 0 s left; a process that
        # misses that second (a loaded core) runs on forever: SIGINT ends it (it drains, and
        # its last line has its average so far).
        taskset -c "$CLIENT_CORES" /usr/bin/time -f '%U %S' -o "$out.$k.time" timeout -s INT $((T + 3)) \
          iscsi-perf -i "iqn.2026-11.io.ferrite:bench-$k" -r -b 1 -m "$qd" -t "$T" "$url" >"$out.$k" 2>&1 &
        ;;
      randwrite | rw-randread)
        taskset -c "$CLIENT_CORES" /usr/bin/time -f '%U %S' -o "$out.$k.time" "$RW" \
          -w "${kind#rw-}" -q "$qd" -t "$T" "$url" >"$out.$k" 2>&1 &
        ;;
      fp-*)
        # Ferrite's initiator (crates/iscsi-host) under `ferrite perf`, one reactor.
        cat >"$out.$k.cfg" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_iscsi_create","params":{"name":"iSCSI0","url":"$url","initiator_iqn":"iqn.2026-11.io.ferrite:bench-$k"}}]}]}
J
        rm -f "$out.$k.json"
        taskset -c "$CLIENT_CORES" /usr/bin/time -f '%U %S' -o "$out.$k.time" "$FERRITE" perf \
          --json "$out.$k.cfg" -T iSCSI0 -q "$qd" -o 4096 -w "${kind#fp-}" -t "$T" -m "[$CLIENT_CORES]" \
          --reactor-mode "$FP_MODE" --results-json "$out.$k.json" >"$out.$k" 2>&1 &
        ;;
    esac
    CPIDS+=($!)
  done
}

# run_cell WHO N KIND QD: one measured run against the (stopped) target WHO, which runs for it
# alone; appends a record "cell who iops client% target% other%".
run_cell() {
  local who=$1 n=$2 kind=$3 qd=$4 out="$TMP/client" pid=${TPID[$1]} b0 b1 t0 t1 n0 n1 k iops=0 cu=0 got p u s
  wait_quiet
  kill -CONT "$pid"
  if [ -n "${LOAD:-}" ]; then
    taskset -c "$HOG_CORES" "$HOG" "$HOG_BUSY" "$HOG_SLEEP" &
    HOG_PID=$!
  fi
  sleep 0.2
  b0=$(busy_jiffies) t0=$(cpu_ticks "$pid") n0=$(date +%s%N)
  client "$n" "$kind" "$qd" "$out" "${URL[$who]}"
  for p in "${CPIDS[@]}"; do
    wait "$p" || [ $? = 124 ] || fail "$who $CELL: a client failed: $(tail -c 300 "$out.1" | tr '\r' '\n' | tail -3)"
  done
  CPIDS=()
  b1=$(busy_jiffies) t1=$(cpu_ticks "$pid") n1=$(date +%s%N)
  kill -STOP "$pid"
  if [ -n "$HOG_PID" ]; then
    stop_pids "$HOG_PID"
    HOG_PID=
  fi
  for k in $(seq "$n"); do
    if [ "$kind" = randread ]; then
      got=$(tr '\r' '\n' <"$out.$k" | grep -ao 'iops average [0-9]*' | tail -1 | awk '{print $3}')
    elif [ "${kind#fp-}" != "$kind" ]; then
      got=$(json_get "$out.$k.json" "int(d['total']['iops'])" 2>/dev/null || true)
    else
      got=$(awk '/^ios / {print $6}' "$out.$k")
    fi
    [ -n "$got" ] || fail "$who $CELL: no result from client $k: $(tail -c 300 "$out.$k")"
    iops=$((iops + ${got%.*}))
    read -r u s < <(tail -1 "$out.$k.time") # (after "Command exited with non-zero status 124")
    cu=$(python3 -c "print($cu + $u + $s)")
  done
  python3 - "$CELL" "$who" "$iops" "$cu" "$((t1 - t0))" "$((b1 - b0))" "$((n1 - n0))" "$HZ" >>"$RECORDS" <<'P'
import sys
cell, who, iops, cu, tt, busy, ns, hz = sys.argv[1:]
wall = int(ns) / 1e9
client = 100 * float(cu) / wall
target = 100 * int(tt) / int(hz) / wall
other = max(0, 100 * int(busy) / int(hz) / wall - client - target)
print(cell, who, iops, f"{client:.0f}", f"{target:.0f}", f"{other:.0f}", sep="\t")
P
  echo "  $(tail -1 "$RECORDS" | awk -F'\t' '{printf "%-18s %-8s %8s IOPS  client %s%%  target %s%%  other %s%%", $1, $2, $3, $4, $5, $6}')" >&2
}

# --- the run --------------------------------------------------------------------------------
echo "iSCSI targets, 4 KiB random I/O over loopback TCP, ${T}s per run, median of $ROUNDS rounds"
echo "machine: $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo); $(uptime | sed 's/^ *//')"
[ -z "${LOAD:-}" ] || echo "LOAD: cpu_hog on core(s) $HOG_CORES, ${HOG_BUSY} us busy, ${HOG_SLEEP} us asleep, in turn, during each run"
echo "versions: $("$FERRITE" --version); SPDK $(basename "$SPDK_DIR"); tgt $(dpkg-query -W -f '${Version}' tgt 2>/dev/null); libiscsi $(dpkg-query -W -f '${Version}' libiscsi-bin 2>/dev/null)"
others=$(pgrep -c -f 'ferrite serve|iscsi_tgt|nvmf_tgt|tgtd|cargo|rustc' || true)
[ "$others" = 0 ] || echo "note: $others other target/build processes are running on this machine (not ours; left alone)"
spdk_memory 2048
head -c $((BLOCKS * 4096)) /dev/urandom >"$LUN_FILE"

CELL_LIST=("randread qd1:1 randread 1 0x1" "randread qd32:1 randread 32 0x1" "randread qd128:1 randread 128 0x1"
  "randwrite qd1:1 randwrite 1 0x1" "randwrite qd32:1 randwrite 32 0x1" "randwrite qd128:1 randwrite 128 0x1"
  "rw-randread qd32:1 rw-randread 32 0x1"
  "64s-2core randread:$SESSIONS randread $SESSION_QD 0x3" "64s-1core randread:$SESSIONS randread $SESSION_QD 0x1"
  "fp-randread qd1:1 fp-randread 1 0x1" "fp-randread qd32:1 fp-randread 32 0x1" "fp-randread qd128:1 fp-randread 128 0x1"
  "fp-randwrite qd1:1 fp-randwrite 1 0x1" "fp-randwrite qd32:1 fp-randwrite 32 0x1" "fp-randwrite qd128:1 fp-randwrite 128 0x1")
for round in $(seq "$ROUNDS"); do
  echo "round $round ($(uptime | sed 's/.*load/load/'))" >&2
  r=$(((round - 1) % ${#TARGETS[@]}))
  order=("${TARGETS[@]:$r}" "${TARGETS[@]:0:$r}")
  for mask in 0x1 0x3; do
    todo=()
    for c in "${CELL_LIST[@]}"; do
      [ "${c##* }" = "$mask" ] || continue
      [ -z "${CELLS:-}" ] || grep -qE "${CELLS}" <<<"${c%%:*}" || continue
      todo+=("$c")
    done
    [ "${#todo[@]}" -gt 0 ] || continue
    for who in "${order[@]}"; do start_target "$who" "$mask"; done
    CLIENT_CORES=1
    [ "$mask" = 0x3 ] && CLIENT_CORES=0,1
    for c in "${todo[@]}"; do
      CELL=${c%%:*}
      CELL=${CELL// /_}
      read -r n kind qd _ <<<"${c#*:}"
      for who in "${order[@]}"; do run_cell "$who" "$n" "$kind" "$qd"; done
    done
    stop_targets
  done
done

python3 - "$RECORDS" "$OUT/iscsi_vs_peers.json" "${TARGETS[*]}" "$T" "$ROUNDS" <<'P'
import json, statistics, sys
recs, out, targets, secs, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5]
rows = {}
order = []
for line in open(recs):
    cell, who, iops, cu, tu, other = line.rstrip("\n").split("\t")
    if cell not in order:
        order.append(cell)
    rows.setdefault((cell, who), []).append((int(iops), int(cu), int(tu), int(other)))
peers = [t for t in targets if t != "ferrite"]
# short names: f, s, t; ferrite-poll fp
ab = {t: t[0] + (t.split("-", 1)[1][:1] if "-" in t else "") for t in targets}
wd = {t: max(9, len(t) + 1) for t in targets}
hdr = f"{'cell':18}" + "".join(f"{t:>{wd[t]}}" for t in targets)
if "ferrite" in targets:
    hdr += "".join(f"{'f/' + ab[p]:>6}" for p in peers) + "".join(f"{'best ' + ab[t]:>9}" for t in targets)
hdr += "".join(f"{'cli% ' + ab[t]:>8}" for t in targets) + "".join(f"{'tgt% ' + ab[t]:>8}" for t in targets) + f"{'other%':>7}"
print(hdr)
cells = []
for cell in order:
    med = {t: statistics.median(r[0] for r in rows[(cell, t)]) for t in targets if (cell, t) in rows}
    best = {t: max(r[0] for r in rows[(cell, t)]) for t in med}
    cli = {t: statistics.median(r[1] for r in rows[(cell, t)]) for t in med}
    tgt = {t: statistics.median(r[2] for r in rows[(cell, t)]) for t in med}
    other = max(r[3] for t in med for r in rows[(cell, t)])
    line = f"{cell.replace('_', ' '):18}" + "".join(f"{med.get(t, 0):{wd[t]}.0f}" for t in targets)
    ratio = {}
    if "ferrite" in med:
        ratio = {p: med["ferrite"] / med[p] if med.get(p) else None for p in peers}
        line += "".join(f"{ratio[p]:6.2f}" if ratio[p] else f"{'-':>6}" for p in peers)
        line += "".join(f"{best.get(t, 0):9.0f}" for t in targets)
    line += "".join(f"{cli.get(t, 0):8.0f}" for t in targets) + "".join(f"{tgt.get(t, 0):8.0f}" for t in targets)
    print(line + f"{other:7d}")
    cells.append(dict(cell=cell.replace("_", " "), median_iops=med, best_iops=best, client_cpu_pct=cli,
                      target_cpu_pct=tgt, other_pct_max=other, ratio_ferrite_over=ratio,
                      runs={t: rows[(cell, t)] for t in med}))
print("f/s, f/t: Ferrite's median IOPS / SPDK's, / tgt's; best: the best run; cli%, tgt%: the client's (all its")
print("processes) and the target's CPU, % of one core (median); other%: the most the rest of the machine took")
json.dump(dict(seconds=int(secs), rounds=int(rounds), cells=cells), open(out, "w"), indent=1)
print(f"summary: {out}")
P
