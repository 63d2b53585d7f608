#!/usr/bin/env bash
# Ferrite's NBD server vs nbdkit (memory plugin) vs qemu-storage-daemon, all in this run, all
# driven by the same client: fio's nbd engine (libnbd), 4 KiB, one job, time-based.
#   ferrite: `ferrite serve -m 0x1` (one reactor, pinned to core 0), 1 GiB malloc bdev M0.
#   ferrite2: the same with `-m 0x3` (a reactor on each core), for the whole-export copy only,
#            where the peers use both cores too (nbdkit's threads, nbdcopy's four connections).
#   nbdkit:  `nbdkit -f memory 1G` (RAM, sparse allocator), unpinned.
#   qsd:     qemu has no RAM-disk driver, so by default it exports a 1 GiB file on tmpfs
#            (/dev/shm) with driver=file; QSD_BACKEND=null uses driver=null-co instead
#            (read-zeroes=on; writes are discarded, so it does less work than the others).
# Matrix: {tcp, unix} x {randread, randwrite} x QD {1, 32}. Per cell and server: IOPS, mean
# completion latency (fio's clat mean, shown at QD 1), the server's CPU time per I/O
# (utime+stime of the whole process from /proc/PID/stat around the fio run, / I/O count), and
# fio's own CPU use (usr+sys %): near 100% the client, not the server, sets the pace.
# Plus: seconds for `nbdcopy --no-extents URI null:` to read the whole export, after it was
# filled with random data (a file made from /dev/urandom, written with nbdcopy).
# For each transport the three servers run side by side (idle ones sleep), and each cell runs
# the three back to back, so a slow patch of the machine hits all of them alike.
# Knobs (environment): FIO_CPUS (default 1: fio pinned to core 1, away from Ferrite's reactor;
# empty = unpinned), ROUNDS (default 1; >1 repeats the whole matrix and reports medians),
# COPIES (default 3: whole-export copies per server and round, interleaved; one copy takes
# about half a second, so a single one is at the mercy of the machine's noise),
# QSD_BACKEND (file|null), FERRITE_MODE (reactor mode, default adaptive).
# Usage: bench/nbd_vs_peers.sh [SECONDS]
source "$(dirname "$0")/common.sh"
T=${1:-5}
FIO_CPUS=${FIO_CPUS-1}
ROUNDS=${ROUNDS:-1}
COPIES=${COPIES:-3}
QSD_BACKEND=${QSD_BACKEND:-file}
FERRITE_MODE=${FERRITE_MODE:-adaptive}
SIZE_MIB=1024
SERVERS=(ferrite nbdkit qsd)              # measured by fio
COPY_SERVERS=(ferrite ferrite2 nbdkit qsd) # measured by nbdcopy
HZ=$(getconf CLK_TCK)
RECORDS="$TMP/records.tsv"                 # one line per measurement, turned into the report
SEED=/dev/shm/ferrite-nbd-seed-$$          # random data written into every export first
QSD_IMG=/dev/shm/ferrite-nbd-qsd-$$.img    # qsd's backing file (QSD_BACKEND=file)
: >"$RECORDS"

# --- processes: every server started here is tracked and killed on exit --------------------
declare -A LIVE       # pids of servers started here and not yet stopped
declare -A PID URI    # per server, for the current transport
declare -A RPC        # Ferrite's RPC socket, per Ferrite server
alive() { # alive PID: the process exists and is not a zombie
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}
stop_pid() { # stop_pid PID: SIGTERM, up to 5 s to exit, then SIGKILL; reap it
  [[ -n ${LIVE[$1]:-} ]] || return 0   # only our own, and only once (pids get reused)
  unset "LIVE[$1]"
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  for p in "${!LIVE[@]}"; do stop_pid "$p"; done
  rm -rf "$TMP" "$SEED" "$QSD_IMG"
}
trap cleanup EXIT

# --- tools ----------------------------------------------------------------------------------
need fio fio
need nbdkit nbdkit
need qemu-storage-daemon qemu-system-common
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
fio --enghelp=nbd >/dev/null 2>&1 || fail "this fio has no nbd ioengine (needs fio built with libnbd)"
nbdkit memory --dump-plugin >/dev/null 2>&1 || fail "nbdkit has no memory plugin"

