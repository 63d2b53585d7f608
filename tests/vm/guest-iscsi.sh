# Guest side of tests/vm/iscsi-guest.sh (runs as root in the QEMU guest, Debian's 6.1 kernel,
# open-iscsi 2.1). The host wrapper prepends PORT, BASE and the CHAP names and secrets. The
# kernel's initiator against Ferrite's iSCSI target at 10.0.2.2 (the host's 127.0.0.1):
#   1 SendTargets discovery: open; with one-way and mutual CHAP once the host requires it
#     (no CHAP and a wrong secret refused),
#   2 logins: no CHAP, one-way CHAP, mutual CHAP, and after iscsi_target_node_set_auth;
#     a login redirected (iscsi_target_node_set_redirect) to a private portal group;
#     refused: a wrong secret, a wrong target secret (mutual), an unknown user, no CHAP to a
#     CHAP node; no disk appears and the daemon keeps serving,
#   3 ext4 on the malloc LUN: random files, fstrim (UNMAP), sync, drop caches, logout/login,
#     fsck, remount, checksums; the host reads the LUN through libiscsi and compares the files,
#   4 on the file LUN, with CRC32C digests, fio verify across the link down (NOP-Out timeout),
#     a logout request, and the daemon killed and restarted; command timeouts aborted by the
#     kernel (ABORT TASK) and retried: the session recovers each time, no I/O error,
#   5 raw data written to the file LUN read back from its file on the host.
# Asks the host for RPCs through the shared folder (tests/vm/guest-lib.sh's `host`).
set -u
# shellcheck source=guest-lib.sh
. /host/guest-lib.sh
export LC_ALL=C
T0=$(cut -d' ' -f1 /proc/uptime)
since() { awk -v t0="$T0" '{printf "%.1f", $1 - t0}' /proc/uptime; }
step() { echo "=== [+$(since)s] $*"; }
ok() { echo "ok: [+$(since)s] $*"; }
fail() {
  echo "FAIL: $*"
  dmesg >/host/dmesg.txt 2>/dev/null
  echo "--- iscsiadm -m session -P 1"; iscsiadm -m session -P 1 2>&1 | head -40
  echo "--- dmesg (last 40 lines)"; dmesg | tail -n 40
  exit 1
}
P=10.0.2.2:$PORT
PLAIN=$BASE:plain CHAP=$BASE:chap MUTUAL=$BASE:mutual FILE=$BASE:file REDIR=$BASE:redir

modprobe crc32c_generic; modprobe iscsi_tcp || fail "modprobe iscsi_tcp"
modprobe sd_mod; modprobe ext4
iscsid || fail "iscsid did not start"
for _ in $(seq 50); do iscsiadm -m session >/dev/null 2>&1; [ $? = 21 ] && break; sleep 0.1; done
echo "initiator $(cat /etc/iscsi/initiatorname.iscsi)"

