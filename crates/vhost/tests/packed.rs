//! Packed virtqueues served by a reactor, driven by a minimal packed-ring driver written here
//! (as tests/vring.rs does for split rings): chains go into the descriptor ring in guest memory
//! (a memfd) with the driver's wrap counter, the kick eventfd is signalled when the device's
//! event suppression asks for it (Linux's rule), used descriptors are read back at the driver's
//! used position, which moves on by each buffer's descriptor count, and every write is read
//! back and compared. Rings of 100 slots (packed sizes need not be powers of two) wrap dozens
//! of times per test.

use ferrite_modules::delay::{self, Latencies};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_vhost::blk;
use ferrite_vhost::inflight::{InflightArea, InflightQueue};
use ferrite_vhost::memory::Memory;
use ferrite_vhost::packed::{
    PackedRing, Pos, DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED, DESC_F_WRITE, EVENT_DESC, EVENT_DISABLE,
    EVENT_ENABLE,
};
use ferrite_vhost::vring::{self, Device, QueueStats, Setup};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{Bytes, GuestAddress};

const QSIZE: u16 = 100;
/// Each queue's part of guest memory: the ring and its areas, headers, status bytes,
/// indirect tables and data buffers, by buffer id.
const REGION: u64 = 0x40_0000;
const DESC: u64 = 0;
const DRIVER: u64 = 0x2000;
const DEVICE: u64 = 0x2004;
const HDRS: u64 = 0x3000;
const STATUS: u64 = 0x3800;
const TABLES: u64 = 0x4000;
const TABLE_BYTES: u64 = 4096;
const DATA: u64 = 0x80000;
const DATA_BYTES: u64 = 16384;
const MEM: u64 = 4 * REGION;

fn memfd(len: u64) -> File {
    // SAFETY: a fresh memfd, owned by the File.
    let fd = unsafe { libc::memfd_create(c"packed-test".as_ptr(), 0) };
    assert!(fd >= 0);
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f.flush().unwrap();
    f
}

fn eventfd() -> File {
    // SAFETY: a fresh eventfd, owned by the File.
    unsafe { File::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)) }
}

/// The driver's side of one packed ring (queue `q`, in its part of guest memory).
struct Driver {
    engine: Engine,
    mem: Arc<Memory>,
    q: u16,
    kick: File,
    call: File,
    /// Next slot to make available / to find used, with the wrap counters.
    avail: Pos,
    used: Pos,
    free: Vec<u16>,
    /// Ring slots each buffer id took.
    count: Vec<u16>,
    /// Slots made available since the last kick decision.
    added: u16,
}

/// One buffer element: address, length, device-writable.
type Elem = (u64, u32, bool);

impl Driver {
    fn base(&self) -> u64 {
        self.q as u64 * REGION
    }

    fn w<T: vm_memory::ByteValued>(&self, at: u64, v: T) {
        self.mem.guest.write_obj(v, GuestAddress(at)).unwrap();
    }

    fn r<T: vm_memory::ByteValued>(&self, at: u64) -> T {
        self.mem.guest.read_obj(GuestAddress(at)).unwrap()
    }

    fn desc(&self, slot: u16, addr: u64, len: u32, id: u16) {
        let at = self.base() + DESC + 16 * slot as u64;
        self.w(at, addr.to_le());
        self.w(at + 8, len.to_le());
        self.w(at + 12, id.to_le());
    }

    fn flags(&self, slot: u16, f: u16) {
        self.w(self.base() + DESC + 16 * slot as u64 + 14, f.to_le());
    }

    fn avail_bits(&self) -> u16 {
        if self.avail.wrap {
            DESC_F_AVAIL
        } else {
            DESC_F_USED
        }
    }

    fn next_id(&self) -> u16 {
        *self.free.last().expect("a free buffer id")
    }