# --- endpoints ------------------------------------------------------------------------------
NEXT_PORT=10809
pick_endpoint() { # pick_endpoint TRANSPORT: sets ADDR (host:port or socket path) and EP_URI
  if [[ $1 == unix ]]; then
    ADDR="$TMP/nbd-$NEXT_PORT.sock"; NEXT_PORT=$((NEXT_PORT + 1))
    EP_URI="nbd+unix:///M0?socket=$ADDR"
    return
  fi
  while ((NEXT_PORT <= 10899)); do
    local p=$NEXT_PORT; NEXT_PORT=$((NEXT_PORT + 1))
    # Free if nothing accepts a connection on it.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      ADDR="127.0.0.1:$p"; EP_URI="nbd://127.0.0.1:$p/M0"
      return
    fi
  done
  fail "no free TCP port in 10809-10899"
}
wait_until() { # wait_until SERVER CMD...: poll CMD for up to 10 s while SERVER is alive
  local who=$1; shift
  for _ in $(seq 1000); do
    "$@" >/dev/null 2>&1 && return
    alive "${PID[$who]}" || fail "$who exited; its log: $(tail -5 "$TMP/$who.log")"
    sleep 0.01
  done
  fail "$who not ready after 10 s (${*:1:2}...); its log: $(tail -5 "$TMP/$who.log")"
}

# --- servers: start_NAME TRANSPORT runs the server in the background on $ADDR ----------------
start_ferrite() { # malloc bdev M0 of 1 GiB, one reactor on core 0, NBD set up by RPC
  start_ferrite_on ferrite 0x1 "$1"
}
start_ferrite2() { # the same with a reactor on each core
  start_ferrite_on ferrite2 0x3 "$1"
}
start_ferrite_on() { # start_ferrite_on NAME MASK TRANSPORT
  local rpc="$TMP/$1-rpc-$3.sock"
  "$FERRITE" serve -m "$2" -r "$rpc" --reactor-mode "$FERRITE_MODE" --log-level warn >"$TMP/$1.log" 2>&1 &
  PID[$1]=$!; LIVE[$!]=1; RPC[$1]=$rpc
  wait_until "$1" "$FERRITE" rpc -s "$rpc" -t 1 spdk_get_version
  "$FERRITE" rpc -s "$rpc" bdev_malloc_create --name M0 --num-blocks $((SIZE_MIB * 256)) --block-size 4096 >/dev/null
  "$FERRITE" rpc -s "$rpc" nbd_server_start --address "$ADDR" >/dev/null
  "$FERRITE" rpc -s "$rpc" nbd_server_add_export --bdev-name M0 >/dev/null
}
start_nbdkit() { # memory plugin, 1 GiB; nbdkit serves any export name, so /M0 works too
  if [[ $1 == unix ]]; then
    nbdkit -f -U "$ADDR" memory ${SIZE_MIB}M >"$TMP/nbdkit.log" 2>&1 &
  else
    nbdkit -f -i 127.0.0.1 -p "${ADDR##*:}" memory ${SIZE_MIB}M >"$TMP/nbdkit.log" 2>&1 &
  fi
  PID[nbdkit]=$!; LIVE[$!]=1
}
start_qsd() { # NBD export M0 of a 1 GiB tmpfs file (or null-co), writable
  local blockdev addr
  if [[ $QSD_BACKEND == null ]]; then
    blockdev="driver=null-co,node-name=disk,size=$((SIZE_MIB << 20)),read-zeroes=on"
  else
    rm -f "$QSD_IMG"; truncate -s ${SIZE_MIB}M "$QSD_IMG"
    blockdev="driver=file,node-name=disk,filename=$QSD_IMG"
  fi
  if [[ $1 == unix ]]; then addr="addr.type=unix,addr.path=$ADDR"
  else addr="addr.type=inet,addr.host=127.0.0.1,addr.port=${ADDR##*:}"; fi
  qemu-storage-daemon --blockdev "$blockdev" --nbd-server "$addr" \
    --export type=nbd,id=exp0,node-name=disk,name=M0,writable=on >"$TMP/qsd.log" 2>&1 &
  PID[qsd]=$!; LIVE[$!]=1
}
start_server() { # start_server NAME TRANSPORT: start it, wait until its export answers
  pick_endpoint "$2"
  "start_$1" "$2"
  URI[$1]=$EP_URI
  wait_until "$1" nbdinfo --size "$EP_URI"
}