# disk_of IQN: the block device of the session to IQN, empty if none.
disk_of() {
  local s b
  for s in /sys/class/iscsi_session/session*; do
    [ "$(cat "$s/targetname" 2>/dev/null)" = "$1" ] || continue
    for b in "$s"/device/target*/*/block/*; do [ -e "$b" ] && echo "/dev/${b##*/}"; done
  done
}
# wait_disk IQN: waits up to 20 s for its disk; prints it.
wait_disk() {
  local d
  for _ in $(seq 200); do
    d=$(disk_of "$1"); [ -n "$d" ] && [ -b "$d" ] && { echo "$d"; return 0; }
    sleep 0.1
  done
  return 1
}
# setn IQN NAME VALUE: a setting of the node record of IQN at P.
setn() { iscsiadm -m node -T "$1" -p "$P" -o update -n "$2" -v "$3" || fail "iscsiadm update $1 $2"; }
# chap IQN [USER SECRET [MUSER MSECRET]]: the node's CHAP settings (none without USER), in
# one iscsiadm call (it takes several -n/-v pairs).
chap() {
  local n=node.session.auth
  if [ -z "${2:-}" ]; then
    setn "$1" $n.authmethod None
    return
  fi
  iscsiadm -m node -T "$1" -p "$P" -o update -n $n.authmethod -v CHAP -n $n.username -v "$2" \
    -n $n.password -v "$3" -n $n.username_in -v "${4:-}" -n $n.password_in -v "${5:-}" ||
    fail "iscsiadm update $1 CHAP settings"
}
login() { iscsiadm -m node -T "$1" -p "$P" --login >/tmp/login.out 2>&1; }
logout() {
  iscsiadm -m node -T "$1" -p "$P" --logout >/dev/null || fail "logout from $1"
  for _ in $(seq 100); do [ -z "$(disk_of "$1")" ] && return 0; sleep 0.1; done
  fail "the disk of $1 is still there after logout"
}
# refused IQN WHY: a login that must fail: no session, no disk.
refused() {
  if login "$1"; then
    fail "login to $1 with $2 succeeded: $(cat /tmp/login.out)"
  fi
  echo "  refused ($2): $(grep -m1 'iscsiadm:' /tmp/login.out)"
  iscsiadm -m session 2>/dev/null | grep -q " $1\$" && fail "a session to $1 exists after the refused login ($2)"
  [ -z "$(disk_of "$1")" ] || fail "a disk of $1 appeared after the refused login ($2)"
}
# alive [NODE]: the daemon runs and answers RPCs; sets CONNS to its connection count (to node
# NODE, its short name) and IDS to their ids. Not in $(...): `host` counts its requests here.
alive() {
  host alive "${1:-}"
  read -r CONNS IDS <"/host/out-$REQ"
}
# roundtrip DEV MIB [SEEK_MIB]: random data written with O_DIRECT, read back, compared.
roundtrip() {
  dd if=/dev/urandom of=/tmp/src bs=1M count="$2" status=none
  dd if=/tmp/src of="$1" bs=1M seek="${3:-0}" oflag=direct status=none || fail "dd write to $1"
  dd if="$1" of=/tmp/dst bs=1M skip="${3:-0}" count="$2" iflag=direct status=none || fail "dd read from $1"
  cmp /tmp/src /tmp/dst || fail "the data read back from $1 differs"
}
# discover [AUTH USER SECRET [MUSER MSECRET]]: SendTargets through a discovery record with
# those settings; the answer in /tmp/disc.out.
discover() {
  local n=discovery.sendtargets.auth
  iscsiadm -m discoverydb -t st -p "$P" -o delete >/dev/null 2>&1
  iscsiadm -m discoverydb -t st -p "$P" -o new >/dev/null || fail "iscsiadm discoverydb new"
  iscsiadm -m discoverydb -t st -p "$P" -o update -n $n.authmethod -v "${1:-None}" -n $n.username -v "${2:-}" \
    -n $n.password -v "${3:-}" -n $n.username_in -v "${4:-}" -n $n.password_in -v "${5:-}" ||
    fail "iscsiadm discoverydb update"
  iscsiadm -m discoverydb -t st -p "$P" --discover >/tmp/disc.out 2>&1
}
# lists_all: the discovery answer names every node, at the portal the target sees.
lists_all() {
  local t
  for t in "$PLAIN" "$CHAP" "$MUTUAL" "$FILE" "$REDIR"; do
    grep -q "^127.0.0.1:$PORT,1 $t\$" /tmp/disc.out || fail "discovery does not list $t at 127.0.0.1:$PORT,1: $(cat /tmp/disc.out)"
  done
}

# Which of steps 1-3 run (the host may narrow them for debugging; 4 and 5 always run).
runs() { case " ${STEPS:-1 2 3} " in *" $1 "*) return 0;; esac; return 1; }
for t in "$PLAIN" "$CHAP" "$MUTUAL" "$FILE" "$REDIR"; do
  iscsiadm -m node -o new -T "$t" -p "$P" >/dev/null || fail "iscsiadm node new $t"
done

