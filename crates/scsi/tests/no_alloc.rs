//! READ and WRITE (10 and 16) allocate nothing per command in steady state: a driver on the
//! reactor keeps 8 tasks in flight on a malloc logical unit, each resubmitted from its
//! completion (writes with a pool buffer), and a global allocator counts the reactor thread's
//! allocations over 4,000 commands after a warm-up. Reads are checked against what was written.

mod common;

use common::*;
use ferrite_scsi::cdb::op;
use ferrite_scsi::{Response, Session, Task, TaskDone};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

const BS: u32 = 512;
const BLOCKS: u64 = 2048;
const DEPTH: u64 = 8;

struct Driver {
    session: RefCell<Option<Session>>,
    left: Cell<u64>,
    issued: Cell<u64>,
    bad: Cell<u64>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl Driver {
    /// Command `n`: alternately a WRITE(16) of 8 blocks of byte `n % 251` and a READ(10) of
    /// the same blocks (slot `n / 2 % DEPTH`).
    fn issue(&self, n: u64) {
        let lba = (n / 2 % DEPTH) * 8;
        let task = if n.is_multiple_of(2) {
            let mut b = ferrite_reactor::alloc_buf(8 * BS as usize);
            b.fill((n / 2 % 251) as u8);
            let mut c = [0u8; 16];
            c[0] = op::WRITE_16;
            c[2..10].copy_from_slice(&lba.to_be_bytes());
            c[13] = 8;
            Task::new(0, &c, 8 * BS).with_data(b)
        } else {
            let mut c = [0u8; 10];
            c[0] = op::READ_10;
            c[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
            c[8] = 8;
            Task::new(0, &c, 8 * BS)
        };
        self.session.borrow().as_ref().unwrap().submit(task, n);
    }
}

impl TaskDone for Driver {
    fn task_done(&self, tag: u64, r: Response) {
        if !r.is_good() {
            self.bad.set(self.bad.get() + 1);
        }
        if tag % 2 == 1 {
            let want = (tag / 2 % 251) as u8;
            if r.data_len != 8 * BS || r.data.iter().any(|b| b.iter().any(|&x| x != want)) {
                self.bad.set(self.bad.get() + 1);
            }
        }
        drop(r);
        // Each slot's write is followed by its read; the read starts the next write.
        let next = if tag.is_multiple_of(2) { tag + 1 } else { tag + 2 * DEPTH - 1 };
        self.left.set(self.left.get() - 1);
        if self.issued.get() > 0 {
            self.issued.set(self.issued.get() - 1);
            self.issue(next);
        } else if self.left.get() == 0 {
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }
}

async fn drive(d: &Rc<Driver>, first: u64, count: u64) {
    d.left.set(count);
    d.issued.set(count - DEPTH);
    for i in 0..DEPTH {
        d.issue(first + 2 * i);
    }
    std::future::poll_fn(|cx| {
        if d.left.get() == 0 {
            std::task::Poll::Ready(())
        } else {
            *d.waker.borrow_mut() = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    })
    .await;
}

#[test]
fn reads_and_writes_allocate_nothing_per_command() {
    let e = engine(1);
    let t = target("noalloc", BLOCKS, BS);
    let (allocs, bad) = run(&e, 0, move || async move {
        let d = Rc::new(Driver {
            session: RefCell::new(None),
            left: Cell::new(0),
            issued: Cell::new(0),
            bad: Cell::new(0),
            waker: RefCell::new(None),
        });
        *d.session.borrow_mut() = Some(Session::new(&t, initiator(1), 1, d.clone()).unwrap());
        drive(&d, 0, 1000).await;
        // FERRITE_ALLOC_TRACE=N prints where the first N allocations of the measured run come from.
        let trace = ferrite_alloc_count::trace_from_env();
        let before = ferrite_alloc_count::allocs();
        ferrite_alloc_count::trace_next(trace);
        drive(&d, 2000, 4000).await;
        let allocs = ferrite_alloc_count::allocs() - before;
        ferrite_alloc_count::trace_next(0);
        let bad = d.bad.get();
        d.session.borrow_mut().take();
        (allocs, bad)
    });
    assert_eq!(bad, 0, "every command GOOD, every read what was written");
    assert_eq!(allocs, 0, "allocations on the reactor over 4,000 commands");
    e.stop();
    e.join();
}
