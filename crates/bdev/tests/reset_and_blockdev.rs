//! Resets wait for earlier requests on their channel; the uring module on a real block device
//! (a loop device, when the machine allows making one).

mod common;

use common::*;
use ferrite_bdev::{Bdev, Completed, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_modules::{malloc, uring};
use ferrite_reactor::ReactorMode;
use std::cell::RefCell;
use std::process::Command;
use std::rc::Rc;

/// Records the order in which tagged requests complete.
#[derive(Default)]
struct Order(RefCell<Vec<(u64, IoStatus)>>);

impl IoCompleter for Order {
    fn io_done(&self, tag: u64, io: Completed) {
        self.0.borrow_mut().push((tag, io.status));
    }
}

fn reset_completes_after_earlier_requests(bdev: &'static str, make: impl FnOnce() -> Bdev + Send + 'static) {
    let e = engine(1, ReactorMode::Adaptive);
    let order = run(&e, 0, move || async move {
        let b = make();
        let desc = Bdev::open(b.name(), true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let bs = b.block_size() as usize;
        let order = Rc::new(Order::default());
        // Eight writes, a reset, then a read: the reset must complete after all eight writes.
        for i in 0..8u64 {
            ch.submit(IoRequest::write(i * 8, 8, buf_from(&pattern(i, 8 * bs))), order.clone(), i);
        }
        ch.submit(IoRequest::no_payload(IoType::Reset, 0, 0), order.clone(), 100);
        while order.0.borrow().len() < 9 {
            ferrite_reactor::sleep(std::time::Duration::from_millis(1)).await;
        }
        // Once the reset is done, every earlier write is durable in the bdev.
        for i in 0..8u64 {
            let got = io_ok(&ch, IoRequest::read(i * 8, 8, buf_filled(8 * bs, 0))).await;
            assert_bytes_eq(&got, &pattern(i, 8 * bs), "write before the reset reads back");
        }
        ferrite_bdev::unregister(b.name(), None).unwrap();
        let v = order.0.borrow().clone();
        v
    });
    let pos = order.iter().position(|(t, _)| *t == 100).expect("reset completed");
    assert_eq!(pos, 8, "{bdev}: reset completed before earlier writes: {order:?}");
    assert!(order.iter().all(|(_, s)| *s == IoStatus::Success), "{order:?}");
    shutdown(e);
}

#[test]
fn malloc_reset_waits_for_earlier_writes() {
    reset_completes_after_earlier_requests("malloc", || {
        malloc::create(malloc::MallocOpts {
            name: Some("ResetMalloc".into()),
            num_blocks: 1024,
            block_size: 512,
            uuid: None,
            ..Default::default()
        })
        .unwrap()
    });
}

#[test]
fn uring_reset_waits_for_earlier_writes() {
    let file = TempFile::new("reset", 1 << 20);
    let path = file.path_str();
    reset_completes_after_earlier_requests("uring", move || {
        uring::create(uring::UringOpts {
            name: "ResetUring".into(),
            filename: path,
            block_size: None,
            uuid: None,
            ..Default::default()
        })
        .unwrap()
    });
}

/// A loop device over a temp file, detached on drop.
struct LoopDev {
    dev: String,
    _file: TempFile,
}

impl LoopDev {
    fn new(len: u64) -> Result<Self, String> {
        let file = TempFile::new("loopdev", len);
        let out = Command::new("losetup")
            .args(["-f", "--show", &file.path_str()])
            .output()
            .map_err(|e| format!("losetup not runnable: {e}"))?;
        if !out.status.success() {
            return Err(format!("losetup failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Self { dev: String::from_utf8_lossy(&out.stdout).trim().to_string(), _file: file })
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

#[test]
fn uring_on_a_block_device() {
    let lo = match LoopDev::new(8 << 20) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("SKIP uring_on_a_block_device: cannot make a loop device ({why})");
            return;
        }
    };
    let dev = lo.dev.clone();
    let e = engine(1, ReactorMode::Adaptive);
    run(&e, 0, move || async move {
        let b = uring::create(uring::UringOpts {
            name: "LoopUring".into(),
            filename: dev.clone(),
            block_size: None,
            uuid: None,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(b.block_size(), 512, "a loop device's logical block size");
        assert_eq!(b.num_blocks(), (8 << 20) / 512);
        let info = b.backend().driver_specific();
        assert_eq!(info["uring"]["o_direct"], true, "block devices take O_DIRECT: {info}");
        let desc = Bdev::open("LoopUring", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let data = pattern(7, 64 * 1024);
        let c = io(&ch, IoRequest::write(128, 128, buf_from(&data))).await;
        assert_eq!(c.status, IoStatus::Success);
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await.status, IoStatus::Success);
        let got = io_ok(&ch, IoRequest::read(128, 128, buf_filled(64 * 1024, 0))).await;
        assert_bytes_eq(&got, &data, "loop device read-back");
        // Write zeroes becomes FALLOC_FL_ZERO_RANGE on a block device.
        let c = io(&ch, IoRequest::no_payload(IoType::WriteZeroes, 128, 64)).await;
        assert_eq!(c.status, IoStatus::Success);
        let got = io_ok(&ch, IoRequest::read(128, 128, buf_filled(64 * 1024, 9))).await;
        assert!(got[..32 * 1024].iter().all(|&x| x == 0), "zeroed half reads zero");
        assert_bytes_eq(&got[32 * 1024..], &data[32 * 1024..], "untouched half");
        drop(ch);
        drop(desc);
        ferrite_bdev::unregister("LoopUring", None).unwrap();
    });
    shutdown(e);
    // The data reached the device: read it back through the kernel, bypassing Ferrite.
    let mut f = std::fs::File::open(&lo.dev).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(128 * 512)).unwrap();
    std::io::Read::read_exact(&mut f, &mut buf).unwrap();
    assert!(buf[..32 * 1024].iter().all(|&x| x == 0));
    assert_eq!(&buf[32 * 1024..], &pattern(7, 64 * 1024)[32 * 1024..]);
}
