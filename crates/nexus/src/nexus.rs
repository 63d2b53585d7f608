//! Nexuses and their children: the control plane. Operations run on the engine's first core,
//! one at a time (`ctl::lock`); the data path (`channel`) sees the children through each core's
//! layout, refreshed with `Bdev::for_each_channel` after every change. Children keep stable
//! slots (at most [`MAX_CHILDREN`]); a slot changes hands only with the nexus quiesced.
//!
//! Health and the store: every change of which children are healthy bumps the nexus's
//! generation `gen`; a task on the first core writes the record to the store and then sets
//! `recorded` to the generation written. A write that a child missed waits in its channel
//! until `recorded` reaches the generation that marks that child out of date, and every
//! core's layout (`refreshed`) no longer reads from it (`channel`).

use crate::channel::NexusChannel;
use crate::child::{Child, ChildState, Reason};
use crate::ctl;
use crate::fence::Fencing;
use crate::open::{close_child, open_child};
use crate::seglog::{SegmentLog, SEGMENT_BYTES};
use crate::store::{ChildRecord, NexusRecord, Store};
use crate::uri::ChildUri;
use ferrite_bdev::{Bdev, BdevBackend, BdevError, BdevProps, IoStatus, IoType, IoTypes, Limits};
use ferrite_rpc::Ctx;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use uuid::Uuid;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "nexus";
/// Most children of a nexus (slots in a 16-bit mask per request).
pub const MAX_CHILDREN: usize = 16;
/// How long a write a child missed waits for the store before it fails.
pub const STORE_WAIT: Duration = Duration::from_secs(10);
/// NVMe's Reservation Conflict status code (generic status).
const RESERVATION_CONFLICT_SC: u8 = 0x83;
/// How often an unreachable store is tried again.
const STORE_RETRY: Duration = Duration::from_millis(100);

/// A nexus's state, from its children's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NexusState {
    /// Every child healthy.
    Online,
    /// Some healthy, some not.
    Degraded,
    /// None healthy.
    Faulted,
}

impl NexusState {
    /// The name `nexus_get_nexuses` shows.
    pub fn name(self) -> &'static str {
        match self {
            NexusState::Online => "online",
            NexusState::Degraded => "degraded",
            NexusState::Faulted => "faulted",
        }
    }
}

/// What can change about a nexus.
pub(crate) struct Inner {
    /// Children by slot.
    pub(crate) slots: Vec<Option<Child>>,
    /// Bumped by each change of which children are healthy.
    pub(crate) gen: u64,
    /// The registered bdev.
    pub(crate) bdev: Option<Bdev>,
    /// A task is writing the store.
    persisting: bool,
    /// Being destroyed.
    pub(crate) destroying: bool,
}

/// What `nexus_create` asks for.
pub struct CreateOpts {
    /// Name of the nexus bdev.
    pub name: String,
    /// Its UUID (None: a new one).
    pub uuid: Option<Uuid>,
    /// Size in bytes (0: the children's).
    pub size: u64,
    /// Children, by URI.
    pub children: Vec<String>,
    /// Reservation key on `nvmf://` children (0: no fencing).
    pub resv_key: u64,
    /// Key to preempt there (0: none): the nexus this one replaces.
    pub preempt_key: u64,
    /// Reservation type (NVMe RTYPE; Mayastor's default is 5, Write Exclusive - All
    /// Registrants).
    pub resv_type: u8,
    /// Reads go to a local child first.
    pub local_first: bool,
    /// The health store (None: `nexus_set_options`' or the default file).
    pub store: Option<Store>,
    /// Rebuild window, KiB.
    pub rebuild_window_kb: u32,
    /// Rebuild rate bound, MiB/s (0: none).
    pub rebuild_max_mb_sec: u32,
    /// Every this many ms, faulted children that failed on their own are probed and brought
    /// back when they answer (`heal`; 0: only by `nexus_online_child`).
    pub auto_online_ms: u32,
}

/// A replicated volume over children.
pub struct Nexus {
    /// Its name (and its bdev's).
    pub name: String,
    /// Its UUID (its bdev's, and its store key).
    pub uuid: Uuid,
    /// Block size.
    pub block_size: u32,
    /// Blocks.
    pub num_blocks: u64,
    /// Blocks of each child (they are all of one size).
    pub child_blocks: u64,
    /// Reads go to a local child first.
    pub local_first: bool,
    /// Reservation key on the children that carry NVMe reservations (`fence`; 0: none).
    pub resv_key: u64,
    /// The key preempted there when a child is opened.
    pub preempt_key: u64,
    /// The reservation type taken.
    pub resv_type: u8,
    /// Where health is recorded.
    pub store: Store,
    /// Rebuild window, KiB.
    pub rebuild_window_kb: u32,
    /// Rebuild rate bound, MiB/s (0: none); changes apply to running rebuilds.
    pub rebuild_max_mb_sec: AtomicU32,
    /// The period of `heal`'s look at faulted children, ms (0: none).
    pub auto_online_ms: u32,
    /// Segments written while a child was out of date.
    pub log: SegmentLog,
    /// The generation the store holds.
    pub recorded: AtomicU64,
    /// The generation every core's layout reflects (no core still reads from a child faulted
    /// at or before it).
    pub refreshed: AtomicU64,
    /// Some child has a volatile write cache: what it acknowledged may be lost until a flush,
    /// so the segments written since the last flush every child took are kept (`unflushed`).
    pub volatile: AtomicBool,
    /// Segments written (completed) in even and odd flush epochs, not yet covered by a flush.
    unflushed: [SegmentLog; 2],
    /// Flushes begun (the epoch writes completing now mark `unflushed[epoch & 1]`).
    flush_epoch: AtomicU64,
    /// Orders flush beginnings and the clearing of an epoch.
    flush_lock: Mutex<()>,
    /// Set when a child stops being healthy, cleared when all are again: writes completing
    /// meanwhile mark the log too (they may be in a lost child's cache).
    degraded_hint: AtomicBool,
    pub(crate) st: Mutex<Inner>,
}

