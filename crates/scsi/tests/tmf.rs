//! Task management: ABORT TASK, ABORT TASK SET, CLEAR TASK SET and LOGICAL UNIT RESET on tasks
//! held by a delay bdev, across two reactors.

mod common;

use common::*;
use ferrite_modules::delay;
use ferrite_scsi::cdb::op;
use ferrite_scsi::{Lun, LunConfig, PortInfo, Response, Session, Target, Task, TaskDone, TmfResponse};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 512;

#[derive(Default)]
struct Record(RefCell<Vec<(u64, Response)>>);

impl TaskDone for Record {
    fn task_done(&self, tag: u64, resp: Response) {
        self.0.borrow_mut().push((tag, resp));
    }
}

impl Record {
    fn take(&self, tag: u64) -> Option<Response> {
        let mut v = self.0.borrow_mut();
        let i = v.iter().position(|(t, _)| *t == tag)?;
        Some(v.remove(i).1)
    }
}

/// A target whose LUN 0 is a delay bdev of `us` microseconds over a malloc bdev.
fn slow_target(name: &str, us: u64) -> Arc<Target> {
    malloc(&format!("{name}_m"), 256, BS);
    let l = delay::Latencies { avg_read: us, avg_write: us, p99_read: us, p99_write: us };
    delay::create(&format!("{name}_m"), name, None, l).unwrap();
    let t = Target::new("iqn.2026-01.io.ferrite:tmf");
    t.add_port(PortInfo { rel_id: 1, group: 1, name: "p1".into(), protocol: None }).unwrap();
    t.add_lun(0, Lun::new(LunConfig::new(name)).unwrap()).unwrap();
    t
}

fn read(blocks: u16) -> Task {
    Task::new(0, &cdb10(op::READ_10, 0, 0, blocks), u32::from(blocks) * BS)
}

async fn settle() {
    ferrite_reactor::sleep(Duration::from_millis(20)).await;
}

#[test]
fn abort_task_and_abort_task_set() {
    let e = engine(1);
    let t = slow_target("tmf_abort", 5_000_000);
    run(&e, 0, move || async move {
        let rec = Rc::new(Record::default());
        let s = Session::new(&t, initiator(1), 1, rec.clone()).unwrap();
        let start = Instant::now();
        s.submit(read(1), 1);
        settle().await;
        assert_eq!(s.tasks(), 1);
        assert_eq!(s.abort_task(0, 99).await, TmfResponse::NoSuchTask);
        assert_eq!(s.abort_task(4, 1).await, TmfResponse::NoSuchLun);
        assert_eq!(s.abort_task(0, 1).await, TmfResponse::Complete);
        let r = rec.take(1).expect("the aborted task ended before the answer");
        assert!(r.aborted);
        assert_eq!(s.tasks(), 0);
        assert!(start.elapsed() < Duration::from_secs(4), "the delay bdev stopped the read");
        // ABORT TASK SET ends them all (and a slow-path one, which ends as it would).
        s.submit(read(2), 2);
        s.submit(read(3), 3);
        s.submit(Task::new(0, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), 0), 4);
        settle().await;
        assert_eq!(s.abort_task_set(0).await, TmfResponse::Complete);
        for tag in [2, 3] {
            assert!(rec.take(tag).unwrap().aborted, "task {tag}");
        }
        assert_eq!(s.tasks(), 0);
        // A task that ended already is not there to abort.
        let r = s.execute(Task::new(0, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0), 5).await;
        assert!(r.is_good());
        assert_eq!(s.abort_task(0, 5).await, TmfResponse::NoSuchTask);
    });
    e.stop();
    e.join();
}

thread_local! {
    static KEPT: RefCell<Option<(Session, Rc<Record>)>> = const { RefCell::new(None) };
}

#[test]
fn lun_reset_and_clear_task_set_reach_other_reactors() {
    let e = engine(2);
    let t = slow_target("tmf_reset", 5_000_000);
    // Nexus b lives on reactor 1 with a read in flight.
    let tb = t.clone();
    run(&e, 1, move || async move {
        let rec = Rc::new(Record::default());
        let b = Session::new(&tb, initiator(2), 1, rec.clone()).unwrap();
        b.submit(read(1), 10);
        KEPT.with(|k| *k.borrow_mut() = Some((b, rec)));
    });
    let ta = t.clone();
    run(&e, 0, move || async move {
        let rec = Rc::new(Record::default());
        let a = Session::new(&ta, initiator(1), 1, rec.clone()).unwrap();
        a.submit(read(1), 1);
        settle().await;
        let start = Instant::now();
        assert_eq!(a.lun_reset(0).await, TmfResponse::Complete);
        assert!(start.elapsed() < Duration::from_secs(4));
        assert!(rec.take(1).unwrap().aborted);
        let r = a.execute(Task::new(0, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0), 2).await;
        assert_eq!(outcome(&r), check(6, 0x29, 0x03));
        std::mem::forget(a);
    });
    run(&e, 1, || async {
        let (b, rec) = KEPT.with(|k| k.borrow_mut().take()).unwrap();
        assert!(rec.take(10).expect("ended by the reset").aborted);
        let r = b.execute(Task::new(0, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0), 11).await;
        assert_eq!(outcome(&r), check(6, 0x29, 0x03), "every nexus hears of the reset");
        // Another read for CLEAR TASK SET from reactor 0.
        b.submit(read(1), 12);
        KEPT.with(|k| *k.borrow_mut() = Some((b, rec)));
    });
    let ta = t.clone();
    run(&e, 0, move || async move {
        let a = Session::new(&ta, initiator(3), 1, Rc::new(Record::default())).unwrap();
        settle().await;
        assert_eq!(a.clear_task_set(0).await, TmfResponse::Complete);
    });
    run(&e, 1, || async {
        let (b, rec) = KEPT.with(|k| k.borrow_mut().take()).unwrap();
        assert!(rec.take(12).unwrap().aborted);
        let r = b.execute(Task::new(0, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0), 13).await;
        assert_eq!(outcome(&r), check(6, 0x2f, 0x00), "COMMANDS CLEARED BY ANOTHER INITIATOR");
    });
    e.stop();
    e.join();
}
