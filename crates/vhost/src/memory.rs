//! The guest's memory as the front end shares it (VHOST_USER_SET_MEM_TABLE): each region mapped
//! from the file descriptor that came with it, the front end's virtual addresses translated to
//! guest-physical ones (ring addresses arrive in the front end's address space), and host
//! pointers for zero-copy I/O.
//!
//! A region whose file is shorter than the mapping would fault on access (SIGBUS) and bring the
//! daemon down: each file's size is checked before it is mapped. A front end that shrinks a
//! file after the check can still do that (QEMU does not seal its memory files; SPDK has the same
//! exposure): named in docs/guide/vhost.md.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{
    Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress,
};

/// The guest memory type of the rings and the data.
pub type GuestMem = GuestMemoryMmap<()>;

/// Most regions a memory table may have (QEMU sends up to 8; with the slots protocol feature,
/// more: not offered).
pub const MAX_REGIONS: usize = 8;

/// One region as the front end described it.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    user_addr: u64,
    size: u64,
    gpa: u64,
}

/// Where a region is mapped in this process.
#[derive(Debug, Clone, Copy)]
struct Host {
    gpa: u64,
    len: u64,
    base: NonNull<u8>,
}

/// A memory table, mapped.
pub struct Memory {
    /// The regions as vm-memory maps them (they own the mappings; tests read and write
    /// through them).
    pub guest: GuestMem,
    maps: Vec<Mapping>,
    /// The same regions as (guest-physical range, host address), searched by the hot path
    /// (vm-memory's lookup and checks cost a request several times over).
    hosts: Vec<Host>,
}

// SAFETY: `hosts` points into the mappings `guest` owns, which live as long as the value;
// the memory is shared with the guest and touched only through copies and the rings' rules.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").field("regions", &self.maps).finish()
    }
}

