//! QoS rate limits (`bdev_set_qos_limit`): I/O per second and MiB per second (read and write
//! together, reads only, writes only), enforced by the bdev layer across every core.
//!
//! SPDK funnels every I/O of a bdev with QoS through one "QoS thread". Ferrite keeps each core
//! submitting on its own: the bdev has one shared token bucket per limit (`Bucket`, atomics),
//! and each core's channel takes tokens from it in batches into core-local credit, so most I/Os
//! touch no shared memory at all. The bucket is refilled by time, in 1 ms slices as SPDK's
//! poller does: whoever finds it empty credits the slices elapsed since the last refill (at
//! most [`MAX_CATCHUP_SLICES`]); quota not used in its slice is dropped (no bursts after idle
//! time), and an I/O larger than what is left may overdraw it, the debt carried into the next
//! slice (as SPDK). Tokens accrue as `slices × rate / 1000` computed from the start, so rates that
//! are not multiples of 1000 lose nothing to rounding.
//!
//! Reads and writes are limited (SPDK's `bdev_qos_io_to_limit`); other types pass. A request
//! over a limit waits in its channel's QoS queue, and later requests that need that limit queue
//! behind it, in order; a request that needs none of the limits something waits for may pass
//! (a write is not held up by reads waiting for `r_mbytes_per_sec`, as in SPDK, whose QoS
//! poller submits every queued request the limits allow). A 1 ms timer of the channel releases
//! what the bucket allows. Aborts find queued requests; while the bdev is being removed (or the
//! limits are cleared) the queue is released at once.
//!
//! Cost: while no limit is set, one `Cell<bool>` test per read or write. With limits: per I/O a
//! few core-local additions; a compare-and-swap on the shared bucket once per batch (1/8 of a
//! slice's quota, at least one I/O), and a timer per channel per millisecond while requests wait.

use crate::bdev::{lookup, Bdev, BdevError};
use crate::channel::ChannelInner;
use crate::io::{BdevIo, IoType};
use crate::rpc::not_found;
use ferrite_rpc::{errno_error, Registry};
use serde::Deserialize;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// SPDK's QoS timeslice (`SPDK_BDEV_QOS_TIMESLICE_IN_USEC`).
pub const TIMESLICE: Duration = Duration::from_millis(1);
/// Most slices credited at one refill (10 ms of quota): a late refill loses nothing, and an idle
/// bdev cannot save up a burst.
pub const MAX_CATCHUP_SLICES: u64 = 10;
/// `rw_ios_per_sec` is rounded up to a multiple of this (`SPDK_BDEV_QOS_MIN_IOS_PER_SEC`).
pub const MIN_IOS_PER_SEC: u64 = 1000;
/// Largest MiB/s limit (`SPDK_BDEV_QOS_MAX_MBYTES_PER_SEC`: more would overflow bytes/s).
pub const MAX_MBYTES_PER_SEC: u64 = u64::MAX / (1024 * 1024);

/// The limits, in SPDK's RPC units; 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Reads and writes per second (a multiple of 1000).
    pub rw_ios_per_sec: u64,
    /// MiB per second of reads and writes.
    pub rw_mbytes_per_sec: u64,
    /// MiB per second of reads.
    pub r_mbytes_per_sec: u64,
    /// MiB per second of writes.
    pub w_mbytes_per_sec: u64,
}

/// SPDK's names of the limits, in `QosLimits` order.
pub const LIMIT_NAMES: [&str; 4] = ["rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec"];

impl QosLimits {
    fn as_array(&self) -> [u64; 4] {
        [self.rw_ios_per_sec, self.rw_mbytes_per_sec, self.r_mbytes_per_sec, self.w_mbytes_per_sec]
    }

    /// True if no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.as_array() == [0; 4]
    }

    /// Per-second rates the bucket enforces: I/Os, then bytes.
    fn rates(&self) -> [u64; 4] {
        let a = self.as_array();
        [a[0], a[1] << 20, a[2] << 20, a[3] << 20]
    }
}

/// A change of limits: None leaves a limit as it is, 0 removes it (SPDK's RPC semantics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosUpdate {
    /// New `rw_ios_per_sec`.
    pub rw_ios_per_sec: Option<u64>,
    /// New `rw_mbytes_per_sec`.
    pub rw_mbytes_per_sec: Option<u64>,
    /// New `r_mbytes_per_sec`.
    pub r_mbytes_per_sec: Option<u64>,
    /// New `w_mbytes_per_sec`.
    pub w_mbytes_per_sec: Option<u64>,
}

