#!/usr/bin/env bash
# CPU cost of idle NBD connections: one reactor in adaptive mode holds N connections (default
# 2,000) that finished the handshake (NBD_OPT_GO) and then send nothing; the daemon's CPU use
# (utime+stime of all its threads, /proc/PID/stat) is measured over SECONDS (default 10), and
# its resident memory (VmRSS, /proc/PID/status) before the clients connect and with all of them
# connected, with the growth per connection.
# Target: under 1% of a core. Usage: bench/idle_connections.sh [N] [SECONDS]
# FERRITE_BIN=path measures another build of the daemon (e.g. an older one, for a comparison).
source "$(dirname "$0")/common.sh"
FERRITE=${FERRITE_BIN:-$FERRITE}
N=${1:-2000}
SECS=${2:-10}
need python3 python3
ulimit -n "$(ulimit -Hn)"
SOCK="$TMP/ferrite.sock"
"$FERRITE" serve -m 0x1 -r "$SOCK" --reactor-mode adaptive --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; [ -n "${cpid:-}" ] && kill $cpid 2>/dev/null; rm -rf "$TMP"' EXIT
until "$FERRITE" rpc -s "$SOCK" -t 1 spdk_get_version >/dev/null 2>&1; do sleep 0.005; done
rpc() { "$FERRITE" rpc -s "$SOCK" "$@"; }
rpc bdev_malloc_create --name M0 --num-blocks 16384 --block-size 4096 >/dev/null
addr=$(rpc nbd_server_start '{"address": "127.0.0.1:0"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["address"])')
rpc nbd_server_add_export --bdev-name M0 >/dev/null
port=${addr##*:}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
sleep 0.5
rss0=$(rss_kib)

# The clients: N connections, each through the fixed newstyle handshake to NBD_OPT_GO, then idle.
python3 - "$port" "$N" "$TMP/ready" <<'EOF' &
import socket, struct, sys, time
port, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def recv_n(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            raise SystemExit("server closed a connection during the handshake")
        b += c
    return b
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    g = recv_n(s, 18)
    assert g[:16] == b"NBDMAGICIHAVEOPT", g
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    name = b"M0"
    data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", 0x49484156454F5054, 7, len(data)) + data)  # NBD_OPT_GO
    while True:
        magic, opt, typ, ln = struct.unpack(">QIII", recv_n(s, 20))
        recv_n(s, ln)
        if typ == 1:  # NBD_REP_ACK
            break
        if typ & 0x80000000:
            raise SystemExit(f"NBD_OPT_GO refused: {typ:#x}")
    socks.append(s)
open(ready, "w").write(str(len(socks)))
while True:
    time.sleep(3600)
EOF
cpid=$!
for _ in $(seq 600); do [ -s "$TMP/ready" ] && break; kill -0 $cpid 2>/dev/null || fail "the client script died"; sleep 0.1; done
[ -s "$TMP/ready" ] || fail "the clients did not connect within 60 s"
conns=$(rpc nbd_server_get_connections | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$conns" = "$N" ] || fail "the daemon lists $conns connections, expected $N"
sleep 1
hz=$(getconf CLK_TCK)
t0=$(cpu_ticks $pid); sleep "$SECS"; t1=$(cpu_ticks $pid)
cpu=$(python3 -c "print(round(100*($t1-$t0)/$hz/$SECS, 2))")
rss1=$(rss_kib)
conns=$(rpc nbd_server_get_connections | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
per=$(python3 -c "print(round(($rss1-$rss0)/$N, 1))")
echo "idle_connections=$N still_connected=$conns cpu_percent=$cpu (over ${SECS}s, 1 reactor, adaptive)"
echo "rss_before_kib=$rss0 rss_connected_kib=$rss1 rss_per_connection_kib=$per"
python3 -c "import sys; sys.exit(0 if $cpu < 1.0 else 1)" || fail "idle connections cost ${cpu}% of a core (target < 1%)"
