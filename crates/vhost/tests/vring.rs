//! A queue served by a reactor, driven by a minimal split-ring driver written here (no virtio
//! driver runs on the host; the guest kernel tests in crates/ferrite drive the real one): requests
//! go into the rings in guest memory (a memfd), the kick eventfd is signalled, completions are
//! awaited on the call eventfd, and every write is read back and compared.

use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_vhost::blk;
use ferrite_vhost::inflight::{InflightArea, InflightQueue};
use ferrite_vhost::memory::Memory;
use ferrite_vhost::vring::{self, Device, Setup};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{Address, Bytes, GuestAddress};

const QSIZE: u16 = 128;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const HDRS: u64 = 0x4000;
const STATUS: u64 = 0x6000;
const DATA: u64 = 0x10_0000;
const MEM: u64 = 0x100_0000;

fn memfd(len: u64) -> File {
    // SAFETY: a fresh memfd, owned by the File.
    let fd = unsafe { libc::memfd_create(c"ring-test".as_ptr(), 0) };
    assert!(fd >= 0);
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f.flush().unwrap();
    f
}

fn eventfd() -> File {
    // SAFETY: a fresh eventfd, owned by the File.
    unsafe { File::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) }
}

/// The driver's side of one split ring.
struct Driver {
    engine: Engine,
    mem: Arc<Memory>,
    kick: File,
    call: File,
    avail_idx: u16,
    used_seen: u16,
}