#[derive(Default)]
struct Nexuses(Vec<Arc<Nexus>>);

fn nexuses() -> ferrite_reactor::StateGuard<Nexuses> {
    ferrite_reactor::lock_state::<Nexuses>()
}

/// Every nexus, in creation order.
pub fn all() -> Vec<Arc<Nexus>> {
    nexuses().0.clone()
}

/// The nexus named `name` (or with that UUID).
pub fn find(name: &str) -> Option<Arc<Nexus>> {
    nexuses().0.iter().find(|n| n.name == name || n.uuid.to_string() == name).cloned()
}

fn forget(n: &Arc<Nexus>) {
    nexuses().0.retain(|x| !Arc::ptr_eq(x, n));
}

/// The default store (`nexus_set_options`).
#[derive(Default)]
struct DefaultStore(Option<Store>);

/// Sets the store of nexuses created without one.
pub fn set_default_store(s: Option<Store>) {
    ferrite_reactor::lock_state::<DefaultStore>().0 = s;
}

/// The store of nexuses created without one.
pub fn default_store() -> Store {
    ferrite_reactor::lock_state::<DefaultStore>()
        .0
        .clone()
        .unwrap_or_else(|| Store::File(crate::store::DEFAULT_FILE.into()))
}

pub(crate) fn inval(msg: impl Into<String>) -> BdevError {
    BdevError::Errno(libc::EINVAL, msg.into())
}

/// Runs `f` on the engine's first core (now, if this is it).
pub(crate) fn on_first_core(f: impl FnOnce() + Send + 'static) {
    match ferrite_reactor::current_engine() {
        Some(e) if ferrite_reactor::current() != Some(0) => e.send(0, f),
        _ => f(),
    }
}

impl Nexus {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What it asks of its children's reservations.
    pub fn fencing(&self) -> Fencing {
        Fencing { resv_key: self.resv_key, preempt_key: self.preempt_key, resv_type: self.resv_type }
    }

    /// Its state.
    pub fn state(&self) -> NexusState {
        state_of(&self.lock())
    }

    /// The record the store should hold now, and its generation.
    fn record(&self, clean: bool) -> (u64, NexusRecord) {
        let st = self.lock();
        let children = st
            .slots
            .iter()
            .flatten()
            .map(|c| ChildRecord { uri: c.uri.clone(), healthy: c.state() == ChildState::Healthy })
            .collect();
        (st.gen, NexusRecord { name: self.name.clone(), clean_shutdown: clean, children })
    }

    /// Bumps the generation (a change the store must learn) and starts writing it.
    pub(crate) fn bump(self: &Arc<Self>, st: &mut Inner) -> u64 {
        st.gen += 1;
        if !std::mem::replace(&mut st.persisting, true) {
            let n = self.clone();
            on_first_core(move || ferrite_reactor::spawn_local(persist(n)).detach());
        }
        st.gen
    }

