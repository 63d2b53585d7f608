//! A mapping of memory a front end shares by file descriptor (the inflight area, the dirty log):
//! checked to lie inside the file before it is mapped (touching a page past the file's end
//! would fault and bring the daemon down), unmapped when dropped.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// `len` bytes of a file, mapped shared and writable.
pub struct SharedMap {
    /// Start of the mapping (the page `offset` is in).
    base: NonNull<u8>,
    map_len: usize,
    /// Where the asked-for bytes start in the mapping.
    skip: usize,
    len: usize,
}

// SAFETY: plain shared memory; its users touch it only through atomics or their own rules.
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps bytes `[offset, offset + len)` of `file` (`what` names it in errors).
    pub fn map(file: &File, offset: u64, len: usize, what: &str) -> Result<SharedMap, String> {
        if len == 0 {
            return Err(format!("an empty {what}"));
        }
        let have = file.metadata().map_err(|e| format!("{what} fd: {e}"))?.len();
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > have) {
            return Err(format!("{what} fd of {have} bytes is shorter than offset {offset:#x} + {len:#x}"));
        }
        let skip = (offset % 4096) as usize;
        let map_len = skip + len;
        // SAFETY: a fresh shared mapping of a range the file holds; unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                (offset - skip as u64) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mapping the {what}: {}", std::io::Error::last_os_error()));
        }
        let base = NonNull::new(p.cast()).ok_or_else(|| format!("mapping the {what}: null"))?;
        Ok(SharedMap { base, map_len, skip, len })
    }

    /// The first of the mapped bytes asked for.
    pub fn ptr(&self) -> NonNull<u8> {
        // SAFETY: `skip` < the mapping's length.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(self.skip)) }
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (empty mappings are refused); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}
