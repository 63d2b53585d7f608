//! Requests in flight, kept in memory the front end holds for us (vhost-user's
//! VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD), so that a daemon killed with -9 and started again
//! finds which of the guest's requests it had taken and not completed, and submits them again:
//! the guest sees no error.
//!
//! The front end asks for the area once (GET_INFLIGHT_FD: we make a memfd), keeps the
//! descriptor, and hands it to the next daemon (SET_INFLIGHT_FD). Its layout is ours (the front
//! end never reads it); it is the one DPDK and libvhost-user use for split rings, per queue:
//!
//! ```text
//! 0   u64 features      8  u16 version (1)   10 u16 desc_num
//! 12  u16 last_batch_head                     14 u16 used_idx
//! 16  desc[desc_num]: u8 inflight, u8 pad[5], u16 next, u64 counter (16 bytes each)
//! ```
//! with queues [`queue_stride`] bytes apart. A request taken sets its head's `inflight` and a
//! counter (the order it was taken in). A completion notes its head in `last_batch_head`, puts
//! it on the used ring, clears `inflight`, then copies the used ring's index: a crash between
//! the used ring and the clear leaves `used_idx` behind the ring's, which is how recovery
//! knows that `last_batch_head` completed after all.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

const HEADER: usize = 16;
const DESC: usize = 16;
const ALIGN: usize = 64;

/// Bytes one queue of `queue_size` entries takes in the area.
pub fn queue_stride(queue_size: u16) -> usize {
    (HEADER + DESC * queue_size as usize).div_ceil(ALIGN) * ALIGN
}

/// The area, mapped.
pub struct InflightArea {
    ptr: NonNull<u8>,
    len: usize,
    /// Queues it has room for.
    pub num_queues: u16,
    /// Entries per queue.
    pub queue_size: u16,
}

// SAFETY: the mapping is plain shared memory; each queue's part is used by the one reactor
// that runs the queue (see `InflightQueue`).
unsafe impl Send for InflightArea {}
// SAFETY: as above; the area itself is never written through `&InflightArea`.
unsafe impl Sync for InflightArea {}

impl Drop for InflightArea {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn check_shape(num_queues: u16, queue_size: u16) -> Result<usize, String> {
    if num_queues == 0 || num_queues as usize > crate::backend::MAX_QUEUES {
        return Err(format!("inflight area for {num_queues} queues"));
    }
    if queue_size == 0 || !queue_size.is_power_of_two() {
        return Err(format!("inflight area for queues of {queue_size} entries"));
    }
    Ok(num_queues as usize * queue_stride(queue_size))
}

impl InflightArea {
    /// A fresh, zeroed area (GET_INFLIGHT_FD) and the file to give the front end.
    pub fn create(num_queues: u16, queue_size: u16) -> Result<(Arc<InflightArea>, File), String> {
        let len = check_shape(num_queues, queue_size)?;
        // SAFETY: a new memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"ferrite-vhost-inflight".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: we own the new descriptor.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).map_err(|e| format!("inflight area of {len} bytes: {e}"))?;
        let area = Self::map(&file, 0, len, num_queues, queue_size)?;
        Ok((Arc::new(area), file))
    }

    /// Maps an area a front end handed back (SET_INFLIGHT_FD), checking that the file holds it.
    pub fn open(
        file: &File,
        offset: u64,
        size: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, String> {
        let len = check_shape(num_queues, queue_size)?;
        if size < len as u64 {
            return Err(format!("inflight area of {size} bytes; {num_queues} queues of {queue_size} need {len}"));
        }
        let have = file.metadata().map_err(|e| format!("inflight fd: {e}"))?.len();
        if offset.checked_add(len as u64).is_none_or(|end| end > have) {
            return Err(format!("inflight fd of {have} bytes is shorter than offset {offset} + {len}"));
        }
        Ok(Arc::new(Self::map(file, offset, len, num_queues, queue_size)?))
    }

    fn map(file: &File, offset: u64, len: usize, num_queues: u16, queue_size: u16) -> Result<InflightArea, String> {
        if !offset.is_multiple_of(4096) {
            return Err(format!("inflight area offset {offset} is not page aligned"));
        }
        // SAFETY: a shared mapping of a file we checked is long enough.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mapping the inflight area: {}", std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast()).ok_or("mmap returned null")?;
        Ok(InflightArea { ptr, len, num_queues, queue_size })
    }

    /// Queue `index`'s part, if the area has one for a ring of `size` entries.
    pub fn queue(self: &Arc<Self>, index: u16, size: u16) -> Option<InflightQueue> {
        if index >= self.num_queues || size != self.queue_size {
            return None;
        }
        // SAFETY: index < num_queues, so the part lies inside the mapping.
        let base = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(index as usize * queue_stride(size))) };
        Some(InflightQueue { _area: self.clone(), base, size, counter: 0 })
    }
}

