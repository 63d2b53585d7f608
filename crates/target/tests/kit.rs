//! The kit's parts on their own: slot reuse and bounds, phase tables, transfer deadlines, and a
//! reactor's watchdog closing what is overdue and stopping when no connection is left.

use ferrite_reactor::net::Socket;
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_target::table::{self, ConnTable, Served, WatchdogOptions};
use ferrite_target::{transition, ConnCore, Phase, Progress, SlotTable};
use std::cell::{Cell, RefCell};
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