/// The shared token buckets of a bdev with limits (replaced whole when the limits change).
pub(crate) struct Bucket {
    /// Per-second rates (0: that limit is off).
    rates: [u64; 4],
    t0: u64,
    slice_ticks: u64,
    /// Slices since `t0` credited so far.
    slice: AtomicU64,
    tokens: [AtomicI64; 4],
    /// Tokens a core takes at once when it can.
    batch: [i64; 4],
}

impl Bucket {
    fn new(rates: [u64; 4]) -> Self {
        let per_slice = |r: u64| (r / 1000) as i64;
        Bucket {
            rates,
            t0: ferrite_reactor::tsc::ticks(),
            slice_ticks: ferrite_reactor::tsc::duration_to_ticks(TIMESLICE).max(1),
            slice: AtomicU64::new(0),
            // The first slice's quota, so that requests flow at once.
            tokens: rates.map(|r| AtomicI64::new(per_slice(r).max(1))),
            batch: rates.map(|r| (per_slice(r) / 8).max(1)),
        }
    }

    /// Tokens of limit `k` credited by the end of slice `n`.
    fn accrued(&self, k: usize, n: u64) -> i64 {
        (n as u128 * self.rates[k] as u128 / 1000).min(i64::MAX as u128 / 2) as i64
    }

    /// Credits the slices elapsed since the last refill; true if it (or another core) did.
    fn refill(&self) -> bool {
        let now = ferrite_reactor::tsc::ticks().wrapping_sub(self.t0) / self.slice_ticks;
        let last = self.slice.load(Ordering::Relaxed);
        if now <= last {
            return false;
        }
        if self.slice.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return true; // another core refilled
        }
        let from = last.max(now - MAX_CATCHUP_SLICES.min(now));
        for k in 0..4 {
            if self.rates[k] == 0 {
                continue;
            }
            let add = self.accrued(k, now) - self.accrued(k, from);
            // Quota not used in its slice is dropped; debt (an overdraw) is carried.
            let _ = self.tokens[k].fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| Some(c.min(0) + add));
        }
        true
    }

    /// Takes at least `need` tokens of limit `k` (a batch if there are enough); 0 if the
    /// bucket is empty. With some but fewer than `need` left it overdraws, as SPDK does.
    fn take(&self, k: usize, need: i64) -> i64 {
        loop {
            let cur = self.tokens[k].load(Ordering::Acquire);
            if cur <= 0 {
                if self.refill() {
                    continue;
                }
                return 0;
            }
            let want = need.max(self.batch[k]);
            let take = if cur >= want { want } else { cur.max(need) };
            if self.tokens[k].compare_exchange_weak(cur, cur - take, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return take;
            }
        }
    }
}

/// A bdev's limits and their bucket (control plane; channels read it when made or told).
#[derive(Default)]
pub(crate) struct QosShared(Mutex<(QosLimits, Option<Arc<Bucket>>)>);

