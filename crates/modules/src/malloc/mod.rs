//! The malloc bdev: a RAM disk.
//!
//! Its memory is allocated and touched when the bdev is created, as SPDK's is: a malloc bdev
//! that the machine cannot hold is refused with ENOMEM at create instead of getting the daemon
//! killed when it fills, and reads of never-written blocks come from real pages (not the kernel's
//! shared zero page, which would make read benchmarks measure one cache-resident page).
//!
//! The memory is shared by every core's channel and accessed with plain copies, as SPDK does:
//! two cores writing the same blocks at the same time get one of the two payloads per block
//! range, like concurrent writers on a real disk.

pub mod rpc;
mod stream;

use ferrite_bdev::bdev::{check_geometry, register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits};
use ferrite_bdev::io::{BdevIo, DiffOffset, IoAux, IoStatus, IoType, IoTypes};
use ferrite_reactor::{IoBuf, Lender};
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;

/// Parameters of `bdev_malloc_create`.
#[derive(Debug, Clone, Default)]
pub struct MallocOpts {
    /// Name (None: the first free `MallocN`).
    pub name: Option<String>,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes per physical block (None: the block size).
    pub physical_block_size: Option<u32>,
    /// Optimal I/O boundary in blocks; requests crossing it are split (None or 0: none).
    pub optimal_io_boundary: Option<u32>,
    /// UUID (random if None).
    pub uuid: Option<String>,
}

/// The I/O types the malloc module serves itself (compare is done by the bdev layer, and
/// compare-and-write under the layer's lease, compared and written here in one pass).
pub const IO_TYPES: IoTypes = IoTypes::of(&[
    IoType::Read,
    IoType::Write,
    IoType::Flush,
    IoType::Unmap,
    IoType::WriteZeroes,
    IoType::Reset,
    IoType::Copy,
]);

struct Memory {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is valid for the life of Memory and only accessed through raw copies
// bounded by `len` (checked by the bdev layer's range check).
unsafe impl Send for Memory {}
// SAFETY: as above; concurrent copies into the same bytes are the documented disk-like race.
unsafe impl Sync for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `allocate`; no channel outlives the backend.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

struct MallocBackend {
    mem: Arc<Memory>,
    opts: MallocOpts,
}

struct MallocChannel {
    mem: Arc<Memory>,
    /// This core's share of `mem` for lent read buffers: cloning an `Rc` per zero-copy read
    /// touches no counter that other cores write.
    lender: Rc<Lender>,
}

impl BackendChannel for MallocChannel {
    fn lends_reads(&self) -> bool {
        true
    }

    fn compares_in_place(&self) -> bool {
        true
    }

