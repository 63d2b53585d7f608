//! The "guest memory" of a virtio-user device: one memfd, mapped shared into this process and
//! handed to the vhost-user device as its only memory region. Rings, request headers, status
//! bytes and bounce buffers all live in it, so the device (another process) reaches them
//! through its own mapping of the same file.
//!
//! Addresses given to the device are this process's virtual addresses (guest physical address
//! = user address, as SPDK's virtio-user does), so translating one is the identity.
//!
//! # Hugepages, and what SPDK's vhost target needs
//!
//! The memfd is backed by 2 MiB hugepages (`MFD_HUGETLB | MFD_HUGE_2MB`, its size rounded up to
//! 2 MiB, mapped from offset 0) whenever the kernel has enough free ones; otherwise by 4 KiB
//! pages, with a warning in the log. Ferrite's own vhost target and qemu-storage-daemon take
//! either. SPDK's vhost target (v26.05, DPDK 25.11's rte_vhost) takes only the first:
//!
//! - rte_vhost (`vhost_user_mmap_region`) maps each region itself with
//!   `mmap(NULL, ALIGN_CEIL(mmap_offset + memory_size, st_blksize), .., fd, 0)`: the fd's
//!   `st_blksize` (2 MiB on hugetlbfs, 4 KiB on a plain memfd) sets the length, and the kernel
//!   picks the address: 2 MiB-aligned only for a hugetlbfs file.
//! - After every `SET_MEM_TABLE` SPDK registers that mapping for address translation
//!   (`vhost_session_mem_register` in lib/vhost/rte_vhost_user.c) as the whole 2 MiB pages
//!   around it: `spdk_mem_register(FLOOR_2MB(mmap_addr), CEIL_2MB(mmap_addr + mmap_size) -
//!   FLOOR_2MB(mmap_addr))`. Its vtophys map (`vtophys_map_pagemap` in lib/env_dpdk/memory.c)
//!   then reads the first byte of each 2 MiB page of that range, looks up its physical address
//!   in /proc/self/pagemap, and refuses one that is not 2 MiB-aligned (a debug message only:
//!   the registration still succeeds, and vhost-blk over a malloc bdev never needs a physical
//!   address; a bdev that DMAs into guest memory would).
//!
//! So a region of 4 KiB pages mapped at an address that is not 2 MiB-aligned makes SPDK read the
//! unmapped memory below its mapping: the vhost app dies of SIGSEGV while handling
//! `SET_MEM_TABLE` (seen with v26.05 and a 21.3 MiB region: "mmap align: 0x1000", then the
//! crash). What SPDK needs, then: the region's file on hugetlbfs with 2 MiB pages (its
//! `st_blksize` is then 2 MiB and the kernel aligns the mapping), and `mmap_offset +
//! memory_size` a multiple of 2 MiB (so that the registered range is exactly the mapping).
//! 1 GiB pages would do too; 2 MiB ones are what is asked for here. The pages must be reserved
//! (`/proc/sys/vm/nr_hugepages`): a shared hugetlb mapping reserves its pages when mapped, so a
//! shortage is seen here (and the 4 KiB fallback taken), not as a SIGBUS on first touch.
//!
//! A 4 KiB-page region whose size is a multiple of 2 MiB is no better: rte_vhost mapped one of
//! 22 MiB at 0x..3f6000 and SPDK died the same way. (A QEMU guest's 1 GiB memfd was mapped
//! 2 MiB-aligned in SPDK's process once, by the chance of where the kernel put it; SPDK then
//! only failed to translate its 4 KiB pages, silently.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use vhost::VhostUserMemoryRegionInfo;

/// Bytes of a 2 MiB hugepage.
pub const HUGE_PAGE: usize = 2 << 20;
/// Bytes of a small page.
pub const SMALL_PAGE: usize = 4096;

/// Which pages back the shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// 2 MiB hugepages (hugetlbfs memfd): what SPDK's vhost target needs (see the module doc).
    Huge2M,
    /// 4 KiB pages (plain memfd): Ferrite's vhost target and qemu-storage-daemon take it,
    /// SPDK's vhost target does not (module doc).
    Small,
}

impl Backing {
    /// Bytes of one page of this backing.
    pub fn page_size(self) -> usize {
        match self {
            Backing::Huge2M => HUGE_PAGE,
            Backing::Small => SMALL_PAGE,
        }
    }
}

/// A memfd of `len` bytes mapped `MAP_SHARED` at `base`; unmapped when dropped.
pub struct SharedMem {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    backing: Backing,
}

