#!/usr/bin/env bash
# Ferrite's NVMe/TCP target against SPDK's nvmf_tgt, side by side in one run, both driven by the
# same client: SPDK's spdk_nvme_perf (its NVMe/TCP initiator, far cheaper per I/O than fio).
# Both targets load the same SPDK-format JSON config (bdev: bdev_null_create/bdev_malloc_create;
# nvmf: nvmf_create_transport {trtype TCP}, nvmf_create_subsystem, nvmf_subsystem_add_ns,
# nvmf_subsystem_add_listener on 127.0.0.1 and a port free at the time). One target at a time, a
# fresh process per run, on core 0 (`ferrite serve -m 0x1`, `nvmf_tgt -m 0x1 --no-huge -s 2048`:
# 2 GiB because the 1 GiB malloc bdev is allocated inside SPDK's memory); the client on core 1
# (`spdk_nvme_perf -c 0x2 --no-huge -s 1024`), with a 1 s warm-up (-a 1) not counted.
# Cells (IOPS; MiB/s for 128 KiB; mean latency, which spdk_nvme_perf prints, at QD 1):
#   null namespace (1 GiB, 4 KiB blocks), 4 KiB: randread and randwrite at QD 1, 32, 128, and
#   randread QD 32 with header and data digests (spdk_nvme_perf -H -I);
#   null-resp: the null randread cells again, both targets configured with "c2h_success": false
#   (nvmf_create_transport), so that both send a response capsule after each read's C2HData.
#   Why: SPDK v26.05's nvmf_tgt sets C2HData's SUCCESS flag (and skips the response) for every
#   host, although spdk_nvme_perf keeps SQ flow control on and the NVMe/TCP specification allows
#   SUCCESS only when the host disabled it (Connect CATTR bit 2). Ferrite follows the
#   specification, as Linux's nvmet does and as SPDK does after v26.05 (commit 00c2f8cd49,
#   "nvmf/tcp: negotiate C2H_SUCCESS based on host's SQFLOW request"), so in the plain null
#   randread cells Ferrite sends two PDUs per read and SPDK one; the null-resp cells compare the
#   same PDUs on the wire. (spdk_nvme_perf v26.05 cannot ask to disable SQ flow control: its
#   --disable-sq-flow-control came later.)
#   sqfc-off: null randread at QD 1 and 32 from a client that turns SQ flow control off, so that
#   both targets send one PDU per read (C2HData with SUCCESS): `ferrite perf` on core 1 over
#   Ferrite's host (bdev_nvme_attach_controller with "disable_sq_flow_control": true), the only
#   client here that can ask. Its latency column is ferrite perf's mean; it has no warm-up (its
#   timed run starts once the controller is attached).
#   malloc namespace (1 GiB, 4 KiB blocks), 128 KiB: sequential read and write at QD 32. Malloc
#   there so the payload is real memory on both sides: a null bdev does not touch its buffers,
#   so a target could send 128 KiB of whatever it likes, and the cell would measure framing only.
# Each cell alternates the two targets ROUNDS times (who goes first alternates too) and prints
# medians, the ratio ferrite/spdk, the best run of each side and their ratio, the median and
# range of the per-round quotients ferrite/spdk (runs seconds apart: against the machine's drift
# over minutes, many short rounds show a small difference better than a few long ones), and other%: the
# most CPU (% of one core) that the rest of the machine (other processes, and steal) took during
# any of its runs. The machine is shared: above ~10 the cell is noise; rerun when it is quiet.
# The best runs matter on this kind of machine: some runs of the client go at half speed
# whichever target serves it (at 4 KiB randwrite QD 32 the client's own kernel copy of the data
# it sends, _copy_from_iter under its sendmsg, costs ~4x more per byte in those runs: seen with
# perf record on spdk_nvme_perf; SPDK's nvmf_tgt gets them as often as Ferrite does), and two
# of them among a cell's three runs move its median.
# Latency cells: the same client with -L (latency tracking), null namespace, 4 KiB randread and
#   randwrite at QD 1, 32 and 128; the medians of p50, p99, p99.9 and p99.99 (see lat_cells).
# Idle cells: the target's CPU use (utime+stime of all its threads, /proc/PID/stat) over
# IDLE_SECONDS while a host stays connected and sends no I/O, two ways:
#   bdevperf -z: SPDK's bdev_nvme host (bdev_nvme_attach_controller in bdevperf's config),
#     waiting for a perform_tests RPC that never comes: an admin queue with its outstanding
#     Asynchronous Event Requests and keep-alives, no I/O queue (bdev_nvme creates those per I/O
#     channel, and no job runs);
#   perf stopped: spdk_nvme_perf (QD 1) connected and running, then SIGSTOPped: an admin and an
#     I/O queue, both silent.
#   Ferrite in its default (adaptive) and in poll mode; SPDK's reactor polls, ~100%.
# Environment: ROUNDS (3); CELLS (an extended regular expression: only the cells whose
# "kind workload size qd" matches, e.g. CELLS='randread 4096 32'); FERRITE_MODE (reactor mode for the perf cells, default adaptive);
# FERRITE_BIN (another build of the daemon to measure, e.g. a work tree's); IDLE_SECONDS (5);
# ONLY (perf, lat or idle: only those cells); TCP_CC (a TCP congestion control, e.g. cubic: the run
# goes into a network namespace of its own, made with unshare, whose loopback uses it; the
# machine's setting stays as it is. Why it matters: on loopback the client's TCP stack shares
# the work with the target's, and a BBR sender paces and keeps a small congestion window at
# loopback's microsecond round trips, so with 128 KiB writes the client, not the target, sets
# the pace, by an amount that depends on when the target's ACKs come: see docs/PERFORMANCE.md);
# NVMF_TARGET (ferrite; `spdk` puts SPDK's nvmf_tgt in
# the ferrite column too: an SPDK-vs-SPDK run, whose ratios show the noise of the machine).
# Needs SPDK (../shared/anchors/spdk.sh unpacks it); prints SKIP without it. If Ferrite cannot
# serve the config (e.g. nvmf_create_transport: Method not found), it says so and stops.
# Usage: [ROUNDS=3] bench/nvmf_vs_spdk.sh [SECONDS]
source "$(dirname "$0")/common.sh"
in_tcp_cc_netns "$@"
FERRITE=${FERRITE_BIN:-$FERRITE}
T=${1:-5}
ROUNDS=${ROUNDS:-3}
FERRITE_MODE=${FERRITE_MODE:-adaptive}
IDLE_SECONDS=${IDLE_SECONDS:-5}
ONLY=${ONLY:-}
NVMF_TARGET=${NVMF_TARGET:-ferrite}
need_spdk bin/nvmf_tgt bin/spdk_nvme_perf examples/bdevperf
case $NVMF_TARGET in ferrite | spdk) ;; *) fail "NVMF_TARGET must be ferrite or spdk, not $NVMF_TARGET" ;; esac
case $ONLY in "" | perf | lat | idle) ;; *) fail "ONLY must be perf, lat or idle, not $ONLY" ;; esac
need ss iproute2
[ -x /usr/bin/time ] || { apt-get install -y -qq time >/dev/null 2>&1 || true; }
[ -x /usr/bin/time ] || fail "/usr/bin/time (package time) is missing and could not be installed"
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib"
NQN=nqn.2016-06.io.spdk:cnode1
HZ=$(getconf CLK_TCK)

