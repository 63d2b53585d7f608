//! The dirty page log of a live migration (VHOST_USER_SET_LOG_BASE with
//! VHOST_USER_PROTOCOL_F_LOG_SHMFD): a bitmap in memory shared with the front end, one bit per
//! 4 KiB page of guest-physical memory, bit `p % 8` of byte `p / 8` for page `p`. While
//! VHOST_F_LOG_ALL is negotiated the device sets the bit of every page it writes (the used ring,
//! the data of reads, status bytes) after it wrote it; the front end reads and clears the bits
//! and sends those pages again. Bits are set with atomic OR, since the front end clears them
//! concurrently (QEMU exchanges whole 64-bit words with zero; the little-endian bytes of a word
//! are the bytes here).

use crate::shared::SharedMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Bytes of guest memory per bit (VHOST_LOG_PAGE).
pub const LOG_PAGE: u64 = 4096;
/// Largest log taken: enough for 16 TiB of guest memory.
pub const MAX_LOG_BYTES: u64 = 512 << 20;

/// A mapped dirty log.
pub struct DirtyLog {
    map: SharedMap,
    /// Writes to pages the log does not cover (the front end gave too small a log).
    missed: AtomicU64,
}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog").field("bytes", &self.map.len()).finish()
    }
}

impl DirtyLog {
    /// Maps `size` bytes of bitmap at `offset` in `file`. Refuses an empty or oversized log
    /// and a file shorter than the log.
    pub fn map(file: &File, size: u64, offset: u64) -> Result<DirtyLog, String> {
        if size == 0 || size > MAX_LOG_BYTES {
            return Err(format!("a dirty log of {size} bytes (1 to {MAX_LOG_BYTES} taken)"));
        }
        Ok(DirtyLog { map: SharedMap::map(file, offset, size as usize, "dirty log")?, missed: Default::default() })
    }

    /// Marks the pages of guest-physical `[gpa, gpa + len)` written.
    #[inline]
    pub fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            let byte = page / 8;
            if byte >= self.map.len() as u64 {
                self.missed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // SAFETY: `byte` < the log's length, inside the mapping; u8 atomics need no alignment.
            let b = unsafe { &*(self.map.ptr().as_ptr().add(byte as usize) as *const AtomicU8) };
            let bit = 1u8 << (page % 8);
            if b.load(Ordering::Relaxed) & bit == 0 {
                b.fetch_or(bit, Ordering::Release);
            }
        }
    }

    /// Pages written that the log did not cover.
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn memfd(len: usize) -> File {
        // SAFETY: a fresh memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"dirty-test".as_ptr(), 0) };
        let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.write_all(&vec![0u8; len]).unwrap();
        f
    }

    fn bytes(f: &mut File, at: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        f.seek(std::io::SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        b
    }

    #[test]
    fn marks_every_page_a_range_touches_and_nothing_else() {
        let mut f = memfd(8192);
        let log = DirtyLog::map(&f, 16, 4100).unwrap();
        // Pages 0 and 1 (a range across their boundary), page 9, pages 17..=19.
        log.mark(4095, 2);
        log.mark(9 * 4096 + 100, 1);
        log.mark(17 * 4096, 3 * 4096);
        log.mark(5 * 4096, 0);
        assert_eq!(bytes(&mut f, 4100, 4), [0b0000_0011, 0b0000_0010, 0b0000_1110, 0]);
        assert_eq!(bytes(&mut f, 4096, 4), [0; 4], "nothing before the log's offset");
        assert_eq!(log.missed(), 0);
        // Page 128 is past a log of 16 bytes: counted, not written.
        log.mark(128 * 4096, 1);
        assert_eq!(log.missed(), 1);
        assert_eq!(bytes(&mut f, 4116, 4), [0; 4]);
    }

    #[test]
    fn refuses_logs_the_file_cannot_hold() {
        let f = memfd(4096);
        assert!(DirtyLog::map(&f, 0, 0).is_err(), "empty");
        assert!(DirtyLog::map(&f, 4097, 0).is_err(), "longer than the file");
        assert!(DirtyLog::map(&f, 16, 4090).is_err(), "runs past the file's end");
        assert!(DirtyLog::map(&f, 16, u64::MAX - 8).is_err(), "wraps");
        assert!(DirtyLog::map(&f, 4096, 0).is_ok());
    }
}