// SAFETY: the mapping is plain memory owned by this value; who writes which part is decided by
// its users (each queue's part is used by one core at a time, see `crate::queue`).
unsafe impl Send for SharedMem {}
// SAFETY: as for Send; `SharedMem` itself only hands out addresses.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Makes a memfd of at least `len` bytes and maps it; its pages are zero. 2 MiB hugepages
    /// when the kernel can give them (the size is then rounded up to 2 MiB), else 4 KiB pages
    /// (rounded up to 4 KiB), with a warning: SPDK's vhost target needs hugepages.
    pub fn new(name: &str, len: usize) -> io::Result<SharedMem> {
        match SharedMem::with_backing(name, len, Backing::Huge2M) {
            Ok(m) => Ok(m),
            Err(e) => {
                log::warn!(
                    "virtio-user {}: no 2 MiB hugepages for the {} KiB of shared memory ({e}); using 4 KiB \
                     pages: Ferrite's vhost and qemu-storage-daemon take them, SPDK's vhost target needs \
                     hugepages (reserve some in /proc/sys/vm/nr_hugepages)",
                    name.escape_debug(),
                    len.div_ceil(1024)
                );
                SharedMem::with_backing(name, len, Backing::Small)
            }
        }
    }

    /// Makes a memfd of at least `len` bytes with pages of `backing` (the size rounded up to a
    /// page) and maps it; its pages are zero. Fails if the kernel cannot give those pages
    /// (hugepages: none reserved or free, or no hugetlb support).
    pub fn with_backing(name: &str, len: usize, backing: Backing) -> io::Result<SharedMem> {
        let page = backing.page_size();
        let len = len.max(1).div_ceil(page) * page;
        let cname = std::ffi::CString::new(format!("ferrite-virtio-user-{name}"))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name holds a NUL byte"))?;
        let flags = match backing {
            Backing::Huge2M => libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            Backing::Small => libc::MFD_CLOEXEC,
        };
        // SAFETY: memfd_create with a valid C string and constant flags.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address (for a
        // hugetlbfs file, a hugepage-aligned one). A shared hugetlb mapping reserves its pages
        // here: a shortage fails this call (ENOMEM) instead of a later page fault.
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
        debug_assert!((base as usize).is_multiple_of(page), "the kernel aligns a mapping to its pages");
        Ok(SharedMem { fd, base: base.cast(), len, backing })
    }

    /// Which pages back the memory.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Start of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the mapping is empty (never: the constructors round up to a page).
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
        // SAFETY: the mapping made by the constructor, unmapped once; no reference into it outlives self
        // (every user holds the device that owns it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blksize(m: &SharedMem) -> u64 {
        // SAFETY: fstat into a zeroed struct on the mapping's open descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(m.region().mmap_handle, &mut st) }, 0);
        st.st_blksize as u64
    }

    fn shared_through_the_file(m: &SharedMem, at: usize) {
        // SAFETY: within the mapping (callers pass an offset below its length).
        unsafe { m.base().add(at).write(0x5a) };
        let mut byte = [0u8; 1];
        // SAFETY: pread into a local buffer from our descriptor.
        let n = unsafe { libc::pread(m.region().mmap_handle, byte.as_mut_ptr().cast(), 1, at as libc::off_t) };
        assert_eq!((n, byte[0]), (1, 0x5a), "a store through the mapping is in the file");
    }

    #[test]
    fn small_pages_are_shared_through_the_file() {
        let m = SharedMem::with_backing("t", 5000, Backing::Small).unwrap();
        assert_eq!((m.len(), m.backing()), (8192, Backing::Small), "rounded up to pages");
        shared_through_the_file(&m, 4100);
        let end = 8192;
        assert!(m.contains(unsafe { m.base().add(end - 1) }) && !m.contains(unsafe { m.base().add(end) }));
        assert_eq!(blksize(&m), 4096);
    }

    /// What SPDK's vhost target needs of the region (module doc): 2 MiB pages, so a 2 MiB
    /// `st_blksize` (rte_vhost's mapping length and alignment), and a 2 MiB multiple of a size.
    #[test]
    fn hugepages_are_2mib_aligned_and_shared_through_the_file() {
        let m = match SharedMem::with_backing("t", 3 << 20, Backing::Huge2M) {
            Ok(m) => m,
            Err(e) => {
                println!("SKIP hugepages_are_2mib_aligned_and_shared_through_the_file: no 2 MiB hugepages ({e})");
                return;
            }
        };
        assert_eq!((m.len(), m.backing()), (4 << 20, Backing::Huge2M), "rounded up to 2 MiB");
        assert!((m.base() as usize).is_multiple_of(HUGE_PAGE), "mapped 2 MiB-aligned: {:p}", m.base());
        let r = m.region();
        assert_eq!((r.mmap_offset, r.memory_size % HUGE_PAGE as u64), (0, 0));
        assert_eq!(blksize(&m), HUGE_PAGE as u64, "rte_vhost maps by st_blksize");
        shared_through_the_file(&m, (2 << 20) + 100);
    }

    #[test]
    fn new_takes_hugepages_when_it_can_and_small_pages_otherwise() {
        let m = SharedMem::new("t", 5000).unwrap();
        assert!(m.len() >= 5000 && m.len().is_multiple_of(m.backing().page_size()));
        assert!((m.base() as usize).is_multiple_of(m.backing().page_size()));
        shared_through_the_file(&m, 4999);
    }
}