    #[inline]
    fn submit(&mut self, mut io: BdevIo) {
        let off = io.offset_bytes() as usize;
        let len = io.len_bytes() as usize;
        debug_assert!(off + len <= self.mem.len, "bdev layer range check missed");
        if io.req.is_zcopy_read() {
            // SAFETY: [off, off+len) lies within the mapping, which the lender keeps mapped.
            let buf = unsafe {
                let ptr = std::ptr::NonNull::new(self.mem.base.add(off)).expect("mapping is non-null");
                IoBuf::lent(ptr, len, self.lender.clone())
            };
            io.req.bufs.push(buf);
            io.complete_deferred(IoStatus::Success);
            return;
        }
        // SAFETY: [off, off+len) lies within the mapping (range checked by the bdev layer), and
        // buffers are disjoint from it (lent views of it are only ever read from, and a copy
        // between overlapping ranges of it is a memmove).
        unsafe {
            let base = self.mem.base.add(off);
            match io.req.io_type {
                IoType::Read => {
                    let mut pos = 0;
                    for b in io.req.bufs.iter_mut() {
                        std::ptr::copy_nonoverlapping(base.add(pos), b.as_mut_ptr(), b.len());
                        pos += b.len();
                    }
                }
                IoType::Write => {
                    let mut pos = 0;
                    for b in io.req.bufs.iter() {
                        std::ptr::copy(b.as_ptr(), base.add(pos), b.len());
                        pos += b.len();
                    }
                }
                IoType::CompareAndWrite => {
                    // Under the layer's lease: no other write reaches these blocks meanwhile.
                    let IoAux::Compare(cmp) = &io.req.aux else { unreachable!("the layer checked the compare data") };
                    let blocks = std::slice::from_raw_parts(base, len);
                    if let Some(at) =
                        ferrite_bdev::first_difference(std::iter::once(blocks), cmp.iter().map(|b| &b[..]))
                    {
                        return io.complete_deferred(IoStatus::Miscompare { offset: DiffOffset::at(at) });
                    }
                    let mut pos = 0;
                    for b in io.req.bufs.iter() {
                        std::ptr::copy(b.as_ptr(), base.add(pos), b.len());
                        pos += b.len();
                    }
                }
                IoType::Unmap | IoType::WriteZeroes => std::ptr::write_bytes(base, 0, len),
                IoType::Copy => {
                    if let IoAux::CopyFrom(src) = io.req.aux {
                        let src = self.mem.base.add((src * io.block_size() as u64) as usize);
                        stream::copy(src, base, len);
                    }
                }
                _ => {}
            }
        }
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for MallocBackend {
    fn zcopy(&self) -> bool {
        true
    }

    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(MallocChannel { mem: self.mem.clone(), lender: Rc::new(Lender::new(self.mem.clone())) }))
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let mut params = json!({"name": bdev.name(), "num_blocks": bdev.num_blocks(),
            "block_size": bdev.block_size(), "uuid": bdev.uuid().to_string()});
        if let Some(p) = self.opts.physical_block_size {
            params["physical_block_size"] = json!(p);
        }
        if let Some(b) = self.opts.optimal_io_boundary.filter(|b| *b > 0) {
            params["optimal_io_boundary"] = json!(b);
        }
        Some(json!({"method": "bdev_malloc_create", "params": params}))
    }
}

/// Bytes this process may still take: the smaller of the machine's available memory and what
/// its cgroup (v2) allows.
fn memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()?;
    let mut avail = kib * 1024;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if let Some(path) = cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
        let dir = format!("/sys/fs/cgroup{}", path.trim());
        let read =
            |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok().and_then(|s| s.trim().parse::<u64>().ok());
        if let (Some(max), Some(cur)) = (read("memory.max"), read("memory.current")) {
            avail = avail.min(max.saturating_sub(cur));
        }
    }
    Some(avail)
}

/// The transparent huge page size the mapping is aligned to (x86-64's and arm64's with 4 KiB
/// pages).
const HUGE_PAGE: usize = 2 << 20;

/// The base page size the mappings are made of.
const PAGE: usize = 4096;

/// Whether malloc bdevs made from now on ask for transparent huge pages (the default).
static HUGE_PAGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets whether malloc bdevs made from now on ask for transparent huge pages: off with
/// `--no-huge`, as SPDK's memory is without hugepages then (benchmarks that compare the two on
/// 4 KiB pages).
pub fn set_huge_pages(on: bool) {
    HUGE_PAGES.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Maps `len` bytes, anonymous and private. From one huge page up the mapping starts on a
/// huge page boundary and asks for transparent huge pages (`MADV_HUGEPAGE`, which the usual
/// `madvise` THP policy needs): random 4 KiB reads over a malloc bdev of 4 KiB pages miss the
/// TLB nearly every time, and its page walks cost a quarter of a random read's time. Where the
/// kernel has no huge page to give, it maps 4 KiB ones, as without the advice. Not asked for
/// after [`set_huge_pages`]`(false)`.
fn map_aligned(len: usize) -> Result<Memory, BdevError> {
    let huge = len >= HUGE_PAGE && HUGE_PAGES.load(std::sync::atomic::Ordering::Relaxed);
    let span = if huge { len + HUGE_PAGE } else { len };
    // SAFETY: an anonymous private mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(BdevError::NoMemory(format!("cannot map {len} bytes: {}", std::io::Error::last_os_error())));
    }
    if !huge {
        return Ok(Memory { base: p as *mut u8, len });
    }
    let Trim { head, kept, tail } = trim(p as usize, len);
    let base = (p as usize + head) as *mut u8;
    // SAFETY: both pieces lie within the span just mapped and outside the part kept, and
    // start on page boundaries.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap(base.add(kept) as *mut libc::c_void, tail);
        }
        // Advice only: without THP support it fails and changes nothing.
        libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    Ok(Memory { base, len })
}