    /// Makes a buffer available: its elements as a chain of consecutive slots (the buffer id
    /// only in the last; the others carry a wrong one the device must not read) or as one
    /// indirect descriptor; the first slot's flags last.
    fn add(&mut self, elems: &[Elem], indirect: bool) -> u16 {
        let id = self.free.pop().expect("a free buffer id");
        let first = self.avail.index;
        let head_flags;
        if indirect {
            let t = self.base() + TABLES + id as u64 * TABLE_BYTES;
            for (i, &(a, l, wr)) in elems.iter().enumerate() {
                let at = t + 16 * i as u64;
                self.w(at, a.to_le());
                self.w(at + 8, l.to_le());
                self.w(at + 12, 0xbeefu16.to_le());
                // Only WRITE counts in a table; NEXT is reserved and ignored.
                self.w(at + 14, (if wr { DESC_F_WRITE } else { 0 } | DESC_F_NEXT).to_le());
            }
            self.desc(first, t, 16 * elems.len() as u32, id);
            head_flags = self.avail_bits() | DESC_F_INDIRECT;
            self.avail = self.avail.advance(1, QSIZE);
            self.count[id as usize] = 1;
        } else {
            self.free.push(id);
            let el: Vec<(u64, u32, u16)> =
                elems.iter().map(|&(a, l, wr)| (a, l, if wr { DESC_F_WRITE } else { 0 })).collect();
            return self.add_flags(&el);
        }
        fence(Ordering::SeqCst);
        self.flags(first, head_flags);
        self.added += self.count[id as usize];
        id
    }

    /// Makes a chain of consecutive slots available, each element with its own flags (WRITE,
    /// INDIRECT) besides NEXT and the wrap bits, the buffer id in the last.
    fn add_flags(&mut self, elems: &[(u64, u32, u16)]) -> u16 {
        let id = self.free.pop().expect("a free buffer id");
        let first = self.avail.index;
        let mut head_flags = 0;
        for (i, &(a, l, extra)) in elems.iter().enumerate() {
            let last = i + 1 == elems.len();
            let mut f = self.avail_bits() | extra;
            if !last {
                f |= DESC_F_NEXT;
            }
            let slot = self.avail.index;
            self.desc(slot, a, l, if last { id } else { 0xdead });
            if i == 0 {
                head_flags = f;
            } else {
                self.flags(slot, f);
            }
            self.avail = self.avail.advance(1, QSIZE);
        }
        self.count[id as usize] = elems.len() as u16;
        fence(Ordering::SeqCst);
        self.flags(first, head_flags);
        self.added += self.count[id as usize];
        id
    }

    /// A virtio-blk request of `len` bytes at `sector`, its data at the id's buffer cut into
    /// `pieces` descriptors; returns its id.
    fn request(&mut self, kind: u32, sector: u64, len: u32, pieces: u32, indirect: bool) -> u16 {
        let id = self.next_id();
        let h = self.base() + HDRS + 16 * id as u64;
        self.w(h, kind.to_le());
        self.w(h + 4, 0u32);
        self.w(h + 8, sector.to_le());
        self.w(self.base() + STATUS + id as u64, 0xffu8);
        let data = self.data(id);
        let wr = kind == blk::T_IN || kind == blk::T_GET_ID;
        let mut elems = vec![(h, 16, false)];
        let piece = len / pieces;
        for p in 0..pieces {
            let n = if p + 1 == pieces { len - piece * p } else { piece };
            elems.push((data + (piece * p) as u64, n, wr));
        }
        elems.push((self.base() + STATUS + id as u64, 1, true));
        assert_eq!(self.add(&elems, indirect), id);
        id
    }

    fn data(&self, id: u16) -> u64 {
        self.base() + DATA + id as u64 * DATA_BYTES
    }

    fn status(&self, id: u16) -> u8 {
        self.r(self.base() + STATUS + id as u64)
    }

    fn kick(&self) {
        let one = 1u64;
        // SAFETY: 8 bytes from a local to an eventfd we own.
        assert_eq!(unsafe { libc::write(self.kick.as_raw_fd(), (&one as *const u64).cast(), 8) }, 8);
    }

    /// Kicks if the device's event suppression asks for it, as Linux decides
    /// (virtqueue_kick_prepare_packed).
    fn kick_if_needed(&mut self) {
        fence(Ordering::SeqCst);
        let off_wrap = u16::from_le(self.r(self.base() + DEVICE));
        let flags = u16::from_le(self.r(self.base() + DEVICE + 2));
        let new = self.avail.index;
        let old = new.wrapping_sub(self.added);
        self.added = 0;
        let needed = if flags != EVENT_DESC {
            flags != EVENT_DISABLE
        } else {
            let mut event = off_wrap & 0x7fff;
            if (off_wrap >> 15 != 0) != self.avail.wrap {
                event = event.wrapping_sub(QSIZE);
            }
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        };
        if needed {
            self.kick();
        }
    }

