//! `FixedMem` under `RLIMIT_MEMLOCK`: a region above the limit stays unregistered and its I/O
//! still works; one within it registers; one the kernel refuses (the limit counts what is
//! pinned already) falls back too. In a test binary of its own: it lowers the process's
//! limit and drops `CAP_IPC_LOCK` from the thread that starts the reactors (which inherit it).

use ferrite_reactor::ring::{uring_opcode as op, uring_types as types, CqeHandler};
use ferrite_reactor::*;
use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

const CAP_IPC_LOCK: u32 = 14;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops `CAP_IPC_LOCK` from the calling thread's effective set (kept in the permitted one).
fn drop_cap_ipc_lock() {
    let mut h = CapHeader { version: 0x2008_0522, pid: 0 };
    let mut d = [CapData::default(); 2];
    // SAFETY: capget/capset with a version-3 header and two data words.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut h as *mut CapHeader, d.as_mut_ptr()), 0);
        d[0].effective &= !(1 << CAP_IPC_LOCK);
        assert_eq!(libc::syscall(libc::SYS_capset, &mut h as *mut CapHeader, d.as_ptr()), 0);
    }
}

struct Mapping(NonNull<u8>, usize);
// SAFETY: plain shared memory; the test coordinates access.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `memfd`.
        unsafe { libc::munmap(self.0.as_ptr().cast(), self.1) };
    }
}

fn memfd(len: usize) -> Arc<Mapping> {
    // SAFETY: memfd_create, ftruncate and a shared mapping of it; checked.
    unsafe {
        let fd = libc::memfd_create(c"guest".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len as i64), 0);
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        assert_ne!(p, libc::MAP_FAILED);
        libc::close(fd);
        Arc::new(Mapping(NonNull::new(p.cast()).unwrap(), len))
    }
}

struct Done(Rc<Cell<Option<i32>>>);
impl CqeHandler for Done {
    fn complete(&self, _tag: u64, result: i32) {
        self.0.set(Some(result));
    }
}

#[test]
fn a_region_above_rlimit_memlock_falls_back_and_one_within_registers() {
    drop_cap_ipc_lock();
    let limit = 1u64 << 20;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: get and set this process's memlock limit (soft only).
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim), 0);
        lim.rlim_cur = limit.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
    }
    let e = Engine::start(EngineConfig {
        cores: vec![0],
        pin: false,
        // Small registered pool classes, so they leave room under the limit.
        bufs: BufPoolConfig { small_count: 8, large_count: 0, ..Default::default() },
        recv_bufs: RecvBufConfig { count: 0, ..Default::default() },
        ..Default::default()
    })
    .unwrap();
    let big = memfd(8 << 20);
    // SAFETY: the mapping lives as long as the Arc given as `keep`.
    let fm = unsafe { FixedMem::register(&e, big.0, big.1, big.clone()) }.wait().unwrap();
    assert_eq!(fm.registered(), &[false], "8 MiB above a 1 MiB limit");
    let small = memfd(64 << 10);
    // SAFETY: as above.
    let fs = unsafe { FixedMem::register(&e, small.0, small.1, small.clone()) }.wait().unwrap();
    assert_eq!(fs.registered(), &[true], "64 KiB within it");
    // Within the limit alone, not with what is pinned already: the kernel itself refuses.
    let mid = memfd(960 << 10);
    // SAFETY: as above.
    let fmid = unsafe { FixedMem::register(&e, mid.0, mid.1, mid.clone()) }.wait().unwrap();
    assert_eq!(fmid.registered(), &[false], "the kernel's RLIMIT_MEMLOCK check");
    assert_eq!(e.call(0, || with_ring(|r| r.external_slots_used())).wait().unwrap(), 1, "only the small one");
    drop(fmid);
    let fm = Arc::new(fm);
    let f2 = fm.clone();
    let (res, fixed, ok) = e
        .run_async(0, move || async move {
            let path = std::env::temp_dir().join(format!("ferrite-memlock-{}", std::process::id()));
            std::fs::write(&path, vec![7u8; 8192]).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: nothing else touches these bytes.
            let mut v = unsafe { f2.local().unwrap().view(4 << 20, 8192) };
            let fixed = v.fixed_index();
            let done = Rc::new(Cell::new(None));
            let e = op::Read::new(types::Fd(file.as_raw_fd()), v.as_mut_ptr(), 8192).build();
            // SAFETY: the view and the file live until the completion, awaited below.
            unsafe { with_ring(|r| r.push(e, Rc::new(Done(done.clone())), 0)) }.unwrap();
            while done.get().is_none() {
                sleep(Duration::from_millis(1)).await;
            }
            std::fs::remove_file(path).unwrap();
            (done.get().unwrap(), fixed, v.iter().all(|&b| b == 7))
        })
        .wait()
        .unwrap();
    assert_eq!((res, fixed, ok), (8192, None, true), "plain I/O into the unregistered region");
    drop((fm, fs));
    e.stop();
    e.join();
}
