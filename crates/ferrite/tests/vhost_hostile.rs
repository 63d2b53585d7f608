//! The vhost-user-blk target against hostile and buggy front ends, over the daemon's real
//! controller sockets. A raw front end written here sends what no real one would (garbage,
//! cut messages, bad rings and memory tables); the `vhost` crate's front end, with guest memory
//! a memfd shared with the daemon and a split-ring driver written here, sets up a correct
//! session and then puts malformed descriptor chains on its ring. After each case the daemon
//! must still be running, must have logged the refusal, must have dropped the connection or
//! failed the request, and a correct session on the same controller and on a second controller
//! must write a block and read it back.

mod common;

use common::{Daemon, TempDir};
use serde_json::json;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

/// Each controller's bdev: 1024 blocks of 4 KiB.
const BLOCK: usize = 4096;
const BLOCKS: u64 = 1024;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const F_VERSION_1: u64 = 1 << 32;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const F_INDIRECT_DESC: u64 = 1 << 28;

/// Descriptor flags.
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

/// Guest memory: 4 MiB at guest-physical 0, laid out as below.
const MEM_LEN: u64 = 4 << 20;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const HDR: u64 = 0x4000;
const STATUS: u64 = 0x5000;
const TABLE: u64 = 0x1_0000;
const DATA: u64 = 0x10_0000;

/// How long a refused connection may take to be closed (the daemon's MSG_TIMEOUT is 1 s).
const CLOSE: Duration = Duration::from_secs(3);
/// How long a request may take.
const IO: Duration = Duration::from_secs(5);

/// Guest memory: a memfd mapped here, shared with the daemon as one region.
struct Guest {
    file: File,
    ptr: *mut u8,
}

impl Guest {
    fn new() -> Guest {
        let file = memfd(MEM_LEN);
        // SAFETY: a shared mapping of the whole memfd, unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_LEN as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Guest { file, ptr: ptr.cast() }
    }

    /// The front end's virtual address of `gpa`.
    fn va(&self, gpa: u64) -> u64 {
        self.ptr as u64 + gpa
    }

    fn write(&self, gpa: u64, b: &[u8]) {
        assert!(gpa + b.len() as u64 <= MEM_LEN);
        // SAFETY: inside the mapping (checked).
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.add(gpa as usize), b.len()) };
    }

    fn read(&self, gpa: u64, n: usize) -> Vec<u8> {
        assert!(gpa + n as u64 <= MEM_LEN);
        let mut v = vec![0u8; n];
        // SAFETY: inside the mapping (checked).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(gpa as usize), v.as_mut_ptr(), n) };
        v
    }

    fn w16(&self, gpa: u64, v: u16) {
        assert!(gpa.is_multiple_of(2) && gpa + 2 <= MEM_LEN);
        // SAFETY: aligned, inside the mapping; shared with the daemon, hence volatile.
        unsafe { std::ptr::write_volatile(self.ptr.add(gpa as usize).cast::<u16>(), v.to_le()) };
    }

    fn r16(&self, gpa: u64) -> u16 {
        assert!(gpa.is_multiple_of(2) && gpa + 2 <= MEM_LEN);
        // SAFETY: as in `w16`.
        u16::from_le(unsafe { std::ptr::read_volatile(self.ptr.add(gpa as usize).cast::<u16>()) })
    }

    fn r32(&self, gpa: u64) -> u32 {
        u32::from_le_bytes(self.read(gpa, 4).try_into().unwrap())
    }

    /// Descriptor `i` of the table at `table`.
    fn desc_at(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.write(table + i as u64 * 16, &d);
    }

    /// A virtio-blk request header at `at`.
    fn header(&self, at: u64, kind: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.write(at, &h);
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), MEM_LEN as usize) };
    }
}