# --- measurements ---------------------------------------------------------------------------
fill_export() { # fill_export SERVER: write the random seed over the whole export (real data)
  nbdcopy "$SEED" "${URI[$1]}"
}
time_copy() { # time_copy SERVER TRANSPORT: seconds to read the whole export to null:
  # --no-extents: read every block, even where a server would report zeros or holes.
  local t0 t1
  t0=$(date +%s%N)
  nbdcopy --no-extents "${URI[$1]}" null:
  t1=$(date +%s%N)
  printf 'copy\t%s\t%s\t%s\n' "$1" "$2" "$(python3 -c "print(($t1-$t0)/1e9)")" >>"$RECORDS"
}
busy_ticks() { # busy_ticks SERVER: "BUSY TICK_RATE" of a Ferrite's reactors (its own accounting)
  if [[ -z ${RPC[$1]:-} ]]; then echo "0 1"; return; fi
  "$FERRITE" rpc -s "${RPC[$1]}" framework_get_reactors |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(r["busy"] for r in d["reactors"]), d["tick_rate"])'
}
run_fio() { # run_fio SERVER TRANSPORT RW QD: IOPS, clat mean and server CPU per I/O of one run
  local out="$OUT/nbd_${1}_${2}_${3}_qd${4}.json" c0 c1 b0 b1 rate
  read -r b0 rate < <(busy_ticks "$1")
  c0=$(cpu_ticks "${PID[$1]}")
  fio --name=nbd --ioengine=nbd --uri="${URI[$1]}" --rw="$3" --bs=4k --iodepth="$4" --numjobs=1 \
    --runtime="$T" --time_based ${FIO_CPUS:+--cpus_allowed=$FIO_CPUS} \
    --output-format=json --output="$out" >/dev/null
  c1=$(cpu_ticks "${PID[$1]}")
  read -r b1 rate < <(busy_ticks "$1")
  python3 - "$out" "$1" "$2" "$3" "$4" "$((c1 - c0))" "$HZ" "$((b1 - b0))" "$rate" >>"$RECORDS" <<'PY'
import json, sys
out, server, transport, rw, qd, ticks, hz, busy, rate = sys.argv[1:]
j = json.load(open(out))["jobs"][0]["write" if rw.endswith("write") else "read"]
cpu_us = int(ticks) / int(hz) * 1e6 / max(j["total_ios"], 1)
job = json.load(open(out))["jobs"][0]
busy_us = int(busy) / int(rate) * 1e6 / max(j["total_ios"], 1)
print("fio", server, transport, rw, qd, j["iops"], j["clat_ns"]["mean"] / 1000, cpu_us,
      job["usr_cpu"] + job["sys_cpu"], busy_us, sep="\t")
PY
  echo "  $2 $3 qd$4 $1: $(tail -1 "$RECORDS" | cut -f6 | cut -d. -f1) IOPS" >&2
}
bench_transport() { # bench_transport TRANSPORT: all three servers up, filled, then measured
  local s rw qd
  echo "bench: $1: starting and filling ${COPY_SERVERS[*]}" >&2
  for s in "${COPY_SERVERS[@]}"; do start_server "$s" "$1"; fill_export "$s"; done
  for _ in $(seq "$ROUNDS"); do
    for _ in $(seq "$COPIES"); do
      for s in "${COPY_SERVERS[@]}"; do time_copy "$s" "$1"; done
    done
    for rw in randread randwrite; do
      for qd in 1 32; do
        for s in "${SERVERS[@]}"; do run_fio "$s" "$1" "$rw" "$qd"; done
      done
    done
  done
  for s in "${COPY_SERVERS[@]}"; do stop_pid "${PID[$s]}"; done
}