    /// Sets the driver area: when the device should signal.
    fn driver_event(&self, flags: u16, off: Pos) {
        self.w(self.base() + DRIVER, off.encode().to_le());
        fence(Ordering::SeqCst);
        self.w(self.base() + DRIVER + 2, flags.to_le());
    }

    /// The used descriptor at the used position, if the device wrote it: (id, len); the
    /// position moves on by the buffer's descriptor count.
    fn take_used(&mut self) -> Option<(u16, u32)> {
        let at = self.base() + DESC + 16 * self.used.index as u64;
        let flags = u16::from_le(self.r(at + 14));
        // Used: AVAIL and USED both equal to the wrap counter (a descriptor the driver made
        // available a lap ago in the middle of a chain has USED equal to it alone).
        let (avail, used) = (flags & DESC_F_AVAIL != 0, flags & DESC_F_USED != 0);
        if avail != used || used != self.used.wrap {
            return None;
        }
        fence(Ordering::Acquire);
        let id = u16::from_le(self.r(at + 12));
        let len = u32::from_le(self.r(at + 8));
        assert!((id as usize) < self.count.len() && !self.free.contains(&id), "used id {id} is not in flight");
        assert_eq!(flags & DESC_F_WRITE != 0, len > 0, "WRITE says whether data was written");
        self.used = self.used.advance(self.count[id as usize], QSIZE);
        self.free.push(id);
        Some((id, len))
    }

    /// Whether the call eventfd was signalled (and clears it).
    fn signalled(&self) -> bool {
        let mut v = 0u64;
        // SAFETY: 8 bytes into a local from a non-blocking eventfd.
        unsafe { libc::read(self.call.as_raw_fd(), (&mut v as *mut u64).cast(), 8) == 8 }
    }

    fn wait_call(&self, ms: i32) -> bool {
        let mut p = libc::pollfd { fd: self.call.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
        self.signalled()
    }

    /// Waits for `n` completions (on the call eventfd, looking at the ring as well).
    fn wait(&mut self, n: usize) -> Vec<(u16, u32)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            while let Some(u) = self.take_used() {
                out.push(u);
            }
            if out.len() >= n {
                break;
            }
            if Instant::now() >= deadline {
                panic!("{} of {n} completions in 10 s; queue: {:?}", out.len(), self.stats());
            }
            self.wait_call(100);
        }
        out
    }

    /// Waits for one completion trusting the call eventfd alone, having asked for a signal at
    /// the used position (EVENT_IDX's DESC, as Linux does on enabling callbacks): a completion
    /// found without a signal after a wait timed out is a lost interrupt.
    fn wait_strict(&mut self) -> Result<Vec<(u16, u32)>, String> {
        self.driver_event(EVENT_DESC, self.used);
        fence(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut out = Vec::new();
            while let Some(u) = self.take_used() {
                out.push(u);
            }
            if !out.is_empty() {
                return Ok(out);
            }
            if Instant::now() >= deadline {
                return Err("no completion in 10 s".into());
            }
            if !self.wait_call(500) && self.take_used().is_some() {
                return Err("a completion on the ring without a signal for 500 ms".into());
            }
        }
    }

    fn stats(&self) -> QueueStats {
        let q = self.q;
        let st = self.engine.call(0, || vring::stats(1)).wait().unwrap();
        st.into_iter().find(|s| s.index == q).expect("the queue runs")
    }
}

/// An engine with bdevs M0 (malloc, 8192 blocks of 512 bytes) and D0 (a delay bdev over
/// malloc M1 with `lat`), and guest memory.
fn engine(mode: ReactorMode, lat: Latencies) -> (Engine, Arc<Memory>) {
    let e = Engine::start(EngineConfig { cores: vec![0], mode, pin: false, ..Default::default() }).expect("engine");
    e.run_async(0, move || async move {
        for name in ["M0", "M1"] {
            malloc::create(MallocOpts {
                name: Some(name.into()),
                num_blocks: 8192,
                block_size: 512,
                ..Default::default()
            })
            .expect("malloc");
        }
        delay::create("M1", "D0", None, lat).expect("delay");
    })
    .wait()
    .unwrap();
    let mem =
        Arc::new(Memory::map(&[VhostUserMemoryRegion::new(0, MEM, 0x7f00_0000_0000, 0)], vec![memfd(MEM)]).unwrap());
    (e, mem)
}