impl Driver {
    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = GuestAddress(DESC + i as u64 * 16);
        let g = &self.mem.guest;
        g.write_obj(addr.to_le(), at).unwrap();
        g.write_obj(len.to_le(), at.unchecked_add(8)).unwrap();
        g.write_obj(flags.to_le(), at.unchecked_add(12)).unwrap();
        g.write_obj(next.to_le(), at.unchecked_add(14)).unwrap();
    }

    /// Queues request `slot` (its descriptors are 3*slot..3*slot+2): header, one data buffer of
    /// `len` bytes, status.
    fn queue(&mut self, slot: u16, kind: u32, sector: u64, len: u32) {
        let g = &self.mem.guest;
        let h = HDRS + slot as u64 * 16;
        g.write_obj(kind.to_le(), GuestAddress(h)).unwrap();
        g.write_obj(0u32, GuestAddress(h + 4)).unwrap();
        g.write_obj(sector.to_le(), GuestAddress(h + 8)).unwrap();
        g.write_obj(0xffu8, GuestAddress(STATUS + slot as u64)).unwrap();
        let (d0, d1, d2) = (3 * slot, 3 * slot + 1, 3 * slot + 2);
        const NEXT: u16 = 1;
        const WRITE: u16 = 2;
        self.desc(d0, h, 16, NEXT, d1);
        let data_flags = if kind == blk::T_IN || kind == blk::T_GET_ID { NEXT | WRITE } else { NEXT };
        self.desc(d1, DATA + slot as u64 * 65536, len, data_flags, d2);
        self.desc(d2, STATUS + slot as u64, 1, WRITE, 0);
        let ring_at = AVAIL + 4 + (self.avail_idx % QSIZE) as u64 * 2;
        g.write_obj(d0.to_le(), GuestAddress(ring_at)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        g.write_obj(self.avail_idx.to_le(), GuestAddress(AVAIL + 2)).unwrap();
    }

    fn kick(&self) {
        let one = 1u64;
        // SAFETY: 8 bytes from a local to an eventfd we own.
        assert_eq!(unsafe { libc::write(self.kick.as_raw_fd(), (&one as *const u64).cast(), 8) }, 8);
    }

    /// EVENT_IDX: asks for a signal once `n` more requests are used (used_event).
    fn want_signal_after(&self, n: u16) {
        let used_event = self.used_seen.wrapping_add(n - 1);
        self.mem.guest.write_obj(used_event.to_le(), GuestAddress(AVAIL + 4 + 2 * QSIZE as u64)).unwrap();
    }

    /// Kicks only if the device asked for it (EVENT_IDX's avail_event), as Linux does.
    fn kick_if_needed(&self, old: u16) {
        let avail_event: u16 = self.mem.guest.read_obj(GuestAddress(USED + 4 + 8 * QSIZE as u64)).unwrap();
        let new = self.avail_idx;
        if new.wrapping_sub(avail_event).wrapping_sub(1) < new.wrapping_sub(old) {
            self.kick();
        }
    }

    fn used_idx(&self) -> u16 {
        self.mem.guest.read_obj::<u16>(GuestAddress(USED + 2)).unwrap()
    }

    /// Waits for `n` more completions trusting the call eventfd alone (an interrupt-driven
    /// driver): a completion found on the used ring without a signal after a wait timed out
    /// is a lost interrupt, returned as an error.
    fn reap_strict(&mut self, n: u16) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.used_idx().wrapping_sub(self.used_seen) < n {
            if Instant::now() >= deadline {
                return Err(format!("no completion in 10 s (used {})", self.used_idx()));
            }
            let before = self.used_idx();
            let mut p = libc::pollfd { fd: self.call.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 500) };
            if p.revents == 0 {
                if self.used_idx() != before || before.wrapping_sub(self.used_seen) > 0 {
                    return Err(format!(
                        "completions on the used ring ({}) without a signal for 500 ms",
                        self.used_idx()
                    ));
                }
                continue;
            }
            let mut v = 0u64;
            // SAFETY: 8 bytes into a local from a readable eventfd.
            unsafe { libc::read(self.call.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        self.used_seen = self.used_seen.wrapping_add(n);
        Ok(())
    }

    /// Waits (on the call eventfd, as an interrupt handler would) until `n` more completions are
    /// on the used ring; returns (head, len) of each.
    fn reap(&mut self, n: u16) -> Vec<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.used_idx().wrapping_sub(self.used_seen) < n {
            if Instant::now() >= deadline {
                let st = self.engine.call(0, || vring::stats(1)).wait().unwrap();
                eprintln!("stats: {st:?}");
            }
            assert!(
                Instant::now() < deadline,
                "completions stopped at used idx {} (want {} more after {})",
                self.used_idx(),
                n,
                self.used_seen
            );
            let mut p = libc::pollfd { fd: self.call.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 100) };
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local (the eventfd is blocking, but poll said readable
            // or timed out: a timeout skips the read).
            if p.revents != 0 {
                unsafe { libc::read(self.call.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
        }
        let mut out = Vec::new();
        for _ in 0..n {
            let at = USED + 4 + (self.used_seen % QSIZE) as u64 * 8;
            let id: u32 = self.mem.guest.read_obj(GuestAddress(at)).unwrap();
            let len: u32 = self.mem.guest.read_obj(GuestAddress(at + 4)).unwrap();
            out.push((id, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

fn setup(mode: ReactorMode, event_idx: bool) -> (Engine, Driver) {
    setup_dev(mode, event_idx, false)
}

fn setup_dev(mode: ReactorMode, event_idx: bool, readonly: bool) -> (Engine, Driver) {
    let (e, d) = engine_and_driver(mode);
    start_queue(&e, &d, event_idx, readonly, 0, None);
    (e, d)
}

/// An engine with bdev M0 (4096 blocks of 512 bytes) and a driver with guest memory, no queue.
fn engine_and_driver(mode: ReactorMode) -> (Engine, Driver) {
    let e = Engine::start(EngineConfig { cores: vec![0], mode, pin: false, ..Default::default() }).expect("engine");
    e.run_async(0, || async {
        malloc::create(MallocOpts { name: Some("M0".into()), num_blocks: 4096, block_size: 512, ..Default::default() })
            .expect("malloc");
    })
    .wait()
    .unwrap();
    let mem =
        Arc::new(Memory::map(&[VhostUserMemoryRegion::new(0, MEM, 0x7f00_0000_0000, 0)], vec![memfd(MEM)]).unwrap());
    let (kick, call) = (eventfd(), eventfd());
    (e.clone(), Driver { engine: e, mem, kick, call, avail_idx: 0, used_seen: 0 })
}

/// Starts queue 0 on the engine's reactor, from `next_avail`, with an inflight area part.
fn start_queue(
    e: &Engine,
    d: &Driver,
    event_idx: bool,
    readonly: bool,
    next_avail: u16,
    inflight: Option<InflightQueue>,
) -> Arc<Device> {
    start_queue_with(e, d, event_idx, readonly, next_avail, inflight, (0, 60_000))
}

/// `start_queue` with coalescing set to (delay_base_us, iops_threshold).
fn start_queue_with(
    e: &Engine,
    d: &Driver,
    event_idx: bool,
    readonly: bool,
    next_avail: u16,
    inflight: Option<InflightQueue>,
    coalescing: (u32, u32),
) -> Arc<Device> {
    let dev = Device {
        ctrlr: "t".into(),
        bdev: "M0".into(),
        readonly,
        packed_ring: false,
        seg_max: 126,
        serial: [b'x'; 20],
        coalescing: Default::default(),
        writeback: true.into(),
    };
    dev.coalescing.set(coalescing.0, coalescing.1).unwrap();
    let dev = Arc::new(dev);
    let s = Setup {
        ctrlr_id: 1,
        index: 0,
        size: QSIZE,
        desc: DESC,
        avail: AVAIL,
        used: USED,
        next_avail,
        packed: false,
        event_idx,
        kick: d.kick.try_clone().unwrap(),
        call: Some(d.call.try_clone().unwrap()),
        mem: d.mem.clone(),
        dev: dev.clone(),
        inflight,
        log: None,
    };
    e.call(0, move || vring::start(s)).wait().unwrap().expect("queue starts");
    dev
}

/// Rounds of 32 writes then 32 reads of the same blocks, each round waited for through the call
/// eventfd with the reactor free to sleep between them; every read matches its write.
fn rounds(mode: ReactorMode, event_idx: bool) {
    let (e, mut d) = setup(mode, event_idx);
    for round in 0..50u64 {
        for slot in 0..32u16 {
            let pattern = (round * 100 + slot as u64) as u8;
            d.mem.guest.write_slice(&[pattern; 4096], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
            d.queue(slot, blk::T_OUT, slot as u64 * 8, 4096);
        }
        d.kick();
        d.want_signal_after(32);
        let done = d.reap(32);
        assert_eq!(done.len(), 32);
        for slot in 0..32u16 {
            assert_eq!(d.mem.guest.read_obj::<u8>(GuestAddress(STATUS + slot as u64)).unwrap(), blk::S_OK);
            d.mem.guest.write_slice(&[0u8; 4096], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
            d.queue(slot, blk::T_IN, slot as u64 * 8, 4096);
        }
        d.kick();
        d.want_signal_after(32);
        let done = d.reap(32);
        assert!(done.iter().all(|&(_, len)| len == 4097), "a read's used length is its data and status: {done:?}");
        for slot in 0..32u16 {
            let pattern = (round * 100 + slot as u64) as u8;
            let mut back = [0u8; 4096];
            d.mem.guest.read_slice(&mut back, GuestAddress(DATA + slot as u64 * 65536)).unwrap();
            assert!(back.iter().all(|&b| b == pattern), "round {round} slot {slot} reads back what it wrote");
        }
        // Let the reactor go idle (and, adaptive, to sleep) between rounds.
        std::thread::sleep(Duration::from_millis(2));
    }
    e.stop();
    e.join();
}

/// A fio-like driver: 32 reads kept in flight, each completion answered at once by a new
/// request, kicks only where the device asks (EVENT_IDX), signals asked for on every completion.
fn streaming(mode: ReactorMode) {
    eprintln!("streaming in {mode:?} mode");
    let (e, mut d) = setup(mode, true);
    for slot in 0..32u16 {
        d.mem.guest.write_slice(&[slot as u8 + 1; 512], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        d.queue(slot, blk::T_OUT, slot as u64, 512);
    }
    d.kick();
    d.want_signal_after(32);
    d.reap(32);
    let mut free: Vec<u16> = Vec::new();
    let old = d.avail_idx;
    for slot in 0..32u16 {
        d.queue(slot, blk::T_IN, slot as u64, 512);
    }
    d.kick_if_needed(old);
    let mut done = 0u32;
    while done < 20_000 {
        d.want_signal_after(1);
        for (head, len) in d.reap(1) {
            assert_eq!(len, 513);
            let slot = (head / 3) as u16;
            let mut b = [0u8; 512];
            d.mem.guest.read_slice(&mut b, GuestAddress(DATA + slot as u64 * 65536)).unwrap();
            assert!(b.iter().all(|&x| x == slot as u8 + 1), "slot {slot} reads back its block");
            free.push(slot);
            done += 1;
        }
        let old = d.avail_idx;
        for slot in free.drain(..) {
            d.queue(slot, blk::T_IN, slot as u64, 512);
        }
        d.kick_if_needed(old);
    }
    e.stop();
    e.join();
}

#[test]
fn streaming_requests_complete_in_every_mode() {
    streaming(ReactorMode::Adaptive);
    streaming(ReactorMode::Interrupt);
    streaming(ReactorMode::Poll);
}

#[test]
fn requests_complete_in_adaptive_mode() {
    rounds(ReactorMode::Adaptive, false);
    rounds(ReactorMode::Adaptive, true);
}

#[test]
fn requests_complete_in_interrupt_mode() {
    rounds(ReactorMode::Interrupt, false);
    rounds(ReactorMode::Interrupt, true);
}

#[test]
fn requests_complete_in_poll_mode() {
    rounds(ReactorMode::Poll, false);
    rounds(ReactorMode::Poll, true);
}

/// A read-only device answers IOERR to writes, discards and write zeroes without touching the
/// bdev, and serves reads; an unknown request type gets UNSUPP; GET_ID answers the serial.
#[test]
fn read_only_devices_refuse_writes_and_unknown_types_are_unsupported() {
    let (e, mut d) = setup_dev(ReactorMode::Adaptive, false, true);
    d.mem.guest.write_slice(&[7u8; 512], GuestAddress(DATA)).unwrap();
    d.queue(0, blk::T_OUT, 0, 512);
    d.queue(1, blk::T_IN, 0, 512);
    d.queue(2, blk::T_WRITE_ZEROES, 0, 16);
    d.queue(3, 99, 0, 512);
    d.queue(4, blk::T_GET_ID, 0, 20);
    d.mem.guest.write_slice(&[0u8; 16], GuestAddress(DATA + 2 * 65536)).unwrap();
    d.kick();
    let mut done = d.reap(5);
    done.sort_unstable();
    let status = |slot: u64| d.mem.guest.read_obj::<u8>(GuestAddress(STATUS + slot)).unwrap();
    assert_eq!(status(0), blk::S_IOERR, "a write to a read-only device");
    assert_eq!(status(1), blk::S_OK, "a read from a read-only device");
    assert_eq!(status(2), blk::S_IOERR, "write zeroes to a read-only device");
    assert_eq!(status(3), blk::S_UNSUPP, "an unknown request type");
    assert_eq!(status(4), blk::S_OK, "GET_ID");
    let mut back = [1u8; 512];
    d.mem.guest.read_slice(&mut back, GuestAddress(DATA + 65536)).unwrap();
    assert!(back.iter().all(|&b| b == 0), "the refused write did not reach the bdev");
    let mut id = [0u8; 20];
    d.mem.guest.read_slice(&mut id, GuestAddress(DATA + 4 * 65536)).unwrap();
    assert_eq!(&id, &[b'x'; 20], "GET_ID answers the serial");
    assert_eq!(done.iter().map(|&(_, len)| len).collect::<Vec<_>>(), vec![1, 513, 1, 1, 21], "used lengths");
    e.stop();
    e.join();
}

/// A daemon killed with requests in flight: the next one, handed the same inflight area and
/// the ring put back at its used index (what QEMU does), submits exactly the requests that were
/// taken and not completed, in the order they were taken, and goes on from past them; the one
/// that had completed is not done twice. Every write is read back.
#[test]
fn a_restart_resubmits_what_was_in_flight_from_the_inflight_area() {
    let (e, mut d) = engine_and_driver(ReactorMode::Adaptive);
    let (area, _file) = InflightArea::create(1, QSIZE).unwrap();
    let mut old = area.queue(0, QSIZE).unwrap();
    assert!(old.recover(0).is_empty());
    // Three writes in the ring (heads 0, 3, 6); the old daemon took all three and completed
    // only the second (head 3), then died.
    for slot in 0..3u16 {
        d.mem.guest.write_slice(&[0x40 + slot as u8; 512], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        d.queue(slot, blk::T_OUT, 10 + slot as u64, 512);
    }
    for head in [0, 3, 6] {
        old.begin(head);
    }
    old.completing(3);
    d.mem.guest.write_obj(3u32, GuestAddress(USED + 4)).unwrap();
    d.mem.guest.write_obj(1u32, GuestAddress(USED + 8)).unwrap();
    d.mem.guest.write_obj(1u16, GuestAddress(USED + 2)).unwrap();
    old.completed(3, 1);
    d.mem.guest.write_obj(blk::S_OK, GuestAddress(STATUS + 1)).unwrap();
    drop(old);
    d.used_seen = 1;
    // The restarted daemon: the ring put back at the used index.
    start_queue(&e, &d, false, false, 1, area.queue(0, QSIZE));
    let done = d.reap(2);
    let heads: Vec<u32> = done.iter().map(|&(h, _)| h).collect();
    assert_eq!(heads, vec![0, 6], "the two requests in flight, in the order taken, and not the completed one");
    let st = e.call(0, || vring::stats(1)).wait().unwrap();
    assert_eq!(st[0].next_avail, 3, "the queue goes on past what was taken");
    assert_eq!(st[0].requests, 2, "nothing else was taken");
    // Read the three blocks back: slots 0 and 2 were written by the restarted daemon; slot 1's
    // block was never written (its completion was faked above), so it reads zeroes.
    for slot in 0..3u16 {
        d.mem.guest.write_slice(&[0xffu8; 512], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        d.queue(slot, blk::T_IN, 10 + slot as u64, 512);
    }
    d.kick();
    d.reap(3);
    for slot in 0..3u16 {
        let mut b = [0u8; 512];
        d.mem.guest.read_slice(&mut b, GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        let want = if slot == 1 { 0 } else { 0x40 + slot as u8 };
        assert!(b.iter().all(|&x| x == want), "slot {slot}: want {want:#x}, got {:#x}", b[0]);
    }
    e.stop();
    e.join();
}

#[test]
fn writes_in_writethrough_mode_are_flushed_before_they_complete() {
    use std::sync::atomic::Ordering::Relaxed;
    let (e, mut d) = engine_and_driver(ReactorMode::Adaptive);
    let dev = start_queue(&e, &d, true, false, 0, None);
    let flushes = |e: &Engine| {
        e.call(0, || ferrite_bdev::channel::local_iostat(ferrite_bdev::lookup("M0").unwrap().id()).num_flush_ops)
            .wait()
            .unwrap()
    };
    let round = |d: &mut Driver, kind: u32, first: u16| {
        for slot in first..first + 8 {
            d.mem.guest.write_slice(&[slot as u8 ^ 0x5a; 4096], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
            d.queue(slot, kind, slot as u64 * 8, 4096);
        }
        d.kick();
        d.want_signal_after(8);
        d.reap(8);
    };
    // Writeback (the default): writes go as they are; the driver flushes when it wants.
    round(&mut d, blk::T_OUT, 0);
    assert_eq!(flushes(&e), 0);
    // The driver turns the cache to writethrough: each write is followed by a flush, and only
    // writes are.
    dev.writeback.store(false, Relaxed);
    round(&mut d, blk::T_OUT, 8);
    assert_eq!(flushes(&e), 8, "one flush per write");
    round(&mut d, blk::T_IN, 0);
    assert_eq!(flushes(&e), 8, "reads are not flushed");
    for slot in 0..8u16 {
        assert_eq!(d.mem.guest.read_obj::<u8>(GuestAddress(STATUS + slot as u64)).unwrap(), blk::S_OK);
        let mut b = [0u8; 4096];
        d.mem.guest.read_slice(&mut b, GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        assert!(b.iter().all(|&x| x == slot as u8 ^ 0x5a), "slot {slot} reads back");
    }
    e.stop();
    e.join();
}

/// The bits of a dirty log (one per 4 KiB page) that are set.
fn dirty_pages(log: &File) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; 512];
    log.read_exact_at(&mut b, 0).unwrap();
    (0..b.len() as u64 * 8).filter(|&p| b[p as usize / 8] & (1 << (p % 8)) != 0).collect()
}

#[test]
fn a_migration_s_dirty_log_gets_every_page_the_device_writes_and_no_other() {
    use ferrite_vhost::dirty::DirtyLog;
    let (e, mut d) = setup(ReactorMode::Adaptive, true);
    // 16 MiB of guest memory: 4096 pages, 512 bytes of log.
    let file = memfd(512);
    let log = Arc::new(DirtyLog::map(&file, 512, 0).unwrap());
    let l = log.clone();
    e.call(0, move || vring::set_log(1, Some(l))).wait().unwrap();
    let page = |gpa: u64| gpa / 4096;
    assert_eq!(dirty_pages(&file), vec![page(USED)], "logging starts with the used ring");
    // Slots 0..4 write 8 KiB each (the device only reads their data)...
    for slot in 0..4u16 {
        d.mem.guest.write_slice(&[slot as u8; 8192], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        d.queue(slot, blk::T_OUT, slot as u64 * 16, 8192);
    }
    d.kick();
    d.want_signal_after(4);
    d.reap(4);
    assert_eq!(dirty_pages(&file), vec![page(USED), page(STATUS)], "status bytes and the used ring");
    // ... then slots 4..8 read it back.
    for slot in 4..8u16 {
        d.mem.guest.write_slice(&[0xee; 8192], GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        d.queue(slot, blk::T_IN, (slot as u64 - 4) * 16, 8192);
    }
    d.kick();
    d.want_signal_after(4);
    d.reap(4);
    let mut want = vec![page(STATUS), page(USED)];
    for slot in 4..8u64 {
        want.extend([page(DATA + slot * 65536), page(DATA + slot * 65536) + 1]);
    }
    want.sort_unstable();
    assert_eq!(dirty_pages(&file), want, "read data, status bytes, the used ring; not the written data or headers");
    for slot in 4..8u16 {
        let mut b = [0u8; 8192];
        d.mem.guest.read_slice(&mut b, GuestAddress(DATA + slot as u64 * 65536)).unwrap();
        assert!(b.iter().all(|&x| x == slot as u8 - 4), "slot {slot} reads what slot {} wrote", slot - 4);
    }
    // The migration ends: nothing more is marked.
    e.call(0, || vring::set_log(1, None)).wait().unwrap();
    file.set_len(0).unwrap();
    file.set_len(512).unwrap();
    d.queue(4, blk::T_IN, 0, 8192);
    d.kick();
    d.want_signal_after(1);
    d.reap(1);
    assert_eq!(dirty_pages(&file), Vec::<u64>::new(), "no log without a migration");
    assert_eq!(log.missed(), 0);
    e.stop();
    e.join();
}

/// Signals sent for `total` reads kept 32 deep by an interrupt-driven driver (it waits on the
/// call eventfd alone and resubmits what completed), with coalescing set to `coalescing`.
fn signals_for_streaming(mode: ReactorMode, coalescing: (u32, u32), total: u64) -> u64 {
    let (e, mut d) = engine_and_driver(mode);
    start_queue_with(&e, &d, false, false, 0, None, coalescing);
    for slot in 0..32u16 {
        d.queue(slot, blk::T_IN, slot as u64, 512);
    }
    d.kick();
    let mut completed = 0u64;
    while completed < total {
        d.reap_strict(1).unwrap_or_else(|err| panic!("{mode:?} {coalescing:?}: {err}"));
        let mut done = 1u16;
        // Take whatever else completed with it, then resubmit as many.
        let more = d.used_idx().wrapping_sub(d.used_seen);
        d.used_seen = d.used_seen.wrapping_add(more);
        done += more;
        for i in 0..done {
            d.queue((completed as u16 + i) % 32, blk::T_IN, 0, 512);
        }
        d.kick();
        completed += done as u64;
    }
    let st = e.call(0, || vring::stats(1)).wait().unwrap();
    e.stop();
    e.join();
    st[0].signals
}

/// Coalescing on (1 ms base, a threshold of 10,000 IOPS): in every mode an interrupt-driven
/// driver never waits on a signal that was held back (in adaptive and interrupt mode the sleep
/// hook sends it before the reactor sleeps; on a polling reactor the held-back signal goes when
/// its delay ends). How many signals coalescing saves depends on timing, so it is printed, not
/// asserted (the spacing rule itself is unit-tested in `coalesce`).
#[test]
fn coalescing_never_holds_a_signal_back_from_a_waiting_driver() {
    for mode in [ReactorMode::Poll, ReactorMode::Adaptive, ReactorMode::Interrupt] {
        let off = signals_for_streaming(mode, (0, 60_000), 20_000);
        let on = signals_for_streaming(mode, (1_000, 10_000), 20_000);
        eprintln!("{mode:?}: 20000 reads: {off} signals without coalescing, {on} with");
    }
}