fn memfd(len: u64) -> File {
    // SAFETY: a fresh memfd, owned by the File.
    let fd = unsafe { libc::memfd_create(c"vhost-hostile".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// A correct front end (the `vhost` crate's) with one queue of `size` entries on guest memory
/// of its own, and the driver's side of that split ring.
struct Fe {
    /// The connection: the session ends when it is dropped.
    conn: Frontend,
    /// Memory given to the daemon in place of `g` (see the ring cases), kept while it may map it.
    other: Option<Guest>,
    g: Guest,
    kick: EventFd,
    call: EventFd,
    size: u16,
    avail: u16,
    used_seen: u16,
}

impl Fe {
    /// Connects to `sock` and sets up queue 0 as QEMU would (REPLY_ACK on every message).
    fn open(sock: &Path, size: u16) -> Result<Fe, String> {
        let e = |what: &str| {
            let what = what.to_string();
            move |err: vhost::Error| format!("{what}: {err}")
        };
        let mut fe = Frontend::connect(sock, 1).map_err(e("connect"))?;
        fe.set_owner().map_err(e("SET_OWNER"))?;
        let offered = fe.get_features().map_err(e("GET_FEATURES"))?;
        if offered & F_PROTOCOL_FEATURES == 0 {
            return Err(format!("features {offered:#x} lack PROTOCOL_FEATURES"));
        }
        fe.set_features(F_VERSION_1 | F_PROTOCOL_FEATURES | (offered & F_INDIRECT_DESC)).map_err(e("SET_FEATURES"))?;
        let proto = fe.get_protocol_features().map_err(e("GET_PROTOCOL_FEATURES"))?;
        let want = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIG;
        fe.set_protocol_features(proto & want).map_err(e("SET_PROTOCOL_FEATURES"))?;
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let g = Guest::new();
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_LEN,
            userspace_addr: g.va(0),
            mmap_offset: 0,
            mmap_handle: g.file.as_raw_fd(),
        };
        fe.set_mem_table(&[region]).map_err(e("SET_MEM_TABLE"))?;
        let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        fe.set_vring_num(0, size).map_err(e("SET_VRING_NUM"))?;
        let addrs = VringConfigData {
            queue_max_size: size,
            queue_size: size,
            flags: 0,
            desc_table_addr: g.va(DESC),
            used_ring_addr: g.va(USED),
            avail_ring_addr: g.va(AVAIL),
            log_addr: None,
        };
        fe.set_vring_addr(0, &addrs).map_err(e("SET_VRING_ADDR"))?;
        fe.set_vring_base(0, 0).map_err(e("SET_VRING_BASE"))?;
        fe.set_vring_call(0, &call).map_err(e("SET_VRING_CALL"))?;
        fe.set_vring_kick(0, &kick).map_err(e("SET_VRING_KICK"))?;
        fe.set_vring_enable(0, true).map_err(e("SET_VRING_ENABLE"))?;
        Ok(Fe { conn: fe, other: None, g, kick, call, size, avail: 0, used_seen: 0 })
    }

    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.g.desc_at(DESC, i, addr, len, flags, next);
    }

    /// Puts `head` on the available ring and kicks.
    fn publish(&mut self, head: u16) {
        self.g.w16(AVAIL + 4 + (self.avail % self.size) as u64 * 2, head);
        self.avail = self.avail.wrapping_add(1);
        fence(Ordering::SeqCst);
        self.g.w16(AVAIL + 2, self.avail);
        fence(Ordering::SeqCst);
        self.kick.write(1).unwrap();
    }

    /// Waits up to `timeout` for `n` more used entries; returns their (id, len).
    fn wait_used(&mut self, n: u16, timeout: Duration) -> Option<Vec<(u32, u32)>> {
        let deadline = Instant::now() + timeout;
        while self.g.r16(USED + 2).wrapping_sub(self.used_seen) < n {
            if Instant::now() >= deadline {
                return None;
            }
            let mut p = libc::pollfd { fd: self.call.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 20) };
            let _ = self.call.read();
        }
        fence(Ordering::SeqCst);
        let mut out = Vec::new();
        for _ in 0..n {
            let at = USED + 4 + (self.used_seen % self.size) as u64 * 8;
            out.push((self.g.r32(at), self.g.r32(at + 4)));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        Some(out)
    }

    /// One request of the usual shape (header, one data buffer, status) on descriptors 0 to 2;
    /// returns (status byte, used length).
    fn io(&mut self, kind: u32, sector: u64, data: &mut [u8]) -> Result<(u8, u32), String> {
        self.g.header(HDR, kind, sector);
        self.g.write(STATUS, &[0xff]);
        if kind == T_OUT {
            self.g.write(DATA, data);
        } else {
            self.g.write(DATA, &vec![0u8; data.len()]);
        }
        let data_flags = if kind == T_IN { NEXT | WRITE } else { NEXT };
        self.desc(0, HDR, 16, NEXT, 1);
        self.desc(1, DATA, data.len() as u32, data_flags, 2);
        self.desc(2, STATUS, 1, WRITE, 0);
        self.publish(0);
        let used =
            self.wait_used(1, IO).ok_or_else(|| format!("request type {kind} sector {sector}: no completion"))?;
        if kind == T_IN {
            data.copy_from_slice(&self.g.read(DATA, data.len()));
        }
        Ok((self.g.read(STATUS, 1)[0], used[0].1))
    }

    /// Writes block `block` with a pattern made of `seed` and reads it back.
    fn write_read_back(&mut self, block: u64, seed: u8) -> Result<(), String> {
        let mut data: Vec<u8> = (0..BLOCK).map(|i| seed ^ (i as u8)).collect();
        let sector = block * (BLOCK as u64 / 512);
        match self.io(T_OUT, sector, &mut data)? {
            (S_OK, 1) => {}
            other => return Err(format!("write of block {block}: status and used length {other:?}")),
        }
        let mut back = vec![0u8; BLOCK];
        match self.io(T_IN, sector, &mut back)? {
            (S_OK, n) if n == BLOCK as u32 + 1 => {}
            other => return Err(format!("read of block {block}: status and used length {other:?}")),
        }
        if back != data {
            return Err(format!("block {block} reads back other bytes than were written"));
        }
        Ok(())
    }

    /// Reads block `block`.
    fn read_block(&mut self, block: u64) -> Vec<u8> {
        let mut back = vec![0u8; BLOCK];
        let r = self.io(T_IN, block * (BLOCK as u64 / 512), &mut back);
        assert_eq!(r, Ok((S_OK, BLOCK as u32 + 1)), "read of block {block}");
        back
    }
}

impl Drop for Fe {
    fn drop(&mut self) {
        shut(self.conn.as_raw_fd());
    }
}

/// Shuts a front end's connection down, so that the daemon sees it end even if a process this
/// test process forks meanwhile (another test's daemon) holds a copy of the descriptor until it
/// execs.
fn shut(fd: RawFd) {
    // SAFETY: shutdown of a socket this process owns.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// A daemon with two controllers: vhost.0 on bdev M0 and vhost.1 on M1.
struct Target {
    dir: TempDir,
    d: Daemon,
}

impl Target {
    fn start(tag: &str) -> Target {
        let dir = TempDir::new(tag);
        let sock_dir = dir.path().to_str().unwrap().to_string();
        let d = Daemon::start(&dir, &["-S", &sock_dir]);
        for i in 0..2 {
            let bdev = format!("M{i}");
            d.call("bdev_malloc_create", Some(json!({"name": bdev, "num_blocks": BLOCKS, "block_size": BLOCK})));
            d.call("vhost_create_blk_controller", Some(json!({"ctrlr": format!("vhost.{i}"), "dev_name": bdev})));
        }
        Target { dir, d }
    }

    fn sock(&self, i: usize) -> PathBuf {
        self.dir.join(&format!("vhost.{i}"))
    }

    fn alive(&mut self) {
        if let Some(st) = self.d.proc.child.try_wait().unwrap() {
            panic!("the daemon exited ({st}); stderr:\n{}", self.d.proc.stderr());
        }
        self.d.assert_serving();
    }

    /// A correct session on controller `i` writes a block and reads it back.
    fn works(&mut self, i: usize, what: &str) {
        self.alive();
        let r = Fe::open(&self.sock(i), 64).and_then(|mut fe| fe.write_read_back(7 + i as u64, 0x3c));
        if let Err(e) = r {
            panic!("after {what}: a correct session on vhost.{i}: {e}; stderr:\n{}", self.d.proc.stderr());
        }
        // The controller has seen the session go before the next one comes.
        self.wait_disconnected(i, what);
    }

    fn both_work(&mut self, what: &str) {
        self.works(0, what);
        self.works(1, what);
    }

    /// Waits until controller `i` shows no session.
    fn wait_disconnected(&self, i: usize, what: &str) {
        let deadline = Instant::now() + CLOSE;
        loop {
            let c = self.d.call("vhost_get_controllers", Some(json!({"name": format!("vhost.{i}")})));
            if c[0]["sessions"].as_array().is_some_and(|s| s.is_empty()) {
                return;
            }
            assert!(Instant::now() < deadline, "after {what}: vhost.{i} still shows a session: {c}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for `needle` in the log after byte `from`.
    fn logged(&self, from: usize, needle: &str, what: &str) {
        let deadline = Instant::now() + CLOSE;
        loop {
            let log = self.d.proc.stderr();
            if log.get(from..).is_some_and(|l| l.contains(needle)) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: no log line with {needle:?}; log since:\n{}", &log[from..]);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_len(&self) -> usize {
        self.d.proc.stderr().len()
    }

    /// Queue 0 of controller `i` as vhost_get_controllers shows it.
    fn queue0(&self, i: usize) -> serde_json::Value {
        let c = self.d.call("vhost_get_controllers", Some(json!({"name": format!("vhost.{i}")})));
        c[0]["queues"].as_array().and_then(|q| q.iter().find(|q| q["index"] == 0).cloned()).unwrap_or_default()
    }

    /// Open file descriptors and threads of the daemon, the least seen over 100 ms (an RPC
    /// connection just answered may still hold a thread and a descriptor for a moment).
    fn fds_and_threads(&self) -> (usize, usize) {
        let pid = self.d.proc.pid();
        let count = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).unwrap().count();
        let mut least = (usize::MAX, usize::MAX);
        for _ in 0..5 {
            least = (least.0.min(count("fd")), least.1.min(count("task")));
            std::thread::sleep(Duration::from_millis(20));
        }
        least
    }

    /// Waits until the daemon has no more file descriptors and threads than `before`.
    fn settles_to(&self, before: (usize, usize), what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.fds_and_threads();
            if now.0 <= before.0 && now.1 <= before.1 {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: (fds, threads) {now:?}, were {before:?}");
        }
    }
}

/// A front end that sends raw bytes: what the `vhost` crate would refuse to send.
struct Raw {
    s: UnixStream,
}

impl Raw {
    fn connect(sock: &Path) -> Raw {
        let s = UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect {}: {e}", sock.display()));
        s.set_read_timeout(Some(IO)).unwrap();
        Raw { s }
    }

    /// Sends `bytes` with `fds` attached (false if the daemon has closed the connection).
    fn send_fds(&mut self, bytes: &[u8], fds: &[RawFd]) -> bool {
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
        // SAFETY: CMSG_SPACE is a size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
        let mut control = vec![0u8; space.max(1)];
        // SAFETY: a zeroed msghdr filled with pointers to the locals above, which outlive the call;
        // the control message is written inside `control`, sized by CMSG_SPACE.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            if !fds.is_empty() {
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = space as _;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
                std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
            }
            libc::sendmsg(self.s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
        };
        n == bytes.len() as isize
    }

    fn send(&mut self, bytes: &[u8]) -> bool {
        self.send_fds(bytes, &[])
    }

    /// A request: header (version 1) and body in one send.
    fn msg(&mut self, code: FrontendReq, body: &[u8], fds: &[RawFd]) -> bool {
        self.send_fds(&message(code as u32, 0x1, body), fds)
    }

    /// Reads the reply to request `code`; its body.
    fn reply(&mut self, code: FrontendReq) -> Vec<u8> {
        let mut h = [0u8; 12];
        self.s.read_exact(&mut h).unwrap_or_else(|e| panic!("no reply to {code:?}: {e}"));
        assert_eq!(u32::from_le_bytes(h[0..4].try_into().unwrap()), code as u32, "a reply to {code:?}");
        let mut body = vec![0u8; u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize];
        self.s.read_exact(&mut body).unwrap();
        body
    }

    /// Whether the daemon closes the connection within `within` (what it sends is discarded).
    fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.s.set_read_timeout(Some(left)).unwrap();
            match self.s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return false
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// SET_OWNER and the features of a front end that does without the protocol features (no
    /// acks: a refused message is seen as the connection closing).
    fn handshake(&mut self) {
        assert!(self.msg(FrontendReq::SET_OWNER, &[], &[]));
        assert!(self.msg(FrontendReq::GET_FEATURES, &[], &[]));
        let offered = u64::from_le_bytes(self.reply(FrontendReq::GET_FEATURES).try_into().unwrap());
        assert_ne!(offered & F_VERSION_1, 0);
        assert!(self.msg(FrontendReq::SET_FEATURES, &F_VERSION_1.to_le_bytes(), &[]));
    }

    /// SET_MEM_TABLE of `g` as one region.
    fn mem_table(&mut self, g: &Guest) -> bool {
        self.msg(FrontendReq::SET_MEM_TABLE, &mem_body(&[(0, MEM_LEN, g.va(0), 0)]), &[g.file.as_raw_fd()])
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        shut(self.s.as_raw_fd());
    }
}

/// A message: header (`code`, `flags`, body size) and `body`.
fn message(code: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + body.len());
    m.extend_from_slice(&code.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// A header that announces `size` body bytes (none sent).
fn header_only(code: FrontendReq, size: u32) -> Vec<u8> {
    let mut m = message(code as u32, 0x1, &[]);
    m[8..12].copy_from_slice(&size.to_le_bytes());
    m
}

/// The body of SET_VRING_NUM, SET_VRING_BASE, GET_VRING_BASE, SET_VRING_ENABLE.
fn state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

/// The body of SET_VRING_ADDR (front end virtual addresses).
fn addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for a in [desc, used, avail, 0] {
        b.extend_from_slice(&a.to_le_bytes());
    }
    b
}

/// The body of SET_MEM_TABLE: regions of (guest-physical address, size, user address, offset).
fn mem_body(regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for &(gpa, size, ua, off) in regions {
        for v in [gpa, size, ua, off] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// A raw front end's case: what it sends, given guest memory to share.
type Case = (&'static str, &'static str, fn(&mut Raw, &Guest));

/// Messages the daemon must refuse by dropping the connection, with the log line it writes.
fn message_cases() -> Vec<Case> {
    use FrontendReq as R;
    vec![
        ("garbage bytes", "message refused", |r, _| {
            r.send(&[0xa5; 64]);
        }),
        ("request code 0", "message refused", |r, _| {
            r.send(&message(0, 0x1, &[]));
        }),
        ("an unknown request code", "message refused", |r, _| {
            r.send(&message(99, 0x1, &[]));
        }),
        ("request code 0xffffffff", "message refused", |r, _| {
            r.send(&message(u32::MAX, 0x1, &[0; 8]));
        }),
        ("a request flagged as a reply", "message refused", |r, _| {
            r.send(&message(R::SET_OWNER as u32, 0x5, &[]));
        }),
        ("a header of protocol version 2", "message refused", |r, _| {
            r.send(&message(R::SET_OWNER as u32, 0x2, &[]));
        }),
        ("a header that announces a 64 KiB body", "message refused", |r, _| {
            r.send(&header_only(R::SET_MEM_TABLE, 0x10000));
        }),
        ("a header that announces a body and stalls", "message refused", |r, _| {
            r.send(&header_only(R::SET_MEM_TABLE, 4096));
        }),
        ("a body cut short that stalls", "message refused", |r, _| {
            let mut m = header_only(R::SET_VRING_ADDR, 40);
            m.extend_from_slice(&[0; 10]);
            r.send(&m);
        }),
        ("a body of the wrong size", "message refused", |r, _| {
            r.msg(R::SET_FEATURES, &[0; 4], &[]);
        }),
        ("a body on a message that has none", "message refused", |r, _| {
            r.msg(R::SET_OWNER, &[0; 8], &[]);
        }),
        ("a file descriptor on a message that takes none", "message refused", |r, g| {
            r.msg(R::GET_FEATURES, &[], &[g.file.as_raw_fd()]);
        }),
        ("features not offered", "not offered", |r, _| {
            r.msg(R::SET_OWNER, &[], &[]);
            r.msg(R::SET_FEATURES, &(F_VERSION_1 | 1 << 63).to_le_bytes(), &[]);
        }),
        ("ring addresses before SET_OWNER and the memory table", "before the memory table", |r, g| {
            r.msg(R::SET_VRING_ADDR, &addr(0, g.va(DESC), g.va(USED), g.va(AVAIL)), &[]);
        }),
        ("ring addresses before the memory table", "before the memory table", |r, g| {
            r.handshake();
            r.msg(R::SET_VRING_NUM, &state(0, 64), &[]);
            r.msg(R::SET_VRING_ADDR, &addr(0, g.va(DESC), g.va(USED), g.va(AVAIL)), &[]);
        }),
        ("ring size 0", "ring size 0", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_NUM, &state(0, 0), &[]);
        }),
        ("ring size 3", "ring size 3", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_NUM, &state(0, 3), &[]);
        }),
        ("ring size 65536", "ring size 65536", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_NUM, &state(0, 65536), &[]);
        }),
        ("SET_VRING_NUM of ring 256", "no ring 256", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_NUM, &state(256, 64), &[]);
        }),
        ("SET_VRING_BASE of ring 1000", "no ring 1000", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_BASE, &state(1000, 0), &[]);
        }),
        ("GET_VRING_BASE of ring 256", "no ring 256", |r, _| {
            r.handshake();
            r.msg(R::GET_VRING_BASE, &state(256, 0), &[]);
        }),
        ("SET_VRING_ADDR of ring 256", "no ring 256", |r, g| {
            r.handshake();
            r.mem_table(g);
            r.msg(R::SET_VRING_ADDR, &addr(256, g.va(DESC), g.va(USED), g.va(AVAIL)), &[]);
        }),
        ("a kick without its eventfd", "polling front end", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_KICK, &0x100u64.to_le_bytes(), &[]);
        }),
        ("a kick that says it has an eventfd and has none", "message refused", |r, _| {
            r.handshake();
            r.msg(R::SET_VRING_KICK, &0u64.to_le_bytes(), &[]);
        }),
        ("a memory table of 0 regions", "message refused", |r, _| {
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[]), &[]);
        }),
        ("a memory table of 9 regions", "9 memory regions", |r, g| {
            r.handshake();
            let regions: Vec<_> = (0..9u64).map(|i| (i << 20, 1 << 20, g.va(i << 20), i << 20)).collect();
            r.msg(R::SET_MEM_TABLE, &mem_body(&regions), &[g.file.as_raw_fd(); 9]);
        }),
        ("overlapping memory regions", "memory regions", |r, g| {
            r.handshake();
            let regions = [(0, 2 << 20, g.va(0), 0), (1 << 20, 2 << 20, g.va(2 << 20), 0)];
            r.msg(R::SET_MEM_TABLE, &mem_body(&regions), &[g.file.as_raw_fd(); 2]);
        }),
        ("a region of size 0", "message refused", |r, g| {
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(0, 0, g.va(0), 0)]), &[g.file.as_raw_fd()]);
        }),
        ("a region that wraps the address space", "message refused", |r, g| {
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(u64::MAX - 0xfff, MEM_LEN, g.va(0), 0)]), &[g.file.as_raw_fd()]);
        }),
        ("a region larger than its file, rings put past the file's end", "shorter than", |r, g| {
            let short = memfd(64 << 10);
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(0, MEM_LEN, g.va(0), 0)]), &[short.as_raw_fd()]);
            // Were it mapped, starting a ring past the file's end would fault in the daemon.
            r.msg(R::SET_VRING_NUM, &state(0, 64), &[]);
            r.msg(R::SET_VRING_ADDR, &addr(0, g.va(DATA), g.va(DATA + 0x2000), g.va(DATA + 0x1000)), &[]);
            let kick = EventFd::new(0).unwrap();
            r.msg(R::SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
        }),
        ("a region whose offset runs past the file's end", "shorter than", |r, g| {
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(0, MEM_LEN, g.va(0), 4096)]), &[g.file.as_raw_fd()]);
        }),
        ("a region backed by an eventfd", "shorter than", |r, g| {
            let not_memory = EventFd::new(0).unwrap();
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(0, MEM_LEN, g.va(0), 0)]), &[not_memory.as_raw_fd()]);
        }),
        ("more file descriptors than regions", "message refused", |r, g| {
            r.handshake();
            r.msg(R::SET_MEM_TABLE, &mem_body(&[(0, MEM_LEN, g.va(0), 0)]), &[g.file.as_raw_fd(); 3]);
        }),
        ("fewer file descriptors than regions", "message refused", |r, g| {
            r.handshake();
            let regions = [(0, 1 << 20, g.va(0), 0), (1 << 20, 1 << 20, g.va(1 << 20), 1 << 20)];
            r.msg(R::SET_MEM_TABLE, &mem_body(&regions), &[g.file.as_raw_fd()]);
        }),
        ("ring addresses outside the regions", "not in guest memory", |r, g| {
            r.handshake();
            r.mem_table(g);
            r.msg(R::SET_VRING_NUM, &state(0, 64), &[]);
            r.msg(R::SET_VRING_ADDR, &addr(0, g.va(DESC), g.va(MEM_LEN + 0x2000), g.va(AVAIL)), &[]);
        }),
        ("rings that run past the end of the regions", "not in guest memory", |r, g| {
            r.handshake();
            r.mem_table(g);
            r.msg(R::SET_VRING_NUM, &state(0, 256), &[]);
            let end = MEM_LEN - 16;
            r.msg(R::SET_VRING_ADDR, &addr(0, g.va(end), g.va(USED), g.va(AVAIL)), &[]);
            let kick = EventFd::new(0).unwrap();
            r.msg(R::SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
        }),
    ]
}