fn driver(e: &Engine, mem: &Arc<Memory>, q: u16) -> Driver {
    Driver {
        engine: e.clone(),
        mem: mem.clone(),
        q,
        kick: eventfd(),
        call: eventfd(),
        avail: Pos::START,
        used: Pos::START,
        free: (0..QSIZE).rev().collect(),
        count: vec![0; QSIZE as usize],
        added: 0,
    }
}

/// Starts packed queue `d.q` on bdev `bdev` at position `base` (SET_VRING_BASE's low half).
fn start(d: &Driver, bdev: &str, event_idx: bool, seg_max: u32, base: u16, inflight: Option<InflightQueue>) {
    let dev = Arc::new(Device {
        ctrlr: "p".into(),
        bdev: bdev.into(),
        readonly: false,
        packed_ring: true,
        seg_max,
        serial: [b'p'; 20],
        coalescing: Default::default(),
        writeback: true.into(),
    });
    let s = Setup {
        ctrlr_id: 1,
        index: d.q,
        size: QSIZE,
        desc: d.base() + DESC,
        avail: d.base() + DRIVER,
        used: d.base() + DEVICE,
        next_avail: base,
        packed: true,
        event_idx,
        kick: d.kick.try_clone().unwrap(),
        call: Some(d.call.try_clone().unwrap()),
        mem: d.mem.clone(),
        dev,
        inflight,
        log: None,
    };
    d.engine.call(0, move || vring::start(s)).wait().unwrap().expect("queue starts");
}

fn no_delay() -> Latencies {
    Latencies::default()
}

