//! A verifying I/O driver for the no-allocation tests of the initiators (`nvmf_no_alloc.rs`,
//! `iscsi_host_no_alloc.rs`): a target and a host, each an engine of one reactor in this
//! process configured through the RPC handlers `ferrite serve` uses ([`Side`]), and a driver on
//! the host's reactor that keeps `QD` requests outstanding on a host bdev, each queue slot
//! resubmitting its request from its completion with the slot's own pool buffer. [`cases`]
//! reads both reactors' allocation counts around measured runs (after a warm-up): 4 KiB random
//! reads and writes, 128 KiB random reads and writes, and both sizes mixed.
//!
//! Every read is compared with what was last written to its blocks (the driver keeps a shadow
//! of the bdev's contents; a bdev that does not store, the null bdev, reads zeroes), and every
//! case that writes is followed by a read of the whole bdev, compared the same way.
//!
//! `FERRITE_ALLOC_TRACE=N` prints the backtraces of the first N allocations on each reactor
//! during each measured run. The test that uses it installs the counting allocator
//! (`ferrite_alloc_count::Counting`) as its global allocator.

use ferrite_bdev::{Bdev, BdevDesc, Completed, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_reactor::{Engine, EngineConfig, IoBuf, ReactorMode};
use ferrite_rpc::{Ctx, Params, Registry};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Block size of both bdevs.
const BS: u64 = 4096;
/// Blocks of a 128 KiB I/O; the bdev is split into chunks of this size.
const CHUNK: u64 = 32;
/// Chunks of each bdev (32 MiB).
const CHUNKS: u64 = 256;
/// Requests the driver keeps outstanding.
const QD: usize = 16;
/// Allocations a side may make in one measured run, besides `SLACK_PER_S` per second of it:
/// timers that fire by the clock, not by I/O, land in a run. Idle, a target allocates about once
/// a second (its connection watchdog re-arms its timer, a boxed callback), the NVMe/TCP
/// host three times per keep-alive (every 5 s), and the iSCSI initiator's session watchdog arms
/// a timer once a second while there is work. A run lasts well under a second in a release
/// build and several seconds in a debug build on a busy machine; an allocation per I/O, or per
/// 1% of I/Os, is still far beyond this.
const SLACK: u64 = 3;
/// Allocations a side may make per second of a measured run (see `SLACK`): measured 1.5-2.3 a
/// second in debug builds on a loaded 2-core machine (2 was exceeded in CI); an allocation per
/// 1% of a run's I/Os is still beyond it.
const SLACK_PER_S: u64 = 3;

/// What a run of the driver does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// Random reads of the run's size.
    RandRead,
    /// Random writes of the run's size.
    RandWrite,
    /// Random reads and writes, half each, each 4 KiB or 128 KiB at random.
    Mixed,
    /// Writes every chunk once, in order (128 KiB each).
    FillAll,
    /// Reads every chunk once, in order (128 KiB each), comparing it with the shadow.
    ReadAll,
}

/// One run: a pattern, the size of its I/Os in blocks (for the random patterns but `Mixed`)
/// and how many I/Os it makes.
#[derive(Clone, Copy, Debug)]
struct Run {
    pattern: Pattern,
    blocks: u64,
    ios: u64,
}

/// What the driver tells the test thread.
#[derive(Default)]
struct Progress {
    /// Set when a run's last request completed.
    idle: AtomicBool,
    /// Requests completed (all runs).
    ios: AtomicU64,
    /// Requests that failed.
    failed: AtomicU64,
    /// Reads whose data differed from what was written.
    mismatched: AtomicU64,
    /// The first failure or mismatch.
    first_error: Mutex<Option<String>>,
}

impl Progress {
    fn note(&self, what: String) {
        self.first_error.lock().unwrap().get_or_insert(what);
    }
}