#[test]
fn refused_messages_drop_theconnection_and_nothing_else() {
    let mut t = Target::start("vhmsg");
    t.both_work("start");
    let before = t.fds_and_threads();
    let g = Guest::new();
    for (what, log, send) in message_cases() {
        let from = t.log_len();
        let mut r = Raw::connect(&t.sock(0));
        send(&mut r, &g);
        assert!(r.closed_within(CLOSE), "{what}: the connection was not dropped; log:\n{}", t.d.proc.stderr());
        t.logged(from, log, what);
        t.wait_disconnected(0, what);
        t.alive();
    }
    t.both_work("every refused message");
    t.settles_to(before, "after the refused messages (their memory and file descriptors released)");
}

#[test]
fn harmless_messages_out_of_order_keep_the_session() {
    use FrontendReq as R;
    let mut t = Target::start("vhorder");
    let g = Guest::new();
    let mut r = Raw::connect(&t.sock(0));
    // QEMU asks for the features before SET_OWNER; rte_vhost takes any order too.
    assert!(r.msg(R::GET_FEATURES, &[], &[]));
    assert_eq!(r.reply(R::GET_FEATURES).len(), 8);
    assert!(r.msg(R::GET_PROTOCOL_FEATURES, &[], &[]));
    assert_eq!(r.reply(R::GET_PROTOCOL_FEATURES).len(), 8);
    // A kick before the ring's size, addresses and memory; a base before SET_OWNER.
    let kick = EventFd::new(0).unwrap();
    assert!(r.msg(R::SET_VRING_BASE, &state(0, 0), &[]));
    assert!(r.msg(R::SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]));
    r.handshake();
    assert!(r.mem_table(&g));
    assert!(r.msg(R::SET_VRING_NUM, &state(0, 64), &[]));
    assert!(r.msg(R::SET_VRING_ADDR, &addr(0, g.va(DESC), g.va(USED), g.va(AVAIL)), &[]));
    // GET_VRING_BASE stops the ring if it runs and answers where it is.
    assert!(r.msg(R::GET_VRING_BASE, &state(0, 0), &[]));
    assert_eq!(r.reply(R::GET_VRING_BASE), state(0, 0));
    // A second memory table replaces the first; the session goes on.
    assert!(r.mem_table(&g));
    assert!(r.msg(R::GET_FEATURES, &[], &[]));
    assert_eq!(r.reply(R::GET_FEATURES).len(), 8);
    drop(r);
    t.wait_disconnected(0, "an out-of-order session");
    t.both_work("an out-of-order session");
}

