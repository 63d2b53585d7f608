# Shared by the bench scripts: build once, find the binary, make temp dirs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# FERRITE_BIN=PATH measures another build (an A/B of two builds in one run); the default is
# this tree's release build, made here.
FERRITE="${FERRITE_BIN:-$ROOT/target/release/ferrite}"
OUT="$ROOT/bench/results"
mkdir -p "$OUT"
(cd "$ROOT" && cargo build --release -q -p ferrite)
TMP=$(mktemp -d)
HUGE_RESTORE= # the hugepage count to give back at exit, if spdk_memory raised it
trap 'rm -rf "$TMP"; [ -z "$HUGE_RESTORE" ] || echo "$HUGE_RESTORE" >/proc/sys/vm/nr_hugepages' EXIT
# fail MESSAGE: print it and stop the bench.
fail() { echo "bench: $*" >&2; exit 1; }
# need COMMAND PACKAGE: install PACKAGE (apt) if COMMAND is missing; fail if it is still missing.
need() {
  command -v "$1" >/dev/null && return
  echo "bench: $1 missing, installing package $2" >&2
  apt-get install -y -qq "$2" >/dev/null 2>&1 || true
  command -v "$1" >/dev/null || fail "$1 (package $2) is missing and could not be installed"
}
# cpu_ticks PID: utime+stime (fields 14, 15 of /proc/PID/stat) of all its threads, in clock ticks.
cpu_ticks() {
  local s f
  s=$(<"/proc/$1/stat"); s=${s##*) }
  read -r -a f <<<"$s"
  echo $((f[11] + f[12]))
}
# thread_of PID NAME: the id of PID's thread named NAME (a reactor_N), or nothing.
thread_of() {
  local t
  for t in /proc/"$1"/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = "$2" ] && { echo "${t##*/}"; return 0; }
  done
  return 0
}
# sched_ns PID TID: "RUN WAIT" of thread TID of PID so far, in ns (/proc/PID/task/TID/schedstat):
# its time on a CPU and its time runnable but waiting for one; "0 0" if it is gone. A polling
# reactor is always runnable, so RUN / (RUN + WAIT) is the share of its core it was given.
sched_ns() {
  local r w s
  { read -r r w s <"/proc/$1/task/$2/schedstat"; } 2>/dev/null || { echo "0 0"; return 0; }
  echo "$r $w"
}
# core_share RUN0 WAIT0 RUN1 WAIT1: the percentage of its core a polling thread was given
# between two sched_ns samples (100 if it was neither on a CPU nor waiting for one).
core_share() {
  local run=$(($3 - $1)) wait=$(($4 - $2))
  [ $((run + wait)) -gt 0 ] || { echo 100; return 0; }
  echo $((100 * run / (run + wait)))
}
# json_get FILE EXPR: evaluate a Python expression on the parsed JSON document `d`.
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# in_tcp_cc_netns ARGS...: with TCP_CC set (a congestion control, e.g. cubic), runs the calling
# script again, with ARGS, in a network namespace of its own (unshare -n, loopback up) whose TCP
# uses TCP_CC; the machine's setting stays as it is. Without TCP_CC, or inside, returns.
in_tcp_cc_netns() {
  [ -n "${TCP_CC:-}" ] && [ -z "${FERRITE_BENCH_NETNS:-}" ] || return 0
  [ "$(id -u)" = 0 ] || fail "TCP_CC needs root (a network namespace of the run's own)"
  need ip iproute2
  need unshare util-linux
  grep -qw "$TCP_CC" /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null ||
    modprobe "tcp_$TCP_CC" 2>/dev/null || true
  grep -qw "$TCP_CC" /proc/sys/net/ipv4/tcp_available_congestion_control ||
    fail "TCP congestion control $TCP_CC is not available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)"
  rm -rf "$TMP" # the run inside makes its own
  exec env FERRITE_BENCH_NETNS=1 unshare -n bash -c \
    'ip link set lo up && sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" && exec bash "$0" "$@"' "$0" "$@"
}

# say_tcp_cc: prints the TCP congestion control the run uses.
say_tcp_cc() {
  echo "TCP congestion control: $(cat /proc/sys/net/ipv4/tcp_congestion_control)$([ -n "${FERRITE_BENCH_NETNS:-}" ] && echo " (TCP_CC, in a network namespace of this run's own)")"
}

# spdk_memory MB [PROCS]: sets SPDK_MEM, the memory flags of an SPDK program given MB MiB
# (hugepages reserved for PROCS such programs running at once, default 1), and
# FERRITE_MEM, the matching flags of `ferrite perf`. Ferrite's malloc bdevs ask for transparent
# huge pages, so SPDK gets 2 MiB hugepages too where this can reserve them (root; the count is
# given back at exit): SPDK `-s MB`, Ferrite nothing. Elsewhere, or with SPDK_HUGE=0, neither
# has huge pages: SPDK `--no-huge -s MB`, Ferrite `--no-huge`. Prints which.
# shellcheck disable=SC2034 # SPDK_MEM and FERRITE_MEM are read by the scripts that source this
spdk_memory() {
  SPDK_MEM=(--no-huge -s "$1")
  FERRITE_MEM=(--no-huge)
  if [ "${SPDK_HUGE:-1}" != 1 ] || [ "$(id -u)" != 0 ]; then
    echo "Memory: 4 KiB pages on both sides (SPDK --no-huge -s $1, Ferrite --no-huge)"
    return 0
  fi
  local want=$((${2:-1} * ($1 / 2 + 16))) have free
  have=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$have" -lt "$want" ]; then
    [ -n "$HUGE_RESTORE" ] || HUGE_RESTORE=$have
    echo "$want" >/proc/sys/vm/nr_hugepages
  fi
  mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }
  free=$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)
  if [ "$free" -lt "$want" ]; then
    echo "Memory: 4 KiB pages on both sides (SPDK --no-huge -s $1, Ferrite --no-huge):" \
      "only $free of $want hugepages could be reserved"
    return 0
  fi
  SPDK_MEM=(-s "$1")
  FERRITE_MEM=()
  echo "Memory: huge pages on both sides (SPDK -s $1 of 2 MiB hugepages, Ferrite's malloc transparent huge pages)"
}

