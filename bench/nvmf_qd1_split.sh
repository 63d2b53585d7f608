#!/usr/bin/env bash
# Where a QD 1 read's round trip goes: Ferrite's NVMe/TCP target and SPDK's nvmf_tgt, each on
# core 0 serving a null namespace (4 KiB blocks) to spdk_nvme_perf on core 1 (4 KiB randread,
# QD 1), their runs alternating. During each run `perf record` takes the system-call entries and
# exits of sendmsg, readv and io_uring_enter on both cores for one second (the tracepoints'
# own cost makes every part longer than it is untraced: compare the two columns, not the
# absolute numbers). Each I/O is then split, from the exit of the client's sendmsg (the
# command is in the target's socket: loopback delivers it inside that call) to the exit of
# the target's sendmsg (the reply is in the client's socket):
#   rx_start: from the client's send to the entry of the target's receiving call (Ferrite:
#     the io_uring_enter that runs the receive; SPDK: readv), negative when the target enters
#     before the client's call has returned;
#   rx: that call; user: from its exit to the entry of the target's sendmsg; tx: that sendmsg;
#   target: the whole, client send exit to target send exit; client: the rest of the round
#   trip (target send exit to the client's next send exit: its polling, readv, parsing the
#   reply's PDUs, the completion, the next command and most of its sendmsg);
#   cli_tx: the client's sendmsg itself (its share of the loopback delivery to the target).
# Medians per run, in µs, and the run's IOPS. Why: the QD 1 cells of bench/nvmf_vs_spdk.sh give
# one number per side; this shows which side of the wire a difference is on.
# Environment: ROUNDS (4); FERRITE_BIN (another build of the daemon); TAILS=1 also prints the
# mean, p90, p99 and p99.9 of the target's and the client's parts.
# Needs SPDK (../shared/anchors/spdk.sh) and perf (linux-perf); prints SKIP without them.
# Usage: [ROUNDS=4] bench/nvmf_qd1_split.sh [SECONDS]
source "$(dirname "$0")/common.sh"
FERRITE=${FERRITE_BIN:-$FERRITE}
T=${1:-3}
ROUNDS=${ROUNDS:-4}
need_spdk bin/nvmf_tgt bin/spdk_nvme_perf
command -v perf >/dev/null || { echo "SKIP: perf (package linux-perf) not installed"; exit 0; }
[ "$T" -ge 2 ] || fail "SECONDS must be at least 2 (the trace takes one second after a warm-up)"
need ss iproute2
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib"
NQN=nqn.2016-06.io.spdk:cnode1
TPID=
PPID_PERF=
cleanup() {
  stop_pids $PPID_PERF $TPID
  rm -rf "$TMP"
}
trap cleanup EXIT

# split.py: reads `perf script` lines of raw_syscalls enter/exit on cpus 0 (target) and 1
# (client); prints the medians described above.
cat >"$TMP/split.py" <<'PY'
import bisect, re, statistics, sys
SENDMSG, READV, URING = 46, 19, 426
ev = []
for line in sys.stdin:
    m = re.match(r'\s*\[(\d+)\]\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit): NR (\d+)', line)
    if m:
        ev.append((float(m[2]), int(m[1]), m[3], int(m[4])))
ev.sort()
cpu0 = [e for e in ev if e[1] == 0]
t0s = [e[0] for e in cpu0]
cli_tx, open_tx = [], None
for t, c, k, nr in ev:
    if c == 1 and nr == SENDMSG:
        if k == "enter":
            open_tx = t
        elif open_tx is not None:
            cli_tx.append((open_tx, t))
            open_tx = None