/// What must become of a malformed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Completed with VIRTIO_BLK_S_IOERR in its status byte (used length 1).
    IoErr,
    /// Returned on the used ring with length 0 and its status byte untouched: the chain gives
    /// no status byte the device can trust.
    Unanswered,
}

/// A malformed request: what it is, what must become of it, and how it is put at head 0 (the
/// header at HDR asks to write block 10 with the 0xee bytes at DATA).
type ChainCase = (&'static str, Outcome, fn(&Fe));

/// A discard or write zeroes request of one segment at head 0.
fn discard(f: &Fe, kind: u32, sector: u64, sectors: u32) {
    f.g.header(HDR, kind, 0);
    let mut seg = [0u8; 16];
    seg[0..8].copy_from_slice(&sector.to_le_bytes());
    seg[8..12].copy_from_slice(&sectors.to_le_bytes());
    f.g.write(DATA + 0x10000, &seg);
    f.desc(0, HDR, 16, NEXT, 1);
    f.desc(1, DATA + 0x10000, 16, NEXT, 2);
    f.desc(2, STATUS, 1, WRITE, 0);
}

/// The queue size the chain cases use.
const QSIZE: u16 = 16;

fn chain_cases() -> Vec<ChainCase> {
    use Outcome::*;
    vec![
        ("the status descriptor's next points at itself", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE | NEXT, 2);
        }),
        ("the chain loops back to its head", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE | NEXT, 0);
        }),
        ("the status descriptor's next index is past the table", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE | NEXT, 200);
        }),
        ("a chain through every descriptor of the queue and on", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            for i in 1..QSIZE - 1 {
                f.desc(i, DATA + (i as u64 - 1) * 512, 512, NEXT, i + 1);
            }
            f.desc(QSIZE - 1, STATUS, 1, WRITE | NEXT, 0);
        }),
        ("the header's next index is the table's size", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, QSIZE);
        }),
        ("an indirect table of 17 bytes", Unanswered, |f| {
            f.desc(0, TABLE, 17, INDIRECT, 0);
        }),
        ("an indirect table of 0 bytes", Unanswered, |f| {
            f.desc(0, TABLE, 0, INDIRECT, 0);
        }),
        ("an indirect table in an indirect table", Unanswered, |f| {
            f.desc(0, TABLE, 48, INDIRECT, 0);
            f.g.desc_at(TABLE, 0, HDR, 16, NEXT, 1);
            f.g.desc_at(TABLE, 1, TABLE + 0x1000, 48, INDIRECT | NEXT, 2);
            f.g.desc_at(TABLE, 2, STATUS, 1, WRITE, 0);
            f.g.desc_at(TABLE + 0x1000, 0, DATA, BLOCK as u32, NEXT, 1);
            f.g.desc_at(TABLE + 0x1000, 1, STATUS, 1, WRITE, 0);
        }),
        ("an indirect table outside guest memory", Unanswered, |f| {
            f.desc(0, 1 << 40, 48, INDIRECT, 0);
        }),
        ("an indirect table of 200 descriptors (more segments than seg_max)", IoErr, |f| {
            f.desc(0, TABLE, 200 * 16, INDIRECT, 0);
            f.g.desc_at(TABLE, 0, HDR, 16, NEXT, 1);
            for i in 1..199u16 {
                f.g.desc_at(TABLE, i, DATA + (i as u64 - 1) * 512, 512, NEXT, i + 1);
            }
            f.g.desc_at(TABLE, 199, STATUS, 1, WRITE, 0);
        }),
        ("an indirect table of 4095 descriptors", IoErr, |f| {
            f.desc(0, TABLE, 4095 * 16, INDIRECT, 0);
            f.g.desc_at(TABLE, 0, HDR, 16, NEXT, 1);
            for i in 1..4094u16 {
                f.g.desc_at(TABLE, i, DATA, 16, NEXT, i + 1);
            }
            f.g.desc_at(TABLE, 4094, STATUS, 1, WRITE, 0);
        }),
        ("a header outside guest memory", IoErr, |f| {
            f.desc(0, 1 << 40, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("data that runs past the end of guest memory", IoErr, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, MEM_LEN - 2048, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("data at the top of the address space", IoErr, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, u64::MAX - (BLOCK as u64 - 1), BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("a status byte outside guest memory", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, 1 << 40, 1, WRITE, 0);
        }),
        ("a status descriptor of length 0", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 0, WRITE, 0);
        }),
        ("no status descriptor", Unanswered, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, 0, 0);
        }),
        ("a header of 8 bytes", IoErr, |f| {
            f.desc(0, HDR, 8, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("a device-readable descriptor after a device-writable one", IoErr, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA + 0x10000, 512, WRITE | NEXT, 2);
            f.desc(2, DATA, BLOCK as u32, NEXT, 3);
            f.desc(3, STATUS, 1, WRITE, 0);
        }),
        // A chain the driver may not build (VIRTIO 1.2 2.7.5.2); its status byte is there, so
        // it is failed (its data is not whole blocks) rather than left unanswered.
        ("descriptors of more than 4 GiB in all", IoErr, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, u32::MAX, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("a write of less than a block", IoErr, |f| {
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, 1000, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("a read at sector 2^64 - 8", IoErr, |f| {
            f.g.header(HDR, T_IN, u64::MAX - 7);
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT | WRITE, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
        ("a discard past the end of the disk", IoErr, |f| {
            discard(f, T_DISCARD, BLOCKS * (BLOCK as u64 / 512), 8);
        }),
        ("a discard at the last block the sector space holds", IoErr, |f| {
            discard(f, T_DISCARD, u64::MAX / BLOCK as u64 * (BLOCK as u64 / 512), 8);
        }),
        ("a write zeroes of 2^32 - 8 sectors", IoErr, |f| {
            discard(f, T_WRITE_ZEROES, 0, u32::MAX - 7);
        }),
        ("a write past the end of the disk", IoErr, |f| {
            f.g.header(HDR, T_OUT, BLOCKS * (BLOCK as u64 / 512));
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
        }),
    ]
}

#[test]
fn malformed_chains_fail_and_the_queue_goes_on() {
    let mut t = Target::start("vhchain");
    let mut f = Fe::open(&t.sock(0), QSIZE).expect("a correct session");
    f.write_read_back(10, 0x11).unwrap();
    let block10 = f.read_block(10);
    let from = t.log_len();
    let mut wrong = Vec::new();
    for (n, (what, want, put)) in chain_cases().into_iter().enumerate() {
        f.g.header(HDR, T_OUT, 10 * (BLOCK as u64 / 512));
        f.g.write(DATA, &[0xee; BLOCK]);
        f.g.write(STATUS, &[0xff]);
        put(&f);
        f.publish(0);
        let used = f.wait_used(1, IO).unwrap_or_else(|| panic!("{what}: never returned; log:\n{}", t.d.proc.stderr()));
        let status = f.g.read(STATUS, 1)[0];
        let got = match (status, used[0].1) {
            (S_IOERR, 1) => Some(Outcome::IoErr),
            (0xff, 0) => Some(Outcome::Unanswered),
            _ => None,
        };
        if used[0].0 != 0 || got != Some(want) {
            wrong.push(format!("{what}: head {}, status {status}, used length {}", used[0].0, used[0].1));
        }
        if f.read_block(10) != block10 {
            wrong.push(format!("{what}: block 10 was written"));
            f.write_read_back(10, 0x11).unwrap();
        }
        f.write_read_back(20 + n as u64, n as u8).unwrap_or_else(|e| panic!("after {what}: {e}"));
        t.alive();
    }
    assert!(wrong.is_empty(), "malformed requests not failed as they must be:\n{}", wrong.join("\n"));
    t.logged(from, "malformed request", "malformed chains");
    assert_eq!(t.queue0(0)["broken"], false, "{}", t.queue0(0));
    drop(f);
    t.wait_disconnected(0, "malformed chains");
    t.both_work("malformed chains");
}

/// A driver that breaks the ring's rules: what it does to a fresh queue of QSIZE entries.
type RingCase = (&'static str, &'static str, fn(&mut Fe));

#[test]
fn a_driver_that_breaks_the_ring_stops_its_queue_and_nothing_else() {
    let cases: Vec<RingCase> = vec![
        ("an available index more than the ring's size ahead", "broke the ring", |f| {
            f.g.w16(AVAIL + 2, f.avail.wrapping_add(QSIZE + 1));
        }),
        ("the same head in flight twice", "already in flight", |f| {
            f.g.header(HDR, T_OUT, 0);
            f.desc(0, HDR, 16, NEXT, 1);
            f.desc(1, DATA, BLOCK as u32, NEXT, 2);
            f.desc(2, STATUS, 1, WRITE, 0);
            f.g.w16(AVAIL + 4 + (f.avail % QSIZE) as u64 * 2, 0);
            f.g.w16(AVAIL + 4 + (f.avail.wrapping_add(1) % QSIZE) as u64 * 2, 0);
            fence(Ordering::SeqCst);
            f.g.w16(AVAIL + 2, f.avail.wrapping_add(2));
        }),
        ("a memory table without the rings' region while the ring runs", "broke the ring", |f| {
            let other = Guest::new();
            let region = VhostUserMemoryRegionInfo {
                guest_phys_addr: 1 << 30,
                memory_size: MEM_LEN,
                userspace_addr: other.va(0),
                mmap_offset: 0,
                mmap_handle: other.file.as_raw_fd(),
            };
            f.conn.set_mem_table(&[region]).expect("a second memory table");
            f.other = Some(other);
            f.g.header(HDR, T_OUT, 0);
            f.g.w16(AVAIL + 4 + (f.avail % QSIZE) as u64 * 2, 0);
            fence(Ordering::SeqCst);
            f.g.w16(AVAIL + 2, f.avail.wrapping_add(1));
        }),
        ("a head past the descriptor table", "broke the ring", |f| {
            f.g.w16(AVAIL + 4 + (f.avail % QSIZE) as u64 * 2, 300);
            fence(Ordering::SeqCst);
            f.g.w16(AVAIL + 2, f.avail.wrapping_add(1));
        }),
    ];
    let mut t = Target::start("vhring");
    for (what, log, put) in cases {
        let from = t.log_len();
        let mut f = Fe::open(&t.sock(0), QSIZE).expect("a correct session");
        f.write_read_back(1, 1).unwrap();
        put(&mut f);
        f.kick.write(1).unwrap();
        t.logged(from, log, what);
        let deadline = Instant::now() + CLOSE;
        while t.queue0(0)["broken"] != true {
            assert!(Instant::now() < deadline, "{what}: queue 0 is not shown broken: {}", t.queue0(0));
            std::thread::sleep(Duration::from_millis(10));
        }
        // A broken queue takes nothing more.
        let next_avail = t.queue0(0)["next_avail"].clone();
        f.avail = f.g.r16(AVAIL + 2);
        f.g.header(HDR, T_OUT, 8);
        f.publish(0);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(t.queue0(0)["next_avail"], next_avail, "{what}: the broken queue took a request");
        t.works(1, what);
        drop(f);
        t.wait_disconnected(0, what);
        t.works(0, what);
    }
}

#[test]
fn a_second_front_end_is_closed_and_aconnected_controller_is_not_deleted() {
    let mut t = Target::start("vhsecond");
    let mut f = Fe::open(&t.sock(0), 64).expect("a correct session");
    f.write_read_back(1, 1).unwrap();
    let from = t.log_len();
    let mut second = Raw::connect(&t.sock(0));
    second.msg(FrontendReq::GET_FEATURES, &[], &[]);
    assert!(second.closed_within(Duration::from_secs(1)), "the second front end was not closed at once");
    t.logged(from, "a second front end connected", "a second front end");
    f.write_read_back(2, 2).expect("the first front end, after a second came");

    let e = t.d.call_err("vhost_delete_controller", Some(json!({"ctrlr": "vhost.0"})));
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert!(t.sock(0).exists(), "the socket of a controller not deleted is gone");
    f.write_read_back(3, 3).expect("the first front end, after a refused delete");
    drop(f);
    t.wait_disconnected(0, "the front end left");
    t.d.call("vhost_delete_controller", Some(json!({"ctrlr": "vhost.0"})));
    assert!(!t.sock(0).exists(), "the deleted controller's socket file is still there");
    assert!(UnixStream::connect(t.sock(0)).is_err());
    t.works(1, "deleting vhost.0");
}

#[test]
fn a_thousand_sessions_leave_no_descriptor_or_thread_behind() {
    let mut t = Target::start("vhcycle");
    t.both_work("start");
    let before = t.fds_and_threads();
    let g = Guest::new();
    for i in 0..1000 {
        // 500 sessions one after the other on each controller: each new front end comes as
        // soon as the last one has closed.
        let c = i / 500;
        if i % 100 == 0 {
            // Now and then a session whose ring runs.
            let mut f = Fe::open(&t.sock(c), 64).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
            f.write_read_back(1, i as u8).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
            continue;
        }
        let session = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut r = Raw::connect(&t.sock(c));
            r.handshake();
            if i % 10 == 1 {
                // Memory mapped by the daemon, then the front end goes.
                assert!(r.mem_table(&g));
            }
            assert!(r.msg(FrontendReq::GET_FEATURES, &[], &[]));
            r.reply(FrontendReq::GET_FEATURES);
        }));
        if let Err(e) = session {
            let log = t.d.proc.stderr();
            eprintln!(
                "cycle {i} on vhost.{c}; the daemon's last log lines:\n{}",
                &log[log.len().saturating_sub(2000)..]
            );
            std::panic::resume_unwind(e);
        }
    }
    t.settles_to(before, "after 1000 sessions");
    t.both_work("1000 sessions");
}

#[test]
fn a_header_cut_short_holds_up_no_other_controller_for_long() {
    let mut t = Target::start("vhcut");
    t.both_work("start");
    let from = t.log_len();
    let mut r = Raw::connect(&t.sock(0));
    assert!(r.send(&message(FrontendReq::GET_FEATURES as u32, 0x1, &[])[..5]));
    // Meanwhile a session on the other controller; the daemon waits for the rest of the header
    // at most MSG_TIMEOUT.
    let sock1 = t.sock(1);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Fe::open(&sock1, 64).and_then(|mut f| f.write_read_back(3, 9)));
    });
    let other = rx.recv_timeout(IO);
    assert!(r.closed_within(CLOSE), "a connection with half a header is kept");
    assert_eq!(other, Ok(Ok(())), "vhost.1 while vhost.0 had half a header");
    t.logged(from, "cut short", "half a header");
    t.both_work("half a header");
}