# --- processes: everything started here is killed on exit ---------------------------------
TPID= # the running target
HPID= # the running idle host
cleanup() {
  stop_pids $HPID $TPID
  rm -rf "$TMP"
}
trap cleanup EXIT

# config KIND PORT: the JSON config both targets load (nvmf_bench_config in common.sh).
config() { nvmf_bench_config "$1" "$2" "$NQN"; }

# start_target WHO KIND [MODE]: WHO ferrite|spdk, KIND null|malloc; sets TPID and PORT, and
# returns once the listener accepts connections.
start_target() {
  local who=$1 kind=$2 mode=${3:-$FERRITE_MODE}
  PORT=$(free_port)
  config "$kind" "$PORT" >"$TMP/config.json"
  if [ "$who" = ferrite ]; then
    "$FERRITE" serve -m 0x1 -r "$TMP/target.sock" -c "$TMP/config.json" --reactor-mode "$mode" \
      --log-level warn >"$TMP/target.log" 2>&1 &
  else
    "$SPDK_DIR/build/bin/nvmf_tgt" --no-huge -s 2048 -m 0x1 -r "$TMP/target.sock" \
      --json "$TMP/config.json" >"$TMP/target.log" 2>&1 &
  fi
  TPID=$!
  for _ in $(seq 3000); do
    if ! kill -0 "$TPID" 2>/dev/null; then
      wait "$TPID" 2>/dev/null || true
      TPID=
      if grep -q "Method not found" "$TMP/target.log"; then
        fail "$who cannot serve the NVMe/TCP config yet: $(grep -m1 'Method not found' "$TMP/target.log")"
      fi
      fail "$who exited while starting; its log: $(tail -5 "$TMP/target.log")"
    fi
    # Ready once the listener accepts a connection (closed again before any PDU).
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return; fi
    sleep 0.01
  done
  fail "$who: nothing listens on 127.0.0.1:$PORT after 30 s; its log: $(tail -5 "$TMP/target.log")"
}

