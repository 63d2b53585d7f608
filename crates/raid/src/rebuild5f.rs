//! The rebuild of a raid5f member (SPDK's `raid5f_submit_process_request`): each of its strips
//! is the XOR of the same strip of every other member (a data strip from the other data and the
//! parity, the parity from the data). As the raid1 rebuild (`process`), the target takes every
//! write from the start (full-stripe writes reach every member there is), reads of its strips
//! are reconstructed until it is done, and the RAID is rebuilt window by window
//! (`process_window_size_kb`, in whole stripes) under a range lock of the RAID bdev, at most at
//! `process_max_bandwidth_mb_sec`. A window is one range of each member (stripes lie back to
//! back on every member): the others' ranges are read, XORed, and written to the target.

use crate::process::Opts;
use crate::raid::{refresh_channels, Process, Raid};
use ferrite_bdev::{BdevError, IoChannel, IoRequest};
use ferrite_reactor::IoBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Starts rebuilding member `slot` (configured as a target) of an online raid5f.
pub(crate) async fn start(raid: &Arc<Raid>, slot: usize, opts: Opts) -> Result<(), BdevError> {
    let offset = Arc::new(AtomicU64::new(0));
    let cancel = Arc::new(AtomicBool::new(false));
    let bdev = {
        let mut st = raid.lock();
        debug_assert!(st.process.is_none() && st.slots[slot].target, "one process, on a target");
        st.process = Some(Process { target: slot, offset: offset.clone(), cancel: cancel.clone(), done: Vec::new() });
        st.bdev.clone().ok_or_else(|| BdevError::Removing(raid.name.clone()))?
    };
    refresh_channels(&bdev).await;
    log::info!("raid {}: rebuild of raid5f slot {slot} starts", raid.name);
    let raid = raid.clone();
    ferrite_reactor::spawn_local(async move {
        let res = copy(&raid, slot, opts, &offset, &cancel).await;
        crate::process::finish(&raid, slot, res).await;
    })
    .detach();
    Ok(())
}

/// Rebuilds the target. Ok(false): stopped before the end.
async fn copy(
    raid: &Arc<Raid>,
    slot: usize,
    opts: Opts,
    offset: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<bool, BdevError> {
    let (bdev, bs, strip, stripes, others, target) = {
        let st = raid.lock();
        let n = st.slots.len();
        let ch = |i: usize| -> Result<(IoChannel, u64), BdevError> {
            let s = &st.slots[i];
            let d = s.desc.as_ref().filter(|_| s.configured && !s.removing).ok_or_else(|| {
                BdevError::Errno(libc::ENODEV, format!("raid5f member at slot {i} is missing: nothing to rebuild from"))
            })?;
            Ok((d.channel()?, s.data_offset))
        };
        let others = (0..n).filter(|&i| i != slot).map(ch).collect::<Result<Vec<_>, _>>()?;
        let strip = st.strip_blocks as u64;
        (
            st.bdev.clone().ok_or_else(|| BdevError::Removing(raid.name.clone()))?,
            st.block_size as u64,
            strip,
            st.slots[slot].data_size / strip,
            others,
            ch(slot)?,
        )
    };
    let stripe_blocks = strip * others.len() as u64;
    let window = (opts.window_kb as u64 * 1024 / bs / stripe_blocks).max(1);
    let len = |k: u64| (k * strip * bs) as usize;
    let mut bufs: Vec<Option<IoBuf>> = others.iter().map(|_| Some(ferrite_reactor::alloc_buf(len(window)))).collect();
    let start = Instant::now();
    let mut s = 0u64;
    while s < stripes {
        if cancel.load(Ordering::Acquire) {
            return Ok(false);
        }
        let k = window.min(stripes - s);
        let lock = bdev.lock_lba_range(s * stripe_blocks, k * stripe_blocks).await;
        for (i, (ch, off)) in others.iter().enumerate() {
            let mut b = bufs[i].take().expect("the window's buffers are back");
            b.set_len(len(k));
            let mut c = ch.submit_wait(IoRequest::read(off + s * strip, k * strip, b)).await;
            bufs[i] = c.take_req().bufs.pop();
            if !c.status.is_ok() {
                return Err(BdevError::Errno(libc::EIO, format!("rebuild read at stripe {s}: {}", c.status)));
            }
        }
        // The target's strips: the XOR of the others', into the first buffer.
        let mut first = bufs[0].take().expect("read back");
        {
            let mut p = [std::ptr::null::<u8>(); crate::xor::MAX_SOURCES];
            for (d, b) in p.iter_mut().zip(bufs.iter()) {
                *d = b.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
            }
            p[0] = first.as_ptr();
            debug_assert!(p[..others.len()].iter().all(|x| !x.is_null()));
            // SAFETY: every buffer holds `len(k)` bytes; the destination is source 0 itself.
            unsafe { crate::xor::xor_raw(first.as_mut_ptr(), &p[..others.len()], len(k)) };
        }
        let mut c = target.0.submit_wait(IoRequest::write(target.1 + s * strip, k * strip, first)).await;
        bufs[0] = c.take_req().bufs.pop();
        if !c.status.is_ok() {
            return Err(BdevError::Errno(libc::EIO, format!("rebuild write at stripe {s}: {}", c.status)));
        }
        drop(lock);
        s += k;
        offset.store(s * stripe_blocks, Ordering::Relaxed);
        if opts.max_bandwidth_mb_sec > 0 {
            let bytes = (s * strip * bs * others.len() as u64) as f64;
            let due = Duration::from_secs_f64(bytes / (opts.max_bandwidth_mb_sec as f64 * 1048576.0));
            let spent = start.elapsed();
            if due > spent {
                ferrite_reactor::sleep(due - spent).await;
            }
        }
        for b in bufs.iter_mut().filter(|b| b.is_none()) {
            *b = Some(ferrite_reactor::alloc_buf(len(window)));
        }
    }
    Ok(true)
}