/// How a span of `len + HUGE_PAGE` bytes mapped at a page boundary is cut: a head and a tail to
/// unmap around the part kept, which starts on a huge page boundary.
#[derive(Debug, PartialEq, Eq)]
struct Trim {
    head: usize,
    /// `len` in whole pages (a size of 512-byte blocks may end inside one).
    kept: usize,
    tail: usize,
}

fn trim(at: usize, len: usize) -> Trim {
    let span = (len + HUGE_PAGE).next_multiple_of(PAGE); // as mmap maps it
    let kept = len.next_multiple_of(PAGE);
    let head = at.next_multiple_of(HUGE_PAGE) - at;
    Trim { head, kept, tail: span - head - kept }
}

/// Maps `len` bytes and makes every page resident (zero-filled, private to this bdev).
fn allocate(len: usize) -> Result<Memory, BdevError> {
    // Keep a margin for everything else the machine runs.
    const MARGIN: u64 = 64 << 20;
    if let Some(avail) = memory_available() {
        if len as u64 + MARGIN > avail {
            return Err(BdevError::NoMemory(format!(
                "cannot allocate {len} bytes for a malloc bdev: {} MiB of memory available",
                avail >> 20
            )));
        }
    }
    let mem = map_aligned(len)?;
    let p = mem.base as *mut libc::c_void;
    const MADV_POPULATE_WRITE: i32 = 23;
    // SAFETY: advice on the mapping just made.
    if unsafe { libc::madvise(p, len, MADV_POPULATE_WRITE) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOMEM) {
            return Err(BdevError::NoMemory(format!("cannot populate {len} bytes: {e}")));
        }
        // Older kernels: touch one byte per page.
        for off in (0..len).step_by(PAGE) {
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_volatile(mem.base.add(off), 0) };
        }
    }
    Ok(mem)
}