stop_target() { # SIGTERM, up to 5 s, then SIGKILL
  [ -n "$TPID" ] || return 0
  kill -TERM "$TPID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$TPID" 2>/dev/null || true
  wait "$TPID" 2>/dev/null || true
  TPID=
}

# busy_jiffies: CPU time the whole machine spent busy so far (user, nice, system, irq, softirq
# and steal of /proc/stat's cpu line), in clock ticks.
busy_jiffies() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# other_cpu BUSY_TICKS OURS_TICKS NANOSECONDS: sets OTHER to the % of one core that everything
# but our processes (and the hypervisor, through steal) took in the window: the noise.
other_cpu() { OTHER=$(python3 -c "print(max(0, round(100 * ($1 - ($2)) / $HZ / ($3 / 1e9))))"); }

# run_perf QD SIZE WORKLOAD [FLAGS...]: spdk_nvme_perf against the running target; sets RESULT
# to "IOPS MiB/s mean_latency_us" from its Total line, and OTHER to the CPU the rest of the
# machine used meanwhile. (Results go through globals, not $(...): a fail in a command
# substitution would stop only that subshell.)
run_perf() {
  local qd=$1 size=$2 w=$3 out="$TMP/perf.out" b0 b1 t0 t1 n0 n1 pu ps
  shift 3
  b0=$(busy_jiffies) t0=$(cpu_ticks "$TPID") n0=$(date +%s%N)
  if ! timeout $((T + 30)) /usr/bin/time -f '%U %S' -o "$TMP/perf.time" \
    "$SPDK_DIR/build/bin/spdk_nvme_perf" --no-huge -s 1024 -c 0x2 -q "$qd" -o "$size" \
    -w "$w" -t "$T" -a 1 "$@" -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" \
    >"$out" 2>&1; then
    fail "spdk_nvme_perf -q $qd -o $size -w $w $* failed (exit status); its errors and last lines:
$(grep -iE 'error|fail' "$out" | head -10)
$(grep -v '^$' "$out" | tail -3)"
  fi
  b1=$(busy_jiffies) t1=$(cpu_ticks "$TPID") n1=$(date +%s%N)
  read -r pu ps <"$TMP/perf.time"
  other_cpu "$((b1 - b0))" "$((t1 - t0)) + ($pu + $ps) * $HZ" "$((n1 - n0))"
  # Total : IOPS MiB/s Average min max (latencies in microseconds)
  RESULT=$(awk '/^Total *:/ {print $3, $4, $5}' "$out")
  # With -L: "  99.90000% :    63.899us" lines, for the percentiles of PCTS.
  LAT=$(awk -v want="$PCTS" 'BEGIN {n = split(want, w, " ")} $2 == ":" {sub(/%$/, "", $1); v[$1 + 0] = $3 + 0}
    END {for (i = 1; i <= n; i++) printf "%s ", ((w[i] + 0) in v) ? v[w[i] + 0] : "-"}' "$out")
  # (It exits 0 when it cannot connect at all: "No valid NVMe controllers found".)
  [ -n "$RESULT" ] || fail "no Total line from spdk_nvme_perf -q $qd -o $size -w $w $*: $(grep -iE 'error|fail|no valid' "$out" | head -10)"
}

# run_host_perf QD SIZE WORKLOAD: `ferrite perf` over Ferrite's host, SQ flow control off,
# against the running target; sets RESULT and OTHER as run_perf does.
run_host_perf() {
  local qd=$1 size=$2 w=$3 res="$TMP/host-perf.json" b0 b1 t0 t1 n0 n1 pu ps
  cat >"$TMP/host.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller","params":{"name":"Nvme0","trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$PORT","subnqn":"$NQN","disable_sq_flow_control":true}}]}]}
