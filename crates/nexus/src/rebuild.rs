//! Rebuilding a child from a healthy one while I/O goes on (`ferrite_bdev::copy`): the child
//! first takes every write (each core's layout is refreshed), then the ranges to copy are
//! taken: the segments the nexus's log marked while the child was away (a partial rebuild,
//! Mayastor's), or the whole nexus (a full one: a new child, or no log covers it). Each window
//! is copied under a range lock of the nexus bdev. At the end the child is healthy (and the
//! store says so), or faulted again with the reason. Pause, resume, stop, rate and statistics
//! by RPC.

use crate::child::{ChildState, Reason};
use crate::nexus::Nexus;
use ferrite_bdev::copy::{blocks_in, copy_ranges, CopyControl, CopyEnd, CopyEnds};
use ferrite_bdev::{BdevError, IoRequest, IoType};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How a rebuild stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Copying.
    Running,
    /// Every range copied; the child is healthy.
    Completed,
    /// Stopped before the end.
    Stopped,
    /// A read or write failed.
    Failed,
}

impl JobState {
    fn name(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Stopped => "stopped",
            JobState::Failed => "failed",
        }
    }
}

struct JobInner {
    state: JobState,
    ended: Option<Instant>,
    waiters: Vec<ferrite_reactor::oneshot::Sender<()>>,
}

/// One rebuild of one child.
pub struct RebuildJob {
    /// The child rebuilt.
    pub target: String,
    /// The child copied from.
    pub source: String,
    /// Only logged segments are copied.
    pub partial: bool,
    /// Blocks to copy.
    pub total: u64,
    /// Blocks per segment of the log.
    pub segment_blocks: u64,
    /// Blocks per window.
    pub window_blocks: u64,
    /// Block size.
    pub block_size: u32,
    /// Cancel, pause, progress, rate.
    pub ctl: CopyControl,
    started: Instant,
    started_unix: u64,
    inner: Mutex<JobInner>,
}

impl RebuildJob {
    fn lock(&self) -> std::sync::MutexGuard<'_, JobInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the copy to stop.
    pub fn cancel(&self) {
        self.ctl.cancel.store(true, Ordering::Release);
    }

    /// Its state.
    pub fn state(&self) -> JobState {
        self.lock().state
    }

    /// Percent done.
    pub fn percent(&self) -> u64 {
        let done = self.ctl.done.load(Ordering::Relaxed);
        (done * 100).checked_div(self.total).unwrap_or(100)
    }

    /// Waits until it has ended.
    pub async fn wait(&self) {
        let rx = {
            let mut i = self.lock();
            if i.state != JobState::Running {
                return;
            }
            let (tx, rx) = ferrite_reactor::oneshot::channel();
            i.waiters.push(tx);
            rx
        };
        let _ = rx.await;
    }

    fn end(&self, s: JobState) {
        let waiters = {
            let mut i = self.lock();
            i.state = s;
            i.ended = Some(Instant::now());
            std::mem::take(&mut i.waiters)
        };
        for w in waiters {
            w.send(());
        }
    }

    /// `nexus_rebuild_get_stats`' object (Mayastor's RebuildStats).
    pub fn stats(&self) -> Value {
        let i = self.lock();
        let done = self.ctl.done.load(Ordering::Relaxed);
        let secs = i.ended.unwrap_or_else(Instant::now).duration_since(self.started).as_secs_f64();
        let rate = if secs > 0.0 { (done * self.block_size as u64) as f64 / secs } else { 0.0 };
        json!({
            "target": self.target,
            "source": self.source,
            "state": if self.ctl.paused.load(Ordering::Relaxed) && i.state == JobState::Running { "paused" } else { i.state.name() },
            "is_partial": self.partial,
            "blocks_total": self.total,
            "blocks_recovered": done,
            "blocks_remaining": self.total.saturating_sub(done),
            "progress": self.percent(),
            "segment_size_blks": self.segment_blocks,
            "blocks_per_task": self.window_blocks,
            "block_size": self.block_size,
            "rebuild_rate_bytes_per_sec": rate as u64,
            "max_mb_sec": self.ctl.max_mb_sec.load(Ordering::Relaxed),
            "start_time": self.started_unix,
            "elapsed_ms": (secs * 1000.0) as u64,
        })
    }
}