impl QosShared {
    fn bucket(&self) -> Option<Arc<Bucket>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }
    fn limits(&self) -> QosLimits {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// A channel's QoS state: the bucket it draws from, its credit, and the requests waiting.
pub(crate) struct ChannelQos {
    bucket: RefCell<Option<Arc<Bucket>>>,
    credit: [Cell<i64>; 4],
    /// Requests over the limit, in submission order.
    pub(crate) queue: RefCell<VecDeque<BdevIo>>,
    /// The other queue, swapped in while the timer walks the queue (no allocation per walk).
    spare: RefCell<VecDeque<BdevIo>>,
    /// Limits (bit k: limit k) that queued requests wait for.
    blocked: Cell<u8>,
    timer: Cell<bool>,
}

impl ChannelQos {
    pub(crate) fn new() -> Self {
        ChannelQos {
            bucket: RefCell::new(None),
            credit: Default::default(),
            queue: RefCell::new(VecDeque::new()),
            spare: RefCell::new(VecDeque::new()),
            blocked: Cell::new(0),
            timer: Cell::new(false),
        }
    }
}

/// True for the types the limits apply to.
#[inline]
pub(crate) fn limited(t: IoType) -> bool {
    matches!(t, IoType::Read | IoType::Write)
}

/// What `io` costs under each limit (0 where the limit does not apply).
fn costs(ch: &ChannelInner, io: &BdevIo) -> [i64; 4] {
    let bytes = (io.req.num_blocks * ch.block_size as u64) as i64;
    let read = io.req.io_type == IoType::Read;
    [1, bytes, if read { bytes } else { 0 }, if read { 0 } else { bytes }]
}

/// The limits (bit k: limit k) that `io` needs.
fn needs(ch: &ChannelInner, io: &BdevIo) -> u8 {
    let b = ch.qos.bucket.borrow();
    let Some(b) = b.as_ref() else { return 0 };
    let cost = costs(ch, io);
    (0..4).filter(|&k| b.rates[k] != 0 && cost[k] != 0).fold(0, |m, k| m | 1 << k)
}

/// Takes what `io` costs from the channel's credit (refilled from the bucket); Err(bit of the
/// limit that refused) if the limits do not allow it now (credit taken stays with the channel).
fn admit(ch: &ChannelInner, io: &BdevIo) -> Result<(), u8> {
    let b = ch.qos.bucket.borrow();
    let Some(b) = b.as_ref() else { return Ok(()) };
    let cost = costs(ch, io);
    for (k, &c) in cost.iter().enumerate() {
        if b.rates[k] == 0 || c == 0 {
            continue;
        }
        let have = ch.qos.credit[k].get();
        if have < c {
            let got = b.take(k, c - have);
            if got == 0 {
                return Err(1 << k);
            }
            ch.qos.credit[k].set(have + got);
        }
    }
    for (k, &c) in cost.iter().enumerate() {
        if b.rates[k] != 0 {
            ch.qos.credit[k].set(ch.qos.credit[k].get() - c);
        }
    }
    Ok(())
}

/// A read or write on a channel with limits: on its way if the limits allow and nothing waits
/// for a limit it needs, else queued for the channel's timer.
pub(crate) fn submit(ch: &Rc<ChannelInner>, mut io: BdevIo) {
    let waits = ch.qos.blocked.get();
    let verdict = if waits & needs(ch, &io) != 0 { Err(0) } else { admit(ch, &io) };
    match verdict {
        Ok(()) => {
            io.qos_passed = true;
            ch.route(io);
        }
        Err(k) => {
            ch.qos.blocked.set(waits | k);
            ch.qos.queue.borrow_mut().push_back(io);
            arm(ch);
        }
    }
}

fn arm(ch: &Rc<ChannelInner>) {
    if ch.qos.timer.replace(true) {
        return;
    }
    let me = Rc::downgrade(ch);
    let f = move || {
        if let Some(ch) = me.upgrade() {
            release(&ch);
        }
    };
    if ferrite_reactor::current().is_some() {
        ferrite_reactor::after(TIMESLICE, f);
    } else {
        crate::io::defer_fn(Box::new(f));
    }
}

/// Sends on what the limits now allow, in order (a request stays behind an earlier one that
/// waits for a limit it needs); everything if the limits are gone or the bdev is being removed.
fn release(ch: &Rc<ChannelInner>) {
    ch.qos.timer.set(false);
    let free = !ch.qos_on.get() || ch.bdev.removing.load(Ordering::Relaxed);
    // Walk the queue taken out whole, so that no borrow is held while requests are routed.
    let spare = std::mem::take(&mut *ch.qos.spare.borrow_mut());
    let mut waiting = std::mem::replace(&mut *ch.qos.queue.borrow_mut(), spare);
    let mut blocked = 0u8;
    for _ in 0..waiting.len() {
        let Some(mut io) = waiting.pop_front() else { break };
        let verdict = if free {
            Ok(())
        } else if blocked & needs(ch, &io) != 0 {
            Err(0)
        } else {
            admit(ch, &io)
        };
        match verdict {
            Ok(()) => {
                io.qos_passed = true;
                ch.route(io);
            }
            Err(k) => {
                blocked |= k;
                waiting.push_back(io);
            }
        }
    }
    // Requests queued while routing (none today) go behind those still waiting.
    let mut q = ch.qos.queue.borrow_mut();
    waiting.append(&mut q);
    *ch.qos.spare.borrow_mut() = std::mem::replace(&mut *q, waiting);
    ch.qos.blocked.set(if q.is_empty() { 0 } else { blocked });
    let again = !q.is_empty();
    drop(q);
    if again {
        arm(ch);
    }
}

/// Makes a channel follow its bdev's current limits (on the channel's core).
pub(crate) fn apply(ch: &Rc<ChannelInner>) {
    let b = ch.bdev.qos.bucket();
    ch.qos_on.set(b.is_some());
    *ch.qos.bucket.borrow_mut() = b;
    for c in &ch.qos.credit {
        c.set(0);
    }
    if !ch.qos.queue.borrow().is_empty() {
        release(ch);
    }
}

/// Changes the limits of `bdev` (SPDK's `spdk_bdev_set_qos_rate_limits`): `rw_ios_per_sec` is
/// rounded up to a multiple of 1000 and MiB/s capped as SPDK does. Channels follow once told
/// ([`apply_everywhere`]). Returns the limits now in force.
pub fn set_limits(bdev: &Bdev, u: QosUpdate) -> Result<QosLimits, BdevError> {
    let mut st = bdev.0.qos.0.lock().unwrap_or_else(|p| p.into_inner());
    let mut l = st.0;
    if let Some(mut v) = u.rw_ios_per_sec {
        if v % MIN_IOS_PER_SEC != 0 {
            let up = v.div_ceil(MIN_IOS_PER_SEC).saturating_mul(MIN_IOS_PER_SEC);
            log::warn!("rw_ios_per_sec {v} is not a multiple of {MIN_IOS_PER_SEC}; rounded up to {up}");
            v = up;
        }
        l.rw_ios_per_sec = v;
    }
    let mb = |v: Option<u64>, cur: u64, what: &str| match v {
        Some(v) if v > MAX_MBYTES_PER_SEC => {
            log::warn!("{what} {v} would overflow; set to {MAX_MBYTES_PER_SEC}");
            MAX_MBYTES_PER_SEC
        }
        Some(v) => v,
        None => cur,
    };
    l.rw_mbytes_per_sec = mb(u.rw_mbytes_per_sec, l.rw_mbytes_per_sec, "rw_mbytes_per_sec");
    l.r_mbytes_per_sec = mb(u.r_mbytes_per_sec, l.r_mbytes_per_sec, "r_mbytes_per_sec");
    l.w_mbytes_per_sec = mb(u.w_mbytes_per_sec, l.w_mbytes_per_sec, "w_mbytes_per_sec");
    let bucket = (!l.is_unlimited()).then(|| Arc::new(Bucket::new(l.rates())));
    *st = (l, bucket);
    Ok(l)
}

/// Tells every core's channel of `bdev` (on `engine`) to follow its current limits; resolves
/// once all have.
pub async fn apply_everywhere(engine: &ferrite_reactor::Engine, bdev: &Bdev) {
    let id = bdev.id();
    if let Some(ch) = crate::channel::local_channel(id) {
        apply(&ch);
    }
    let _ = engine
        .on_all(move |_| {
            if let Some(ch) = crate::channel::local_channel(id) {
                apply(&ch);
            }
        })
        .await;
}

/// The limits of `bdev` (zero where none).
pub fn limits(bdev: &Bdev) -> QosLimits {
    bdev.0.qos.limits()
}

/// `assigned_rate_limits` of `bdev_get_bdevs`.
pub(crate) fn limits_json(b: &Bdev) -> Value {
    let l = limits(b).as_array();
    Value::Object(LIMIT_NAMES.iter().zip(l).map(|(k, v)| (k.to_string(), json!(v))).collect())
}

/// The saved-config entry that sets the limits of `b`, if any (only the limits set, as SPDK).
pub(crate) fn config_entry(b: &Bdev) -> Option<Value> {
    let l = limits(b);
    if l.is_unlimited() {
        return None;
    }
    let mut params = json!({"name": b.name()});
    for (k, v) in LIMIT_NAMES.iter().zip(l.as_array()) {
        if v > 0 {
            params[*k] = json!(v);
        }
    }
    Some(json!({"method": "bdev_set_qos_limit", "params": params}))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetParams {
    /// The bdev.
    name: String,
    /// Read and write I/Os per second (0: no limit).
    rw_ios_per_sec: Option<u64>,
    /// Read and write MB/s (0: no limit).
    rw_mbytes_per_sec: Option<u64>,
    /// Read MB/s (0: no limit).
    r_mbytes_per_sec: Option<u64>,
    /// Write MB/s (0: no limit).
    w_mbytes_per_sec: Option<u64>,
}

/// Registers `bdev_set_qos_limit`.
pub(crate) fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_set_qos_limit",
        "Sets or clears the QoS rate limits (IOPS and MB/s) of a bdev.",
        |ctx, p: SetParams| async move {
            let b = lookup(&p.name).ok_or_else(|| not_found(&p.name))?;
            let u = QosUpdate {
                rw_ios_per_sec: p.rw_ios_per_sec,
                rw_mbytes_per_sec: p.rw_mbytes_per_sec,
                r_mbytes_per_sec: p.r_mbytes_per_sec,
                w_mbytes_per_sec: p.w_mbytes_per_sec,
            };
            if u == QosUpdate::default() {
                return Err(errno_error(libc::EINVAL, "No rate limits specified"));
            }
            let l = set_limits(&b, u).map_err(crate::rpc::bdev_err)?;
            apply_everywhere(&ctx.engine, &b).await;
            log::info!("bdev {}: QoS limits {l:?}", b.name().escape_debug());
            Ok(json!(true))
        },
    );
}