/// Creates a malloc bdev. Allocating and touching its memory takes time proportional to its
/// size (about 0.3 s per GiB): call it off the reactors (the RPC does).
pub fn create(opts: MallocOpts) -> Result<Bdev, BdevError> {
    check_geometry(opts.block_size, opts.num_blocks)?;
    let len = usize::try_from(opts.num_blocks * opts.block_size as u64)
        .map_err(|_| BdevError::Invalid("malloc bdev too large".into()))?;
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => super::next_free_name("Malloc"),
    };
    ferrite_bdev::bdev::check_name(&name)?;
    if ferrite_bdev::bdev::lookup(&name).is_some() {
        return Err(BdevError::Exists(name));
    }
    let uuid = super::parse_uuid(opts.uuid.as_deref())?;
    let boundary = opts.optimal_io_boundary.unwrap_or(0);
    let limits = Limits {
        physical_block_size: opts.physical_block_size.unwrap_or(0),
        optimal_io_boundary: boundary,
        split_on_optimal_io_boundary: boundary > 0,
        ..Limits::default()
    };
    let mem = Arc::new(allocate(len)?);
    let props = BdevProps {
        name,
        aliases: vec![],
        uuid,
        block_size: opts.block_size,
        num_blocks: opts.num_blocks,
        product_name: "Malloc disk",
        module: "malloc",
        io_types: IO_TYPES,
        limits,
    };
    register(props, Arc::new(MallocBackend { mem, opts }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smaps fields of the mapping that starts at `base`.
    fn smaps_of(base: *mut u8) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let start = format!("{:x}-", base as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        let mut out = String::from(lines.next().expect("mapping listed"));
        // The fields, up to the last (VmFlags).
        for l in lines {
            out.push('\n');
            out.push_str(l);
            if l.starts_with("VmFlags:") {
                break;
            }
        }
        out
    }

    /// The length of the mapping whose smaps entry `smaps_of` gave.
    fn mapping_len(smaps: &str) -> usize {
        let range = smaps.split_whitespace().next().unwrap_or_default();
        let (a, b) = range.split_once('-').expect("a range first");
        usize::from_str_radix(b, 16).expect("hex") - usize::from_str_radix(a, 16).expect("hex")
    }

    #[test]
    fn a_large_bdev_is_mapped_on_huge_page_boundaries_and_asks_for_huge_pages() {
        let len = 3 * HUGE_PAGE + 4096;
        let mem = allocate(len).expect("allocate");
        assert_eq!(mem.base as usize % HUGE_PAGE, 0, "the mapping starts on a huge page boundary");
        // Every byte is ours and reads back what was written, first and last pages too.
        // SAFETY: within the mapping.
        unsafe {
            std::ptr::write_volatile(mem.base, 0xa5);
            std::ptr::write_volatile(mem.base.add(len - 1), 0x5a);
            assert_eq!(std::ptr::read_volatile(mem.base), 0xa5);
            assert_eq!(std::ptr::read_volatile(mem.base.add(len - 1)), 0x5a);
        }
        let smaps = smaps_of(mem.base);
        assert_eq!(mapping_len(&smaps), len, "the head and tail of the span were unmapped:\n{smaps}");
        let policy = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if policy.is_empty() || policy.contains("[never]") {
            eprintln!("SKIP the huge page check: transparent huge pages are off here ({policy:?})");
            return;
        }
        let eligible = smaps.lines().find_map(|l| l.strip_prefix("THPeligible:")).map(str::trim);
        assert_eq!(eligible, Some("1"), "the mapping may take huge pages:\n{smaps}");
    }

    #[test]
    fn a_size_that_ends_inside_a_page_keeps_whole_pages_and_no_more() {
        // 4,097 blocks of 512 bytes: 2 MiB and half a page.
        let len = 4097 * 512;
        let mem = allocate(len).expect("allocate");
        assert_eq!(mem.base as usize % HUGE_PAGE, 0);
        // SAFETY: within the mapping.
        unsafe {
            std::ptr::write_volatile(mem.base.add(len - 1), 9);
            assert_eq!(std::ptr::read_volatile(mem.base.add(len - 1)), 9);
        }
        let smaps = smaps_of(mem.base);
        assert_eq!(mapping_len(&smaps), HUGE_PAGE + 4096, "the part kept is len in whole pages:\n{smaps}");
    }

    #[test]
    fn the_span_is_cut_on_page_boundaries_around_a_huge_page_aligned_part() {
        for at in [HUGE_PAGE, HUGE_PAGE + 4096, 3 * HUGE_PAGE - 4096, 7 * HUGE_PAGE + 123 * 4096] {
            for len in [HUGE_PAGE, HUGE_PAGE + 512, 4097 * 512, 5 * HUGE_PAGE - 512, 1 << 30] {
                let t = trim(at, len);
                let span = (len + HUGE_PAGE).next_multiple_of(4096);
                assert_eq!(t.head + t.kept + t.tail, span, "{at:#x} {len}: the whole span");
                assert_eq!((at + t.head) % HUGE_PAGE, 0, "{at:#x} {len}: the part kept is aligned");
                assert!(t.kept >= len && t.kept - len < 4096, "{at:#x} {len}: whole pages of len");
                assert_eq!(t.head % 4096, 0, "{at:#x} {len}: head in pages");
                assert_eq!((at + t.head + t.kept) % 4096, 0, "{at:#x} {len}: tail starts on a page");
            }
        }
    }

    #[test]
    fn a_small_bdev_is_mapped_as_it_is() {
        let mem = allocate(64 << 10).expect("allocate");
        // SAFETY: within the mapping.
        unsafe {
            std::ptr::write_volatile(mem.base.add((64 << 10) - 1), 7);
            assert_eq!(std::ptr::read_volatile(mem.base.add((64 << 10) - 1)), 7);
        }
    }
}
