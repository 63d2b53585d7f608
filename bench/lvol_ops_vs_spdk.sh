#!/usr/bin/env bash
# Two lvol operations against SPDK v26.05's (../shared/anchors), side by side in one run, one core
# each (-m 0x1), a fresh process per run, no hugepages for SPDK:
#
# snap: the longest an I/O waits when an lvol snapshot is taken under load (issue: Ferrite's
#   pause <= SPDK's). `ferrite perf` and SPDK's bdevperf load the same JSON config (a 2 GiB malloc
#   bdev of 4 KiB blocks, an lvstore with 4 MiB clusters, a thick 1000 MiB lvol; 2 GiB and not
#   1 GiB: after the snapshot every cluster of the lvol is copied into a new one, and a 1 GiB
#   lvstore has no room for the copies, so writes fail with ENOSPC in both; bdevperf gets -s 3072
#   for the same reason) and run 4 KiB randwrite QD 32 on lvs0/l0 for SECONDS; SECONDS/2 after
#   the tool prints "Running I/O", bdev_lvol_snapshot (lvs0/l0 -> snap) goes to the tool's RPC
#   socket (-r) through its own client (`ferrite rpc`, rpc.py); the answer must be a UUID.
#   Reported: the run's max latency (us; --results-json total.max_latency_us for Ferrite, the last
#   column of bdevperf's Total line for SPDK) with the snapshot and in the same run without one,
#   IOPS both ways and their quotient (so a snapshot that stalls the lvol for long shows as lost
#   IOPS). No I/O may fail. Beware, this max latency is not the snapshot's pause alone: after
#   the snapshot the lvol is a thin clone of it, and the first write to each of its 250 clusters
#   copies the whole 4 MiB cluster (copy-on-write) in both implementations; at QD 32 randwrite
#   those copies come in a burst right after the snapshot and queue behind each other, and the
#   max latency includes them. So the same pair of runs follows with two more workloads (set
#   WORKLOADS to choose): `write` (sequential, QD 32: one cluster is copied at a time, as the
#   writes reach it, so its max is the pause plus about one copy) and `randread` (no copy at all;
#   SPDK freezes all I/O of the lvol while it snapshots, Ferrite holds only writes back, so this
#   row is what a reader sees, not the write pause).
#
# load: the time to load an lvstore holding LVOLS (1,000) thin lvols of 64 MiB (issue: <= SPDK's),
#   from an image left by a clean shutdown and from one left by kill -9. Ferrite makes the image
#   once, on a 4 GiB sparse file (`ferrite serve -c` with bdev_uring_create of 4 KiB blocks, an
#   lvstore with 4 MiB clusters and LVOLS bdev_lvol_create entries), then spdk_kill_instance
#   SIGTERM -> "clean" image. A copy is loaded again by `ferrite perf` (randwrite on lvs0/l7 for
#   2 s, which allocates its clusters) and killed with -9 -> "dirty" image (the blobstore's clean
#   flag is 0 and its masks are stale, so a loader has to rebuild them from the metadata pages;
#   `ferrite blobstore check` confirms each image's state). Each load works on a fresh sparse copy
#   of the image (synced to disk first) in a daemon that is already up and answering RPCs
#   (`ferrite serve -m 0x1`; `spdk_tgt -m 0x1 --no-huge -s 1024`): the clock runs from sending
#   bdev_uring_create (Ferrite) / bdev_aio_create (SPDK) FILE B0 4096, through
#   bdev_wait_for_examine, until bdev_lvol_get_lvols lists LVOLS lvols. One small Python client on
#   one connection sends these for both (so neither side's timing includes an RPC client's
#   start-up: rpc.py alone takes ~0.15 s to start), and afterwards the tool's own client (`ferrite
#   rpc`, rpc.py) must list LVOLS lvols too. SPDK loads Ferrite's image: same on-disk format.
#   Page cache: both open the file with O_DIRECT (SPDK's aio and Ferrite's uring bdev), so the
#   loads read the disk whatever the page cache holds and it is not dropped (DROP_CACHES=1 drops
#   it before each load anyway; needs root). Ferrite's daemon log (info level) is kept and its
#   phases printed for the last load of each image (recovery, blobstore, lvstore), in ms
#   after the base bdev registered.
#
# Each cell alternates the tools ROUNDS (load: LOAD_ROUNDS) times, who goes first alternates too,
# and prints medians and the ratio ferrite/spdk (for both cells lower is better). Run it on a
# quiet machine: max latency is one sample, and anything else running shows in it.
# Usage: [ROUNDS=3] [LOAD_ROUNDS=5] [LVOLS=1000] [CELLS="snap load"]
#        [WORKLOADS="randwrite write randread"] bench/lvol_ops_vs_spdk.sh [SECONDS]
# Needs SPDK (../shared/anchors/spdk.sh unpacks it); prints SKIP without it.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
T=${1:-10}
ROUNDS=${ROUNDS:-3}
LOAD_ROUNDS=${LOAD_ROUNDS:-5}
LVOLS=${LVOLS:-1000}
CELLS=${CELLS:-snap load}
WORKLOADS=${WORKLOADS:-randwrite write randread}
need_spdk examples/bdevperf bin/spdk_tgt
need stdbuf coreutils # bdevperf's stdout is a file here: line-buffer it to see "Running I/O" in time