parts = {k: [] for k in ("rx_start", "rx", "user", "tx", "target", "client", "cli_tx")}
sends = [b for _, b in cli_tx]
for i, t0 in enumerate(sends[:-1]):
    j = bisect.bisect_right(t0s, t0)
    while j < len(cpu0) and not (cpu0[j][2] == "enter" and cpu0[j][3] == SENDMSG):
        j += 1
    if j + 1 >= len(cpu0) or cpu0[j + 1][2] != "exit" or j < 2:
        continue
    rx_exit, rx_enter = cpu0[j - 1], cpu0[j - 2]
    if rx_exit[2] != "exit" or rx_enter[2] != "enter" or rx_exit[3] not in (READV, URING) or rx_exit[0] < t0:
        continue
    t1 = cpu0[j + 1][0]
    nxt = sends[i + 1]
    if nxt < t1:
        continue
    parts["rx_start"].append(rx_enter[0] - t0)
    parts["rx"].append(rx_exit[0] - rx_enter[0])
    parts["user"].append(cpu0[j][0] - rx_exit[0])
    parts["tx"].append(t1 - cpu0[j][0])
    parts["target"].append(t1 - t0)
    parts["client"].append(nxt - t1)
    parts["cli_tx"].append(cli_tx[i + 1][1] - cli_tx[i + 1][0])
if not parts["target"]:
    print("no round trips found")
    sys.exit()
print(" ".join("%s %6.2f" % (k, statistics.median(v) * 1e6) for k, v in parts.items()), " n %d" % len(parts["target"]))
if "--tails" in sys.argv:
    for k in ("target", "client"):
        v = sorted(parts[k])
        q = lambda f: v[min(len(v) - 1, int(f * len(v)))] * 1e6
        print("    %s: mean %.2f p90 %.2f p99 %.2f p99.9 %.2f" % (k, statistics.mean(v) * 1e6, q(0.9), q(0.99), q(0.999)))
PY

# run WHO: one traced run; prints its line.
run() {
  local who=$1 port
  port=$(free_port)
  nvmf_bench_config null "$port" "$NQN" >"$TMP/config.json"
  if [ "$who" = ferrite ]; then
    "$FERRITE" serve -m 0x1 -r "$TMP/t.sock" -c "$TMP/config.json" --log-level warn >"$TMP/target.log" 2>&1 &
  else
    "$SPDK_DIR/build/bin/nvmf_tgt" --no-huge -s 2048 -m 0x1 -r "$TMP/t.sock" --json "$TMP/config.json" >"$TMP/target.log" 2>&1 &
  fi
  TPID=$!
  for _ in $(seq 500); do
    ss -ltn | grep -q ":$port " && break
    kill -0 "$TPID" 2>/dev/null || fail "$who did not start: $(tail -3 "$TMP/target.log")"
    sleep 0.02
  done
  "$SPDK_DIR/build/bin/spdk_nvme_perf" -c 0x2 --no-huge -s 1024 -q 1 -o 4096 -w randread -t "$T" -a 1 \
    -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$NQN" >"$TMP/perf.out" 2>&1 &
  PPID_PERF=$!
  sleep 2.5
  perf record -q -o "$TMP/sc.data" -a \
    -e raw_syscalls:sys_enter --filter 'id == 46 || id == 19 || id == 426' \
    -e raw_syscalls:sys_exit --filter 'id == 46 || id == 19 || id == 426' -- sleep 1 >/dev/null 2>&1
  wait "$PPID_PERF" || fail "spdk_nvme_perf failed against $who: $(tail -3 "$TMP/perf.out")"
  PPID_PERF=
  kill "$TPID"
  wait "$TPID" 2>/dev/null || true
  TPID=
  local iops
  iops=$(awk '/^Total/ {print $3}' "$TMP/perf.out")
  printf '%-8s %10s  %s\n' "$who" "$iops" \
    "$(perf script --ns -i "$TMP/sc.data" -F cpu,time,event,trace 2>/dev/null | python3 "$TMP/split.py" ${TAILS:+--tails})"
}

echo "QD 1 4 KiB randread, null namespace; medians per run in µs (traced: compare columns, not absolutes)"
printf '%-8s %10s  %s\n' who IOPS parts
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run ferrite; run spdk; else run spdk; run ferrite; fi
done
