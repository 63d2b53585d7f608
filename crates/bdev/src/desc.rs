//! Open descriptors: read or write access to a bdev, typed claims, events, and closing.
//!
//! Claims follow SPDK's: a module that builds on a bdev (an lvol store, a RAID, a passthru)
//! claims it so that nobody else writes under it.
//! - `ExclusiveWrite` (SPDK's v1 claim): one claimant, no other writer.
//! - `ReadManyWriteOne`: the claimant writes (its descriptor becomes writable), anyone may read.
//! - `ReadManyWriteNone`: several claimants, all read-only; nobody writes.
//! - `ReadManyWriteShared`: several claimants with the same key write (a replicated volume's
//!   paths), nobody else does.
//!
//! While any claim is held, opens for writing fail; claimants of the last two kinds open
//! read-only and get write access with the claim, as in SPDK.

use crate::bdev::{Bdev, BdevError};
use crate::channel::IoChannel;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What happened to an open bdev (the descriptor's event callback gets it on the opening core).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BdevEvent {
    /// The bdev is being deleted: stop submitting, let in-flight I/O finish, close.
    Remove,
    /// The bdev's block count changed (grew, or shrank while nobody had it open).
    Resize,
    /// The bdev stopped serving some I/O types (`Bdev::stop_serving`: an lvol made read-only
    /// takes no more writes). Openers that show the bdev to others (a namespace) tell them.
    IoTypesChanged,
    /// The module reported media events (blocks that went bad or were relocated, SPDK's
    /// `SPDK_BDEV_EVENT_MEDIA_MANAGEMENT`): the opener takes them with
    /// [`BdevDesc::take_media_events`].
    MediaManagement,
    /// A part the bdev stands on failed (a RAID member, a replica of a replicated volume) and the
    /// bdev goes on without it, degraded (`Bdev::notify_fault`): openers that show health to
    /// others (a target, a control plane) can tell them.
    Fault,
}

/// A media event: blocks the module found bad or relocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaEvent {
    /// First block.
    pub offset_blocks: u64,
    /// Number of blocks.
    pub num_blocks: u64,
}

/// Media events kept per descriptor until its opener takes them (as SPDK's pool of 64 per
/// descriptor): beyond it, the oldest are dropped and counted.
pub const MEDIA_EVENTS_MAX: usize = 64;

/// A descriptor's media events not yet taken.
#[derive(Default)]
pub(crate) struct MediaQueue {
    events: std::collections::VecDeque<MediaEvent>,
    dropped: u64,
}

pub(crate) type EventCallback = Arc<dyn Fn(BdevEvent) + Send + Sync>;

/// The kinds of claim a module can take on a bdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimType {
    /// One claimant, no other writer (SPDK's `exclusive_write`).
    ExclusiveWrite,
    /// One claimant writes, any number read (`read_many_write_one`).
    ReadManyWriteOne,
    /// Claimants only read; nobody writes (`read_many_write_none`).
    ReadManyWriteNone,
    /// Claimants with the same key write; nobody else does (`read_many_write_shared`).
    ReadManyWriteShared,
}

impl ClaimType {
    /// SPDK's name of the claim type (`claim_type` in `bdev_get_bdevs`).
    pub fn name(self) -> &'static str {
        match self {
            ClaimType::ExclusiveWrite => "exclusive_write",
            ClaimType::ReadManyWriteOne => "read_many_write_one",
            ClaimType::ReadManyWriteNone => "read_many_write_none",
            ClaimType::ReadManyWriteShared => "read_many_write_shared",
        }
    }
}

/// A claim held through a descriptor.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The descriptor that holds it.
    pub(crate) desc: u64,
    /// The claiming module.
    pub module: String,
    /// Its kind.
    pub kind: ClaimType,
    /// The shared key of a `ReadManyWriteShared` claim.
    pub key: u64,
}

pub(crate) struct DescEntry {
    pub(crate) id: u64,
    pub(crate) write: Arc<AtomicBool>,
    /// The reactor that opened it (and the engine to reach it), if any.
    pub(crate) core: Option<(usize, ferrite_reactor::Engine)>,
    pub(crate) on_event: EventCallback,
    pub(crate) media: Arc<std::sync::Mutex<MediaQueue>>,
}

static NEXT_DESC: AtomicU64 = AtomicU64::new(1);

/// An open handle on a bdev. Dropping it closes it (and releases its claim).
pub struct BdevDesc {
    bdev: Bdev,
    id: u64,
    write: Arc<AtomicBool>,
    media: Arc<std::sync::Mutex<MediaQueue>>,
}

impl BdevDesc {
    pub(crate) fn open(bdev: Bdev, write: bool, on_event: EventCallback) -> Result<Self, BdevError> {
        if bdev.is_removing() {
            return Err(BdevError::Removing(bdev.name().to_string()));
        }
        let id = NEXT_DESC.fetch_add(1, Ordering::Relaxed);
        let write = Arc::new(AtomicBool::new(write));
        let media = Arc::new(std::sync::Mutex::new(MediaQueue::default()));
        {
            let mut st = bdev.0.state.lock().unwrap();
            if write.load(Ordering::Relaxed) {
                if let Some(c) = st.claims.first() {
                    return Err(BdevError::Claimed(format!(
                        "bdev {} is claimed by module {} ({}); it cannot be opened for writing",
                        bdev.name(),
                        c.module,
                        c.kind.name()
                    )));
                }
            }
            st.descs.push(DescEntry {
                id,
                write: write.clone(),
                core: ferrite_reactor::current().map(|c| (c, ferrite_reactor::engine())),
                on_event,
                media: media.clone(),
            });
        }
        Ok(Self { bdev, id, write, media })
    }