J
  b0=$(busy_jiffies) t0=$(cpu_ticks "$TPID") n0=$(date +%s%N)
  timeout $((T + 30)) /usr/bin/time -f '%U %S' -o "$TMP/perf.time" "$FERRITE" perf --json "$TMP/host.json" \
    -T Nvme0n1 -q "$qd" -o "$size" -w "$w" -t "$T" -m 0x2 --results-json "$res" >"$TMP/perf.out" 2>&1 ||
    fail "ferrite perf -q $qd -o $size -w $w (SQ flow control off) failed: $(tail -3 "$TMP/perf.out")"
  b1=$(busy_jiffies) t1=$(cpu_ticks "$TPID") n1=$(date +%s%N)
  read -r pu ps <"$TMP/perf.time"
  other_cpu "$((b1 - b0))" "$((t1 - t0)) + ($pu + $ps) * $HZ" "$((n1 - n0))"
  RESULT=$(json_get "$res" "f\"{d['total']['iops']} {d['total']['mibps']} {d['total']['avg_latency_us']:.2f}\"")
  [ "$(json_get "$res" "d['total']['io_failed']")" = 0 ] || fail "ferrite perf (SQ flow control off): failed I/O"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
med() { tr ' ' '\n' <<<"$1" | grep . | median; } # med "V1 V2 ...": their median
best() { tr ' ' '\n' <<<"$1" | grep . | sort -g | tail -1; } # best "V1 V2 ...": the highest
ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else '-')"; }