/// Starts rebuilding the faulted child of `slot` (it takes writes from now on).
pub(crate) async fn start(n: &Arc<Nexus>, slot: usize) -> Result<(), BdevError> {
    let (bdev, partial) = {
        let mut st = n.lock();
        let bdev = st.bdev.clone().ok_or_else(|| BdevError::Removing(n.name.clone()))?;
        let c = st.slots[slot].as_mut().ok_or_else(|| BdevError::Errno(libc::ENOENT, "no such child".into()))?;
        if c.state() != ChildState::Faulted || c.desc.is_none() {
            return Err(BdevError::Errno(libc::EBUSY, format!("child {} cannot be rebuilt now", c.uri)));
        }
        let gen = c.fault_gen;
        c.transition(ChildState::Rebuilding, Some(Reason::OutOfSync), gen);
        (bdev, c.log_valid)
    };
    // From here on every write reaches the child; what the log holds is what it missed.
    n.refresh().await;
    let setup = (|| {
        let st = n.lock();
        let src = st
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .filter(|(i, c)| *i != slot && c.readable())
            .min_by_key(|(_, c)| !c.parsed.is_local())
            .map(|(_, c)| c)
            .ok_or_else(|| BdevError::Errno(libc::ENODEV, "no healthy child to rebuild from".into()))?;
        let tgt = st.slots[slot].as_ref().expect("the target");
        let src_ch = src.desc.as_ref().expect("a readable child is open").channel()?;
        let tgt_desc = tgt.desc.as_ref().expect("a rebuilt child is open");
        let tgt_ch = tgt_desc.channel()?;
        let tgt_flush = tgt_desc.bdev().supports(IoType::Flush);
        Ok::<_, BdevError>((src.uri.clone(), tgt.uri.clone(), src_ch, tgt_ch, tgt_flush))
    })();
    let (src_uri, tgt_uri, src_ch, tgt_ch, tgt_flush) = match setup {
        Ok(s) => s,
        Err(e) => {
            end_child(n, slot, Err(e.to_string())).await;
            return Err(e);
        }
    };
    let ranges = if partial { n.log.ranges() } else { std::iter::once(0..n.num_blocks).collect() };
    let window_blocks = (n.rebuild_window_kb as u64 * 1024 / n.block_size as u64).max(1);
    let job = Arc::new(RebuildJob {
        target: tgt_uri.clone(),
        source: src_uri.clone(),
        partial,
        total: blocks_in(&ranges),
        segment_blocks: n.log.segment_blocks(),
        window_blocks,
        block_size: n.block_size,
        ctl: CopyControl::with_rate(n.rebuild_max_mb_sec.load(Ordering::Relaxed)),
        started: Instant::now(),
        started_unix: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        inner: Mutex::new(JobInner { state: JobState::Running, ended: None, waiters: Vec::new() }),
    });
    n.lock().slots[slot].as_mut().expect("the target").rebuild = Some(job.clone());
    log::info!(
        "nexus {}: {} rebuild of {tgt_uri} from {src_uri}: {} blocks",
        n.name,
        if partial { "partial" } else { "full" },
        job.total
    );
    let n = n.clone();
    ferrite_reactor::spawn_local(async move {
        let ends = CopyEnds { bdev: &bdev, src: &src_ch, src_offset: 0, dst: &tgt_ch, dst_offset: 0 };
        let res = copy_ranges(&ends, &ranges, window_blocks, &job.ctl).await;
        // What was copied is in the target's cache: flushed before it counts as healthy.
        let flushed = match &res {
            Ok(CopyEnd::Done) if tgt_flush => {
                let c = tgt_ch.submit_wait(IoRequest::new(IoType::Flush, 0, 0)).await;
                if c.status.is_ok() {
                    Ok(())
                } else {
                    Err(format!("flush of the rebuilt child: {}", c.status))
                }
            }
            _ => Ok(()),
        };
        drop((src_ch, tgt_ch));
        let (js, outcome) = match res {
            Ok(CopyEnd::Done) if flushed.is_err() => (JobState::Failed, flushed),
            Ok(CopyEnd::Done) => (JobState::Completed, Ok(())),
            Ok(CopyEnd::Cancelled) => (JobState::Stopped, Err(String::new())),
            Err(e) => (JobState::Failed, Err(e.to_string())),
        };
        log::info!("nexus {}: rebuild of {} {}", n.name, job.target, js.name());
        end_child(&n, slot, outcome).await;
        job.end(js);
    })
    .detach();
    Ok(())
}

/// The end of a child's rebuild: healthy (then recorded in the store), or faulted again (an
/// empty error: stopped). Nothing changes if the child left the rebuild already (faulted by an
/// I/O error or the client).
async fn end_child(n: &Arc<Nexus>, slot: usize, outcome: Result<(), String>) {
    let gen = {
        let mut st = n.lock();
        let Some(c) = st.slots[slot].as_ref() else { return };
        if c.state() != ChildState::Rebuilding {
            return;
        }
        match outcome {
            Ok(()) => {
                let gen = n.bump(&mut st);
                st.slots[slot].as_mut().expect("there").transition(ChildState::Healthy, None, gen);
                Some(gen)
            }
            Err(e) => {
                let c = st.slots[slot].as_mut().expect("there");
                let gen = c.fault_gen;
                let why = if e.is_empty() { Reason::RebuildStopped } else { Reason::RebuildFailed(e) };
                n.fault_log();
                c.transition(ChildState::Faulted, Some(why), gen);
                None
            }
        }
    };
    n.refresh().await;
    if let Some(g) = gen {
        n.maybe_clear_log();
        if let Err(e) = n.recorded_at_least(g).await {
            log::warn!("nexus {}: {e}", n.name);
        }
    }
}

/// The rebuild of `uri` in `n`, running or the last.
pub fn job(n: &Nexus, uri: &str) -> Result<Arc<RebuildJob>, BdevError> {
    let st = n.lock();
    let c = st
        .slots
        .iter()
        .flatten()
        .find(|c| c.uri == uri)
        .ok_or_else(|| BdevError::Errno(libc::ENOENT, format!("nexus {}: no child {uri}", n.name)))?;
    c.rebuild.clone().ok_or_else(|| BdevError::Errno(libc::ENOENT, format!("nexus {}: no rebuild of {uri}", n.name)))
}

/// The running rebuild of `uri` in `n`.
pub fn running(n: &Nexus, uri: &str) -> Result<Arc<RebuildJob>, BdevError> {
    let j = job(n, uri)?;
    if j.state() != JobState::Running {
        return Err(BdevError::Errno(libc::ENOENT, format!("nexus {}: no rebuild of {uri} running", n.name)));
    }
    Ok(j)
}
