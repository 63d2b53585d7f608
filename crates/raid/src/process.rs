//! Background processes of a RAID (SPDK's "process"): the rebuild of a raid1 member.
//!
//! The target takes every write from the moment the rebuild starts (each core's channel is told
//! before the first window is copied). The RAID is then copied window by window
//! (`process_window_size_kb`) from a readable member to the target, each window under a range
//! lock of the RAID bdev: writes to the window wait for its copy, writes elsewhere and every
//! read go on. `process_max_bandwidth_mb_sec` (0: no limit) bounds the rate. Progress (the
//! blocks done) shows in `bdev_raid_get_bdevs`. At the end the target serves reads and its
//! superblock entry says configured; a failed copy removes the target.

use crate::raid::{refresh_channels, remove_slot, write_superblock, Process, Raid};
use crate::sb::MemberState;
use ferrite_bdev::copy::{copy_ranges, CopyEnd, CopyEnds, Steer};
use ferrite_bdev::BdevError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// `bdev_raid_set_options`' members, as a process starts with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opts {
    /// Blocks of a window, in KiB.
    pub window_kb: u32,
    /// Most MiB/s the process copies (0: no limit).
    pub max_bandwidth_mb_sec: u32,
}

impl Default for Opts {
    fn default() -> Self {
        Self { window_kb: 1024, max_bandwidth_mb_sec: 0 }
    }
}

/// Starts rebuilding member `slot` (configured as a target) of an online RAID.
pub(crate) async fn start_rebuild(raid: &Arc<Raid>, slot: usize, opts: Opts) -> Result<(), BdevError> {
    let offset = Arc::new(AtomicU64::new(0));
    let cancel = Arc::new(AtomicBool::new(false));
    let bdev = {
        let mut st = raid.lock();
        debug_assert!(st.process.is_none() && st.slots[slot].target, "one process, on a target");
        st.process = Some(Process { target: slot, offset: offset.clone(), cancel: cancel.clone(), done: Vec::new() });
        st.bdev.clone().ok_or_else(|| BdevError::Removing(raid.name.clone()))?
    };
    refresh_channels(&bdev).await;
    log::info!("raid {}: rebuild of slot {slot} starts", raid.name);
    let raid = raid.clone();
    ferrite_reactor::spawn_local(async move {
        let res = copy(&raid, slot, opts, &offset, &cancel).await;
        finish(&raid, slot, res).await;
    })
    .detach();
    Ok(())
}

/// Stops the RAID's process, if any, and waits until it has; the slot it was rebuilding if it
/// did not finish.
pub(crate) async fn stop(raid: &Arc<Raid>) -> Option<usize> {
    let (rx, target) = {
        let mut st = raid.lock();
        let p = st.process.as_mut()?;
        p.cancel.store(true, Ordering::Release);
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        p.done.push(tx);
        (rx, p.target)
    };
    let _ = rx.await;
    raid.lock().slots.get(target).filter(|s| s.target).map(|_| target)
}

/// The RAID's process as the copy sees it: its cancel flag and its progress (blocks done).
struct Steering<'a> {
    cancel: &'a AtomicBool,
    offset: &'a AtomicU64,
    max_bandwidth_mb_sec: u32,
}

impl Steer for Steering<'_> {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
    fn max_mb_sec(&self) -> u32 {
        self.max_bandwidth_mb_sec
    }
    fn progress(&self, _blocks: u64, total: u64) {
        self.offset.store(total, Ordering::Relaxed);
    }
}

/// Copies the RAID onto the target (`ferrite_bdev::copy`, the whole RAID as one range).
/// Ok(false): stopped before the end.
async fn copy(
    raid: &Arc<Raid>,
    slot: usize,
    opts: Opts,
    offset: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<bool, BdevError> {
    let (bdev, bs, total, src, src_off, tgt, tgt_off) = {
        let st = raid.lock();
        let src = st
            .slots
            .iter()
            .position(|s| s.configured && !s.target && !s.removing && s.desc.is_some())
            .ok_or_else(|| BdevError::Errno(libc::ENODEV, "no member to rebuild from".into()))?;
        let ch = |i: usize| st.slots[i].desc.as_ref().expect("a configured member is open").channel();
        (
            st.bdev.clone().ok_or_else(|| BdevError::Removing(raid.name.clone()))?,
            st.block_size as u64,
            st.raid_blocks,
            ch(src)?,
            st.slots[src].data_offset,
            ch(slot)?,
            st.slots[slot].data_offset,
        )
    };
    let window = (opts.window_kb as u64 * 1024 / bs).max(1);
    let ends = CopyEnds { bdev: &bdev, src: &src, src_offset: src_off, dst: &tgt, dst_offset: tgt_off };
    let steer = Steering { cancel, offset, max_bandwidth_mb_sec: opts.max_bandwidth_mb_sec };
    let whole = std::iter::once(0..total).collect::<Vec<_>>();
    let end = copy_ranges(&ends, &whole, window, &steer).await?;
    Ok(end == CopyEnd::Done)
}

/// The end of a rebuild: the target becomes a member like the others (superblock entry
/// configured), or goes if the rebuild failed (raid1 copies and raid5f reconstructions alike).
pub(crate) async fn finish(raid: &Arc<Raid>, slot: usize, res: Result<bool, BdevError>) {
    let done = match &res {
        Ok(true) => {
            let bdev = {
                let mut st = raid.lock();
                let (uuid, off, size) = {
                    let s = &mut st.slots[slot];
                    s.target = false;
                    (s.uuid, s.data_offset, s.data_size)
                };
                if let Some(sb) = st.sb.as_mut() {
                    if let Some(m) = sb.members.iter_mut().find(|m| m.slot as usize == slot) {
                        m.state = MemberState::Configured;
                        m.uuid = uuid;
                        m.data_offset = off;
                        m.data_size = size;
                    }
                }
                st.bdev.clone()
            };
            if let Err(e) = write_superblock(raid).await {
                log::error!("raid {}: superblock after rebuild: {e}", raid.name);
            }
            if let Some(b) = bdev {
                refresh_channels(&b).await;
            }
            log::info!("raid {}: rebuild of slot {slot} done", raid.name);
            true
        }
        Ok(false) => {
            log::info!("raid {}: rebuild of slot {slot} stopped", raid.name);
            true
        }
        Err(e) => {
            log::error!("raid {}: rebuild of slot {slot} failed: {e}", raid.name);
            false
        }
    };
    let waiters = raid.lock().process.take().map(|p| p.done).unwrap_or_default();
    for w in waiters {
        w.send(());
    }
    if !done {
        let _g = crate::ctl::lock().await;
        if let Err(e) = remove_slot(raid, slot, true).await {
            log::warn!("raid {}: removing the rebuild target: {e}", raid.name);
        }
    }
}