impl Memory {
    /// Maps `regions` from `files` (one each, in order). Refuses empty, overlapping, oversized
    /// or wrapping regions, files too short for their mapping, and a count of files that does
    /// not match.
    pub fn map(regions: &[VhostUserMemoryRegion], files: Vec<File>) -> Result<Memory, String> {
        if regions.is_empty() || regions.len() > MAX_REGIONS {
            return Err(format!("{} memory regions (1 to {MAX_REGIONS} taken)", regions.len()));
        }
        if files.len() != regions.len() {
            return Err(format!("{} memory regions came with {} file descriptors", regions.len(), files.len()));
        }
        let mut mapped = Vec::with_capacity(regions.len());
        let mut maps = Vec::with_capacity(regions.len());
        for (r, file) in regions.iter().zip(files) {
            let (gpa, size, ua, off) = (r.guest_phys_addr, r.memory_size, r.user_addr, r.mmap_offset);
            if size == 0
                || gpa.checked_add(size).is_none()
                || ua.checked_add(size).is_none()
                || off.checked_add(size).is_none()
                || size > isize::MAX as u64
            {
                return Err(format!(
                    "memory region gpa {gpa:#x} size {size:#x} user {ua:#x} offset {off:#x} is invalid"
                ));
            }
            // SAFETY: fstat into a zeroed struct on a descriptor we own.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
                return Err(format!("memory region fd: {}", std::io::Error::last_os_error()));
            }
            if (st.st_size as u64) < off + size {
                return Err(format!(
                    "memory region gpa {gpa:#x}: file of {} bytes is shorter than offset {off:#x} + size {size:#x}",
                    st.st_size
                ));
            }
            let region = vhost::vhost_user::message::VhostUserMemoryRegion::mmap_region::<()>(r, file)
                .map_err(|e| format!("mapping memory region gpa {gpa:#x}: {e}"))?;
            let region = GuestRegionMmap::new(region, GuestAddress(gpa))
                .ok_or_else(|| format!("memory region gpa {gpa:#x} size {size:#x} wraps"))?;
            mapped.push(region);
            maps.push(Mapping { user_addr: ua, size, gpa });
        }
        let guest = GuestMemoryMmap::from_regions(mapped).map_err(|e| format!("memory regions: {e}"))?;
        let mut hosts = Vec::with_capacity(maps.len());
        for r in guest.iter() {
            let base =
                r.get_host_address(MemoryRegionAddress(0)).ok().and_then(NonNull::new).ok_or_else(|| {
                    format!("memory region gpa {:#x} has no host address", r.start_addr().raw_value())
                })?;
            hosts.push(Host { gpa: r.start_addr().raw_value(), len: r.len(), base });
        }
        Ok(Memory { guest, maps, hosts })
    }

    /// The guest-physical address of the front end's virtual address `va`.
    pub fn va_to_gpa(&self, va: u64) -> Option<u64> {
        self.maps.iter().find(|m| va >= m.user_addr && va - m.user_addr < m.size).map(|m| va - m.user_addr + m.gpa)
    }

    /// Copies guest memory at `gpa` into `buf` (a descriptor, a request header): the hot path's
    /// reads, without vm-memory's per-access iterator. False if part of it is not guest memory.
    #[inline]
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
        let mut at = 0usize;
        self.host_pieces(gpa, buf.len() as u64, |p, n| {
            // SAFETY: `p` is valid for `n` bytes of the mapping; the guest may write them
            // meanwhile, as it may under any device (the copy is what the device saw).
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), buf.as_mut_ptr().add(at), n) };
            at += n;
        }) && at == buf.len()
    }

    /// Copies `buf` into guest memory at `gpa` (a status byte). False if part of it is not
    /// guest memory (nothing is written then).
    #[inline]
    pub fn write(&self, gpa: u64, buf: &[u8]) -> bool {
        if !self.covers(gpa, buf.len() as u64) {
            return false;
        }
        let mut at = 0usize;
        self.host_pieces(gpa, buf.len() as u64, |p, n| {
            // SAFETY: `p` is valid for `n` bytes of the mapping.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr().add(at), p.as_ptr(), n) };
            at += n;
        })
    }

    /// Calls `f(host pointer, len)` for each piece of `[gpa, gpa + len)` that lies in one
    /// region, in order. False (and maybe some calls made) if part of it is not guest memory.
    #[inline]
    pub fn host_pieces(&self, gpa: u64, len: u64, mut f: impl FnMut(NonNull<u8>, usize)) -> bool {
        let (mut at, mut left) = (gpa, len);
        while left > 0 {
            let Some(h) = self.hosts.iter().find(|h| at.wrapping_sub(h.gpa) < h.len) else { return false };
            let off = at - h.gpa;
            let here = (h.len - off).min(left);
            // SAFETY: `off` < the region's length: inside its mapping.
            f(unsafe { NonNull::new_unchecked(h.base.as_ptr().add(off as usize)) }, here as usize);
            at += here;
            left -= here;
        }
        true
    }

    /// Whether `[gpa, gpa + len)` is all guest memory.
    pub fn covers(&self, gpa: u64, len: u64) -> bool {
        gpa.checked_add(len).is_some() && self.host_pieces(gpa, len, |_, _| {})
    }

    /// Regions, for the log.
    pub fn regions(&self) -> usize {
        self.maps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(len: usize) -> File {
        let fd = unsafe { libc::memfd_create(c"vhost-test".as_ptr(), 0) };
        assert!(fd >= 0);
        let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.write_all(&vec![0u8; len]).unwrap();
        f
    }

    fn region(gpa: u64, size: u64, ua: u64, off: u64) -> VhostUserMemoryRegion {
        VhostUserMemoryRegion::new(gpa, size, ua, off)
    }

    #[test]
    fn translates_user_addresses_and_splits_across_regions() {
        let m = Memory::map(
            &[region(0, 0x10000, 0x7000_0000, 0), region(0x10000, 0x10000, 0x9000_0000, 0x1000)],
            vec![memfd(0x10000), memfd(0x11000)],
        )
        .unwrap();
        assert_eq!(m.va_to_gpa(0x7000_0010), Some(0x10));
        assert_eq!(m.va_to_gpa(0x9000_0010), Some(0x10010));
        assert_eq!(m.va_to_gpa(0x8000_0000), None);
        let mut pieces = vec![];
        assert!(m.host_pieces(0xff00, 0x200, |_, n| pieces.push(n)));
        assert_eq!(pieces, vec![0x100, 0x100], "one piece per region");
        assert!(m.covers(0, 0x20000));
        assert!(!m.covers(0x1ff00, 0x200), "runs past the end");
        assert!(!m.covers(u64::MAX, 2), "wraps");
    }

    #[test]
    fn refuses_short_files_overlaps_and_bad_counts() {
        let e = Memory::map(&[region(0, 0x10000, 0, 0x1000)], vec![memfd(0x10000)]).unwrap_err();
        assert!(e.contains("shorter"), "{e}");
        let e = Memory::map(
            &[region(0, 0x10000, 0, 0), region(0x8000, 0x10000, 0x100000, 0)],
            vec![memfd(0x10000), memfd(0x10000)],
        )
        .unwrap_err();
        assert!(e.contains("memory regions"), "{e}");
        assert!(Memory::map(&[region(0, 0x10000, 0, 0)], vec![]).is_err());
        assert!(Memory::map(&[region(0, 0, 0, 0)], vec![memfd(16)]).is_err());
        assert!(Memory::map(&[region(u64::MAX - 10, 0x10000, 0, 0)], vec![memfd(0x10000)]).is_err());
    }
}