    /// The bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// Makes every core's channel of the bdev keep a table of its outstanding requests from
    /// now on, for [`IoChannel::for_each_io`] (a descriptor with a timeout does the same):
    /// one slot per request, freed at completion, no allocation once the table has grown to
    /// the queue depth. Ends with [`BdevDesc::clear_timeout`] or when the descriptor closes.
    pub fn track_io(&self) {
        crate::timeout::track_only(&self.bdev, self.id);
    }

    /// Takes the media events reported since the last call (at most [`MEDIA_EVENTS_MAX`]), and
    /// how many older ones were dropped because the opener did not take them in time.
    pub fn take_media_events(&self) -> (Vec<MediaEvent>, u64) {
        let mut q = self.media.lock().unwrap_or_else(|p| p.into_inner());
        (q.events.drain(..).collect(), std::mem::take(&mut q.dropped))
    }

    /// True if opened for writing (or given write access by a claim).
    pub fn writable(&self) -> bool {
        self.write.load(Ordering::Relaxed)
    }

    /// Takes the exclusive write claim for `module` (so that, say, an lvol store owns its base
    /// bdev): fails if another module holds a claim or another descriptor can write.
    pub fn claim(&self, module: &str) -> Result<(), BdevError> {
        self.claim_as(module, ClaimType::ExclusiveWrite, 0)
    }

    /// Takes a claim of `kind` for `module` (`key` matters for `ReadManyWriteShared` only).
    pub fn claim_as(&self, module: &str, kind: ClaimType, key: u64) -> Result<(), BdevError> {
        let name = self.bdev.name();
        let mut st = self.bdev.0.state.lock().unwrap();
        let refuse = |why: String| Err(BdevError::Claimed(format!("bdev {name}: cannot claim {}: {why}", kind.name())));
        if st.claims.iter().any(|c| c.desc == self.id) {
            return refuse("this descriptor already holds a claim".into());
        }
        if let Some(c) = st.claims.iter().find(|c| {
            !matches!(
                (kind, c.kind),
                (ClaimType::ReadManyWriteNone, ClaimType::ReadManyWriteNone)
                    | (ClaimType::ReadManyWriteShared, ClaimType::ReadManyWriteShared)
            ) || (kind == ClaimType::ReadManyWriteShared && c.key != key)
        }) {
            return refuse(format!("already claimed by module {} ({})", c.module, c.kind.name()));
        }
        let claimants: Vec<u64> = st.claims.iter().map(|c| c.desc).collect();
        let other_writer =
            st.descs.iter().any(|d| d.id != self.id && d.write.load(Ordering::Relaxed) && !claimants.contains(&d.id));
        if other_writer {
            return refuse("other descriptors can write".into());
        }
        if kind == ClaimType::ReadManyWriteNone && self.writable() {
            return refuse("the descriptor is open for writing".into());
        }
        if matches!(kind, ClaimType::ReadManyWriteOne | ClaimType::ReadManyWriteShared) {
            self.write.store(true, Ordering::Relaxed);
        }
        st.claims.push(Claim { desc: self.id, module: module.to_string(), kind, key });
        Ok(())
    }

    /// Gets this core's I/O channel for the bdev (made on first use on each core).
    pub fn channel(&self) -> Result<IoChannel, BdevError> {
        IoChannel::get(&self.bdev, self.writable(), self.id)
    }

    /// Sets a timeout (SPDK's `spdk_bdev_set_timeout`): `cb` runs, on the submitting core, for
    /// each request submitted through this descriptor that is still outstanding `secs` seconds
    /// later (checked every 100 ms, each request reported once); if it returns true the request
    /// is aborted and completes with `IoStatus::TimedOut`. Replaces an earlier timeout; `secs`
    /// 0 clears it. Channels track outstanding requests only while a timeout is set. Channels
    /// off the reactors track but are never checked.
    pub fn set_timeout(&self, secs: u64, cb: impl Fn(&crate::timeout::TimedOutIo) -> bool + Send + Sync + 'static) {
        crate::timeout::set(&self.bdev, self.id, secs, Some(Arc::new(cb)));
    }

    /// Clears the timeout set with [`BdevDesc::set_timeout`].
    pub fn clear_timeout(&self) {
        crate::timeout::set(&self.bdev, self.id, 0, None);
    }
}

impl Drop for BdevDesc {
    fn drop(&mut self) {
        crate::timeout::set(&self.bdev, self.id, 0, None);
        {
            let mut st = self.bdev.0.state.lock().unwrap();
            st.descs.retain(|d| d.id != self.id);
            st.claims.retain(|c| c.desc != self.id);
        }
        crate::lifecycle::maybe_destruct(&self.bdev.0);
    }
}

impl MediaQueue {
    /// Adds `e`, dropping the oldest beyond [`MEDIA_EVENTS_MAX`].
    pub(crate) fn push(&mut self, e: MediaEvent) {
        if self.events.len() == MEDIA_EVENTS_MAX {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(e);
    }
}