/// The I/O generator on the host's reactor: QD slots, each owning one 128 KiB pool buffer and
/// one request in flight, resubmitted in place from its completion.
struct Driver {
    ch: IoChannel,
    _desc: BdevDesc,
    /// This driver as the completer of its requests (a cycle, broken by `close_driver`).
    me: Option<Rc<dyn IoCompleter>>,
    /// False for the null bdev: writes are dropped and reads return zeroes.
    stores: bool,
    /// Per block, the seed of the pattern last written there.
    shadow: Vec<u64>,
    /// Per slot, the seed of its write in flight.
    seeds: Vec<u64>,
    /// Per slot, its buffer while no request holds it (between runs).
    bufs: Vec<Option<IoBuf>>,
    run: Run,
    /// Requests of the run not yet submitted.
    left: u64,
    /// Next chunk of a sequential pattern.
    cursor: u64,
    in_flight: usize,
    rng: u64,
    next_seed: u64,
    progress: Arc<Progress>,
}

struct DriverCell(RefCell<Driver>);

thread_local! {
    /// The driver, on the host's reactor.
    static DRIVER: RefCell<Option<Rc<DriverCell>>> = const { RefCell::new(None) };
}

fn xorshift(s: &mut u64) -> u64 {
    let mut x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    x
}

/// Word `i` of block `block` written with `seed` (seed 0: zeroes, as never written).
fn word(seed: u64, block: u64, i: usize) -> u64 {
    if seed == 0 {
        return 0;
    }
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (block << 20) ^ i as u64
}

fn fill_block(buf: &mut [u8], seed: u64, block: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(seed, block, i).to_le_bytes());
    }
}

fn block_matches(buf: &[u8], seed: u64, block: u64) -> bool {
    buf.chunks_exact(8).enumerate().all(|(i, w)| w == word(seed, block, i).to_le_bytes())
}

impl Driver {
    /// Turns `req` (holding the slot's buffer) into the slot's next request, in place.
    fn prepare(&mut self, slot: usize, req: &mut IoRequest) {
        let (write, blocks, offset) = match self.run.pattern {
            Pattern::FillAll | Pattern::ReadAll => {
                let c = self.cursor;
                self.cursor += 1;
                (self.run.pattern == Pattern::FillAll, CHUNK, c * CHUNK)
            }
            p => {
                let r = xorshift(&mut self.rng);
                let write = match p {
                    Pattern::RandRead => false,
                    Pattern::RandWrite => true,
                    _ => r & 1 == 1,
                };
                let blocks = if p == Pattern::Mixed { [1, CHUNK][(r >> 1) as usize & 1] } else { self.run.blocks };
                // Only the slot's own chunks, so that no two requests in flight share a block
                // and the shadow stays exact.
                let chunk = slot as u64 + QD as u64 * ((r >> 8) % (CHUNKS / QD as u64));
                let within = if blocks == CHUNK { 0 } else { (r >> 40) % CHUNK };
                (write, blocks, chunk * CHUNK + within)
            }
        };
        req.io_type = if write { IoType::Write } else { IoType::Read };
        req.offset_blocks = offset;
        req.num_blocks = blocks;
        let buf = &mut req.bufs[0];
        buf.set_len((blocks * BS) as usize);
        if write {
            self.next_seed += 1;
            self.seeds[slot] = self.next_seed;
            for (i, b) in buf.chunks_exact_mut(BS as usize).enumerate() {
                fill_block(b, self.next_seed, offset + i as u64);
            }
        }
    }

    /// True if `buf` holds what was last written to the `blocks` blocks at `offset`.
    fn read_matches(&self, buf: Option<&IoBuf>, offset: u64, blocks: u64) -> bool {
        let Some(buf) = buf.filter(|b| b.len() as u64 == blocks * BS) else { return false };
        buf.chunks_exact(BS as usize).enumerate().all(|(i, b)| {
            let block = offset + i as u64;
            block_matches(b, if self.stores { self.shadow[block as usize] } else { 0 }, block)
        })
    }
}