/// One queue's part of the area, used by the reactor that runs the queue.
pub struct InflightQueue {
    _area: Arc<InflightArea>,
    base: NonNull<u8>,
    size: u16,
    counter: u64,
}

// SAFETY: moved to the queue's reactor once, then used only there.
unsafe impl Send for InflightQueue {}

impl InflightQueue {
    fn at<T>(&self, off: usize) -> *mut T {
        debug_assert!(off + std::mem::size_of::<T>() <= queue_stride(self.size));
        // SAFETY: offsets inside this queue's part (checked above in debug builds; callers pass
        // heads below `size`).
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    fn get<T: Copy>(&self, off: usize) -> T {
        // SAFETY: an aligned field inside this queue's part.
        unsafe { std::ptr::read_volatile(self.at::<T>(off)) }
    }

    fn set<T: Copy>(&self, off: usize, v: T) {
        // SAFETY: as `get`.
        unsafe { std::ptr::write_volatile(self.at::<T>(off), v) }
    }

    fn desc(head: u16) -> usize {
        HEADER + DESC * head as usize
    }

    /// After a restart: the heads that were taken and not completed, in the order they were
    /// taken, given the used ring's index now. Clears them as it goes only when they complete
    /// again. A fresh area (version 0) is made ours and has none.
    pub fn recover(&mut self, used_idx: u16) -> Vec<u16> {
        if self.get::<u16>(8) != 1 || self.get::<u16>(10) != self.size {
            for h in 0..self.size {
                self.set::<u8>(Self::desc(h), 0);
            }
            self.set::<u64>(0, 0);
            self.set::<u16>(10, self.size);
            self.set::<u16>(12, 0);
            self.set::<u16>(14, used_idx);
            fence(Ordering::Release);
            self.set::<u16>(8, 1);
            return Vec::new();
        }
        if self.get::<u16>(14) != used_idx {
            // Killed between the used ring and the clear: that request did complete.
            let last = self.get::<u16>(12);
            if last < self.size {
                self.set::<u8>(Self::desc(last), 0);
            }
            self.set::<u16>(14, used_idx);
        }
        let mut taken: Vec<(u64, u16)> = (0..self.size)
            .filter(|&h| self.get::<u8>(Self::desc(h)) == 1)
            .map(|h| (self.get::<u64>(Self::desc(h) + 8), h))
            .collect();
        taken.sort_unstable();
        self.counter = taken.last().map_or(0, |&(c, _)| c);
        taken.into_iter().map(|(_, h)| h).collect()
    }

    /// Request `head` was taken from the ring.
    #[inline]
    pub fn begin(&mut self, head: u16) {
        self.counter += 1;
        self.set::<u64>(Self::desc(head) + 8, self.counter);
        self.set::<u8>(Self::desc(head), 1);
    }

    /// Request `head` is about to go on the used ring.
    #[inline]
    pub fn completing(&self, head: u16) {
        self.set::<u16>(12, head);
        fence(Ordering::Release);
    }

    /// Request `head` is on the used ring, whose index is now `used_idx`.
    #[inline]
    pub fn completed(&self, head: u16, used_idx: u16) {
        fence(Ordering::Release);
        self.set::<u8>(Self::desc(head), 0);
        fence(Ordering::Release);
        self.set::<u16>(14, used_idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_finds_what_was_taken_and_not_completed_in_order() {
        let (area, file) = InflightArea::create(2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        assert!(q.recover(0).is_empty(), "a fresh area has nothing in flight");
        for h in [5, 2, 7, 0] {
            q.begin(h);
        }
        // 2 completes whole; 7 is on the used ring (index 2) when the daemon dies.
        q.completing(2);
        q.completed(2, 1);
        q.completing(7);
        drop(q);
        drop(area);
        // The next daemon maps the same file.
        let area = InflightArea::open(&file, 0, file.metadata().unwrap().len(), 2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        assert_eq!(q.recover(2), vec![5, 0], "7 completed (used ring ahead), 2 completed; 5 then 0 remain, in order");
        assert!(area.queue(0, 8).unwrap().recover(0).is_empty(), "the other queue had none");
        assert!(area.queue(2, 8).is_none() && area.queue(0, 16).is_none(), "no part for another shape");
        q.begin(3);
        assert_eq!(q.recover(2), vec![5, 0, 3], "counting goes on after the recovered ones");
    }

    #[test]
    fn refuses_bad_shapes_and_short_files() {
        assert!(InflightArea::create(0, 8).is_err());
        assert!(InflightArea::create(1, 6).is_err());
        let (_, file) = InflightArea::create(1, 8).unwrap();
        assert!(InflightArea::open(&file, 0, 1 << 20, 4, 8).is_err(), "file shorter than 4 queues");
        assert!(InflightArea::open(&file, 0, 8, 1, 8).is_err(), "size smaller than the shape");
        assert!(InflightArea::open(&file, 1, 4096, 1, 8).is_err(), "unaligned offset");
    }
}