#[test]
fn a_front_end_that_reads_no_reply_holds_up_no_other_controller_for_long() {
    let mut t = Target::start("vhnoread");
    t.both_work("start");
    let from = t.log_len();
    let r = Raw::connect(&t.sock(0));
    r.s.set_nonblocking(true).unwrap();
    // GET_FEATURES after GET_FEATURES, no reply read, until the daemon takes no more.
    let one = message(FrontendReq::GET_FEATURES as u32, 0x1, &[]);
    let mut idle_since = Instant::now();
    let mut sent = 0usize;
    while idle_since.elapsed() < Duration::from_millis(300) {
        // SAFETY: sends the bytes of `one`, which outlives the call.
        let n = unsafe { libc::send(r.s.as_raw_fd(), one.as_ptr().cast(), one.len(), libc::MSG_NOSIGNAL) };
        if n == one.len() as isize {
            sent += 1;
            idle_since = Instant::now();
        } else {
            assert!(n < 0, "a message sent in part");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(sent > 100, "only {sent} messages sent");
    let sock1 = t.sock(1);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Fe::open(&sock1, 64).and_then(|mut f| f.write_read_back(3, 9)));
    });
    let other = rx.recv_timeout(IO);
    assert_eq!(other, Ok(Ok(())), "vhost.1 while vhost.0's front end reads no reply");
    // Dropped, which shows as a hang-up (its replies are not read here).
    let mut p = libc::pollfd { fd: r.s.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd.
    unsafe { libc::poll(&mut p, 1, CLOSE.as_millis() as i32) };
    assert_ne!(p.revents & (libc::POLLHUP | libc::POLLRDHUP), 0, "the front end that reads nothing is kept");
    t.logged(from, "reads no reply", "a front end that reads no reply");
    drop(r);
    t.both_work("a front end that reads no reply");
}