# --- throughput cells -----------------------------------------------------------------------
perf_cells() {
  echo "ferrite column: $NVMF_TARGET$([ "$NVMF_TARGET" = ferrite ] && echo " ($FERRITE_MODE)"); spdk column: nvmf_tgt;" \
    "${T}s per run after 1 s warm-up, median of $ROUNDS; other%: the most CPU (% of one core) the rest" \
    "of the machine took during any of the cell's runs (over ~10 and the cell is noise)"
  printf '%-30s %10s %10s %6s %10s %10s %6s %7s %13s %9s %9s %8s %8s %6s\n' cell ferrite spdk ratio f_best s_best ratio \
    q_med q_range f_MiB/s s_MiB/s f_lat_us s_lat_us other%
  for cell in "null randread 4096 1" "null randread 4096 32" "null randread 4096 128" \
    "null randwrite 4096 1" "null randwrite 4096 32" "null randwrite 4096 128" \
    "null randread 4096 32 -H -I" "null-resp randread 4096 1" "null-resp randread 4096 32" \
    "null-resp randread 4096 128" "sqfc-off randread 4096 1" "sqfc-off randread 4096 32" \
    "malloc read 131072 32" "malloc write 131072 32"; do
    [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"$cell" || continue
    read -r kind w size qd flags <<<"$cell"
    fiops_all='' siops_all='' fm_all='' sm_all='' fl_all='' sl_all='' q_all='' other_max=0
    for round in $(seq "$ROUNDS"); do
      order="ferrite spdk"
      ((round % 2)) || order="spdk ferrite" # alternate who goes first, against drift
      for side in $order; do
        who=$side
        [ "$side" = ferrite ] && who=$NVMF_TARGET
        if [ "$kind" = sqfc-off ]; then
          start_target "$who" null
          run_host_perf "$qd" "$size" "$w"
        else
          start_target "$who" "$kind"
          # shellcheck disable=SC2086 # flags are words
          run_perf "$qd" "$size" "$w" $flags
        fi
        stop_target
        read -r i m l <<<"$RESULT"
        [ "$OTHER" -gt "$other_max" ] && other_max=$OTHER
        if [ "$side" = ferrite ]; then fi_round=$i fiops_all+="$i " fm_all+="$m " fl_all+="$l "; else si_round=$i siops_all+="$i " sm_all+="$m " sl_all+="$l "; fi
      done
      q_all+="$(python3 -c "print(f'{$fi_round/$si_round:.3f}' if $si_round else 0)") "
    done
    fiops=$(med "$fiops_all") siops=$(med "$siops_all")
    fbest=$(best "$fiops_all") sbest=$(best "$siops_all")
    fm=- sm=- fl=- sl=-
    if [ "$size" != 4096 ]; then fm=$(med "$fm_all") sm=$(med "$sm_all"); fi
    if [ "$qd" = 1 ]; then fl=$(med "$fl_all") sl=$(med "$sl_all"); fi
    name="$kind $w $((size / 1024))k qd$qd${flags:+ digests}"
    qr="$(tr ' ' '\n' <<<"$q_all" | grep . | sort -g | head -1)-$(tr ' ' '\n' <<<"$q_all" | grep . | sort -g | tail -1)"
    printf '%-30s %10.0f %10.0f %6s %10.0f %10.0f %6s %7s %13s %9s %9s %8s %8s %6s\n' "$name" "$fiops" "$siops" \
      "$(ratio "$fiops" "$siops")" "$fbest" "$sbest" "$(ratio "$fbest" "$sbest")" "$(med "$q_all")" "$qr" \
      "$fm" "$sm" "$fl" "$sl" "$other_max"
  done
}

# --- tail latency cells ---------------------------------------------------------------------
PCTS="50 99 99.9 99.99" # the percentiles the latency cells show

# lat_cells: spdk_nvme_perf -L (its software latency tracking: a histogram of every I/O's
# latency) against each target, null namespace, 4 KiB; the median over the rounds of each
# percentile, in microseconds, and the ratios ferrite/spdk of p99 and p99.9 (below 1: Ferrite's
# tail is shorter). p99.99 of a 4-5 s run rests on a few hundred I/Os and moves with the machine.
lat_cells() {
  echo
  echo "latency percentiles (us), spdk_nvme_perf -L, ${T}s per run, median of $ROUNDS"
  printf '%-24s %-31s %-31s %6s %6s %6s\n' cell "ferrite p50/p99/p99.9/p99.99" "spdk p50/p99/p99.9/p99.99" \
    r_p99 r_p999 other%
  for cell in "null randread 4096 1" "null randwrite 4096 1" "null randread 4096 32" \
    "null randwrite 4096 32" "null randread 4096 128" "null randwrite 4096 128"; do
    [ -z "${CELLS:-}" ] || grep -qE "$CELLS" <<<"$cell" || continue
    read -r kind w size qd <<<"$cell"
    declare -A lat=()
    other_max=0
    for round in $(seq "$ROUNDS"); do
      order="ferrite spdk"
      ((round % 2)) || order="spdk ferrite"
      for side in $order; do
        who=$side
        [ "$side" = ferrite ] && who=$NVMF_TARGET
        start_target "$who" "$kind"
        run_perf "$qd" "$size" "$w" -L
        stop_target
        [ "$OTHER" -gt "$other_max" ] && other_max=$OTHER
        read -r -a got <<<"$LAT"
        local i=0
        for pct in $PCTS; do
          lat[$side$pct]+="${got[$i]} "
          i=$((i + 1))
        done
      done
    done
    fcol='' scol=''
    for pct in $PCTS; do
      fcol+="$(med "${lat[ferrite$pct]}")/" scol+="$(med "${lat[spdk$pct]}")/"
    done
    printf '%-24s %-31s %-31s %6s %6s %6s\n' "$w $((size / 1024))k qd$qd" "${fcol%/}" "${scol%/}" \
      "$(ratio "$(med "${lat[ferrite99]}")" "$(med "${lat[spdk99]}")")" \
      "$(ratio "$(med "${lat[ferrite99.9]}")" "$(med "${lat[spdk99.9]}")")" "$other_max"
    unset lat
  done
}

# --- idle cells ----------------------------------------------------------------------------
# established PORT: number of established TCP connections to the target's port.
established() { ss -Htn state established "( sport = :$1 )" | wc -l; }

# idle_host HOW: starts a host that connects to the target on $PORT and then stays idle; sets
# HPID; returns once its connections (admin queue, plus the I/O queue for perf) are established.
idle_host() {
  local want
  if [ "$1" = bdevperf ]; then
    cat >"$TMP/host.json" <<J
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller","params":{"name":"Nvme0","trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$PORT","subnqn":"$NQN"}}]}]}
J
    "$SPDK_DIR/build/examples/bdevperf" --json "$TMP/host.json" -z -q 1 -o 4096 -w randread -t 1 -m 0x2 \
      --no-pci --no-huge -s 1024 -r "$TMP/host.sock" >"$TMP/host.log" 2>&1 &
    want=1
  else
    "$SPDK_DIR/build/bin/spdk_nvme_perf" --no-huge -s 1024 -c 0x2 -q 1 -o 4096 -w randread -t 3600 \
      -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" >"$TMP/host.log" 2>&1 &
    want=2
  fi
  HPID=$!
  for _ in $(seq 300); do
    kill -0 "$HPID" 2>/dev/null || fail "idle host $1 exited: $(tail -5 "$TMP/host.log")"
    if [ "$(established "$PORT")" -ge "$want" ]; then
      if [ "$1" = perf ]; then
        sleep 0.5 # running I/O
        kill -STOP "$HPID"
      fi
      return
    fi
    sleep 0.1
  done
  fail "idle host $1: $want connection(s) not established after 30 s: $(tail -5 "$TMP/host.log")"
}

stop_host() {
  kill -KILL "$HPID" 2>/dev/null || true
  wait "$HPID" 2>/dev/null || true
  HPID=
}

# idle_cpu WHO MODE HOW: sets CPU to the % of one core the target used while the host idled,
# and OTHER to what the rest of the machine (not the target, not the host) used meanwhile.
idle_cpu() {
  start_target "$1" null "$2"
  idle_host "$3"
  local n0 n1 t0 t1 h0 h1 b0 b1 w0 w1
  n0=$(established "$PORT")
  sleep 1
  b0=$(busy_jiffies) t0=$(cpu_ticks "$TPID") h0=$(cpu_ticks "$HPID") w0=$(date +%s%N)
  sleep "$IDLE_SECONDS"
  b1=$(busy_jiffies) t1=$(cpu_ticks "$TPID") h1=$(cpu_ticks "$HPID") w1=$(date +%s%N)
  n1=$(established "$PORT")
  [ "$n1" = "$n0" ] || fail "$1 idle with $3: connections went from $n0 to $n1 during the window"
  stop_host
  stop_target
  CPU=$(python3 -c "print(f'{100 * ($t1 - $t0) / $HZ / ($w1 - $w0) * 1e9:.1f}')")
  other_cpu "$((b1 - b0))" "$((t1 - t0 + h1 - h0))" "$((w1 - w0))"
}

idle_cells() {
  echo
  echo "idle: target CPU % of one core over ${IDLE_SECONDS}s with a host connected and silent"
  printf '%-30s %12s %12s %12s %6s\n' host ferrite ferrite_poll spdk other%
  for how in bdevperf perf; do
    label="bdevperf -z (admin queue)"
    [ "$how" = perf ] && label="perf stopped (admin + I/O)"
    other_max=0
    idle_cpu "$NVMF_TARGET" adaptive "$how"
    fa=$CPU fp=- other_max=$OTHER
    if [ "$NVMF_TARGET" = ferrite ]; then
      idle_cpu ferrite poll "$how"
      fp=$CPU
      [ "$OTHER" -gt "$other_max" ] && other_max=$OTHER
    fi
    idle_cpu spdk - "$how"
    [ "$OTHER" -gt "$other_max" ] && other_max=$OTHER
    printf '%-30s %12s %12s %12s %6s\n' "$label" "$fa" "$fp" "$CPU" "$other_max"
  done
}

# --- the run --------------------------------------------------------------------------------
say_tcp_cc
start_target "$NVMF_TARGET" null # can it serve the config at all? (stops here if not)
stop_target
case $ONLY in "" | perf) perf_cells ;; esac
case $ONLY in "" | lat) lat_cells ;; esac
case $ONLY in "" | idle) idle_cells ;; esac
