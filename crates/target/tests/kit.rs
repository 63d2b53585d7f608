//! The kit's parts on their own: slot reuse and bounds, phase tables, transfer deadlines, a
//! reactor's watchdog closing what is overdue and stopping when no connection is left, and a
//! connection's two ends (graceful: drained, then closed; forced: every command ended once).

use ferrite_reactor::net::Socket;
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_target::table::{self, ConnTable, Served, WatchdogOptions};
use ferrite_target::{close_gracefully, end_all, transition, ConnCore, Phase, Progress, SlotTable};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

#[test]
fn slots_are_bounded_reused_and_keep_their_last_value() {
    let mut t: SlotTable<u32> = SlotTable::default();
    assert_eq!(t.take(2, || 7), Some(0));
    assert_eq!(t.take(2, || 8), Some(1));
    assert_eq!(t.take(2, || 9), None, "the bound holds");
    t[1] = 42;
    t.release(1);
    assert_eq!(t.live(), 1);
    assert_eq!(t.take(2, || 0), Some(1), "a freed slot is reused");
    assert_eq!(t[1], 42, "a reused slot keeps its value for the caller to set");
    assert_eq!(t.iter().count(), 2);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum P {
    Free,
    Busy,
    Done,
}

impl Phase for P {
    fn may_become(self, to: P) -> bool {
        matches!((self, to), (P::Free, P::Busy) | (P::Busy, P::Done) | (P::Done, P::Free))
    }
}

#[test]
fn a_legal_phase_change_goes_through() {
    let mut p = P::Free;
    transition(&mut p, P::Busy, 1, 0);
    transition(&mut p, P::Done, 1, 0);
    assert_eq!(p, P::Done);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "illegal phase change Free -> Done")]
fn an_illegal_phase_change_is_caught() {
    let mut p = P::Free;
    transition(&mut p, P::Done, 1, 0);
}

#[test]
fn a_transfer_is_stalled_only_past_its_base_and_size_time() {
    let p = Progress::default();
    let now = ferrite_reactor::tsc::ticks();
    assert!(!p.stalled(now, Duration::ZERO, Duration::ZERO), "nothing under way");
    p.begin(3 << 20);
    let later = now + ferrite_reactor::tsc::duration_to_ticks(Duration::from_secs(12));
    assert!(!p.stalled(later, Duration::from_secs(10), Duration::from_secs(1)), "10 s + 3 s for 3 MiB");
    let much_later = now + ferrite_reactor::tsc::duration_to_ticks(Duration::from_secs(14));
    assert!(p.stalled(much_later, Duration::from_secs(10), Duration::from_secs(1)));
    p.end();
    assert!(!p.stalled(much_later, Duration::ZERO, Duration::ZERO));
}

/// A connection over one end of a socket pair, counting the watchdog's looks.
struct Conn {
    core: ConnCore,
    looks: Cell<u32>,
}

impl Served for Conn {
    fn core(&self) -> &ConnCore {
        &self.core
    }
    fn watch(&self, _now: u64) {
        self.looks.set(self.looks.get() + 1);
    }
}

ferrite_reactor::reactor_local! {
    static CONNS: RefCell<ConnTable<Conn>> = const { RefCell::new(ConnTable::new()) };
}

fn conn(id: u64) -> (Rc<Conn>, std::os::unix::net::UnixStream) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd: OwnedFd = a.into();
    (Rc::new(Conn { core: ConnCore::new("test", id, Socket::new(fd), "peer".into()), looks: Cell::new(0) }), b)
}

#[test]
fn the_watchdog_closes_overdue_handshakes_and_looks_at_the_rest() {
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, ..Default::default() }).unwrap();
    let opts = WatchdogOptions { period: Duration::from_millis(20), proto: "test" };
    let out = e.run_async(0, move || async move {
        let (late, _p1) = conn(1);
        late.core.handshake_within(Duration::from_millis(10));
        let (fine, _p2) = conn(2);
        fine.core.handshake_within(Duration::from_millis(10));
        fine.core.handshake_done();
        table::register(&CONNS, late.clone(), opts);
        table::register(&CONNS, fine.clone(), opts);
        ferrite_reactor::sleep(Duration::from_millis(150)).await;
        let r = (late.core.is_dead(), fine.core.is_dead(), fine.looks.get() > 0, late.looks.get());
        assert_eq!(table::close_where(&CONNS, &|c: &Conn| c.core.id == 2), 1);
        table::unregister(&CONNS, 1);
        table::unregister(&CONNS, 2);
        r
    });
    let (late_dead, fine_dead, fine_looked, late_looks) = out.wait().unwrap();
    assert!(late_dead, "a handshake past its bound is closed");
    assert!(!fine_dead, "a finished handshake is not");
    assert!(fine_looked, "the watchdog asks live connections to check their deadlines");
    assert_eq!(late_looks, 0, "a connection closed for its handshake is not asked");
    e.stop();
    e.join();
}

#[test]
fn the_taken_slots_are_those_not_released() {
    let mut t: SlotTable<()> = SlotTable::default();
    for _ in 0..4 {
        t.take(4, || ());
    }
    t.release(2);
    t.release(0);
    assert_eq!(t.taken(), vec![1, 3]);
    assert!(t.is_taken(1) && !t.is_taken(2) && !t.is_taken(9));
}