# ------------------------------------------------------------------ 1. discovery
if runs 1; then
  step "1. SendTargets discovery at $P"
  discover || fail "discovery: $(cat /tmp/disc.out)"
  cat /tmp/disc.out
  lists_all
  grep -q ":$PORT2," /tmp/disc.out && fail "discovery lists the private portal group's portal: $(cat /tmp/disc.out)"
  ok "discovery without CHAP lists the 5 nodes (not the private portal group)"
  host disc_auth chap
  discover && fail "discovery without CHAP succeeded though the target requires CHAP"
  echo "  refused (no CHAP): $(tail -n 1 /tmp/disc.out)"
  discover CHAP "$DU" wrong-secret-0000 && fail "discovery with a wrong CHAP secret succeeded"
  echo "  refused (wrong secret): $(tail -n 1 /tmp/disc.out)"
  discover CHAP "$DU" "$DS" || fail "discovery with one-way CHAP: $(cat /tmp/disc.out)"
  lists_all
  ok "discovery CHAP required: refused without CHAP and with a wrong secret, one-way CHAP lists the nodes"
  host disc_auth mutual
  discover CHAP "$DU" "$DS" && fail "discovery without the mutual step succeeded though the target requires mutual CHAP"
  discover CHAP "$DU" "$DS" "$DMU" wrong-target-secret && fail "discovery accepted a target that does not know the mutual secret"
  discover CHAP "$DU" "$DS" "$DMU" "$DMS" || fail "discovery with mutual CHAP: $(cat /tmp/disc.out)"
  lists_all
  ok "discovery with mutual CHAP lists the nodes; refused without the mutual part and with a wrong target secret"
  host disc_auth none
  discover || fail "discovery after CHAP was turned off: $(cat /tmp/disc.out)"
  lists_all
  iscsiadm -m discoverydb -t st -p "$P" -o delete >/dev/null 2>&1
  ok "discovery open again"
fi

