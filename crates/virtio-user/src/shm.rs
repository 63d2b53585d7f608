//! The "guest memory" of a virtio-user device: one memfd, mapped shared into this process and
//! handed to the vhost-user device as its only memory region. Rings, request headers, status
//! bytes and bounce buffers all live in it, so the device (another process) reaches them
//! through its own mapping of the same file.
//!
//! Addresses given to the device are this process's virtual addresses (guest physical address
//! = user address, as SPDK's virtio-user does), so translating one is the identity.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use vhost::VhostUserMemoryRegionInfo;

/// A memfd of `len` bytes mapped `MAP_SHARED` at `base`; unmapped when dropped.
pub struct SharedMem {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; who writes which part is decided by
// its users (each queue's part is used by one core at a time, see `crate::queue`).
unsafe impl Send for SharedMem {}
// SAFETY: as for Send; `SharedMem` itself only hands out addresses.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Makes a memfd of `len` bytes (rounded up to a page) and maps it; its pages are zero.
    pub fn new(name: &str, len: usize) -> io::Result<SharedMem> {
        let page = 4096;
        let len = len.div_ceil(page) * page;
        let cname = std::ffi::CString::new(format!("ferrite-virtio-user-{name}"))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name holds a NUL byte"))?;
        // SAFETY: memfd_create with a valid C string and constant flags.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMem { fd, base: base.cast(), len })
    }

    /// Start of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the mapping is empty (never: `new` rounds up to a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the device is given for `ptr` (a pointer into the mapping).
    pub fn device_addr(&self, ptr: *const u8) -> u64 {
        debug_assert!(self.contains(ptr), "device addresses are only given for the shared region");
        ptr as u64
    }

    /// True if `ptr` points into the mapping.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let start = self.base as usize;
        (start..start + self.len).contains(&(ptr as usize))
    }

    /// The region as `VHOST_USER_SET_MEM_TABLE` describes it (the descriptor travels with the
    /// message; the device maps the file itself).
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: self.base as u64,
            memory_size: self.len as u64,
            userspace_addr: self.base as u64,
            mmap_offset: 0,
            mmap_handle: self.fd.as_raw_fd(),
        }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no reference into it outlives self
        // (every user holds the device that owns it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_shared_through_the_file() {
        let m = SharedMem::new("t", 5000).unwrap();
        assert_eq!(m.len(), 8192, "rounded up to pages");
        // SAFETY: within the mapping.
        unsafe { m.base().add(4100).write(0x5a) };
        let mut byte = [0u8; 1];
        // SAFETY: pread into a local buffer from our descriptor.
        let n = unsafe { libc::pread(m.region().mmap_handle, byte.as_mut_ptr().cast(), 1, 4100) };
        assert_eq!((n, byte[0]), (1, 0x5a), "a store through the mapping is in the file");
        assert!(m.contains(unsafe { m.base().add(8191) }) && !m.contains(unsafe { m.base().add(8192) }));
    }
}