/// A command of the tests below: the request it ends (its count of ends).
#[derive(Default)]
struct Req {
    ended: Rc<Cell<u32>>,
}

#[test]
fn a_forced_close_ends_every_outstanding_command_exactly_once() {
    let (c, _peer) = conn(7);
    let slots: RefCell<SlotTable<Req>> = RefCell::new(SlotTable::default());
    let reqs: Vec<Rc<Cell<u32>>> = (0..6).map(|_| Rc::new(Cell::new(0))).collect();
    for r in &reqs {
        let i = slots.borrow_mut().take(8, Req::default).unwrap();
        slots.borrow_mut()[i as usize].ended = r.clone();
    }
    // Two completed normally before the close.
    for i in [1u32, 4] {
        reqs[i as usize].set(reqs[i as usize].get() + 1);
        slots.borrow_mut().release(i);
    }
    c.core.close();
    let ended = end_all(&c.core, &slots, |i| {
        // The table is not borrowed here: ending may complete a request whose callback looks.
        let r = slots.borrow()[i as usize].ended.clone();
        r.set(r.get() + 1);
        slots.borrow_mut().release(i);
    });
    assert_eq!(ended, 4, "the four still outstanding were ended");
    assert!(
        reqs.iter().all(|r| r.get() == 1),
        "every request ended once: {:?}",
        reqs.iter().map(|r| r.get()).collect::<Vec<_>>()
    );
    assert_eq!(slots.borrow().live(), 0);
    assert_eq!(end_all(&c.core, &slots, |_| unreachable!("nothing left")), 0);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "still takes new ones")]
fn a_forced_close_of_a_connection_that_still_takes_work_is_caught() {
    let (c, _peer) = conn(8);
    let slots: RefCell<SlotTable<Req>> = RefCell::new(SlotTable::default());
    end_all(&c.core, &slots, |_| {});
}

#[test]
fn a_graceful_close_waits_for_the_outstanding_commands_then_closes() {
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, ..Default::default() }).unwrap();
    let out = e.run_async(0, move || async move {
        let (c, _peer) = conn(9);
        let slots: Rc<RefCell<SlotTable<Req>>> = Rc::new(RefCell::new(SlotTable::default()));
        let a = slots.borrow_mut().take(4, Req::default).unwrap();
        let b = slots.borrow_mut().take(4, Req::default).unwrap();
        // The two complete later, the connection waking its close after the last, as a
        // connection does when its last command ends while it closes.
        let waiting = Rc::new(Cell::new(false));
        let (c2, s2, w2) = (c.clone(), slots.clone(), waiting.clone());
        ferrite_reactor::spawn_local(async move {
            ferrite_reactor::sleep(Duration::from_millis(50)).await;
            s2.borrow_mut().release(a);
            ferrite_reactor::sleep(Duration::from_millis(50)).await;
            // The close still waits: no new work taken, not closed yet.
            w2.set(c2.core.is_closing() && !c2.core.is_dead());
            s2.borrow_mut().release(b);
            if c2.core.is_closing() && s2.borrow().live() == 0 {
                c2.core.wake();
            }
        })
        .detach();
        let start = std::time::Instant::now();
        let drained = close_gracefully(&c.core, || slots.borrow().live() == 0, Duration::from_secs(30)).await;
        let live = slots.borrow().live();
        (drained, c.core.is_dead(), waiting.get(), live, start.elapsed())
    });
    let (drained, dead, waited, live, took) = out.wait().unwrap();
    assert!(took < Duration::from_secs(20), "the last command's end woke the close ({took:?})");
    assert!(waited, "the close waited, taking no new work, while a command was outstanding");
    assert!(drained, "it drained before its bound");
    assert!(dead, "then it is closed for good");
    assert_eq!(live, 0);

    // A command that never ends: closed anyway at the bound, and it is left for the forced close.
    let out = e.run_async(0, move || async move {
        let (c, _peer) = conn(10);
        let slots: RefCell<SlotTable<Req>> = RefCell::new(SlotTable::default());
        slots.borrow_mut().take(4, Req::default).unwrap();
        let closing_at_once = {
            let f = close_gracefully(&c.core, || slots.borrow().live() == 0, Duration::from_millis(100));
            let mut f = std::pin::pin!(f);
            // One poll: no new work is taken from the start.
            std::future::poll_fn(|cx| {
                let _ = f.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            let closing = c.core.is_closing() && !c.core.is_dead();
            (closing, f.await)
        };
        let ended = end_all(&c.core, &slots, |i| slots.borrow_mut().release(i));
        (closing_at_once, c.core.is_dead(), ended)
    });
    let ((closing_at_once, drained), dead, ended) = out.wait().unwrap();
    assert!(closing_at_once, "a graceful close takes no new work while it waits");
    assert!(!drained, "the command never ended");
    assert!(dead, "closed at its bound");
    assert_eq!(ended, 1, "the forced close ends what the graceful one left");
    e.stop();
    e.join();
}