# --- processes: every one started here is killed on exit ---------------------------------
BG= # the running tool or daemon
cleanup() {
  if [ -n "$BG" ]; then
    kill -KILL "$BG" 2>/dev/null || true
    wait "$BG" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
# stop_bg: kill -9 the running tool and reap it.
stop_bg() {
  kill -KILL "$BG" 2>/dev/null || true
  wait "$BG" 2>/dev/null || true
  BG=
}
spdk_rpc() { PYTHONPATH="$SPDK_DIR/python" python3 "$SPDK_DIR/scripts/rpc.py" -s "$@"; }
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
ratio() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2"; }
# wait_line LOG TEXT: wait (60 s at most) until LOG holds TEXT while the tool runs.
wait_line() {
  local _
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return
    kill -0 "$BG" 2>/dev/null || fail "the tool exited before printing \"$2\": $(tail -5 "$1")"
    sleep 0.1
  done
  fail "no \"$2\" in $1 after 60 s"
}

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) CPUs; anything else running shows in max latency)"

# ===== cell snap ==========================================================================
cat >"$TMP/snap.json" <<'J'
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":524288,"block_size":4096}},
 {"method":"bdev_lvol_create_lvstore","params":{"bdev_name":"M0","lvs_name":"lvs0","cluster_sz":4194304}},
 {"method":"bdev_lvol_create","params":{"lvs_name":"lvs0","lvol_name":"l0","size_in_mib":1000}},
 {"method":"bdev_wait_for_examine"}]}]}