# ------------------------------------------------------------------ 2. logins
if runs 2; then
  step "2. logins: none, one-way CHAP, mutual CHAP, and refused ones"
  chap "$PLAIN"
  login "$PLAIN" || fail "login to $PLAIN: $(cat /tmp/login.out)"
  D=$(wait_disk "$PLAIN") || fail "no disk for $PLAIN"
  S=/sys/block/${D#/dev/}
  echo "$PLAIN: $D, $(cat "$S/size") sectors, $(cat "$S/queue/logical_block_size") B blocks, vendor '$(cat "$S/device/vendor")' model '$(cat "$S/device/model")'"
  [ "$(cat "$S/size")" = 131072 ] || fail "$D has $(cat "$S/size") sectors, expected 131072"
  grep -q FERRITE "$S/device/vendor" || fail "vendor '$(cat "$S/device/vendor")'"
  roundtrip "$D" 4
  ok "login without CHAP: $D, 4 MiB raw round trip"

  refused "$CHAP" "no CHAP"
  chap "$CHAP" "$U1" wrong-secret-0001
  refused "$CHAP" "a wrong secret"
  chap "$CHAP" nobody "$S1"
  refused "$CHAP" "an unknown user"
  alive plain
  [ "$CONNS" = 1 ] || fail "the daemon lists $CONNS connections to plain, expected 1"
  chap "$CHAP" "$U1" "$S1"
  login "$CHAP" || fail "login to $CHAP with one-way CHAP: $(cat /tmp/login.out)"
  DC=$(wait_disk "$CHAP") || fail "no disk for $CHAP"
  roundtrip "$DC" 2
  logout "$CHAP"
  ok "one-way CHAP: $DC, 2 MiB raw round trip; refused without CHAP, with a wrong secret, an unknown user"
  # The node turned mutual while the daemon runs (auth group 1 has guest2's mutual secret).
  host set_auth chap mutual
  refused "$CHAP" "one-way CHAP after iscsi_target_node_set_auth made it mutual"
  chap "$CHAP" "$U2" "$S2" "$MU" "$MS"
  login "$CHAP" || fail "login to $CHAP with mutual CHAP after set_auth: $(cat /tmp/login.out)"
  DC=$(wait_disk "$CHAP") || fail "no disk for $CHAP (mutual)"
  logout "$CHAP"
  host set_auth chap oneway
  chap "$CHAP" "$U1" "$S1"
  login "$CHAP" || fail "login to $CHAP with one-way CHAP after set_auth back: $(cat /tmp/login.out)"
  logout "$CHAP"
  ok "iscsi_target_node_set_auth: mutual required (one-way refused, mutual logs in), then one-way again"

  chap "$MUTUAL" "$U2" "$S2"
  refused "$MUTUAL" "one-way CHAP to a mutual node"
  chap "$MUTUAL" "$U2" wrong-secret-0002 "$MU" "$MS"
  refused "$MUTUAL" "a wrong initiator secret"
  chap "$MUTUAL" "$U2" "$S2" "$MU" wrong-target-secret
  refused "$MUTUAL" "a wrong target secret"
  chap "$MUTUAL" "$U2" "$S2" "$MU" "$MS"
  login "$MUTUAL" || fail "login to $MUTUAL with mutual CHAP: $(cat /tmp/login.out)"
  DM=$(wait_disk "$MUTUAL") || fail "no disk for $MUTUAL"
  [ "$(cat "/sys/block/${DM#/dev/}/queue/logical_block_size")" = 4096 ] || fail "$DM: not 4096-byte blocks"
  roundtrip "$DM" 2 1
  logout "$MUTUAL"
  alive mutual
  [ "$CONNS" = 0 ] || fail "the daemon lists $CONNS connections to mutual after logout"
  ok "mutual CHAP: $DM (4 KiB blocks), 2 MiB raw round trip; refused: one-way, wrong initiator and target secrets; the daemon serves"
  # Login redirection: the target answers "moved temporarily" with 10.0.2.2:PORT2, the
  # initiator logs in there; the session keeps PORT as its persistent portal.
  host redirect
  chap "$REDIR"
  login "$REDIR" || fail "login to $REDIR (redirected): $(cat /tmp/login.out)"
  DR=$(wait_disk "$REDIR") || fail "no disk for $REDIR"
  iscsiadm -m session -P 1 | sed -n "/Target: ${REDIR//./\\.} /,/SID:/p" >/tmp/redir.out
  grep -q "Current Portal: 10.0.2.2:$PORT2," /tmp/redir.out &&
    grep -q "Persistent Portal: 10.0.2.2:$PORT," /tmp/redir.out || fail "redirected session's portals: $(cat /tmp/redir.out)"
  roundtrip "$DR" 1
  logout "$REDIR"
  ok "login redirection: $PORT -> $PORT2 (current portal $PORT2, persistent $PORT), 1 MiB raw round trip"
  runs 3 || { logout "$PLAIN"; D=; }
fi

# ------------------------------------------------------------------ 3. ext4
if runs 3; then
  step "3. ext4 on $PLAIN: files, sync, drop caches, logout/login, fsck, remount, compare"
  if [ -z "${D:-}" ]; then
    chap "$PLAIN"
    login "$PLAIN" || fail "login to $PLAIN: $(cat /tmp/login.out)"
    D=$(wait_disk "$PLAIN") || fail "no disk for $PLAIN"
  fi
  mkfs.ext4 -q -F -b 4096 "$D" || fail "mkfs.ext4 $D"
  mkdir -p /mnt/p && mount "$D" /mnt/p || fail "mount $D"
  mkdir -p /mnt/p/dir/sub
  dd if=/dev/urandom of=/mnt/p/big bs=1M count=6 status=none || fail "write big"
  dd if=/dev/urandom of=/mnt/p/dir/mid bs=1M count=3 status=none || fail "write dir/mid"
  dd if=/dev/urandom of=/mnt/p/dir/sub/odd bs=4097 count=77 status=none || fail "write dir/sub/odd"
  for i in $(seq 20); do head -c $((i * 1000 + 1)) /dev/urandom >/mnt/p/dir/s$i; done
  # A file removed and the free space trimmed (UNMAP): the others stay.
  head -c 2M /dev/urandom >/mnt/p/gone && sync && rm /mnt/p/gone
  pm=$(cat "/sys/block/${D#/dev/}/device/scsi_disk/"*/provisioning_mode)
  [ "$pm" = unmap ] || fail "$D: provisioning mode '$pm', expected unmap (a malloc LUN supports UNMAP)"
  fstrim -v /mnt/p >/tmp/trim.out || fail "fstrim: $(cat /tmp/trim.out)"
  grep -qE '\(([1-9][0-9]*) bytes\) trimmed' /tmp/trim.out || fail "fstrim trimmed nothing: $(cat /tmp/trim.out)"
  (cd /mnt/p && find . -type f | sort | sed 's|^\./||' | xargs md5sum) >/tmp/sums || fail "md5sum"
  sync || fail "sync"
  umount /mnt/p || fail "umount"
  echo 3 >/proc/sys/vm/drop_caches
  logout "$PLAIN"
  login "$PLAIN" || fail "login to $PLAIN again: $(cat /tmp/login.out)"
  D=$(wait_disk "$PLAIN") || fail "no disk for $PLAIN after the second login"
  e2fsck -fn "$D" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck -fn $D"; }
  mount "$D" /mnt/p || fail "mount $D again"
  (cd /mnt/p && md5sum -c --quiet /tmp/sums) || fail "files read back after remount differ"
  umount /mnt/p || fail "umount"
  logout "$PLAIN"
  awk '{print $1, "/" $2}' /tmp/sums >/host/plain.sums
  ok "ext4: $(wc -l </tmp/sums) files (9.5 MiB) equal after fstrim (UNMAP, $(sed 's/.*(\(.*\) bytes.*/\1/' /tmp/trim.out) bytes), drop caches, logout, login, fsck and remount"
  host verify_plain || { cat "/host/out-$REQ"; fail "the host read other files from the LUN"; }
  if grep -q '^SKIP' "/host/out-$REQ"; then
    echo "host check $(cat "/host/out-$REQ")"
  else
    ok "the host read the LUN through libiscsi: the $(wc -l <"/host/out-$REQ") files' checksums match"
  fi
fi

# ------------------------------------------------------------------ 4. recoveries under fio
# session_state: the state of session SID.
session_state() { iscsiadm -m session -r "$SID" -P 1 2>/dev/null | sed -n 's/.*iSCSI Session State: *//p'; }
# under_fio WHAT ERR CMD...: fio writes and verifies DF; 2 s in, CMD breaks the session (WHAT;
# ERR=1: the kernel logs a connection error); the session must come back (LOGGED_IN, the same
# disk) and fio end without an error.
under_fio() {
  local what=$1 err=$2 errs0 conns0 rc T st
  shift 2
  errs0=$(dmesg | grep -cE 'I/O error|blk_update_request|Buffer I/O')
  conns0=$(dmesg | grep -c 'detected conn error')
  fio --name=r --filename="$DF" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
    --size=32M --time_based --runtime="${RUNTIME:-7}" --verify=crc32c --verify_fatal=1 --do_verify=1 \
    --verify_backlog=64 --output-format=terse --terse-version=3 >/tmp/fio.r 2>/tmp/fio.err &
  FIO=$!
  sleep 2
  kill -0 $FIO 2>/dev/null || { cat /tmp/fio.err; fail "fio ended before $what"; }
  "$@"
  local t1
  t1=$(awk '{print int($1) + 60}' /proc/uptime)
  while [ "$(awk '{print int($1)}' /proc/uptime)" -lt "$t1" ]; do
    st=$(session_state)
    [ "$st" = LOGGED_IN ] && { [ "$err" = 0 ] || [ "$(dmesg | grep -c 'detected conn error')" -gt "$conns0" ]; } && break
    sleep 0.2
  done
  [ "$st" = LOGGED_IN ] || fail "session $SID is '$st' 60 s after $what"
  wait $FIO; rc=$?
  T=$(grep '^3;' /tmp/fio.r)
  # Terse v3: 5 error, 6 KiB read (verification), 47 KiB written.
  local wkb rkb
  wkb=$(echo "$T" | cut -d';' -f47) rkb=$(echo "$T" | cut -d';' -f6)
  echo "  fio across $what: rc=$rc errors=$(echo "$T" | cut -d';' -f5) written=${wkb} KiB verified=${rkb} KiB"
  [ "$rc" = 0 ] || { cat /tmp/fio.err /tmp/fio.r; fail "fio failed across $what"; }
  [ "$(echo "$T" | cut -d';' -f5)" = 0 ] || fail "fio reported errors across $what"
  [ "${wkb:-0}" -gt 0 ] && [ "${rkb:-0}" -gt 0 ] || fail "fio wrote $wkb KiB and verified $rkb KiB across $what"
  [ "$err" = 0 ] || [ "$(dmesg | grep -c 'detected conn error')" -gt "$conns0" ] || fail "no connection error in dmesg: $what was not seen"
  [ "$(dmesg | grep -cE 'I/O error|blk_update_request|Buffer I/O')" = "$errs0" ] ||
    fail "the kernel logged I/O errors across $what: $(dmesg | grep -E 'I/O error|blk_update_request|Buffer I/O' | tail -n 3)"
  [ "$(session_state)" = LOGGED_IN ] || fail "session $SID is '$(session_state)' after fio"
  [ "$(disk_of "$FILE")" = "$DF" ] || fail "the disk of $FILE changed: '$(disk_of "$FILE")'"
}
# link_flap: the guest's network goes down for 6 s: the kernel's NOP-Outs go unanswered (2 s
# interval, 2 s timeout on this node), it drops the connection and logs in again once the link
# is back, while the target may still hold the old connection (then the new login reinstates
# the session: same initiator name and ISID).
NIC=$(ip -o link | awk -F': ' '$2 != "lo" {print $2; exit}')
link_flap() {
  ip link set "$NIC" down || fail "ip link set $NIC down"
  sleep 6
  ip link set "$NIC" up || fail "ip link set $NIC up"
  ip route replace default via 10.0.2.2 dev "$NIC" 2>/dev/null
}
step "4. recoveries on $FILE: the link down, a logout request, command timeouts, the daemon killed and restarted"
setn "$FILE" node.session.timeo.replacement_timeout 60
setn "$FILE" "node.conn[0].timeo.noop_out_interval" 2
setn "$FILE" "node.conn[0].timeo.noop_out_timeout" 2
setn "$FILE" "node.conn[0].iscsi.HeaderDigest" CRC32C
setn "$FILE" "node.conn[0].iscsi.DataDigest" CRC32C
chap "$FILE"
login "$FILE" || fail "login to $FILE: $(cat /tmp/login.out)"
DF=$(wait_disk "$FILE") || fail "no disk for $FILE"
SID=$(iscsiadm -m session | awk -v t="$FILE" '$4 == t {gsub(/[][]/, "", $2); print $2}')
iscsiadm -m session -r "$SID" -P 2 >/tmp/p2 || fail "iscsiadm -m session -r $SID -P 2"
grep -qE 'HeaderDigest: CRC32C' /tmp/p2 && grep -qE 'DataDigest: CRC32C' /tmp/p2 ||
  fail "digests not negotiated: $(grep -E 'Digest' /tmp/p2)"
echo "$FILE: $DF, session $SID, $(grep -E 'HeaderDigest|DataDigest' /tmp/p2 | tr -s '\t\n' '  ')"
alive file; ids0=$IDS
RUNTIME=14 under_fio "the link down for 6 s" 1 link_flap
alive file; ids1=$IDS
[ "$CONNS" = 1 ] && [ "$ids1" != "$ids0" ] || fail "the target lists connections '$IDS' to file after the link came back (before: '$ids0')"
ok "the link down for 6 s: NOP-Out timeout, the session came back (target connection $ids0 -> $ids1), fio verify ended without an error"
under_fio "a logout request (iscsi_target_node_request_logout)" 0 host request_logout
alive file; ids2=$IDS
[ "$CONNS" = 1 ] && [ "$ids2" != "$ids1" ] || fail "the target lists connections '$IDS' to file after the logout request (before: '$ids1')"
ok "a logout request: the initiator logged out and in again (connection $ids1 -> $ids2), fio verify ended without an error"
# A command that would take 20 s against the disk's 2 s timeout: after a timeout or two (the
# kernel asks for more time while the command moved data, then pings with a NOP-Out) the
# kernel's error handler aborts it (ABORT TASK, 15 s to answer), the target ends it (the delay
# bdev completes it as aborted) and answers, the SCSI layer retries it; no reconnect.
S=/sys/block/${DF#/dev/}/device
tmo0=$(cat "$S/timeout")
echo 2 >"$S/timeout" || fail "set the command timeout of $DF"
iotmo0=$(printf '%d' "$(cat "$S/iotmo_cnt")")
conns0=$(dmesg | grep -c 'detected conn error')
# conn_stat NAME: a counter of the session's connection (iscsiadm -s).
conn_stat() { iscsiadm -m session -r "$SID" -s | awk -v k="$1:" '$1 == k {print $2}'; }
tmf0=$(conn_stat tmfcmd_pdus) tmfr0=$(conn_stat tmfrsp_pdus)
dd if=/dev/urandom of=/tmp/src bs=64k count=16 status=none
host latency 20000000
dd if=/tmp/src of="$DF" bs=64k seek=100 oflag=direct status=none 2>/tmp/dd.err &
DD=$!
sleep 1
host latency 10000
wait $DD || fail "a write whose command timed out failed: $(cat /tmp/dd.err)"
echo "$tmo0" >"$S/timeout"
iotmo=$(printf '%d' "$(cat "$S/iotmo_cnt")")
[ "$iotmo" -gt "$iotmo0" ] || fail "no command of $DF timed out (iotmo_cnt $iotmo0 -> $iotmo): the abort path was not taken"
dd if="$DF" of=/tmp/dst bs=64k skip=100 count=16 iflag=direct status=none || fail "dd read after the aborts"
cmp -s /tmp/src /tmp/dst || fail "the data written across the aborts reads back different"
[ "$(dmesg | grep -c 'detected conn error')" = "$conns0" ] || fail "the session was dropped: the aborts were not answered"
alive file
[ "$CONNS" = 1 ] && [ "$IDS" = "$ids2" ] || fail "the target lists connections '$IDS' to file after the aborts (before: '$ids2')"
[ "$(session_state)" = LOGGED_IN ] || fail "session $SID is '$(session_state)' after the aborts"
tmf=$(conn_stat tmfcmd_pdus) tmfr=$(conn_stat tmfrsp_pdus)
[ "$tmf" -gt "$tmf0" ] && [ "$((tmfr - tmfr0))" = "$((tmf - tmf0))" ] ||
  fail "task management: $((tmf - tmf0)) requests sent, $((tmfr - tmfr0)) answered"
ok "$((iotmo - iotmo0)) command timeout(s) of 2 s: $((tmf - tmf0)) task management request(s) answered, commands retried on the same connection, data intact"
under_fio "the daemon's kill -9 and restart" 1 host restart
alive file
[ "$CONNS" = 1 ] || fail "the restarted daemon lists $CONNS connections to file"
ok "the daemon killed and restarted: the session recovered, fio verify ended without an error"

# ------------------------------------------------------------------ 5. the file seen by the host
step "5. raw data written to $DF read back from the LUN's file on the host"
roundtrip "$DF" 8 40
sum=$(md5sum </tmp/src | cut -d' ' -f1)
logout "$FILE"
host verify_file 40 8 "$sum" || { cat "/host/out-$REQ"; fail "the file on the host holds other data"; }
cat "/host/out-$REQ"
alive
[ "$CONNS" = 0 ] || fail "the daemon lists $CONNS connections after every logout"
iscsiadm -m session >/dev/null 2>&1 && fail "sessions left: $(iscsiadm -m session)"
ok "8 MiB at 40 MiB of $FILE equal on the host; no session or connection left"
dmesg >/host/dmesg.txt
step "PASS: all guest checks"
