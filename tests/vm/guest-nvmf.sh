# Guest side of tests/vm/nvmf-guest.sh (runs as root in the QEMU guest, Debian's 6.1 kernel).
# The host wrapper prepends PORT, PORT2, NQN, SN, MN, STEPS and ANA. The kernel's NVMe/TCP host
# (nvme-cli) against Ferrite's target at 10.0.2.2 (the host's 127.0.0.1):
#   1 discovery, 2 connect + identify/log pages, 3 raw and ext4 round trips, 4 fio verify,
#   5 reconnect with header and data digests, then with SQ flow control disabled, 6 namespace
#   hot add/remove (AEN),
#   7 native multipath over two listeners while the host flips ANA states, 8 the daemon killed
#   and restarted while connected: the kernel reconnects and I/O goes on, 9 a thin lvol and
#   its snapshot: the snapshot's disk is read-only, a write to a full lvstore fails ENOSPC,
#   the lvol made read-only while connected turns its disk read-only, 10 `nvme reset` during
#   fio verify: no error, the queues come back, 11 the host NQN removed from NQN2 (listed hosts
#   only) and added back RMHOST_ROUNDS times while the kernel reconnects: the target's controller
#   count is back to zero after each removal, and I/O works after each reconnect, 12 two hosts
#   (host NQN and ID each) on NQN3: register, Write Exclusive, report, the other host's O_DIRECT
#   write refused while its reads work, release, then its write goes through (data compared).
# Asks the host for RPCs through the shared folder (tests/vm/guest-lib.sh's `host`).
set -u
# shellcheck source=guest-lib.sh
. /host/guest-lib.sh
export LC_ALL=C
T0=$(cut -d' ' -f1 /proc/uptime)
step() { echo "=== [+$(awk -v t0="$T0" '{printf "%.1f", $1 - t0}' /proc/uptime)s] $*"; }
ok() { echo "ok: $*"; }
FAILED=()
# bad MSG: a failed check after which the rest can still run (reported at the end).
bad() { echo "FAIL: $*"; FAILED+=("$*"); }
# fail MSG: a failed check after which nothing else makes sense.
fail() {
  echo "FAIL: $*"
  [ ${#FAILED[@]} = 0 ] || printf 'FAIL (earlier): %s\n' "${FAILED[@]}"
  echo "--- nvme list-subsys"; nvme list-subsys 2>&1 | head -20
  echo "--- dmesg (last 60 lines)"; dmesg | tail -n 60
  exit 1
}
# Which steps run (space-separated list; the host may narrow it for debugging).
runs() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }


# ns_dev NSID: the block device (multipath head) of namespace NSID, empty if none.
ns_dev() {
  local b
  for b in /sys/block/nvme*n*; do
    [[ ${b##*/} =~ ^nvme[0-9]+n[0-9]+$ ]] || continue
    [ "$(cat "$b/nsid" 2>/dev/null)" = "$1" ] && { echo "/dev/${b##*/}"; return; }
  done
}
# wait_ns NSID [SECONDS]: waits for the namespace's device; prints it.
wait_ns() {
  local d
  for _ in $(seq $((${2:-10} * 10))); do
    d=$(ns_dev "$1"); [ -n "$d" ] && [ -b "$d" ] && { echo "$d"; return 0; }
    sleep 0.1
  done
  return 1
}
# ctrl_of PORT: the controller (nvmeN) connected through PORT.
ctrl_of() {
  local c
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
    grep -q "trsvcid=$1\b" "$c/address" 2>/dev/null && { echo "${c##*/}"; return; }
  done
}
wait_no_ctrl() {
  for _ in $(seq 100); do ls /sys/class/nvme/ 2>/dev/null | grep -q . || return 0; sleep 0.1; done
  return 1
}
# roundtrip DEV MIB: writes MIB MiB of random data with O_DIRECT, reads back, compares.
roundtrip() {
  dd if=/dev/urandom of=/tmp/src bs=1M count="$2" status=none
  dd if=/tmp/src of="$1" bs=1M oflag=direct status=none || fail "dd write to $1"
  dd if="$1" of=/tmp/dst bs=1M count="$2" iflag=direct status=none || fail "dd read from $1"
  cmp /tmp/src /tmp/dst || fail "raw data read back from $1 differs"
  ok "raw $2 MiB O_DIRECT write/read/cmp on $1"
}

modprobe nvme-tcp || fail "modprobe nvme-tcp"
modprobe crc32c_generic; modprobe ext4
[ -s /etc/nvme/hostnqn ] || { mkdir -p /etc/nvme; nvme gen-hostnqn >/etc/nvme/hostnqn; }
echo "host NQN $(cat /etc/nvme/hostnqn); multipath=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)"
A="-t tcp -a 10.0.2.2"

# ------------------------------------------------------------------ 1. discovery
if runs 1; then
  step "1. nvme discover -t tcp -a 10.0.2.2 -s $PORT"
  out=$(nvme discover $A -s "$PORT" 2>&1); rc=$?
  echo "$out"
  [ $rc = 0 ] || fail "nvme discover (rc $rc)"
  echo "$out" | grep -q "subnqn: *$NQN\$" || fail "discovery log does not list $NQN"
  for p in "$PORT" "$PORT2"; do
    echo "$out" | grep -q "trsvcid: *$p\b" || fail "discovery log has no entry for port $p"
  done
  ok "discovery lists $NQN on ports $PORT and $PORT2"
fi

# ------------------------------------------------------------------ 2. connect, identify
step "2. nvme connect $A -s $PORT -n $NQN"
nvme connect $A -s "$PORT" -n "$NQN" || fail "nvme connect"
D1=$(wait_ns 1) || fail "namespace 1 did not appear"
D2=$(wait_ns 2) || fail "namespace 2 did not appear"
C=$(ctrl_of "$PORT"); [ -n "$C" ] || fail "no controller for port $PORT in /sys/class/nvme"
echo "controller /dev/$C, nsid 1 = $D1, nsid 2 = $D2"
nvme list || fail "nvme list"
if runs 2; then
  idc=$(nvme id-ctrl /dev/$C) || fail "nvme id-ctrl /dev/$C"
  echo "$idc" | grep -E '^(vid|sn|mn|fr|cntlid|ver|mdts|oacs|oaes|anacap|anagrpmax|nanagrpid|mnan|sgls|subnqn|ioccsz|iorcsz|nn|kas|cmic) '
  sn=$(echo "$idc" | sed -n 's/^sn *: *//p' | sed 's/ *$//')
  mn=$(echo "$idc" | sed -n 's/^mn *: *//p' | sed 's/ *$//')
  n=${#FAILED[@]}
  [ "$sn" = "$SN" ] || bad "id-ctrl sn '$sn', expected '$SN'"
  [ "$mn" = "$MN" ] || bad "id-ctrl mn '$mn', expected '$MN'"
  [ ${#FAILED[@]} = "$n" ] && ok "id-ctrl: sn '$sn', mn '$mn'"
  for pair in "$D1:9:131072" "$D2:12:16384"; do
    IFS=: read -r d lbads nsze <<<"$pair"
    n=${#FAILED[@]}
    idn=$(nvme id-ns "$d") || { bad "nvme id-ns $d"; continue; }
    echo "$idn" | grep -E '^(nsze|ncap|nuse|nlbaf|flbas|nmic|anagrpid|nguid|eui64) |in use'
    inuse=$(echo "$idn" | grep 'in use' | sed -n 's/.*lbads:\([0-9]*\).*/\1/p')
    [ "$inuse" = "$lbads" ] || bad "id-ns $d: lbads in use '$inuse', expected $lbads"
    [ $(($(echo "$idn" | sed -n 's/^nsze *: *//p'))) = "$nsze" ] || bad "id-ns $d: nsze is not $nsze"
    [ "$(cat /sys/block/${d#/dev/}/queue/logical_block_size)" = $((1 << lbads)) ] ||
      bad "$d: logical block size is not $((1 << lbads))"
    [ ${#FAILED[@]} = "$n" ] && ok "id-ns $d: lbads $lbads ($((1 << lbads))-byte blocks), nsze $nsze"
  done
  nvme smart-log /dev/$C && ok "smart-log" || bad "nvme smart-log /dev/$C"
  if [ "$ANA" = 1 ]; then
    if ! ana=$(nvme ana-log /dev/$C 2>&1); then
      echo "$ana"
      # Evidence: nvme-cli reads the ANA log in 4 KiB pieces (log page offsets 0, 4096, ...) up
      # to the size id-ctrl allows (NANAGRPID and MNAN); the first piece alone, then the second.
      echo "$idc" | grep -E '^(nanagrpid|mnan|anacap) '
      for o in 0 4096; do
        r=$(nvme get-log /dev/$C --log-id=12 --log-len=4096 --lpo=$o 2>&1 >/dev/null) && r=ok
        echo "  nvme get-log /dev/$C --log-id=12 --log-len=4096 --lpo=$o: $r"
      done
      bad "nvme ana-log /dev/$C"
    else
      echo "$ana"
      [ "$(echo "$ana" | grep -cE '^state\s*:\s*optimized')" = 2 ] && ok "ana-log" ||
        bad "ana-log does not show 2 optimized groups"
    fi
  fi
fi

# ------------------------------------------------------------------ 3. raw + ext4
if runs 3; then
  step "3a. raw 8 MiB on nsid 1 ($D1, 512-byte blocks)"
  roundtrip "$D1" 8
  step "3b. ext4 on nsid 2 ($D2, 4096-byte blocks)"
  mkfs.ext4 -q -F "$D2" || fail "mkfs.ext4 $D2"
  mkdir -p /mnt/t && mount "$D2" /mnt/t || fail "mount $D2"
  dd if=/dev/urandom of=/tmp/f bs=1M count=16 status=none
  cp /tmp/f /mnt/t/f && sync && umount /mnt/t || fail "write 16 MiB file through ext4"
  echo 3 >/proc/sys/vm/drop_caches
  mount -o ro "$D2" /mnt/t || fail "remount $D2"
  a=$(md5sum </tmp/f | cut -d' ' -f1); b=$(md5sum </mnt/t/f | cut -d' ' -f1); umount /mnt/t
  [ "$a" = "$b" ] || fail "ext4 file md5 $b, expected $a"
  ok "ext4 16 MiB file round trip, md5 $a"
fi

# ------------------------------------------------------------------ 4. fio verify
if runs 4; then
  for bs in 4k 128k; do
    step "4. fio randwrite + verify crc32c, bs=$bs, iodepth 32, numjobs 2, 32 MiB on $D1"
    # Each job has its own 16 MiB (offset_increment), so that the jobs do not overwrite each other.
    fio --name=v$bs --filename="$D1" --ioengine=libaio --direct=1 --rw=randwrite --bs=$bs \
      --iodepth=32 --numjobs=2 --size=16M --offset_increment=16M --verify=crc32c \
      --verify_fatal=1 --do_verify=1 --group_reporting --eta=never --output=/tmp/fio.out
    rc=$?
    grep -E 'err=|write:|read:|verify|IOPS' /tmp/fio.out | head -12
    [ $rc = 0 ] || { cat /tmp/fio.out; fail "fio bs=$bs exited $rc"; }
    grep -q ' err= 0' /tmp/fio.out || { cat /tmp/fio.out; fail "fio bs=$bs reported errors"; }
    ok "fio bs=$bs: no verify errors"
  done
  host qpairs
fi

# ------------------------------------------------------------------ 5. digests, SQ flow control
# reconnect_with WHAT ARGS...: disconnects, connects again with ARGS, and round-trips both
# namespaces (sets D1, D2 and C for the steps after).
reconnect_with() {
  local what=$1
  shift
  nvme disconnect -n "$NQN" || fail "nvme disconnect (before $what)"
  wait_no_ctrl || fail "controllers still present after disconnect (before $what)"
  nvme connect $A -s "$PORT" -n "$NQN" "$@" || fail "nvme connect $*"
  D1=$(wait_ns 1) || fail "namespace 1 did not appear ($what)"
  D2=$(wait_ns 2) || fail "namespace 2 did not appear ($what)"
  C=$(ctrl_of "$PORT")
  roundtrip "$D1" 4
  roundtrip "$D2" 4
  ok "connection with $what"
}
if runs 5; then
  step "5. disconnect, reconnect with header and data digests (-g -G)"
  reconnect_with "header and data digests" -g -G
  # The target then answers each successful read with its C2HData alone (SUCCESS flag, no
  # response capsule), which the kernel completes from the data PDU.
  step "5b. disconnect, reconnect with SQ flow control disabled (--disable-sqflow)"
  reconnect_with "SQ flow control disabled" --disable-sqflow
fi

# ------------------------------------------------------------------ 6. namespace hot add/remove
if runs 6; then
  step "6a. host adds namespace 3 (nvmf_subsystem_add_ns) while connected"
  scans=$(dmesg | grep -c 'rescanning namespaces')
  host add_ns
  D3=$(wait_ns 3 20) || { nvme list; fail "namespace 3 did not appear within 20 s (AEN / changed-ns log)"; }
  nvme list
  # The kernel rescans on the Namespace Attribute Changed event and logs it.
  [ "$(dmesg | grep -c 'rescanning namespaces')" -gt "$scans" ] ||
    bad "no 'rescanning namespaces' in dmesg: the namespace appeared without the AEN?"
  dd if="$D3" of=/dev/null bs=1M count=1 iflag=direct status=none || fail "read from new namespace $D3"
  roundtrip "$D3" 2
  ok "namespace 3 appeared as $D3 and works"
  step "6b. host removes namespace 3 (nvmf_subsystem_remove_ns)"
  host remove_ns
  for _ in $(seq 200); do [ -z "$(ns_dev 3)" ] && break; sleep 0.1; done
  [ -z "$(ns_dev 3)" ] || { nvme list; fail "namespace 3 still present 20 s after removal"; }
  nvme list
  [ -n "$(ns_dev 1)" ] && [ -n "$(ns_dev 2)" ] || fail "namespaces 1 and 2 went with namespace 3"
  ok "namespace 3 disappeared; 1 and 2 remain"
fi

# ------------------------------------------------------------------ 7. multipath + ANA
if runs 7; then
  step "7. native multipath: second path through port $PORT2"
  nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
  wait_no_ctrl || fail "controllers still present after disconnect"
  nvme connect $A -s "$PORT" -n "$NQN" || fail "nvme connect (path 1)"
  nvme connect $A -s "$PORT2" -n "$NQN" || fail "nvme connect (path 2, port $PORT2)"
  D1=$(wait_ns 1) || fail "namespace 1 did not appear (multipath)"
  for _ in $(seq 50); do C1=$(ctrl_of "$PORT"); C2=$(ctrl_of "$PORT2"); [ -n "$C1" ] && [ -n "$C2" ] && break; sleep 0.1; done
  [ -n "$C1" ] && [ -n "$C2" ] || fail "controllers for both ports not found ($C1, $C2)"
  ls=$(nvme list-subsys); echo "$ls"
  [ "$(echo "$ls" | grep -c "tcp traddr=10.0.2.2")" = 2 ] || fail "list-subsys does not show two paths"
  [ "$(ls /sys/block | grep -c '^nvme[0-9]*n[0-9]*$')" = 2 ] || fail "expected 2 namespace heads, got: $(ls /sys/block | grep nvme)"
  echo "iopolicy: $(cat /sys/class/nvme-subsystem/*/iopolicy | head -1)"
  # path_state CTRL: the ANA state of CTRL's path to nsid 1.
  path_state() { local p; for p in /sys/class/nvme/$1/nvme*c*n*; do [ "$(cat $p/nsid)" = 1 ] && cat $p/ana_state; done; }
  path_reads() { local p; for p in /sys/class/nvme/$1/nvme*c*n*; do [ "$(cat $p/nsid)" = 1 ] && awk '{print $1}' $p/stat; done; }
  echo "paths: $C1 (port $PORT) $(path_state $C1), $C2 (port $PORT2) $(path_state $C2)"
  if [ "$ANA" = 1 ]; then
    [ "$(path_state $C1)" = optimized ] && [ "$(path_state $C2)" = optimized ] || fail "paths are not both optimized"
  fi
  dd if=/dev/urandom of=/tmp/src bs=1M count=8 status=none
  dd if=/tmp/src of="$D1" bs=1M oflag=direct status=none || fail "dd write to $D1"
  want_md5=$(md5sum </tmp/src | cut -d' ' -f1)
  rm -f /tmp/stop /tmp/ioerr /tmp/reads
  ( while [ ! -f /tmp/stop ]; do
      dd if="$D1" of=/tmp/rd bs=1M count=8 iflag=direct status=none || { echo "dd read error"; echo read >>/tmp/ioerr; }
      m=$(md5sum </tmp/rd | cut -d' ' -f1)
      [ "$m" = "$want_md5" ] || { echo "dd read: md5 $m, expected $want_md5"; echo md5 >>/tmp/ioerr; }
      echo >>/tmp/reads
    done ) &
  RL=$!
  # flip P STATE CTRL: the host sets listener P's ANA state; wait until the guest's path sees it.
  flip() {
    host ana "$1" "$2"
    local s
    for _ in $(seq 100); do s=$(path_state "$3"); [ "$s" = "$2" ] && break; sleep 0.1; done
    [ "$s" = "$2" ] || fail "path $3 (port $1) shows ANA state '$s' 10 s after the host set '$2'"
    sleep 1
    echo "  port $1 -> $2: $C1 $(path_state $C1) ($(path_reads $C1) reads), $C2 $(path_state $C2) ($(path_reads $C2) reads); loop reads $(wc -l </tmp/reads 2>/dev/null)"
  }
  [ "$ANA" = 1 ] || { echo "(ANA reporting off: no flips, the loop reads for 5 s)"; sleep 5; }
  for round in $([ "$ANA" = 1 ] && echo 1 2); do
    step "7. ANA flip round $round (dd read loop running)"
    flip "$PORT" inaccessible "$C1"
    flip "$PORT" optimized "$C1"
    flip "$PORT2" inaccessible "$C2"
    flip "$PORT2" optimized "$C2"
  done
  touch /tmp/stop; wait $RL
  n=$(wc -l </tmp/reads 2>/dev/null || echo 0)
  [ ! -s /tmp/ioerr ] || fail "read loop saw errors: $(sort /tmp/ioerr | uniq -c | tr '\n' ' ')"
  [ "$n" -ge 4 ] || fail "read loop completed only $n reads"
  ok "multipath: $n x 8 MiB reads across ANA flips, no I/O error, data intact"
fi

step "disconnect"
nvme disconnect -n "$NQN" || fail "final nvme disconnect"
wait_no_ctrl || fail "controllers still present after final disconnect"
echo "--- dmesg (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error' | tail -n 40
kerr=$(dmesg | grep -iE 'nvme|blk_|Buffer I/O|I/O error' |
  grep -E 'I/O error|blk_update_request|Buffer I/O|timeout|reset|[Ii]nvalid|[Ff]ail|error' || true)
[ -z "$kerr" ] || bad "kernel reported errors: $kerr"
# ------------------------------------------------------------------ 8. daemon restart
# After the kernel-log check: a restart is meant to make the kernel recover (and log it).
if runs 8; then
  step "8. the daemon is killed and restarted while the host is connected"
  nvme connect $A -s "$PORT" -n "$NQN" --reconnect-delay=1 --ctrl-loss-tmo=60 || fail "nvme connect (restart step)"
  D1=$(wait_ns 1) || fail "namespace 1 did not appear (restart step)"
  dd if=/dev/urandom of=/tmp/src bs=1M count=4 status=none
  dd if=/tmp/src of="$D1" bs=1M oflag=direct status=none || fail "dd write before the restart"
  host restart
  # The daemon came back empty (malloc): this write waits in the kernel until the controller
  # is back, then goes through; the read must return it.
  dd if=/dev/urandom of=/tmp/src2 bs=1M count=4 status=none
  timeout 90 dd if=/tmp/src2 of="$D1" bs=1M oflag=direct status=none || fail "dd write after the restart"
  timeout 30 dd if="$D1" of=/tmp/rd bs=1M count=4 iflag=direct status=none || fail "dd read after the restart"
  cmp -s /tmp/src2 /tmp/rd || fail "data read after the restart differs from what was written"
  dmesg | grep -iE 'reconnect' | tail -n 5
  dmesg | grep -qiE 'Successfully reconnected' || fail "the kernel did not report a reconnection"
  ok "the kernel reconnected after the restart; write and read back match"
  nvme disconnect -n "$NQN" || fail "nvme disconnect after the restart"
  wait_no_ctrl || fail "controllers still present after disconnect (restart step)"
fi
# ------------------------------------------------------------------ 9. lvols: read-only, no space
# After the kernel-log check too: a write that runs out of space is logged by the kernel.
if runs 9; then
  step "9. a thin lvol and its snapshot: the snapshot's disk is read-only, a full lvstore is ENOSPC"
  nvme connect $A -s "$PORT" -n "$NQN" || fail "nvme connect (lvol step)"
  host lvol
  D4=$(wait_ns 4 20) || fail "the thin lvol's namespace 4 did not appear"
  dd if=/dev/urandom of=/tmp/src bs=64k count=1 status=none
  dd if=/tmp/src of="$D4" bs=64k oflag=direct status=none || fail "dd write to the thin lvol $D4"
  host snap
  D5=$(wait_ns 5 20) || fail "the snapshot's namespace 5 did not appear"
  ro=$(cat "/sys/block/${D5#/dev/}/ro")
  [ "$ro" = 1 ] || bad "the snapshot's disk $D5 is not read-only (ro=$ro): NSATTR write-protected not honoured"
  dd if="$D5" of=/tmp/dst bs=64k count=1 iflag=direct status=none || fail "dd read of the snapshot $D5"
  cmp -s /tmp/src /tmp/dst || fail "the snapshot does not hold what was written before it"
  if dd if=/dev/zero of="$D5" bs=4k count=1 oflag=direct status=none 2>/dev/null; then
    bad "a write to the snapshot's disk $D5 succeeded"
  fi
  # One 4 KiB write into each MiB of the lvol: each needs a cluster, and the lvstore has fewer.
  nospc=
  for m in 0 1 2 3 4 5 6 7; do
    if ! dd if=/dev/urandom of="$D4" bs=4k count=1 seek=$((m * 256)) oflag=direct status=none 2>/tmp/err; then
      grep -q "No space left on device" /tmp/err || fail "write into MiB $m of $D4: $(cat /tmp/err)"
      nospc=$m
      break
    fi
  done
  [ -n "$nospc" ] || fail "every write into the 8 MiB thin lvol found a cluster on an lvstore of fewer"
  dd if="$D5" of=/tmp/dst bs=64k count=1 iflag=direct status=none || fail "dd read of the snapshot after"
  cmp -s /tmp/src /tmp/dst || fail "the snapshot changed"
  ok "snapshot $D5 read-only (ro=1) and intact; the write into MiB $nospc of $D4 failed with ENOSPC"
  # The lvol made read-only while connected: a namespace attribute notice, the kernel rescans
  # and makes the disk read-only; what it held reads back.
  dd if="$D4" of=/tmp/before bs=64k count=1 iflag=direct status=none || fail "dd read of $D4"
  host ro
  ro=0
  for _ in $(seq 100); do
    ro=$(cat "/sys/block/${D4#/dev/}/ro")
    [ "$ro" = 1 ] && break
    sleep 0.1
  done
  if [ "$ro" = 1 ]; then
    if dd if=/dev/zero of="$D4" bs=4k count=1 oflag=direct status=none 2>/dev/null; then
      bad "a write to $D4 succeeded after bdev_lvol_set_read_only"
    fi
    dd if="$D4" of=/tmp/dst bs=64k count=1 iflag=direct status=none || fail "dd read of $D4 after set_read_only"
    cmp -s /tmp/before /tmp/dst || fail "$D4 changed when made read-only"
    ok "bdev_lvol_set_read_only while connected: $D4 turned read-only (ro=1) within 10 s and reads back"
  else
    bad "$D4 still writable (ro=$ro) 10 s after bdev_lvol_set_read_only: no namespace attribute notice?"
  fi
  nvme disconnect -n "$NQN" || fail "nvme disconnect after the lvol step"
  wait_no_ctrl || fail "controllers still present after disconnect (lvol step)"
fi
# ------------------------------------------------------------------ 10. reset during fio verify
# After the kernel-log check: a reset is logged by the kernel.
if runs 10; then
  step "10. nvme reset while fio verify runs"
  nvme connect $A -s "$PORT" -n "$NQN" || fail "nvme connect (reset step)"
  D1=$(wait_ns 1) || fail "namespace 1 did not appear (reset step)"
  C=$(ctrl_of "$PORT"); [ -n "$C" ] || fail "no controller for port $PORT (reset step)"
  fio --name=reset --filename="$D1" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --numjobs=2 --size=8M --offset_increment=8M --verify=crc32c \
    --verify_fatal=1 --do_verify=1 --group_reporting --eta=never --output=/tmp/fio.out &
  FIO=$!
  sleep 2
  kill -0 $FIO 2>/dev/null || bad "fio ended before the reset (the reset raced nothing)"
  resets=$(dmesg | grep -c 'resetting controller')
  ioerrs=$(dmesg | grep -cE 'I/O error|blk_update_request|Buffer I/O')
  nvme reset /dev/$C || fail "nvme reset /dev/$C"
  wait $FIO
  rc=$?
  grep -E 'err=|write:|read:|verify|IOPS' /tmp/fio.out | head -12
  [ $rc = 0 ] || { cat /tmp/fio.out; fail "fio across the reset exited $rc"; }
  grep -q ' err= 0' /tmp/fio.out || { cat /tmp/fio.out; fail "fio across the reset reported errors"; }
  [ "$(dmesg | grep -c 'resetting controller')" -gt "$resets" ] || bad "no 'resetting controller' in dmesg"
  [ "$(cat /sys/class/nvme/$C/state)" = live ] || fail "controller $C is $(cat /sys/class/nvme/$C/state) after the reset"
  [ "$(ls -d /sys/class/nvme/$C/nvme*c*n* 2>/dev/null | wc -l)" -ge 2 ] || bad "namespaces missing after the reset"
  host qpairs
  roundtrip "$D1" 4
  [ "$(dmesg | grep -cE 'I/O error|blk_update_request|Buffer I/O')" = "$ioerrs" ] ||
    bad "the kernel reported I/O errors across the reset: $(dmesg | grep -E 'I/O error|blk_update_request|Buffer I/O' | tail -n 3)"
  ok "nvme reset during fio verify: no error, the controller is live and I/O works"
  nvme disconnect -n "$NQN" || fail "nvme disconnect (reset step)"
  wait_no_ctrl || fail "controllers still present after disconnect (reset step)"
fi
# ------------------------------------------------------------------ 11. remove_host rounds
if runs 11; then
  HN=$(cat /etc/nvme/hostnqn)
  step "11. $HN removed from $NQN2 and added back, $RMHOST_ROUNDS times, while the kernel reconnects"
  host add_host "$HN"
  nvme connect $A -s "$PORT" -n "$NQN2" --reconnect-delay=1 --ctrl-loss-tmo=600 || fail "nvme connect $NQN2"
  D=$(wait_ns 1) || fail "the namespace of $NQN2 did not appear"
  C2=
  for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn")" = "$NQN2" ] && C2=${c##*/}; done
  [ -n "$C2" ] || fail "no controller of $NQN2"
  dd if=/dev/urandom of=/tmp/src bs=4k count=1 status=none
  dd if=/tmp/src of="$D" bs=4k oflag=direct status=none || fail "dd write to $D"
  for round in $(seq "$RMHOST_ROUNDS"); do
    # The host waits until the target lists no controller of NQN2 (fails the request if not).
    host remove_host "$HN"
    host add_host "$HN"
    for _ in $(seq 300); do [ "$(cat /sys/class/nvme/$C2/state)" = live ] && break; sleep 0.1; done
    st=$(cat /sys/class/nvme/$C2/state)
    [ "$st" = live ] || fail "round $round: $C2 is $st 30 s after the host was added back"
    dd if="$D" of=/tmp/dst bs=4k count=1 iflag=direct status=none || fail "round $round: dd read from $D"
    cmp -s /tmp/src /tmp/dst || fail "round $round: $D reads back other data"
    [ $((round % 10)) = 0 ] && echo "  round $round: no controller left after the removal; reconnected; data intact"
  done
  ok "$RMHOST_ROUNDS removals: no controller left after each, the kernel reconnected after each"
  nvme disconnect -n "$NQN2" || fail "nvme disconnect $NQN2"
  wait_no_ctrl || fail "controllers still present after disconnect (remove_host step)"
fi
# ------------------------------------------------------------------ 12. reservations
# Two hosts (two host NQNs and host IDs) on NQN3's one namespace. Each controller needs its own
# disk, so nvme-core is reloaded without native multipath (which would merge both paths into
# one disk and pick the path itself).
if runs 12; then
  step "12. reservations: two hosts on $NQN3, nvme resv-register/acquire/report/release"
  nvme disconnect-all >/dev/null 2>&1
  wait_no_ctrl || fail "controllers left before the reservation step"
  modprobe -r nvme-tcp nvme-fabrics nvme nvme-core 2>/dev/null
  modprobe nvme-core multipath=N && modprobe nvme-tcp || fail "reload nvme-core with multipath=N"
  [ "$(cat /sys/module/nvme_core/parameters/multipath)" = N ] || fail "nvme-core multipath is still on"
  ID1=11111111-1111-4111-8111-111111111111 ID2=22222222-2222-4222-8222-222222222222
  H1=nqn.2014-08.org.nvmexpress:uuid:$ID1 H2=nqn.2014-08.org.nvmexpress:uuid:$ID2
  nvme connect $A -s "$PORT" -n "$NQN3" --hostnqn="$H1" --hostid="$ID1" || fail "nvme connect as host 1"
  # Debian's nvme-cli (2.4) answers "already connected" to a second connection to the same
  # port and subsystem, whatever the host NQN; the kernel takes it through /dev/nvme-fabrics.
  nvme connect $A -s "$PORT" -n "$NQN3" --hostnqn="$H2" --hostid="$ID2" --duplicate-connect ||
    echo "transport=tcp,traddr=10.0.2.2,trsvcid=$PORT,nqn=$NQN3,hostnqn=$H2,hostid=$ID2,duplicate_connect" \
      >/dev/nvme-fabrics || fail "connect as host 2"
  # disk_of HOSTNQN: the disk of NQN3's namespace through that host's controller.
  disk_of() {
    local c d
    for c in /sys/class/nvme/nvme*; do
      [ "$(cat "$c/subsysnqn")" = "$NQN3" ] && [ "$(cat "$c/hostnqn")" = "$1" ] || continue
      for d in "$c"/nvme*n1; do [ -e "$d" ] && [ -b "/dev/${d##*/}" ] && echo "/dev/${d##*/}"; done
    done
  }
  for _ in $(seq 100); do DA=$(disk_of "$H1"); DB=$(disk_of "$H2"); [ -n "$DA" ] && [ -n "$DB" ] && break; sleep 0.1; done
  [ -n "$DA" ] && [ -n "$DB" ] && [ "$DA" != "$DB" ] || { nvme list; fail "no disk per host ('$DA', '$DB')"; }
  echo "host 1: $DA, host 2: $DB"
  nvme id-ns "$DA" | grep -E '^rescap' || bad "id-ns shows no rescap"
  for i in 0 1 2 3; do dd if=/dev/urandom of=/tmp/r$i bs=4k count=16 status=none; done
  dd if=/tmp/r0 of="$DB" bs=4k oflag=direct status=none || fail "host 2 writes before any reservation"
  nvme resv-register "$DA" -n 1 --nrkey=0xa1 --rrega=0 || fail "nvme resv-register (host 1)"
  nvme resv-register "$DB" -n 1 --nrkey=0xb2 --rrega=0 || fail "nvme resv-register (host 2)"
  nvme resv-acquire "$DA" -n 1 --crkey=0xa1 --rtype=1 --racqa=0 || fail "nvme resv-acquire Write Exclusive (host 1)"
  if nvme resv-acquire "$DB" -n 1 --crkey=0xb2 --rtype=1 --racqa=0 2>/tmp/err; then
    bad "host 2 acquired what host 1 holds"
  else
    echo "host 2's acquire refused: $(cat /tmp/err)"
  fi
  rep=$(nvme resv-report "$DB" -n 1 --eds 2>&1 || nvme resv-report "$DB" -n 1 --cdw11=1 2>&1); echo "$rep"
  echo "$rep" | grep -qiE 'rtype *: *1' || bad "resv-report: the reservation type is not 1"
  echo "$rep" | grep -qiE 'regctl *: *2' || bad "resv-report: not 2 registrants"
  for id in $ID1 $ID2; do
    echo "$rep" | tr -d '-' | grep -qi "${id//-/}" || bad "resv-report does not show host ID $id"
  done
  if dd if=/tmp/r1 of="$DB" bs=4k oflag=direct status=none 2>/tmp/err; then
    bad "host 2's write succeeded under host 1's Write Exclusive"
  else
    ok "host 2's write refused: $(cat /tmp/err)"
  fi
  dd if="$DB" of=/tmp/rd bs=4k count=16 iflag=direct status=none || fail "host 2 reads under Write Exclusive"
  cmp -s /tmp/r0 /tmp/rd || fail "host 2 reads other data than it wrote (its refused write changed it?)"
  dd if=/tmp/r2 of="$DA" bs=4k oflag=direct status=none || fail "the holder's write"
  dd if="$DB" of=/tmp/rd bs=4k count=16 iflag=direct status=none || fail "host 2 reads the holder's write"
  cmp -s /tmp/r2 /tmp/rd || fail "host 2 does not read what the holder wrote"
  nvme resv-release "$DA" -n 1 --crkey=0xa1 --rtype=1 --rrela=0 || fail "nvme resv-release (host 1)"
  dd if=/tmp/r3 of="$DB" bs=4k oflag=direct status=none || fail "host 2 writes after the release"
  dd if="$DA" of=/tmp/rd bs=4k count=16 iflag=direct status=none || fail "host 1 reads host 2's write"
  cmp -s /tmp/r3 /tmp/rd || fail "host 1 does not read what host 2 wrote after the release"
  nvme resv-register "$DA" -n 1 --crkey=0xa1 --rrega=1 || bad "nvme resv-register unregister (host 1)"
  nvme resv-register "$DB" -n 1 --crkey=0xb2 --rrega=1 || bad "nvme resv-register unregister (host 2)"
  ok "reservations: host 2 refused while host 1 held Write Exclusive, reads intact, writes after the release"
  nvme disconnect -n "$NQN3" || fail "nvme disconnect $NQN3"
  wait_no_ctrl || fail "controllers still present after disconnect (reservation step)"
fi
if [ ${#FAILED[@]} != 0 ]; then
  printf 'FAIL: %s\n' "${FAILED[@]}"
  exit 1
fi
step "PASS: all guest checks"