# free_port: a TCP port on 127.0.0.1 that is free at the time.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# stop_pids PID...: kills each (SIGKILL) and reaps it; empty arguments are skipped.
stop_pids() {
  local p
  for p in "$@"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

# nvmf_bench_config KIND PORT NQN: the SPDK-format JSON config an NVMe/TCP target bench gives
# Ferrite and SPDK's nvmf_tgt alike: namespace 1 of NQN is Null0 (KIND null or null-resp) or
# Malloc0 (KIND malloc), 1 GiB of 4 KiB blocks either way, listening on 127.0.0.1:PORT;
# null-resp turns the transport's c2h_success off (see bench/nvmf_vs_spdk.sh).
nvmf_bench_config() {
  local create=bdev_null_create name=Null0 transport='{"trtype":"TCP"}'
  [ "$1" = malloc ] && create=bdev_malloc_create name=Malloc0
  [ "$1" = null-resp ] && transport='{"trtype":"TCP","c2h_success":false}'
  cat <<J
{"subsystems":[
 {"subsystem":"bdev","config":[
  {"method":"$create","params":{"name":"$name","num_blocks":262144,"block_size":4096}}]},
 {"subsystem":"nvmf","config":[
  {"method":"nvmf_create_transport","params":$transport},
  {"method":"nvmf_create_subsystem","params":{"nqn":"$3","allow_any_host":true,"serial_number":"FERRITE0001","model_number":"Ferrite bench"}},
  {"method":"nvmf_subsystem_add_ns","params":{"nqn":"$3","namespace":{"bdev_name":"$name"}}},
  {"method":"nvmf_subsystem_add_listener","params":{"nqn":"$3","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$2"}}}]}]}
J
}

# need_spdk BIN...: sets SPDK_DIR (from the environment, or ../shared/anchors/spdk.sh) and checks
# SPDK's programs BIN (paths under build/, e.g. bin/nvmf_tgt); prints SKIP and ends the bench
# with status 0 when one is missing.
need_spdk() {
  SPDK_DIR=${SPDK_DIR:-$(bash "$ROOT/../shared/anchors/spdk.sh" 2>/dev/null || true)}
  local b
  local rc
  for b in "$@"; do
    if [ -z "$SPDK_DIR" ] || [ ! -x "$SPDK_DIR/build/$b" ]; then
      echo "SKIP: SPDK's $(basename "$b") not available (run ../shared/anchors/spdk.sh, or set SPDK_DIR)"
      exit 0
    fi
    # A build for a CPU with AVX-512 dies of SIGILL before main on one without ("; exit" keeps
    # the subshell, whose report of the signal goes to /dev/null).
    rc=0
    (LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/$b" --help >/dev/null 2>&1; exit $?) 2>/dev/null || rc=$?
    if [ "$rc" -ge 128 ]; then
      echo "SKIP: SPDK's $(basename "$b") in $SPDK_DIR does not run on this CPU (killed by signal $((rc - 128)));" \
        "build SPDK here (../shared/anchors/README.md) and set SPDK_DIR"
      exit 0
    fi
  done
}

# --- pictures (PLOT=DIR) --------------------------------------------------------------------
# PLOT=DIR: the scripts that support it (perf_vs_spdk.sh, vhost_vs_spdk.sh, raid_vs_spdk.sh)
# also write, for each cell, DIR/CELL.svg: Ferrite's and its peer's IOPS in each second of one
# run, side by side on one scale (`ferrite plot`). Empty: no pictures, and the runs are as without it.
PLOT=${PLOT:-}
[ -z "$PLOT" ] || mkdir -p "$PLOT"

# bdevperf_series: reads bdevperf -S 1's output on stdin, prints "SECONDS IOPS" for each second.
# Each second bdevperf prints a job line (" NAME : RUNTIME IOPS MiB/s ...") whose IOPS is the
# average since the start (its runtime column grows 1.00, 2.00, ...): the rate of the second is
# the difference of the I/O counts (IOPS x runtime) over the difference of the runtimes. The
# final report repeats the last runtime and is skipped. One job (one bdev on one core) expected.
bdevperf_series() {
  tr '\r' '\n' | awk '$2 == ":" && $1 != "Total" && $1 != "Device" && NF >= 9 && $3 + 0 > 0 {
    t = $3 + 0; n = $4 * t
    if (t - lt >= 0.5) { printf "%.2f %.1f\n", t, (n - ln) / (t - lt); lt = t; ln = n }
  }'
}

# plot_cell NAME TITLE FERRITE_SERIES PEER PEER_SERIES: with PLOT set, draws PLOT/NAME.svg, the
# two series files (a `ferrite perf --results-json` file or "SECONDS IOPS" lines) side by side.
plot_cell() {
  [ -n "$PLOT" ] || return 0
  "$FERRITE" plot -o "$PLOT/$1.svg" --title "$2" "ferrite=$3" "$4=$5" || fail "ferrite plot $1 failed"
}