    /// Waits until the store holds generation `gen` (or fails after [`STORE_WAIT`]).
    pub(crate) async fn recorded_at_least(&self, gen: u64) -> Result<(), BdevError> {
        let t0 = std::time::Instant::now();
        while self.recorded.load(Ordering::Acquire) < gen {
            if t0.elapsed() > STORE_WAIT {
                return Err(BdevError::Errno(libc::EIO, format!("store {} unreachable", self.store.name())));
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// A child failed an I/O (on any core): a healthy child (unless it is the last) or one being
    /// rebuilt is faulted and retired (the reason says reservation conflict when `status` is
    /// NVMe's: this nexus was fenced off that child). Returns the generation at which the store
    /// records it out of date (0 if it stays healthy: the I/O fails).
    pub(crate) fn child_failed(self: &Arc<Self>, slot: usize, why: &str, status: IoStatus) -> u64 {
        let reason = if status == IoStatus::RESERVATION_CONFLICT
            || matches!(status, IoStatus::Nvme { sct: 0, sc: RESERVATION_CONFLICT_SC, .. })
        {
            Reason::ReservationConflict(why.to_string())
        } else {
            Reason::IoError(why.to_string())
        };
        let mut st = self.lock();
        let healthy = st.slots.iter().flatten().filter(|c| c.state() == ChildState::Healthy).count();
        let Some(c) = st.slots.get(slot).and_then(|c| c.as_ref()) else { return 0 };
        match c.state() {
            ChildState::Healthy if healthy <= 1 => {
                log::error!("nexus {}: last healthy child {} failed an I/O ({why}); it stays", self.name, c.uri);
                0
            }
            ChildState::Healthy => {
                let gen = self.bump(&mut st);
                let c = st.slots[slot].as_mut().expect("checked");
                self.fault_log();
                c.transition(ChildState::Faulted, Some(reason), gen);
                c.log_valid = true;
                log::warn!("nexus {}: child {} faulted: {why}", self.name, c.uri);
                drop(st);
                self.schedule_refresh();
                gen
            }
            ChildState::Rebuilding => {
                let c = st.slots[slot].as_mut().expect("checked");
                let gen = c.fault_gen;
                self.fault_log();
                c.transition(ChildState::Faulted, Some(reason), gen);
                if let Some(j) = &c.rebuild {
                    j.cancel();
                }
                drop(st);
                self.schedule_refresh();
                gen
            }
            ChildState::Faulted => c.fault_gen,
        }
    }

    /// Refreshes every core's layout (from the first core, in the background).
    pub(crate) fn schedule_refresh(self: &Arc<Self>) {
        let n = self.clone();
        on_first_core(move || {
            ferrite_reactor::spawn_local(async move {
                n.refresh().await;
            })
            .detach()
        });
    }

    /// Every core's channel takes the children as they are now; then the writes that waited
    /// for it (and for the store) complete.
    pub(crate) async fn refresh(&self) {
        let (bdev, gen) = {
            let st = self.lock();
            (st.bdev.clone(), st.gen)
        };
        let Some(bdev) = bdev else { return };
        let rx = bdev.for_each_channel(&ferrite_reactor::engine(), |ch| {
            if let Some(c) = ch.as_any().and_then(|a| a.downcast_mut::<NexusChannel>()) {
                c.refresh();
            }
        });
        let _ = rx.await;
        if self.refreshed.fetch_max(gen, Ordering::AcqRel) < gen {
            self.sweep().await;
        }
    }

    /// The generation both the store and every core's layout reflect: a write a child missed
    /// is acknowledged only once this covers the child's fault (else a read that follows it
    /// could still go, on some core, to the child that missed it).
    pub(crate) fn covered(&self) -> u64 {
        self.recorded.load(Ordering::Acquire).min(self.refreshed.load(Ordering::Acquire))
    }

    /// Every core completes the writes the store now covers, and fails those that waited too
    /// long.
    async fn sweep(&self) {
        let Some(bdev) = self.lock().bdev.clone() else { return };
        let rx = bdev.for_each_channel(&ferrite_reactor::engine(), |ch| {
            if let Some(c) = ch.as_any().and_then(|a| a.downcast_mut::<NexusChannel>()) {
                c.sweep();
            }
        });
        let _ = rx.await;
    }

    /// Clears the segment log if no child needs it any more.
    pub(crate) fn maybe_clear_log(&self) {
        let st = self.lock();
        if st.slots.iter().flatten().all(|c| c.state() == ChildState::Healthy) {
            self.degraded_hint.store(false, Ordering::SeqCst);
            self.log.clear();
        }
    }

    /// A write-type request completed on its children: with volatile caches its segments are
    /// unflushed until a flush covers them, and while a child is out they go to the log too (a
    /// write in flight when the child went may sit in its lost cache). Marks first, then reads
    /// the hint: `fault_log` sets the hint, then merges, so one of them sees the other.
    #[inline]
    pub(crate) fn note_written(&self, offset: u64, num: u64) {
        if !self.volatile.load(Ordering::Relaxed) {
            return;
        }
        let e = self.flush_epoch.load(Ordering::SeqCst);
        self.unflushed[(e & 1) as usize].mark(offset, num);
        if self.degraded_hint.load(Ordering::SeqCst) {
            self.log.mark(offset, num);
        }
    }

    /// A flush is sent to the children: the epoch it covers (None without volatile caches).
    pub(crate) fn flush_begin(&self) -> Option<u64> {
        if !self.volatile.load(Ordering::Relaxed) {
            return None;
        }
        let _g = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        Some(self.flush_epoch.fetch_add(1, Ordering::SeqCst))
    }

    /// The flush begun in epoch `e` succeeded on every child: what completed before it began is
    /// durable everywhere. Its epoch's segments are cleared unless a later flush began since
    /// (then writes of that later epoch share the bitmap: they stay, conservatively).
    pub(crate) fn flush_done(&self, e: u64) {
        let _g = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.flush_epoch.load(Ordering::SeqCst) == e + 1 {
            self.unflushed[(e & 1) as usize].clear();
        }
    }

    /// A child stops being healthy (under the nexus lock): what its cache may have lost (the
    /// segments not yet covered by a flush) joins the log a partial rebuild copies.
    pub(crate) fn fault_log(&self) {
        self.degraded_hint.store(true, Ordering::SeqCst);
        if self.volatile.load(Ordering::Relaxed) {
            self.log.merge(&self.unflushed[0]);
            self.log.merge(&self.unflushed[1]);
        }
    }

    /// `nexus_get_nexuses`' object.
    pub fn info(&self) -> Value {
        let st = self.lock();
        let children: Vec<Value> = st
            .slots
            .iter()
            .flatten()
            .map(|c| {
                let mut v = json!({
                    "uri": c.uri,
                    "bdev": c.bdev_name,
                    "state": c.state().name(),
                    "reason": c.reason.as_ref().map(|r| r.to_string()),
                    "rebuild_progress": Value::Null,
                });
                if let Some(j) = &c.rebuild {
                    if c.state() == ChildState::Rebuilding {
                        v["rebuild_progress"] = json!(j.percent());
                    }
                }
                v
            })
            .collect();
        json!({
            "name": self.name,
            "uuid": self.uuid.to_string(),
            "size": self.num_blocks * self.block_size as u64,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "state": state_of(&st).name(),
            "local_first": self.local_first,
            "store": self.store.name(),
            "rebuild_max_mb_sec": self.rebuild_max_mb_sec.load(Ordering::Relaxed),
            "logged_segments": self.log.count(),
            "children": children,
        })
    }

    /// The slot of the child with `uri`.
    pub(crate) fn slot_of(&self, uri: &str) -> Result<usize, BdevError> {
        self.lock()
            .slots
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.uri == uri))
            .ok_or_else(|| BdevError::Errno(libc::ENOENT, format!("nexus {}: no child {uri}", self.name)))
    }
}

fn state_of(st: &Inner) -> NexusState {
    let (mut healthy, mut total) = (0, 0);
    for c in st.slots.iter().flatten() {
        total += 1;
        healthy += (c.state() == ChildState::Healthy) as usize;
    }
    match healthy {
        0 => NexusState::Faulted,
        h if h == total => NexusState::Online,
        _ => NexusState::Degraded,
    }
}

/// Writes the store until it holds the latest generation; each attempt is followed by a sweep
/// of the writes waiting for it.
async fn persist(n: Arc<Nexus>) {
    loop {
        let (gen, rec) = n.record(false);
        if gen <= n.recorded.load(Ordering::Acquire) {
            let mut st = n.lock();
            if st.gen <= gen {
                st.persisting = false;
                return;
            }
            continue;
        }
        let (store, key) = (n.store.clone(), crate::store::key(&n.uuid));
        let res = ferrite_reactor::spawn_blocking(move || store.put(&key, &rec)).await;
        match res {
            Ok(Ok(())) => {
                n.recorded.fetch_max(gen, Ordering::AcqRel);
                n.sweep().await;
            }
            Ok(Err(e)) => {
                log::warn!("nexus {}: store: {e}", n.name);
                n.sweep().await;
                ferrite_reactor::sleep(STORE_RETRY).await;
            }
            Err(e) => {
                log::warn!("nexus {}: store: {e}", n.name);
                n.sweep().await;
                ferrite_reactor::sleep(STORE_RETRY).await;
            }
        }
    }
}

/// The registered nexus bdev's backend.
struct NexusBackend {
    nexus: Arc<Nexus>,
}

impl BdevBackend for NexusBackend {
    fn create_channel(&self) -> Result<Box<dyn ferrite_bdev::BackendChannel>, BdevError> {
        Ok(Box::new(NexusChannel::new(self.nexus.clone())?))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn driver_specific(&self) -> Value {
        json!({ "nexus": self.nexus.info() })
    }

    fn base_bdevs(&self) -> Vec<Bdev> {
        self.nexus.lock().slots.iter().flatten().filter_map(|c| c.desc.as_ref().map(|d| d.bdev().clone())).collect()
    }

    fn destruct(&self, done: ferrite_bdev::Destructed) {
        let n = &self.nexus;
        let mut st = n.lock();
        st.bdev = None;
        for c in st.slots.iter_mut().flatten() {
            if let Some(j) = &c.rebuild {
                j.cancel();
            }
            c.desc = None;
        }
        drop(st);
        log::info!("nexus {}: unregistered; children released", n.name);
        done.finish();
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let n = &self.nexus;
        let children: Vec<String> = n.lock().slots.iter().flatten().map(|c| c.uri.clone()).collect();
        Some(json!({"method": "nexus_create", "params": {
            "name": bdev.name(),
            "uuid": n.uuid.to_string(),
            "size": n.num_blocks * n.block_size as u64,
            "children": children,
            "local_first": n.local_first,
            "resv_key": n.resv_key,
            "preempt_key": n.preempt_key,
            "resv_type": n.resv_type,
            "store": n.store.name(),
            "rebuild_window_kb": n.rebuild_window_kb,
            "rebuild_max_mb_sec": n.rebuild_max_mb_sec.load(Ordering::Relaxed),
            "auto_online_ms": n.auto_online_ms,
        }}))
    }
}

/// Checks a child's geometry against the others'.
fn check_geometry(uri: &str, bdev: &Bdev, first: Option<(u32, u64)>) -> Result<(), BdevError> {
    if let Some((bs, nb)) = first {
        if bdev.block_size() != bs {
            return Err(inval(format!("child {uri}: block size {} differs from the others' {bs}", bdev.block_size())));
        }
        if bdev.num_blocks() != nb {
            return Err(inval(format!(
                "child {uri}: size {} bytes differs from the others' {} bytes",
                bdev.size_bytes(),
                nb * bs as u64
            )));
        }
    }
    Ok(())
}

/// Parses children URIs and refuses duplicates.
fn parse_children(uris: &[String]) -> Result<Vec<ChildUri>, BdevError> {
    if uris.is_empty() {
        return Err(inval("a nexus needs at least one child"));
    }
    if uris.len() > MAX_CHILDREN {
        return Err(inval(format!("at most {MAX_CHILDREN} children")));
    }
    let mut out = Vec::new();
    for (i, u) in uris.iter().enumerate() {
        if uris[..i].contains(u) {
            return Err(BdevError::Errno(libc::EEXIST, format!("child {u} given twice")));
        }
        out.push(ChildUri::parse(u).map_err(|e| inval(e.0))?);
    }
    Ok(out)
}

/// `nexus_create`.
pub async fn create(ctx: &Ctx, o: CreateOpts) -> Result<Arc<Nexus>, BdevError> {
    let _g = ctl::lock().await;
    ferrite_bdev::bdev::check_name(&o.name)?;
    if find(&o.name).is_some() || ferrite_bdev::lookup(&o.name).is_some() {
        return Err(BdevError::Errno(libc::EEXIST, format!("nexus {} exists", o.name)));
    }
    let parsed = parse_children(&o.children)?;
    let uuid = o.uuid.filter(|u| !u.is_nil()).unwrap_or_else(Uuid::new_v4);
    let store = o.store.clone().unwrap_or_else(default_store);
    let (s2, key) = (store.clone(), crate::store::key(&uuid));
    let record = ferrite_reactor::spawn_blocking(move || s2.get(&key))
        .await
        .map_err(|e| BdevError::Errno(libc::EIO, e.to_string()))?
        .map_err(|e| BdevError::Errno(libc::EIO, format!("store {}: {e}", store.name())))?;
    if let Some(r) = &record {
        if !o.children.iter().any(|u| r.healthy(u) == Some(true)) {
            return Err(BdevError::Errno(
                libc::ENODEV,
                format!("nexus {}: the store knows none of these children as current", o.name),
            ));
        }
    }
    // A nexus that did not shut down cleanly may have left its children different where writes
    // were in flight: one child the store holds healthy (a local one first) is the reference and
    // the others are rebuilt from it, as Mayastor recreates such a nexus from one replica.
    let reference = record.as_ref().filter(|r| !r.clean_shutdown).and_then(|r| {
        o.children
            .iter()
            .zip(&parsed)
            .filter(|(u, _)| r.healthy(u) == Some(true))
            .min_by_key(|(_, p)| !p.is_local())
            .map(|(u, _)| u.clone())
    });
    if let Some(u) = &reference {
        log::warn!(
            "nexus {}: not shut down cleanly; {u} is the reference, the other children are rebuilt from it",
            o.name
        );
    }
    let fencing = Fencing { resv_key: o.resv_key, preempt_key: o.preempt_key, resv_type: o.resv_type };
    let mut children: Vec<Child> = Vec::new();
    let mut geometry = None;
    for (uri, p) in o.children.iter().zip(parsed) {
        let healthy =
            record.as_ref().is_none_or(|r| r.healthy(uri) == Some(true)) && reference.as_ref().is_none_or(|r| r == uri);
        let res = match open_child(ctx, uri, &p, &o.name, &fencing).await {
            Ok((desc, made)) => {
                let b = desc.bdev().clone();
                let c = Child::new(uri.clone(), p.clone(), b.name().to_string(), made, desc, healthy);
                match check_geometry(uri, &b, geometry) {
                    Ok(()) => {
                        geometry.get_or_insert((b.block_size(), b.num_blocks()));
                        Ok(c)
                    }
                    Err(e) => {
                        // What it made goes too (a retry with the right size must not find it).
                        close_child(ctx, c, &fencing).await;
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in children {
                    close_child(ctx, c, &fencing).await;
                }
                return Err(e);
            }
        }
    }
    let (bs, child_blocks) = geometry.expect("at least one child");
    let num_blocks = if o.size == 0 { child_blocks } else { o.size / bs as u64 };
    let bad_size = if !o.size.is_multiple_of(bs as u64) {
        Some(format!("size {} is not a multiple of the block size {bs}", o.size))
    } else if num_blocks > child_blocks {
        Some(format!("size {} is larger than the children ({} bytes)", o.size, child_blocks * bs as u64))
    } else {
        None
    };
    if let Some(why) = bad_size {
        for c in children {
            close_child(ctx, c, &fencing).await;
        }
        return Err(inval(why));
    }
    let volatile = children.iter().any(|c| c.desc.as_ref().is_some_and(|d| d.bdev().limits().write_cache));
    let mut slots: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    slots.resize_with(MAX_CHILDREN, || None);
    let nexus = Arc::new(Nexus {
        name: o.name.clone(),
        uuid,
        block_size: bs,
        num_blocks,
        child_blocks,
        local_first: o.local_first,
        resv_key: o.resv_key,
        preempt_key: o.preempt_key,
        resv_type: o.resv_type,
        store,
        rebuild_window_kb: o.rebuild_window_kb.max(4),
        rebuild_max_mb_sec: AtomicU32::new(o.rebuild_max_mb_sec),
        auto_online_ms: o.auto_online_ms,
        log: SegmentLog::new(num_blocks, bs, SEGMENT_BYTES),
        recorded: AtomicU64::new(0),
        refreshed: AtomicU64::new(0),
        volatile: AtomicBool::new(volatile),
        unflushed: [SegmentLog::new(num_blocks, bs, SEGMENT_BYTES), SegmentLog::new(num_blocks, bs, SEGMENT_BYTES)],
        flush_epoch: AtomicU64::new(0),
        flush_lock: Mutex::new(()),
        degraded_hint: AtomicBool::new(false),
        st: Mutex::new(Inner { slots, gen: 0, bdev: None, persisting: false, destroying: false }),
    });
    let props = {
        let st = nexus.lock();
        let bdevs: Vec<Bdev> =
            st.slots.iter().flatten().filter_map(|c| c.desc.as_ref().map(|d| d.bdev().clone())).collect();
        let mut io_types = IoTypes::of(&[IoType::Read, IoType::Write]);
        for t in [IoType::Flush, IoType::Unmap, IoType::WriteZeroes] {
            if bdevs.iter().all(|b| b.supports(t)) {
                io_types = io_types.with(t);
            }
        }
        let limits = Limits {
            buf_align: bdevs.iter().map(|b| b.limits().buf_align).max().unwrap_or(1),
            seg_len_align: bdevs.iter().map(|b| b.limits().seg_len_align).max().unwrap_or(1),
            physical_block_size: bdevs.iter().map(|b| b.limits().physical_block_size).max().unwrap_or(0),
            write_cache: bdevs.iter().any(|b| b.limits().write_cache),
            ..Limits::default()
        };
        BdevProps {
            name: o.name.clone(),
            aliases: vec![],
            uuid: Some(uuid),
            block_size: bs,
            num_blocks,
            product_name: "Nexus CAS Driver v0.0.1",
            module: MODULE,
            io_types,
            limits,
        }
    };
    let bdev = match ferrite_bdev::register(props, Arc::new(NexusBackend { nexus: nexus.clone() })) {
        Ok(b) => b,
        Err(e) => {
            let children: Vec<Child> = nexus.lock().slots.iter_mut().filter_map(|c| c.take()).collect();
            for c in children {
                close_child(ctx, c, &fencing).await;
            }
            return Err(e);
        }
    };
    nexus.lock().bdev = Some(bdev);
    nexuses().0.push(nexus.clone());
    // The store learns the children before anything is rebuilt. Every channel made so far
    // took the children as they are.
    let gen = {
        let mut st = nexus.lock();
        nexus.bump(&mut st)
    };
    nexus.refreshed.fetch_max(gen, Ordering::AcqRel);
    if let Err(e) = nexus.recorded_at_least(gen).await {
        log::warn!("nexus {}: {e}", nexus.name);
    }
    let stale: Vec<usize> = {
        let st = nexus.lock();
        st.slots.iter().enumerate().filter(|(_, c)| c.as_ref().is_some_and(|c| !c.readable())).map(|(i, _)| i).collect()
    };
    for slot in stale {
        if let Err(e) = crate::rebuild::start(&nexus, slot).await {
            log::warn!("nexus {}: rebuild of slot {slot}: {e}", nexus.name);
        }
    }
    crate::heal::spawn(ctx, &nexus, Duration::from_millis(o.auto_online_ms as u64));
    log::info!("nexus {}: created ({} blocks of {bs}), {}", nexus.name, num_blocks, nexus.state().name());
    Ok(nexus)
}

/// `nexus_destroy`: unpublished, rebuilds stopped, children released.
pub async fn destroy(ctx: &Ctx, name: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let n = find(name).ok_or_else(|| BdevError::Errno(libc::ENODEV, format!("nexus {name} not found")))?;
    // Hosts lose it first (its subsystem goes), as Mayastor unshares before destroying.
    crate::publish::unpublish(ctx, &n).await?;
    let jobs: Vec<_> = {
        let mut st = n.lock();
        st.destroying = true;
        st.slots.iter().flatten().filter_map(|c| c.rebuild.clone()).collect()
    };
    for j in jobs {
        j.cancel();
        j.wait().await;
    }
    let bdev = n.lock().bdev.clone();
    if let Some(b) = bdev {
        let gone = ferrite_bdev::unregister(b.name(), Some(MODULE))?;
        let _ = gone.await;
    }
    let (_, rec) = n.record(true);
    let (store, key) = (n.store.clone(), crate::store::key(&n.uuid));
    match ferrite_reactor::spawn_blocking(move || store.put(&key, &rec)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::warn!("nexus {}: store at destroy: {e}", n.name),
        Err(e) => log::warn!("nexus {}: store at destroy: {e}", n.name),
    }
    let children: Vec<Child> = n.lock().slots.iter_mut().filter_map(|c| c.take()).collect();
    for c in children {
        close_child(ctx, c, &n.fencing()).await;
    }
    forget(&n);
    log::info!("nexus {name}: destroyed");
    Ok(())
}

/// How long each child's flush may take at shutdown.
const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// At daemon shutdown, before the NVMe/TCP host lets remote children go: each nexus stops its
/// rebuilds, quiesces (no write in flight; new ones wait until the bdev goes), flushes its
/// writable children and records a clean shutdown when every flush succeeded, so that a
/// restart trusts every child the store holds healthy (an unclean one trusts one of them only:
/// [`create`]). The nexus then ignores its children's going (their owners remove them) and its
/// bdev goes with the others.
pub async fn shutdown() {
    let _g = ctl::lock().await;
    for n in all() {
        let jobs: Vec<_> = {
            let st = n.lock();
            st.slots.iter().flatten().filter_map(|c| c.rebuild.clone()).collect()
        };
        for j in jobs {
            j.cancel();
            j.wait().await;
        }
        let Some(bdev) = n.lock().bdev.clone() else { continue };
        let quiesced = bdev.quiesce().await.is_ok();
        let chans: Vec<_> = {
            let st = n.lock();
            st.slots
                .iter()
                .flatten()
                .filter(|c| c.writable())
                .filter_map(|c| c.desc.as_ref())
                .map(|d| (d.bdev().supports(IoType::Flush), d.channel()))
                .collect()
        };
        let mut clean = quiesced;
        for (flush, ch) in chans {
            let Ok(ch) = ch else {
                clean = false;
                continue;
            };
            if flush {
                let done =
                    ch.submit_wait_within(ferrite_bdev::IoRequest::new(IoType::Flush, 0, 0), SHUTDOWN_FLUSH_TIMEOUT);
                clean &= done.await.is_some_and(|c| c.status.is_ok());
            }
        }
        n.lock().destroying = true;
        // A store write under way ends first, so that the last record is this one.
        let t0 = std::time::Instant::now();
        while n.lock().persisting && t0.elapsed() < STORE_WAIT {
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        let (_, rec) = n.record(clean);
        let (store, key) = (n.store.clone(), crate::store::key(&n.uuid));
        match ferrite_reactor::spawn_blocking(move || store.put(&key, &rec)).await {
            Ok(Ok(())) => log::info!("nexus {}: shut down {}", n.name, if clean { "cleanly" } else { "uncleanly" }),
            Ok(Err(e)) => log::warn!("nexus {}: store at shutdown: {e}", n.name),
            Err(e) => log::warn!("nexus {}: store at shutdown: {e}", n.name),
        }
        forget(&n);
    }
}

fn find_or_err(name: &str) -> Result<Arc<Nexus>, BdevError> {
    find(name).ok_or_else(|| BdevError::Errno(libc::ENODEV, format!("nexus {name} not found")))
}

/// `nexus_add_child`: opens the child and rebuilds it (fully) into the nexus.
pub async fn add_child(ctx: &Ctx, name: &str, uri: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let n = find_or_err(name)?;
    let p = ChildUri::parse(uri).map_err(|e| inval(e.0))?;
    let free = {
        let st = n.lock();
        if st.slots.iter().flatten().any(|c| c.uri == uri) {
            return Err(BdevError::Errno(libc::EEXIST, format!("nexus {name}: child {uri} is already there")));
        }
        st.slots.iter().position(|c| c.is_none()).ok_or_else(|| inval(format!("nexus {name}: no free slot")))?
    };
    let (desc, made) = open_child(ctx, uri, &p, name, &n.fencing()).await?;
    let b = desc.bdev().clone();
    if b.limits().write_cache {
        n.volatile.store(true, Ordering::SeqCst);
    }
    let child = Child::new(uri.to_string(), p, b.name().to_string(), made, desc, false);
    if let Err(e) = check_geometry(uri, &b, Some((n.block_size, n.child_blocks))) {
        close_child(ctx, child, &n.fencing()).await;
        return Err(e);
    }
    let gen = {
        let mut st = n.lock();
        st.slots[free] = Some(child);
        n.bump(&mut st)
    };
    n.recorded_at_least(gen).await?;
    crate::rebuild::start(&n, free).await
}

/// `nexus_remove_child`: the child goes (refused for the last healthy one).
pub async fn remove_child(ctx: &Ctx, name: &str, uri: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let n = find_or_err(name)?;
    let slot = n.slot_of(uri)?;
    let job = {
        let st = n.lock();
        let healthy = st.slots.iter().flatten().filter(|c| c.state() == ChildState::Healthy).count();
        let c = st.slots[slot].as_ref().expect("found");
        if c.state() == ChildState::Healthy && healthy <= 1 {
            return Err(BdevError::Errno(libc::EBUSY, format!("nexus {name}: {uri} is the last healthy child")));
        }
        c.rebuild.clone()
    };
    if let Some(j) = job {
        j.cancel();
        j.wait().await;
    }
    let bdev = n.lock().bdev.clone();
    if let Some(b) = &bdev {
        b.quiesce().await?;
    }
    let child = n.lock().slots[slot].take().expect("still there");
    n.refresh().await;
    if let Some(b) = &bdev {
        b.unquiesce().await?;
    }
    let gen = {
        let mut st = n.lock();
        n.bump(&mut st)
    };
    n.maybe_clear_log();
    close_child(ctx, child, &n.fencing()).await;
    n.recorded_at_least(gen).await
}

/// `nexus_fault_child`: the client takes the child out (refused for the last healthy one).
pub async fn fault_child(name: &str, uri: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let n = find_or_err(name)?;
    let slot = n.slot_of(uri)?;
    let (gen, job) = {
        let mut st = n.lock();
        let healthy = st.slots.iter().flatten().filter(|c| c.state() == ChildState::Healthy).count();
        let state = st.slots[slot].as_ref().expect("found").state();
        match state {
            ChildState::Healthy if healthy <= 1 => {
                return Err(BdevError::Errno(libc::EBUSY, format!("nexus {name}: {uri} is the last healthy child")));
            }
            ChildState::Healthy => {
                let gen = n.bump(&mut st);
                let c = st.slots[slot].as_mut().expect("found");
                n.fault_log();
                c.transition(ChildState::Faulted, Some(Reason::ByClient), gen);
                c.log_valid = true;
                (gen, None)
            }
            ChildState::Rebuilding => {
                let c = st.slots[slot].as_mut().expect("found");
                let gen = c.fault_gen;
                n.fault_log();
                c.transition(ChildState::Faulted, Some(Reason::ByClient), gen);
                (gen, c.rebuild.clone())
            }
            ChildState::Faulted => {
                let c = st.slots[slot].as_mut().expect("found");
                let gen = c.fault_gen;
                n.fault_log();
                c.transition(ChildState::Faulted, Some(Reason::ByClient), gen);
                (gen, None)
            }
        }
    };
    if let Some(j) = job {
        j.cancel();
        j.wait().await;
    }
    n.refresh().await;
    n.recorded_at_least(gen).await
}

/// `nexus_online_child`: a faulted child comes back and is rebuilt (partially when the segment
/// log covers what it missed). Refused for a child this nexus was fenced off.
pub async fn online_child(ctx: &Ctx, name: &str, uri: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let n = find_or_err(name)?;
    bring_back(ctx, &n, uri).await
}

/// Brings the faulted child at `uri` back: reopened if it was closed, then rebuilt. The caller
/// holds the control lock (`nexus_online_child`, or the nexus's own watcher, `heal`).
pub(crate) async fn bring_back(ctx: &Ctx, n: &Arc<Nexus>, uri: &str) -> Result<(), BdevError> {
    let name = n.name.as_str();
    let slot = n.slot_of(uri)?;
    let (state, open, p, fenced) = {
        let st = n.lock();
        let c = st.slots[slot].as_ref().expect("found");
        (c.state(), c.desc.is_some(), c.parsed.clone(), matches!(c.reason, Some(Reason::ReservationConflict(_))))
    };
    if fenced {
        return Err(BdevError::Errno(
            libc::EACCES,
            format!(
                "nexus {name}: child {uri} was fenced off (another nexus preempted its reservation); \
                 remove it and add it again to take it back"
            ),
        ));
    }
    if state != ChildState::Faulted {
        return Err(BdevError::Errno(libc::EBUSY, format!("nexus {name}: child {uri} is {}", state.name())));
    }
    if !open {
        let (desc, _) = open_child(ctx, uri, &p, name, &n.fencing()).await?;
        if desc.bdev().limits().write_cache {
            n.volatile.store(true, Ordering::SeqCst);
        }
        let mut st = n.lock();
        let c = st.slots[slot].as_mut().expect("found");
        c.bdev_name = desc.bdev().name().to_string();
        c.desc = Some(desc);
    }
    crate::rebuild::start(n, slot).await
}

/// A child's bdev is going away (its `Remove` event, on the first core): it is faulted and
/// closed.
pub(crate) fn child_removed(n: &Arc<Nexus>, bdev_name: &str) {
    let n = n.clone();
    let bdev_name = bdev_name.to_string();
    ferrite_reactor::spawn_local(async move {
        let _g = ctl::lock().await;
        let (job, gen) = {
            let mut st = n.lock();
            let Some(slot) =
                st.slots.iter().position(|c| c.as_ref().is_some_and(|c| c.bdev_name == bdev_name && c.desc.is_some()))
            else {
                return;
            };
            let state = st.slots[slot].as_ref().expect("found").state();
            let gen = if state == ChildState::Healthy {
                n.bump(&mut st)
            } else {
                st.slots[slot].as_ref().expect("found").fault_gen
            };
            let c = st.slots[slot].as_mut().expect("found");
            n.fault_log();
            c.transition(ChildState::Faulted, Some(Reason::Removed), gen);
            if state == ChildState::Healthy {
                c.log_valid = true;
            }
            (c.rebuild.clone(), gen)
        };
        if let Some(j) = job {
            j.cancel();
            j.wait().await;
        }
        n.refresh().await;
        {
            let mut st = n.lock();
            if let Some(c) = st.slots.iter_mut().flatten().find(|c| c.bdev_name == bdev_name) {
                c.desc = None;
            }
        }
        let _ = n.recorded_at_least(gen).await;
    })
    .detach();
}