J
HALF=$(python3 -c "print($T / 2)")
# snapshot TOOL LOG SOCK: SECONDS/2 after the tool's "Running I/O" line, snapshot lvs0/l0 through
# the tool's own RPC client; the answer must be the snapshot's UUID.
snapshot() {
  local out
  wait_line "$2" "Running I/O"
  sleep "$HALF"
  if [ "$1" = ferrite ]; then
    out=$("$FERRITE" rpc -s "$3" bdev_lvol_snapshot --lvol-name lvs0/l0 --snapshot-name snap 2>&1) ||
      fail "ferrite: bdev_lvol_snapshot failed: $out"
  else
    out=$(spdk_rpc "$3" bdev_lvol_snapshot lvs0/l0 snap 2>&1) || fail "spdk: bdev_lvol_snapshot failed: $out"
  fi
  out=$(tr -d '"[:space:]' <<<"$out")
  [[ $out =~ ^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$ ]] ||
    fail "$1: bdev_lvol_snapshot did not answer a UUID: $out"
}
# snap_run TOOL WORKLOAD SNAP(0|1) -> sets R_IOPS R_MAX (us). Not in a $(...): the tool it starts
# must be the one cleanup kills.
snap_run() {
  local sock="$TMP/$1.sock" log="$TMP/$1-perf.log" res="$TMP/res.json" iops fails max
  rm -f "$sock" "$res"
  if [ "$1" = ferrite ]; then
    "$FERRITE" perf --json "$TMP/snap.json" -T lvs0/l0 -q 32 -o 4096 -w "$2" -t "$T" -m 0x1 -r "$sock" \
      --results-json "$res" >"$log" 2>&1 &
  else
    LD_LIBRARY_PATH="$SPDK_DIR/build/lib" stdbuf -oL "$SPDK_DIR/build/examples/bdevperf" --no-pci --no-huge \
      -s 3072 -m 0x1 --disable-cpumask-locks --json "$TMP/snap.json" -T lvs0/l0 -q 32 -o 4096 -w "$2" -t "$T" \
      -r "$sock" >"$log" 2>&1 &
  fi
  BG=$!
  if [ "$3" = 1 ]; then snapshot "$1" "$log" "$sock"; fi
  wait "$BG" || { BG=; fail "$1 $2 (snapshot $3) failed: $(tr -d '\r' <"$log" | tail -5)"; }
  BG=
  if [ "$1" = ferrite ]; then
    [ "$(json_get "$res" "d['total']['io_failed']")" = 0 ] ||
      fail "ferrite $2 (snapshot $3): $(json_get "$res" "d['total']['io_failed']") I/Os failed"
    read -r R_IOPS R_MAX < <(json_get "$res" "'%d %.1f' % (d['total']['iops'], d['total']['max_latency_us'])")
  else
    ! tr -d '\r' <"$log" | grep -q "with error" || fail "spdk $2 (snapshot $3): the job ended with an error"
    # Total : IOPS MiB/s Fail/s TO/s Average min max
    read -r iops fails max < <(tr -d '\r' <"$log" |
      awk '$1 == "Total" { for (i = 1; i <= NF; i++) if ($i == ":") { print $(i + 1), $(i + 3), $NF; exit } }') ||
      fail "could not read bdevperf's Total line ($2, snapshot $3)"
    [ "$(python3 -c "print(float('$fails') == 0)")" = True ] || fail "spdk $2 (snapshot $3): $fails failed I/Os/s"
    R_IOPS=${iops%.*}; R_MAX=$max
  fi
}
# snap_cell WORKLOAD SNAP -> sets F_IOPS F_MAX S_IOPS S_MAX (medians over ROUNDS)
snap_cell() {
  local r tool fio=() fm=() sio=() sm=()
  for r in $(seq 1 "$ROUNDS"); do
    for tool in $(if [ $((r % 2)) = 1 ]; then echo ferrite spdk; else echo spdk ferrite; fi); do
      snap_run "$tool" "$1" "$2"
      if [ "$tool" = ferrite ]; then fio+=("$R_IOPS"); fm+=("$R_MAX"); else sio+=("$R_IOPS"); sm+=("$R_MAX"); fi
    done
  done
  F_IOPS=$(median "${fio[@]}"); F_MAX=$(median "${fm[@]}"); S_IOPS=$(median "${sio[@]}"); S_MAX=$(median "${sm[@]}")
}
row() { printf '%-58s %12.0f %12.0f %7s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
if [[ " $CELLS " == *" snap "* ]]; then
  echo "cell snap: thick 1000 MiB lvol on 2 GiB malloc, 4 KiB QD 32, $T s, bdev_lvol_snapshot at $HALF s; medians of $ROUNDS"
  echo "(max latency: the snapshot's pause AND the copy-on-write of clusters that follows it; see the header)"
  printf '%-58s %12s %12s %7s\n' "" ferrite spdk ratio
  for w in $WORKLOADS; do
    snap_cell "$w" 0; F_IOPS0=$F_IOPS; F_MAX0=$F_MAX; S_IOPS0=$S_IOPS; S_MAX0=$S_MAX
    snap_cell "$w" 1
    case $w in
      randwrite) note="(copy-on-write burst)" ;;
      write) note="(one copy at a time)" ;;
      *read) note="(no copy-on-write)" ;;
      *) note="" ;;
    esac
    row "$w max latency us, snapshot $note" "$F_MAX" "$S_MAX"
    row "$w max latency us, no snapshot" "$F_MAX0" "$S_MAX0"
    row "$w IOPS, snapshot" "$F_IOPS" "$S_IOPS"
    row "$w IOPS, no snapshot" "$F_IOPS0" "$S_IOPS0"
    printf '%-58s %12s %12s\n' "$w IOPS kept (snapshot / none)" "$(ratio "$F_IOPS" "$F_IOPS0")" "$(ratio "$S_IOPS" "$S_IOPS0")"
    for v in "$(ratio "$F_IOPS" "$F_IOPS0") ferrite" "$(ratio "$S_IOPS" "$S_IOPS0") spdk"; do
      [ "$(python3 -c "print(${v% *} >= 0.5)")" = True ] || echo "  WARNING: ${v#* }'s $w IOPS fell below half with the snapshot"
    done
  done
fi