# --- report: tables on stdout, summary in $OUT/nbd_vs_peers.json -----------------------------
report() {
  python3 - "$RECORDS" "$OUT/nbd_vs_peers.json" <<PY
import json, statistics, sys
recs, out = sys.argv[1], sys.argv[2]
servers = "${SERVERS[*]}".split()
copy_servers = "${COPY_SERVERS[*]}".split()
peers = servers[1:]
fio, copy = {}, {}   # key -> list of rounds
for line in open(recs):
    f = line.rstrip("\n").split("\t")
    if f[0] == "fio":
        fio.setdefault((f[2], f[3], int(f[4]), f[1]), []).append([float(x) for x in f[5:10]])
    else:
        copy.setdefault((f[2], f[1]), []).append(float(f[3]))
def med(rows):  # median of each column over the rounds
    return [statistics.median(c) for c in zip(*rows)]
qsd = ("driver=null-co,read-zeroes=on (writes discarded)" if "$QSD_BACKEND" == "null"
       else "driver=file on a 1 GiB tmpfs file in /dev/shm (qemu has no RAM-disk driver)")
rounds = $ROUNDS
print(f"NBD servers, fio ioengine=nbd, 4 KiB, 1 job, {$T} s per cell"
      + (f", median of {rounds} rounds" if rounds > 1 else "") + "; fio cpus_allowed="
      f"{'${FIO_CPUS}' or 'none (unpinned)'}; ferrite -m 0x1 ({'$FERRITE_MODE'} reactor); peers unpinned")
print(f"ferrite: malloc bdev 1 GiB | nbdkit: memory plugin 1G | qsd: {qsd}")
print("ratio = ferrite/peer IOPS; clat = fio clat mean (QD 1 only); cpu = server utime+stime per I/O;")
print("fio % = the client's own CPU use (usr+sys) while it drove that server; busy = Ferrite's reactor")
print("time spent in loop turns that did work, per I/O (its own accounting: the cpu column less polling)")
short = lambda s: f"{s[:7]:>7}"
hdr = (f"{'transport':9} {'rw':9} {'qd':>3} | " + " ".join(f"{s:>9}" for s in servers) + " | "
       + " ".join(f"{'f/'+p:>8}" for p in peers) + " | " + " ".join(map(short, servers))
       + " | " + " ".join(map(short, servers)) + " | " + " ".join(map(short, servers)) + " | us/IO")
print(f"{'':24}| {'IOPS':^29} | {'ratio':^17} | {'clat us (QD1)':^23} | {'cpu us/IO':^23} | {'fio %':^23} | busy")
print(hdr)
print("-" * len(hdr))
cells = []
for transport in ("tcp", "unix"):
    for rw in ("randread", "randwrite"):
        for qd in (1, 32):
            rows = {s: fio.get((transport, rw, qd, s)) for s in servers}
            if not all(rows.values()):
                continue
            r = {s: dict(zip(("iops", "clat_us", "cpu_us_per_io", "fio_cpu_pct", "busy_us_per_io"), med(rows[s])),
                         iops_rounds=[x[0] for x in rows[s]]) for s in servers}
            ratio = {p: r["ferrite"]["iops"] / r[p]["iops"] for p in peers}
            clat = " ".join(f"{r[s]['clat_us']:7.1f}" if qd == 1 else f"{'-':>7}" for s in servers)
            print(f"{transport:9} {rw:9} {qd:>3} | " + " ".join(f"{r[s]['iops']:9.0f}" for s in servers)
                  + " | " + " ".join(f"{ratio[p]:8.2f}" for p in peers) + " | " + clat + " | "
                  + " ".join(f"{r[s]['cpu_us_per_io']:7.2f}" for s in servers) + " | "
                  + " ".join(f"{r[s]['fio_cpu_pct']:7.1f}" for s in servers)
                  + f" | {r['ferrite']['busy_us_per_io']:5.2f}")
            cells.append(dict(transport=transport, rw=rw, qd=qd, servers=r, ratio=ratio))
print()
print("nbdcopy --no-extents URI null: of the whole 1 GiB export (filled first with /dev/urandom data),")
print("nbdcopy defaults otherwise (all servers advertise multi-conn); ferrite2 = Ferrite with a reactor")
print("on each core (-m 0x3); ratio = peer s / ferrite s, for the one- and the two-reactor Ferrite;")
print(f"seconds = median of {$COPIES * rounds} copies ($COPIES per round, servers interleaved)")
fs = [k for k in copy_servers if k.startswith("ferrite")]
print(f"{'transport':9} | " + " ".join(f"{s+' s':>10}" for s in copy_servers) + " | "
      + " ".join(f"{f+'/'+p:>17}" for f in fs for p in peers))
copies = []
for transport in ("tcp", "unix"):
    if not all(copy.get((transport, k)) for k in copy_servers):
        continue
    s = {k: statistics.median(copy[(transport, k)]) for k in copy_servers}
    ratio = {f"{f}/{p}": s[p] / s[f] for f in fs for p in peers}
    print(f"{transport:9} | " + " ".join(f"{s[k]:10.2f}" for k in copy_servers) + " | "
          + " ".join(f"{v:17.2f}" for v in ratio.values()))
    copies.append(dict(transport=transport, seconds=s, ratio=ratio,
                       samples={k: copy[(transport, k)] for k in copy_servers}))
json.dump(dict(seconds=$T, rounds=rounds, fio_cpus_allowed="${FIO_CPUS}" or None,
               ferrite_reactor_mode="$FERRITE_MODE", qsd_backend="$QSD_BACKEND",
               peers=dict(nbdkit="memory 1G", qsd=qsd), versions=json.load(open("$TMP/versions.json")),
               cells=cells, nbdcopy=copies),
          open(out, "w"), indent=1)
print(f"\nsummary: {out}")
PY
}

# --- main -----------------------------------------------------------------------------------
python3 - "$TMP/versions.json" "$(fio --version)" "$(nbdkit --version)" \
  "$(qemu-storage-daemon --version | head -1)" "$(nbdcopy --version | head -1)" <<'PY'
import json, sys
json.dump(dict(zip(["fio", "nbdkit", "qemu-storage-daemon", "nbdcopy"], sys.argv[2:])), open(sys.argv[1], "w"))
PY
head -c ${SIZE_MIB}M /dev/urandom >"$SEED"
for transport in tcp unix; do bench_transport "$transport"; done
report