impl DriverCell {
    /// Starts `run` with up to QD requests (the rest follow from completions).
    pub fn start(&self, run: Run) {
        let mut d = self.0.borrow_mut();
        let d = &mut *d;
        d.run = run;
        d.left = run.ios;
        d.cursor = 0;
        let me = d.me.clone().expect("driver open");
        for slot in 0..QD {
            if d.left == 0 {
                break;
            }
            d.left -= 1;
            let mut req = IoRequest::new(IoType::Read, 0, 0);
            req.bufs.push(d.bufs[slot].take().expect("the slot's buffer is home between runs"));
            d.prepare(slot, &mut req);
            d.in_flight += 1;
            d.ch.submit(req, me.clone(), slot as u64);
        }
    }
}

impl IoCompleter for DriverCell {
    fn io_done(&self, tag: u64, mut io: Completed) {
        let mut d = self.0.borrow_mut();
        let d = &mut *d;
        let slot = tag as usize;
        d.in_flight -= 1;
        let (offset, blocks, io_type) = (io.req.offset_blocks, io.req.num_blocks, io.req.io_type);
        if io.status != IoStatus::Success {
            d.progress.failed.fetch_add(1, Ordering::Relaxed);
            d.progress.note(format!("{io_type:?} of {blocks} blocks at {offset} failed: {}", io.status));
        } else if io_type == IoType::Write {
            if d.stores {
                let seed = d.seeds[slot];
                d.shadow[offset as usize..(offset + blocks) as usize].fill(seed);
            }
        } else if !d.read_matches(io.req.bufs.first(), offset, blocks) {
            d.progress.mismatched.fetch_add(1, Ordering::Relaxed);
            d.progress.note(format!("read of {blocks} blocks at {offset}: not what was written"));
        }
        d.progress.ios.fetch_add(1, Ordering::Relaxed);
        if d.left > 0 {
            d.left -= 1;
            d.prepare(slot, &mut io.req);
            d.in_flight += 1;
            let me = d.me.clone().expect("driver open");
            d.ch.resubmit(io, me, tag);
        } else {
            d.bufs[slot] = io.req.bufs.pop();
            drop(io);
            if d.in_flight == 0 {
                d.progress.idle.store(true, Ordering::Release);
            }
        }
    }
}

/// This thread's allocations so far.
fn allocs() -> u64 {
    ferrite_alloc_count::allocs()
}

/// One side: an engine of one reactor and the RPC context its methods run with.
pub struct Side {
    /// Its engine.
    pub engine: Engine,
    ctx: Ctx,
}

impl Side {
    /// Starts a one-reactor engine (on CPU `core`, unpinned) with the methods `register` adds,
    /// in the runtime RPC state.
    pub fn start(core: usize, register: impl FnOnce(&mut Registry)) -> Side {
        let engine = Engine::start(EngineConfig {
            cores: vec![core],
            mode: ReactorMode::Adaptive,
            pin: false,
            ..Default::default()
        })
        .expect("engine starts");
        let ctx = Ctx { engine: engine.clone(), registry: Arc::new(ferrite_rpc::app::registry(register)) };
        let c = ctx.clone();
        engine
            .run_async(0, move || async move { ferrite_rpc::config::start_framework(&c).await })
            .wait()
            .expect("reactor answers")
            .expect("framework starts");
        Side { engine, ctx }
    }

    /// Calls an RPC method on the reactor, as the daemon's RPC server does.
    pub fn rpc(&self, method: &'static str, params: Value) -> Result<Value, String> {
        let c = self.ctx.clone();
        self.engine
            .run_async(0, move || async move { Registry::call(&c, method, Params(Some(params))).await })
            .wait()
            .expect("reactor answers")
            .map_err(|e| format!("{method}: {e}"))
    }

    /// The reactor's allocations so far (read by a message, which allocates nothing there).
    pub fn allocs(&self) -> u64 {
        self.engine.call(0, allocs).wait().expect("reactor answers")
    }

    /// Makes the reactor print the backtraces of its next `n` allocations.
    fn trace(&self, n: u32) {
        self.engine.call(0, move || ferrite_alloc_count::trace_next(n)).wait().expect("reactor answers");
    }