# ===== cell load ==========================================================================
# One client for both daemons: `wait SOCK` until bdev_get_bdevs answers (30 s at most);
# `load SOCK METHOD FILE WANT`: time METHOD (B0, 4 KiB blocks) + bdev_wait_for_examine + polling
# bdev_lvol_get_lvols until it lists WANT lvols; prints "TOTAL_S EXAMINE_S LVOLS".
cat >"$TMP/client.py" <<'P'
import json, socket, sys, time
dec = json.JSONDecoder()
class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.buf, self.id = "", 0
    def call(self, method, params=None):
        self.id += 1
        req = {"jsonrpc": "2.0", "id": self.id, "method": method}
        if params is not None:
            req["params"] = params
        self.s.sendall(json.dumps(req).encode())
        while True:
            try:
                obj, end = dec.raw_decode(self.buf.lstrip())
                self.buf = self.buf.lstrip()[end:]
                break
            except ValueError:
                chunk = self.s.recv(1 << 20)
                if not chunk:
                    sys.exit("%s: connection closed" % method)
                self.buf += chunk.decode()
        if "error" in obj:
            sys.exit("%s: %s" % (method, obj["error"]))
        return obj["result"]
if sys.argv[1] == "wait":
    deadline = time.monotonic() + 30
    while True:
        try:
            Client(sys.argv[2]).call("bdev_get_bdevs")
            break
        except (OSError, SystemExit):
            if time.monotonic() > deadline:
                sys.exit("no answer on " + sys.argv[2])
            time.sleep(0.05)
else:
    _, _, path, method, filename, want = sys.argv
    c = Client(path)
    t0 = time.monotonic()
    c.call(method, {"name": "B0", "filename": filename, "block_size": 4096})
    c.call("bdev_wait_for_examine")
    t1 = time.monotonic()
    while True:
        n = len(c.call("bdev_lvol_get_lvols"))
        if n >= int(want) or time.monotonic() - t0 > 600:
            break
        time.sleep(0.001)
    print("%.4f %.4f %d" % (time.monotonic() - t0, t1 - t0, n))
P
# make_images: $TMP/clean.img and $TMP/dirty.img (see the header).
make_images() {
  local sock="$TMP/mk.sock" log="$TMP/mk.log" st
  truncate -s 4G "$TMP/clean.img"
  python3 - "$TMP/clean.img" "$LVOLS" >"$TMP/mk.json" <<'P'
import json, sys
cfg = [{"method": "bdev_uring_create", "params": {"name": "U0", "filename": sys.argv[1], "block_size": 4096}},
       {"method": "bdev_lvol_create_lvstore", "params": {"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": 4194304}}]
cfg += [{"method": "bdev_lvol_create", "params": {"lvs_name": "lvs0", "lvol_name": "l%d" % i, "size_in_mib": 64,
         "thin_provision": True}} for i in range(int(sys.argv[2]))]
cfg.append({"method": "bdev_wait_for_examine"})
json.dump({"subsystems": [{"subsystem": "bdev", "config": cfg}]}, sys.stdout)
P
  rm -f "$sock"
  "$FERRITE" serve -m 0x1 -r "$sock" -c "$TMP/mk.json" >"$log" 2>&1 &
  BG=$!
  python3 "$TMP/client.py" wait "$sock" || fail "ferrite serve -c did not come up: $(tail -5 "$log")"
  n=$("$FERRITE" rpc -s "$sock" bdev_lvol_get_lvols | python3 -c "import json,sys; print(len(json.load(sys.stdin)))")
  [ "$n" = "$LVOLS" ] || fail "the image has $n lvols, not $LVOLS"
  "$FERRITE" rpc -s "$sock" spdk_kill_instance --sig-name SIGTERM >/dev/null
  wait "$BG" || { BG=; fail "ferrite serve did not exit cleanly: $(tail -5 "$log")"; }
  BG=
  st=$("$FERRITE" blobstore check "$TMP/clean.img" 2>&1) || fail "clean image: $st"
  [[ $st == *", clean"* ]] || fail "clean image is not clean: $st"
  cp --sparse=always "$TMP/clean.img" "$TMP/dirty.img"
  cat >"$TMP/dirty.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[
 {"method":"bdev_uring_create","params":{"name":"U0","filename":"$TMP/dirty.img","block_size":4096}},
 {"method":"bdev_wait_for_examine"}]}]}
