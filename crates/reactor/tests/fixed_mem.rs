//! External memory registered as fixed buffers (`FixedMem`): file I/O into views of a
//! memfd-backed region uses READ_FIXED/WRITE_FIXED on every reactor, a view keeps its slots
//! until it drops, and regions the ring cannot take (a full table, memory the kernel cannot pin)
//! fall back to plain I/O.

mod common;

use common::stop;
use ferrite_reactor::ring::{uring_opcode as op, uring_types as types, CqeHandler};
use ferrite_reactor::*;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

const MIB: usize = 1 << 20;

fn engine(reactors: usize, fixed_mem_slots: u32) -> Engine {
    let n = reactors.min(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    Engine::start(EngineConfig {
        cores: (0..n).collect(),
        mode: ReactorMode::Adaptive,
        pin: false,
        fixed_mem_slots,
        ..Default::default()
    })
    .expect("engine starts")
}

/// A shared mapping of a memfd, as a vhost target maps a guest memory region.
struct GuestRegion {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; the tests coordinate who writes it when.
unsafe impl Send for GuestRegion {}
// SAFETY: as above.
unsafe impl Sync for GuestRegion {}

impl GuestRegion {
    fn memfd(len: usize) -> Arc<Self> {
        // SAFETY: memfd_create with a constant name; ftruncate and mmap of our descriptor, closed
        // after mapping (the mapping keeps the memory).
        unsafe {
            let fd = libc::memfd_create(c"guest".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as i64), 0);
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            assert_ne!(p, libc::MAP_FAILED);
            libc::close(fd);
            Arc::new(Self { base: NonNull::new(p.cast()).unwrap(), len })
        }
    }

    /// Memory the kernel cannot pin (no access at all).
    fn inaccessible(len: usize) -> Arc<Self> {
        // SAFETY: an anonymous mapping without access; checked.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        Arc::new(Self { base: NonNull::new(p.cast()).unwrap(), len })
    }

    fn register(self: &Arc<Self>, e: &Engine) -> FixedMem {
        // SAFETY: the mapping lives as long as the Arc given as `keep`.
        unsafe { FixedMem::register(e, self.base, self.len, self.clone()) }.wait().expect("registered")
    }
}

impl Drop for GuestRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `memfd`/`inaccessible`; no view of it is left.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The completion of one operation, awaited by one task.
#[derive(Default)]
struct Done {
    res: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
}

impl CqeHandler for Done {
    fn complete(&self, _tag: u64, result: i32) {
        self.res.set(Some(result));
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Reads or writes `buf` at `off` of `fd` the way the uring bdev does: the fixed opcode when
/// the buffer has a fixed index. Returns the result.
async fn rw(fd: RawFd, buf: &mut IoBuf, off: u64, write: bool) -> i32 {
    let (n, fixed) = (buf.len() as u32, buf.fixed_index());
    let ptr = buf.as_mut_ptr();
    let t = types::Fd(fd);
    let e = match (write, fixed) {
        (false, Some(i)) => op::ReadFixed::new(t, ptr, n, i).offset(off).build(),
        (false, None) => op::Read::new(t, ptr, n).offset(off).build(),
        (true, Some(i)) => op::WriteFixed::new(t, ptr, n, i).offset(off).build(),
        (true, None) => op::Write::new(t, ptr, n).offset(off).build(),
    };
    let done = Rc::new(Done::default());
    // SAFETY: `buf` and the file stay alive until the completion, awaited below.
    unsafe { with_ring(|r| r.push(e, done.clone(), 0)) }.unwrap();
    poll_fn(|cx| match done.res.get() {
        Some(r) => Poll::Ready(r),
        None => {
            *done.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    })
    .await
}

fn temp_file(tag: &str) -> (std::fs::File, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("ferrite-fixedmem-{tag}-{}", std::process::id()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    (f, path)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn slots_used(e: &Engine, r: usize) -> usize {
    e.call(r, || with_ring(|ring| ring.external_slots_used())).wait().unwrap()
}

#[test]
fn file_io_into_guest_memory_uses_fixed_ops_on_every_reactor() {
    let e = engine(2, 1022);
    let region = GuestRegion::memfd(8 * MIB);
    let fm = Arc::new(region.register(&e));
    assert_eq!(fm.registered(), vec![true; e.count()], "registered on every reactor");
    for r in 0..e.count() {
        let fm = fm.clone();
        let (ops, got, want) = e
            .run_async(r, move || async move {
                let (file, path) = temp_file(&format!("rw{r}"));
                let local = fm.local().expect("this reactor's part");
                assert!(local.is_registered());
                let want = pattern(r as u8, 64 << 10);
                // An unaligned source and a destination 3 MiB further on.
                let src_off = r * MIB + 512;
                let dst_off = src_off + 3 * MIB;
                // SAFETY: nothing else touches these bytes of the region during the test.
                let (mut src, mut dst) = unsafe { (local.view(src_off, want.len()), local.view(dst_off, want.len())) };
                assert!(src.fixed_index().is_some() && dst.fixed_index().is_some());
                src.copy_from_slice(&want);
                let before = with_ring(|ring| ring.fixed_ops());
                assert_eq!(rw(file.as_raw_fd(), &mut src, 4096, true).await, want.len() as i32);
                assert_eq!(rw(file.as_raw_fd(), &mut dst, 4096, false).await, want.len() as i32);
                let ops = with_ring(|ring| ring.fixed_ops()) - before;
                std::fs::remove_file(path).unwrap();
                (ops, dst.to_vec(), want)
            })
            .wait()
            .unwrap();
        assert_eq!(ops, 2, "reactor {r}: a WRITE_FIXED and a READ_FIXED");
        assert_eq!(got, want, "reactor {r}: the data came back into guest memory");
        // And it is in the mapping itself, as the guest would see it.
        let dst_off = r * MIB + 512 + 3 * MIB;
        // SAFETY: reads bytes of the mapping, which no I/O touches any more.
        let seen = unsafe { std::slice::from_raw_parts(region.base.as_ptr().add(dst_off), want.len()) };
        assert_eq!(seen, &want[..]);
    }
    let used: Vec<usize> = (0..e.count()).map(|r| slots_used(&e, r)).collect();
    assert_eq!(used, vec![1; e.count()], "8 MiB is one chunk, one slot each");
    drop(fm);
    let used: Vec<usize> = (0..e.count()).map(|r| slots_used(&e, r)).collect();
    assert_eq!(used, vec![0; e.count()], "unregistered on every reactor");
    stop(e);
    assert_eq!(Arc::strong_count(&region), 1, "no reactor holds the memory any more");
}

#[test]
fn a_view_keeps_the_region_registered_until_it_drops() {
    let e = engine(1, 1022);
    let region = GuestRegion::memfd(MIB);
    let r2 = region.clone();
    let (with_view, after) = e
        .run_async(0, move || async move {
            // Registered from a task on the reactor itself.
            let fm =
                unsafe { FixedMem::register(&ferrite_reactor::engine(), r2.base, r2.len, r2.clone()) }.await.unwrap();
            drop(r2);
            let local = fm.local().unwrap();
            // SAFETY: nothing else touches the region.
            let view = unsafe { local.view(0, 4096) };
            drop(local);
            drop(fm);
            // The table lets go (a message to this reactor); the view still holds the slot.
            for _ in 0..3 {
                next_turn().await;
            }
            let with_view = with_ring(|ring| ring.external_slots_used());
            drop(view);
            (with_view, with_ring(|ring| ring.external_slots_used()))
        })
        .wait()
        .unwrap();
    assert_eq!((with_view, after), (1, 0));
    stop(e);
    assert_eq!(Arc::strong_count(&region), 1);
}

#[test]
fn a_region_the_table_cannot_take_falls_back_to_plain_io() {
    let e = engine(1, 1);
    let (a, b) = (GuestRegion::memfd(MIB), GuestRegion::memfd(MIB));
    let fa = a.register(&e);
    let fb = b.register(&e);
    assert_eq!((fa.registered(), fb.registered()), (&[true][..], &[false][..]), "one slot: B does not fit");
    let fb = Arc::new(fb);
    let f2 = fb.clone();
    let (ops, ok) = e
        .run_async(0, move || async move {
            let (file, path) = temp_file("fallback");
            let local = f2.local().unwrap();
            assert!(!local.is_registered());
            // SAFETY: nothing else touches these bytes.
            let (mut src, mut dst) = unsafe { (local.view(0, 8192), local.view(MIB - 8192, 8192)) };
            assert_eq!((src.fixed_index(), dst.fixed_index()), (None, None));
            src.copy_from_slice(&pattern(9, 8192));
            let before = with_ring(|ring| ring.fixed_ops());
            let w = rw(file.as_raw_fd(), &mut src, 0, true).await;
            let r = rw(file.as_raw_fd(), &mut dst, 0, false).await;
            std::fs::remove_file(path).unwrap();
            (with_ring(|ring| ring.fixed_ops()) - before, w == 8192 && r == 8192 && dst[..] == src[..])
        })
        .wait()
        .unwrap();
    assert_eq!((ops, ok), (0, true), "plain I/O, correct data");
    drop(fa);
    let c = GuestRegion::memfd(MIB);
    let fc = c.register(&e);
    assert_eq!(fc.registered(), &[true], "A's slot is free again");
    drop((fb, fc));
    stop(e);
}

#[test]
fn memory_the_kernel_cannot_pin_stays_unregistered() {
    let e = engine(2, 1022);
    let bad = GuestRegion::inaccessible(MIB);
    let fm = bad.register(&e);
    assert_eq!(fm.registered(), vec![false; e.count()]);
    assert!((0..e.count()).all(|r| slots_used(&e, r) == 0), "nothing left registered");
    drop(fm);
    stop(e);
}