/// Rounds of 24 writes then 24 reads of the same blocks (chains of 3 to 5 descriptors, every
/// third one indirect), each round waited for with the reactor free to sleep between; every
/// read matches its write. 40 rounds take 40 * 152 slots: 60 laps of the ring. Halfway, a new
/// memory table; at the end GET_VRING_BASE's value.
fn rounds(mode: ReactorMode, event_idx: bool) {
    let (e, mem) = engine(mode, no_delay());
    let mut d = driver(&e, &mem, 0);
    start(&d, "M0", event_idx, 126, Pos::START.encode(), None);
    let mut slots = 0u64;
    for round in 0..40u64 {
        if round == 20 {
            // A new memory table (the same regions): the ring goes on where it was.
            let m = mem.clone();
            e.call(0, move || vring::set_memory(1, m)).wait().unwrap();
        }
        let mut ids = Vec::new();
        for i in 0..24u64 {
            let id = d.next_id();
            d.mem.guest.write_slice(&[(round * 31 + i) as u8; 4096], GuestAddress(d.data(id))).unwrap();
            d.request(blk::T_OUT, i * 8, 4096, 1 + (i % 3) as u32, i % 3 == 0);
            slots += d.count[id as usize] as u64;
            ids.push(id);
        }
        d.kick_if_needed();
        let done = d.wait(24);
        assert!(done.iter().all(|&(_, len)| len == 0 || len == 1), "a write's used length is its status: {done:?}");
        for &id in &ids {
            assert_eq!(d.status(id), blk::S_OK, "round {round}: write {id}");
        }
        let mut ids = Vec::new();
        for i in 0..24u64 {
            let id = d.next_id();
            d.mem.guest.write_slice(&[0u8; 4096], GuestAddress(d.data(id))).unwrap();
            d.request(blk::T_IN, i * 8, 4096, 1 + (i % 3) as u32, i % 3 == 1);
            slots += d.count[id as usize] as u64;
            ids.push((id, i));
        }
        d.kick_if_needed();
        let done = d.wait(24);
        assert!(done.iter().all(|&(_, len)| len == 4097), "a read's used length is its data and status: {done:?}");
        for &(id, i) in &ids {
            assert_eq!(d.status(id), blk::S_OK);
            let mut back = [0u8; 4096];
            d.mem.guest.read_slice(&mut back, GuestAddress(d.data(id))).unwrap();
            assert!(back.iter().all(|&b| b == (round * 31 + i) as u8), "round {round} block {i} reads back its write");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = d.stats();
    assert!(st.packed);
    assert_eq!(st.requests, 40 * 48);
    assert_eq!((st.next_avail, st.next_used), (d.avail.encode(), d.used.encode()), "nothing in flight: {st:?}");
    assert!(slots / QSIZE as u64 > 50, "{slots} slots: {} laps", slots / QSIZE as u64);
    // GET_VRING_BASE: both positions, each with its wrap counter.
    let (tx, mut rx) = ferrite_reactor::oneshot::channel();
    e.call(0, move || vring::stop(1, 0, tx)).wait().unwrap();
    let base = rx.wait_for(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(base, d.avail.encode() as u32 | (d.used.encode() as u32) << 16);
    e.stop();
    e.join();
}

#[test]
fn reads_and_writes_across_many_laps_in_every_mode() {
    rounds(ReactorMode::Adaptive, true);
    rounds(ReactorMode::Interrupt, false);
    rounds(ReactorMode::Poll, true);
}

/// A write held 50 ms by the delay bdev, then 8 reads that complete at once: the reads' used
/// descriptors go first, at the used position (inside the write's slots, which it has not
/// given back), and the driver, skipping by each buffer's descriptor count, finds every one;
/// the write's comes last.
#[test]
fn completions_out_of_order_go_at_the_next_used_position() {
    let lat = Latencies { avg_write: 50_000, p99_write: 50_000, ..Default::default() };
    let (e, mem) = engine(ReactorMode::Adaptive, lat);
    let mut d = driver(&e, &mem, 0);
    start(&d, "D0", true, 126, Pos::START.encode(), None);
    for round in 0..30u64 {
        let w = d.next_id();
        d.mem.guest.write_slice(&[round as u8 + 1; 4096], GuestAddress(d.data(w))).unwrap();
        // A long chain for the write (header, 4 data, status), so the reads land in its slots.
        d.request(blk::T_OUT, 800 + round * 8, 4096, 4, false);
        let mut reads = Vec::new();
        for i in 0..8u64 {
            reads.push(d.request(blk::T_IN, i * 8, 512, 1 + (i % 2) as u32, i % 4 == 3));
        }
        d.kick_if_needed();
        let done = d.wait(9);
        let order: Vec<u16> = done.iter().map(|&(id, _)| id).collect();
        assert_eq!(order.last(), Some(&w), "round {round}: the slow write completes last: {order:?}");
        assert!(reads.iter().all(|r| order.contains(r)));
        assert_eq!(d.status(w), blk::S_OK);
        // The write reads back.
        let r = d.request(blk::T_IN, 800 + round * 8, 4096, 1, false);
        d.kick_if_needed();
        assert_eq!(d.wait(1), vec![(r, 4097)]);
        let mut back = [0u8; 4096];
        d.mem.guest.read_slice(&mut back, GuestAddress(d.data(r))).unwrap();
        assert!(back.iter().all(|&b| b == round as u8 + 1), "round {round}: the write reads back");
    }
    let st = d.stats();
    assert_eq!((st.next_avail, st.next_used, st.in_flight), (d.avail.encode(), d.used.encode(), 0));
    e.stop();
    e.join();
}

/// 16 requests kept in flight over 3000 completions, 1 in 100 held 3 ms by the delay bdev: the
/// order of completions is not the order of submission, the ring wraps over a hundred times,
/// every read matches, the driver asks for a signal at its used position (EVENT_IDX) and waits
/// on the call eventfd alone, and kicks only when the device's event suppression asks.
#[test]
fn a_stream_with_random_latencies_never_loses_a_completion_or_a_signal() {
    let lat = Latencies { avg_read: 0, p99_read: 3_000, avg_write: 0, p99_write: 3_000 };
    let (e, mem) = engine(ReactorMode::Adaptive, lat);
    let mut d = driver(&e, &mem, 0);
    start(&d, "D0", true, 126, Pos::START.encode(), None);
    // Blocks 0..16 hold their number.
    for b in 0..16u64 {
        let id = d.next_id();
        d.mem.guest.write_slice(&[b as u8 + 7; 512], GuestAddress(d.data(id))).unwrap();
        d.request(blk::T_OUT, b, 512, 1, b % 2 == 0);
    }
    d.kick();
    d.wait(16);
    let mut block = vec![0u64; QSIZE as usize];
    let mut order = std::collections::VecDeque::new();
    let submit = |d: &mut Driver, b: u64, order: &mut std::collections::VecDeque<u16>, block: &mut Vec<u64>| {
        let id = d.next_id();
        block[id as usize] = b;
        d.request(blk::T_IN, b, 512, 1 + (b % 2) as u32, b.is_multiple_of(5));
        order.push_back(id);
    };
    for b in 0..16u64 {
        submit(&mut d, b, &mut order, &mut block);
    }
    d.kick_if_needed();
    let (mut done, mut reordered) = (0u32, 0u32);
    while done < 3000 {
        let got = d.wait_strict().unwrap_or_else(|err| panic!("after {done}: {err}"));
        // All of them checked before any id is used again.
        for &(id, len) in &got {
            assert_eq!(len, 513);
            let b = block[id as usize];
            let mut back = [0u8; 512];
            d.mem.guest.read_slice(&mut back, GuestAddress(d.data(id))).unwrap();
            assert!(back.iter().all(|&x| x == b as u8 + 7), "block {b} reads back (id {id}): {:?}", &back[..8]);
            if order.front() != Some(&id) {
                reordered += 1;
            }
            order.retain(|&x| x != id);
            done += 1;
        }
        for &(id, _) in &got {
            submit(&mut d, block[id as usize], &mut order, &mut block);
        }
        d.kick_if_needed();
    }
    eprintln!("3000 reads, {reordered} completed before one submitted earlier");
    assert!(reordered > 0, "1 in 100 held 3 ms: some complete out of order");
    e.stop();
    e.join();
}

/// The driver's event suppression: DISABLE gets no signal however many completions; DESC gets
/// one only once the used descriptor at its offset is written; ENABLE gets one.
#[test]
fn the_driver_turns_signals_off_and_on() {
    let (e, mem) = engine(ReactorMode::Adaptive, no_delay());
    let mut d = driver(&e, &mem, 0);
    start(&d, "M0", true, 126, Pos::START.encode(), None);
    let poll_ring = |d: &mut Driver, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < n {
            assert!(Instant::now() < deadline, "completions stopped");
            while d.take_used().is_some() {
                got += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    for round in 0..10 {
        d.driver_event(EVENT_DISABLE, Pos::START);
        std::thread::sleep(Duration::from_millis(5));
        d.signalled();
        for i in 0..12u64 {
            d.request(blk::T_IN, i, 512, 1, i % 2 == 0);
        }
        d.kick_if_needed();
        poll_ring(&mut d, 12);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!d.signalled(), "round {round}: DISABLE, yet signalled");
        // DESC, 3 buffers on (each of 3 slots): one buffer used is not enough.
        let at = d.used.advance(9, QSIZE);
        d.driver_event(EVENT_DESC, at);
        d.request(blk::T_IN, 1, 512, 1, false);
        d.kick_if_needed();
        poll_ring(&mut d, 1);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!d.signalled(), "round {round}: the event's descriptor is not used yet");
        for _ in 0..3 {
            d.request(blk::T_IN, 1, 512, 1, false);
        }
        d.kick_if_needed();
        poll_ring(&mut d, 3);
        assert!(d.wait_call(2000), "round {round}: the event's descriptor was used: a signal");
        d.driver_event(EVENT_ENABLE, Pos::START);
        d.request(blk::T_IN, 1, 512, 1, true);
        d.kick_if_needed();
        poll_ring(&mut d, 1);
        assert!(d.wait_call(2000), "round {round}: ENABLE: a signal");
    }
    assert!(d.stats().signals >= 20);
    e.stop();
    e.join();
}

/// Chains the driver built wrong: answered IOERR where there is a status byte to put it in,
/// returned with length 0 where there is not, and the queue goes on; a chain over the whole
/// ring, a buffer id twice in flight or past the ring breaks its queue (with an error line)
/// and nothing else: the other queues and the daemon go on.
#[test]
fn malformed_chains_get_ioerr_or_break_their_queue_only() {
    let lat = Latencies { avg_write: 200_000, p99_write: 200_000, ..Default::default() };
    let (e, mem) = engine(ReactorMode::Adaptive, lat);
    let mut d = driver(&e, &mem, 0);
    start(&d, "M0", false, 8, Pos::START.encode(), None);
    let ok_read = |d: &mut Driver| {
        let id = d.request(blk::T_IN, 3, 512, 1, false);
        d.kick();
        assert_eq!(d.wait(1), vec![(id, 513)]);
        assert_eq!(d.status(id), blk::S_OK);
    };
    let hdr = |d: &Driver, id: u16, kind: u32| {
        let h = d.base() + HDRS + 16 * id as u64;
        d.w(h, kind.to_le());
        d.w(h + 8, 0u64);
        d.w(d.base() + STATUS + id as u64, 0xffu8);
        h
    };
    let cases: Vec<(&str, bool, u8)> = vec![
        ("a header outside guest memory", false, blk::S_IOERR),
        ("a direct chain longer than seg_max + 8", false, blk::S_IOERR),
        ("an indirect table of 200", true, blk::S_IOERR),
        ("an indirect table outside guest memory", true, 0xff),
        ("an indirect descriptor at the end of a direct chain", false, 0xff),
        ("an indirect table of no descriptors", true, 0xff),
        ("no writable status byte", false, 0xff),
    ];
    for (i, (what, _, want)) in cases.iter().enumerate() {
        let id = d.next_id();
        let h = hdr(&d, id, blk::T_IN);
        let status = (d.base() + STATUS + id as u64, 1, true);
        let data = (d.data(id), 512, true);
        let t = d.base() + TABLES + id as u64 * TABLE_BYTES;
        match i {
            0 => drop(d.add(&[(1 << 40, 16, false), data, status], false)),
            1 => {
                let mut el = vec![(h, 16, false)];
                el.extend((0..20).map(|k| (d.data(id) + 512 * k, 512, true)));
                el.push(status);
                d.add(&el, false);
            }
            2 => {
                let mut el = vec![(h, 16, false)];
                el.extend((0..198).map(|k| (d.data(id) + 64 * k, 64, true)));
                el.push(status);
                d.add(&el, true);
            }
            3 => drop(d.add_flags(&[(1 << 40, 48, DESC_F_INDIRECT)])),
            // [header NEXT][indirect]: a list of two types.
            4 => drop(d.add_flags(&[(h, 16, 0), (t, 32, DESC_F_INDIRECT)])),
            5 => {
                d.add(&[], true);
            }
            _ => drop(d.add(&[(h, 16, false), (d.data(id), 512, false)], false)),
        }
        d.kick();
        let done = d.wait(1);
        let len = if *want == blk::S_IOERR { 1 } else { 0 };
        assert_eq!(done, vec![(id, len)], "{what}");
        assert_eq!(d.status(id), *want, "{what}");
        ok_read(&mut d);
    }
    assert!(!d.stats().broken, "malformed chains alone do not break the queue");

    // Queue 1: a chain that sets NEXT on every slot.
    let mut d1 = driver(&e, &mem, 1);
    start(&d1, "M0", false, 126, Pos::START.encode(), None);
    ok_read(&mut d1);
    let f = if d1.avail.wrap { DESC_F_AVAIL } else { DESC_F_USED } | DESC_F_NEXT;
    for s in (0..QSIZE).filter(|&s| s != d1.avail.index) {
        d1.flags(s, f);
    }
    fence(Ordering::SeqCst);
    d1.flags(d1.avail.index, f);
    d1.kick();
    // Queue 2: a buffer id twice in flight (the first is a write the delay bdev holds).
    let mut d2 = driver(&e, &mem, 2);
    start(&d2, "D0", false, 126, Pos::START.encode(), None);
    let w = d2.request(blk::T_OUT, 0, 512, 1, false);
    d2.kick();
    std::thread::sleep(Duration::from_millis(20));
    d2.free.push(w);
    d2.request(blk::T_IN, 0, 512, 1, false);
    d2.kick();
    // Queue 3: a buffer id past the ring.
    let mut d3 = driver(&e, &mem, 3);
    start(&d3, "M0", false, 126, Pos::START.encode(), None);
    d3.free.push(QSIZE + 5);
    d3.count.resize(QSIZE as usize + 6, 0);
    d3.request(blk::T_IN, 0, 512, 1, false);
    d3.kick();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ![&d1, &d2, &d3].iter().all(|d| d.stats().broken) {
        assert!(Instant::now() < deadline, "the queues did not stop: {:?}", [&d1, &d2, &d3].map(|d| d.stats()));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The held write still completes on the broken queue; queue 0 goes on.
    assert_eq!(d2.wait(1), vec![(w, 1)]);
    assert!(!d.stats().broken);
    ok_read(&mut d);
    e.stop();
    e.join();
}

/// A daemon killed with requests in flight on a packed ring: the old one is played here by a
/// `PackedRing` and the inflight area's packed calls (three writes taken, the second completed,
/// the third completing when it dies). The next queue gets the front end's stale base (QEMU
/// cannot read a packed ring's positions, so it sends what it sent at the start) and the area:
/// it goes on at the used position the area says, submits exactly the two in flight from their
/// copies in the area, in the order taken, and then serves new requests around the ring.
#[test]
fn a_restart_resubmits_what_was_in_flight_from_the_packed_inflight_area() {
    let (e, mem) = engine(ReactorMode::Adaptive, no_delay());
    let mut d = driver(&e, &mem, 0);
    let (area, _file) = InflightArea::create_packed(1, QSIZE).unwrap();
    // Some traffic first, so that the ring is not at its start.
    start(&d, "M0", false, 126, Pos::START.encode(), area.queue(0, QSIZE));
    for round in 0..5 {
        for i in 0..20u64 {
            d.request(blk::T_IN, i, 512, 1 + (i % 3) as u32, (i + round) % 4 == 0);
        }
        d.kick();
        d.wait(20);
    }
    let (tx, mut rx) = ferrite_reactor::oneshot::channel();
    e.call(0, move || vring::stop(1, 0, tx)).wait().unwrap();
    let base = rx.wait_for(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(base & 0xffff, d.avail.encode() as u32);
    // The old daemon, started at that base.
    let at = Pos::decode(base as u16);
    let mut old_ring = PackedRing::new(mem.clone(), QSIZE, DESC, DRIVER, DEVICE, at, at, false).unwrap();
    let mut old = area.queue(0, QSIZE).unwrap();
    assert_eq!(old.recover_packed(at, |_| None).used, at);
    let mut ids = Vec::new();
    for (k, &(pieces, ind)) in [(3u32, false), (1, false), (2, true)].iter().enumerate() {
        let id = d.next_id();
        d.mem.guest.write_slice(&[0x40 + k as u8; 1024], GuestAddress(d.data(id))).unwrap();
        d.request(blk::T_OUT, 1000 + 2 * k as u64, 1024, pieces, ind);
        ids.push(id);
    }
    let mut taken = Vec::new();
    while let Some(a) = old_ring.pop().unwrap() {
        let entry = old
            .begin_packed(a.count, |i| old_ring.desc_at(((a.slot as u32 + i as u32) % QSIZE as u32) as u16))
            .unwrap();
        taken.push((a, entry));
    }
    assert_eq!(taken.iter().map(|(a, _)| a.id).collect::<Vec<_>>(), ids);
    let ((b, eb), (c, ec)) = (taken[1], taken[2]);
    old.completing_packed(eb, b.count);
    d.w(d.base() + STATUS + b.id as u64, blk::S_OK);
    old_ring.push_used(b.id, 1, b.count);
    old.completed_packed(eb);
    old.completing_packed(ec, c.count);
    drop((old, old_ring));
    assert_eq!(d.wait(1), vec![(b.id, 1)], "the driver saw the one completion");
    // The restarted daemon: QEMU's stale base (the ring's start) and the area.
    start(&d, "M0", false, 126, Pos::START.encode(), area.queue(0, QSIZE));
    let done = d.wait(2);
    assert_eq!(done, vec![(ids[0], 1), (ids[2], 1)], "the two in flight, in the order taken");
    let st = d.stats();
    assert_eq!((st.requests, st.in_flight), (2, 0));
    assert_eq!((st.next_avail, st.next_used), (d.avail.encode(), d.used.encode()));
    // Read the three back: the second was never written (its completion was faked above).
    let mut reads = Vec::new();
    for k in 0..3u64 {
        reads.push(d.request(blk::T_IN, 1000 + 2 * k, 1024, 1, false));
    }
    d.kick();
    d.wait(3);
    for (k, &id) in reads.iter().enumerate() {
        let mut back = [0u8; 1024];
        d.mem.guest.read_slice(&mut back, GuestAddress(d.data(id))).unwrap();
        let want = if k == 1 { 0 } else { 0x40 + k as u8 };
        assert!(back.iter().all(|&x| x == want), "block {k}: want {want:#x}, got {:#x}", back[0]);
    }
    // And the ring goes on, lap after lap.
    for _ in 0..10 {
        for i in 0..30u64 {
            d.request(blk::T_IN, i, 512, 1 + (i % 2) as u32, i % 3 == 0);
        }
        d.kick();
        d.wait(30);
    }
    e.stop();
    e.join();
}