    pub fn stop(self) {
        self.engine.stop();
        self.engine.join();
    }
}

/// The target side (core 0): the bdev methods and those `register` adds, and a malloc bdev
/// Malloc0 and a null bdev Null0 of the driver's geometry.
pub fn target_side(register: impl FnOnce(&mut Registry)) -> Side {
    let t = Side::start(0, |reg| {
        ferrite_modules::register_builtin();
        ferrite_bdev::rpc::register(reg);
        register(reg);
    });
    let blocks = CHUNKS * CHUNK;
    t.rpc("bdev_malloc_create", json!({"name": "Malloc0", "num_blocks": blocks, "block_size": BS})).unwrap();
    t.rpc("bdev_null_create", json!({"name": "Null0", "num_blocks": blocks, "block_size": BS})).unwrap();
    t
}

/// The host side (core 1): the bdev methods and those `register` adds.
pub fn host_side(register: impl FnOnce(&mut Registry)) -> Side {
    Side::start(1, |reg| {
        ferrite_modules::register_builtin();
        ferrite_bdev::rpc::register(reg);
        register(reg);
    })
}

/// A free port of 127.0.0.1 that `listen` took (true), found by binding port 0; another may
/// take it before the target does, so up to 20 are tried.
pub fn listen_on_free_port(mut listen: impl FnMut(u16) -> bool) -> u16 {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if listen(port) {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 for the target");
}

/// Opens `bdev` on the host's reactor and sets up the driver there (with its buffers).
fn open_driver(h: &Side, bdev: &'static str, stores: bool, progress: Arc<Progress>) {
    h.engine
        .run_async(0, move || async move {
            let desc = Bdev::open(bdev, true, || {}).expect("host bdev opens");
            let ch = desc.channel().expect("channel");
            assert_eq!((ch.block_size() as u64, ch.num_blocks()), (BS, CHUNKS * CHUNK), "{bdev}'s geometry");
            let cell = Rc::new(DriverCell(RefCell::new(Driver {
                ch,
                _desc: desc,
                me: None,
                stores,
                shadow: vec![0; (CHUNKS * CHUNK) as usize],
                seeds: vec![0; QD],
                bufs: (0..QD).map(|_| Some(ferrite_reactor::alloc_buf((CHUNK * BS) as usize))).collect(),
                run: Run { pattern: Pattern::ReadAll, blocks: CHUNK, ios: 0 },
                left: 0,
                cursor: 0,
                in_flight: 0,
                rng: 0x2545_f491_4f6c_dd1d,
                next_seed: 0,
                progress,
            })));
            let me: Rc<dyn IoCompleter> = cell.clone();
            cell.0.borrow_mut().me = Some(me);
            DRIVER.with(|d| *d.borrow_mut() = Some(cell));
        })
        .wait()
        .expect("reactor answers");
}

/// Drops the driver (its descriptor, channel and buffers).
fn close_driver(h: &Side) {
    h.engine
        .call(0, || {
            if let Some(d) = DRIVER.with(|d| d.borrow_mut().take()) {
                d.0.borrow_mut().me = None;
            }
        })
        .wait()
        .expect("reactor answers");
}

/// Makes `run` on the host's driver and waits until its last request completed.
fn drive(h: &Side, progress: &Progress, run: Run) {
    progress.idle.store(false, Ordering::Release);
    h.engine
        .call(0, move || DRIVER.with(|d| d.borrow().as_ref().expect("driver open").start(run)))
        .wait()
        .expect("reactor answers");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !progress.idle.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "{run:?} did not finish");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A measured case.
struct Case {
    name: &'static str,
    pattern: Pattern,
    blocks: u64,
    warm: u64,
    ios: u64,
}

const CASES: [Case; 5] = [
    Case { name: "4 KiB randread", pattern: Pattern::RandRead, blocks: 1, warm: 2_000, ios: 20_000 },
    Case { name: "4 KiB randwrite", pattern: Pattern::RandWrite, blocks: 1, warm: 2_000, ios: 20_000 },
    Case { name: "128 KiB randread", pattern: Pattern::RandRead, blocks: CHUNK, warm: 1_000, ios: 5_000 },
    Case { name: "128 KiB randwrite", pattern: Pattern::RandWrite, blocks: CHUNK, warm: 1_000, ios: 5_000 },
    Case { name: "mixed 4/128 KiB read/write", pattern: Pattern::Mixed, blocks: 0, warm: 2_000, ios: 10_000 },
];

/// Runs every case on host bdev `bdev`; returns the failures found (data and allocations).
pub fn cases(t: &Side, h: &Side, bdev: &'static str, stores: bool) -> Vec<String> {
    let progress = Arc::new(Progress::default());
    open_driver(h, bdev, stores, progress.clone());
    let trace = ferrite_alloc_count::trace_from_env();
    let mut failures = Vec::new();
    // Known contents before the first read.
    drive(h, &progress, Run { pattern: Pattern::FillAll, blocks: CHUNK, ios: CHUNKS });
    drive(h, &progress, Run { pattern: Pattern::ReadAll, blocks: CHUNK, ios: CHUNKS });
    for c in &CASES {
        let t0 = Instant::now();
        drive(h, &progress, Run { pattern: c.pattern, blocks: c.blocks, ios: c.warm });
        if trace > 0 {
            h.trace(trace);
            t.trace(trace);
        }
        let (h0, t0a) = (h.allocs(), t.allocs());
        let measured = Instant::now();
        drive(h, &progress, Run { pattern: c.pattern, blocks: c.blocks, ios: c.ios });
        let (h1, t1a) = (h.allocs(), t.allocs());
        let allowed = SLACK + SLACK_PER_S * measured.elapsed().as_secs_f64().ceil() as u64;
        if trace > 0 {
            h.trace(0);
            t.trace(0);
        }
        if c.pattern != Pattern::RandRead {
            // What the case wrote, read back.
            drive(h, &progress, Run { pattern: Pattern::ReadAll, blocks: CHUNK, ios: CHUNKS });
        }
        let (host, target) = (h1 - h0, t1a - t0a);
        eprintln!(
            "{bdev} {:<27} {} I/Os: host {host} allocations ({:.4}/I/O), target {target} ({:.4}/I/O), {:.2} s",
            c.name,
            c.ios,
            host as f64 / c.ios as f64,
            target as f64 / c.ios as f64,
            t0.elapsed().as_secs_f64()
        );
        for (side, n) in [("host", host), ("target", target)] {
            if n > allowed {
                failures.push(format!(
                    "{bdev} {}: the {side} allocated {n} times in {} I/Os, more than the {allowed} the clock \
                     explains (FERRITE_ALLOC_TRACE=N shows where)",
                    c.name, c.ios
                ));
            }
        }
    }
    close_driver(h);
    let (failed, mismatched) = (progress.failed.load(Ordering::Relaxed), progress.mismatched.load(Ordering::Relaxed));
    if failed + mismatched > 0 {
        let first = progress.first_error.lock().unwrap().clone().unwrap_or_default();
        failures.push(format!("{bdev}: {failed} I/Os failed, {mismatched} reads mismatched; first: {first}"));
    }
    failures
}

/// Checks that the counter sees what `side`'s reactor allocates: one allocation made there
/// counts one. The reactor's own timers (a watchdog, a reconnect) may allocate between the two
/// reads, so a few tries are allowed; one must count exactly one.
pub fn check_counting(side: &Side) {
    let mut seen = Vec::new();
    for _ in 0..10 {
        let before = side.allocs();
        side.engine.call(0, || drop(std::hint::black_box(Box::new(7u64)))).wait().expect("reactor answers");
        let n = side.allocs() - before;
        if n == 1 {
            return;
        }
        seen.push(n);
    }
    panic!("an allocation on the reactor is not counted there as one: {seen:?}");
}