J
  "$FERRITE" perf --json "$TMP/dirty.json" -T lvs0/l7 -q 32 -o 4096 -w randwrite -t 60 -m 0x1 >"$TMP/dirty.log" 2>&1 &
  BG=$!
  wait_line "$TMP/dirty.log" "Running I/O"
  sleep 2
  stop_bg
  st=$("$FERRITE" blobstore check "$TMP/dirty.img" 2>&1 | head -1 || true)
  [[ $st == *", not clean" ]] || fail "dirty image is clean after kill -9: $st"
  sync
}
# load_run TOOL IMAGE -> sets R_TOTAL R_EXAMINE (seconds). Not in a $(...), like snap_run.
load_run() {
  local sock="$TMP/$1-tgt.sock" log="$TMP/$1-$2.log" img="$TMP/load.img" out n
  rm -f "$img" "$sock"
  cp --sparse=always "$TMP/$2.img" "$img"
  sync
  if [ "${DROP_CACHES:-0}" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches; fi
  if [ "$1" = ferrite ]; then
    "$FERRITE" serve -m 0x1 -r "$sock" --log-level info >"$log" 2>&1 &
  else
    LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/bin/spdk_tgt" -m 0x1 --no-huge -s 1024 \
      --disable-cpumask-locks -r "$sock" >"$log" 2>&1 &
  fi
  BG=$!
  python3 "$TMP/client.py" wait "$sock" || fail "$1 did not come up: $(tr -d '\r' <"$log" | tail -5)"
  if [ "$1" = ferrite ]; then
    out=$(python3 "$TMP/client.py" load "$sock" bdev_uring_create "$img" "$LVOLS") ||
      fail "ferrite: loading the $2 image failed: $(tail -5 "$log")"
    n=$("$FERRITE" rpc -s "$sock" bdev_lvol_get_lvols | python3 -c "import json,sys; print(len(json.load(sys.stdin)))")
  else
    out=$(python3 "$TMP/client.py" load "$sock" bdev_aio_create "$img" "$LVOLS") ||
      fail "spdk: loading the $2 image failed: $(tr -d '\r' <"$log" | tail -5)"
    n=$(spdk_rpc "$sock" bdev_lvol_get_lvols | python3 -c "import json,sys; print(len(json.load(sys.stdin)))")
  fi
  stop_bg
  [ "$n" = "$LVOLS" ] || fail "$1 lists $n lvols after loading the $2 image, not $LVOLS"
  read -r R_TOTAL R_EXAMINE n <<<"$out"
  [ "$n" = "$LVOLS" ] || fail "$1: $2 image: gave up waiting for $LVOLS lvols ($out)"
}
if [[ " $CELLS " == *" load "* ]]; then
  make_images
  [[ " $CELLS " == *" snap "* ]] && echo
  echo "cell load: lvstore with $LVOLS thin 64 MiB lvols on a 4 GiB file, seconds from the bdev create RPC to all lvols listed; medians of $LOAD_ROUNDS"
  printf '%-58s %12s %12s %7s\n' "" ferrite spdk ratio
  for img in clean dirty; do
    ft=() fe=() st=() se=()
    for r in $(seq 1 "$LOAD_ROUNDS"); do
      for tool in $(if [ $((r % 2)) = 1 ]; then echo ferrite spdk; else echo spdk ferrite; fi); do
        load_run "$tool" $img
        if [ "$tool" = ferrite ]; then ft+=("$R_TOTAL"); fe+=("$R_EXAMINE"); else st+=("$R_TOTAL"); se+=("$R_EXAMINE"); fi
      done
    done
    F=$(median "${ft[@]}"); S=$(median "${st[@]}")
    printf '%-58s %12.3f %12.3f %7s\n' "load after $img shutdown, s" "$F" "$S" "$(ratio "$F" "$S")"
    F=$(median "${fe[@]}"); S=$(median "${se[@]}")
    printf '%-58s %12.3f %12.3f\n' "  of which until examine done, s" "$F" "$S"
  done
  for img in clean dirty; do
    echo "ferrite's log, last $img load (info), ms after the base bdev registered:"
    grep -E "registered bdev B0 |blobstore|lvstore|O_DIRECT" "$TMP/ferrite-$img.log" |
      awk '{ t = substr($1, 2, length($1) - 2) + 0; if (!t0) t0 = t; $1 = ""; printf "  +%7.1f %s\n", (t - t0) * 1000, $0 }'
  done
fi
