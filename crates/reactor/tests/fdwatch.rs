//! Waiting for descriptors on the reactor (`FdWatch`): eventfds written from other threads wake
//! their waiters, many at once, in both poll modes; a dropped watch cancels its poll and fires
//! nothing; a closed watch wakes its waiter with an error; the reactor sleeps while it waits.

mod common;

use common::{run, stop};
use ferrite_reactor::ring::Ring;
use ferrite_reactor::*;
use std::future::{poll_fn, Future};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// A hang guard only: a stalled reactor fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(60);

fn engine(mode: ReactorMode) -> Engine {
    Engine::start(EngineConfig { cores: vec![0], mode, pin: false, ..Default::default() }).expect("engine starts")
}

/// Polls `fut` once in the calling task; its output if it finished.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *fut).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// Operations in flight on the calling reactor's ring (handlers the ring holds).
fn in_flight() -> usize {
    with_ring(|r: &mut Ring| r.in_flight())
}

/// Lets the reactor run turns (and reap completions) until `done` holds.
async fn turn_until(done: impl Fn() -> bool) {
    while !done() {
        sleep(Duration::from_millis(1)).await;
    }
}

/// An eventfd and a second descriptor of it for the writing thread.
fn eventfd_pair() -> (OwnedFd, OwnedFd) {
    let fd = eventfd::new().unwrap();
    let writer = fd.try_clone().unwrap();
    (fd, writer)
}

#[test]
fn an_eventfd_written_from_another_thread_wakes_the_waiter() {
    for multishot in [true, false] {
        let e = engine(ReactorMode::Adaptive);
        let (fd, writer) = eventfd_pair();
        let (armed_tx, armed_rx) = mpsc::channel::<()>();
        let rounds = 50u64;
        let rx = e.run_async(0, move || async move {
            let w = if multishot { FdWatch::new(fd) } else { FdWatch::oneshot(fd) }.unwrap();
            let base = in_flight();
            let mut got = Vec::new();
            for _ in 0..rounds {
                let mut f = pin!(w.readable());
                assert!(poll_once(&mut f).await.is_none(), "nothing written yet");
                assert!(w.is_armed());
                armed_tx.send(()).unwrap();
                f.await.unwrap();
                got.push(w.drain().unwrap());
                // A multishot poll stays armed from one wait to the next; a one-shot one is spent.
                assert_eq!(w.is_armed(), multishot && fdwatch::multishot_poll_supported());
            }
            drop(w);
            turn_until(|| in_flight() == base).await;
            got
        });
        for i in 0..rounds {
            armed_rx.recv_timeout(LIMIT).expect("the waiter armed");
            // One write adding i % 3 + 1 (separate signals could be drained between them, and
            // the later ones' wakeups then report an empty counter: allowed, but not exact).
            let add = i % 3 + 1;
            // SAFETY: writes 8 bytes from a local to our eventfd.
            assert_eq!(unsafe { libc::write(writer.as_raw_fd(), (&add as *const u64).cast(), 8) }, 8);
        }
        let got = rx.wait().unwrap();
        assert_eq!(got, (0..rounds).map(|i| i % 3 + 1).collect::<Vec<_>>(), "multishot {multishot}");
        stop(e);
    }
}

#[test]
fn many_eventfds_wake_their_own_waiters() {
    const N: usize = 200;
    for multishot in [true, false] {
        let e = engine(ReactorMode::Adaptive);
        let (fds, writers): (Vec<_>, Vec<_>) = (0..N).map(|_| eventfd_pair()).unzip();
        let (woke_tx, woke_rx) = mpsc::channel::<usize>();
        let armed = Arc::new(AtomicUsize::new(0));
        let a = armed.clone();
        let base = e
            .call(0, move || {
                let base = in_flight();
                for (i, fd) in fds.into_iter().enumerate() {
                    let (tx, a) = (woke_tx.clone(), a.clone());
                    spawn_local(async move {
                        let w = if multishot { FdWatch::new(fd) } else { FdWatch::oneshot(fd) }.unwrap();
                        let mut f = pin!(w.readable());
                        assert!(poll_once(&mut f).await.is_none());
                        a.fetch_add(1, Ordering::SeqCst);
                        f.await.unwrap();
                        assert_eq!(w.drain().unwrap(), 1);
                        tx.send(i).unwrap();
                    })
                    .detach();
                }
                base
            })
            .wait()
            .unwrap();
        while armed.load(Ordering::SeqCst) < N {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Every other one first, then the rest, from this thread.
        for i in (0..N).step_by(2).chain((1..N).step_by(2)) {
            eventfd::signal(writers[i].as_fd()).unwrap();
        }
        let mut woke: Vec<usize> = (0..N).map(|_| woke_rx.recv_timeout(LIMIT).expect("every waiter wakes")).collect();
        woke.sort_unstable();
        assert_eq!(woke, (0..N).collect::<Vec<_>>(), "each exactly once");
        let left = run(&e, LIMIT, move || async move {
            turn_until(|| in_flight() <= base).await;
            in_flight()
        });
        assert_eq!(left, base, "no poll left in the ring");
        stop(e);
    }
}

/// Counts its wakes.
struct CountWakes(AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0; 2];
    // SAFETY: pipe2 fills the two-element array; the descriptors are owned right after.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
    // SAFETY: both were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

#[test]
fn a_dropped_watch_cancels_its_poll_and_nothing_fires() {
    for multishot in [true, false] {
        let e = engine(ReactorMode::Adaptive);
        let (fd, writer) = eventfd_pair();
        let (read_end, write_end) = pipe();
        let (wakes, leftover) = run(&e, LIMIT, move || async move {
            let base = in_flight();
            let counter = Arc::new(CountWakes(AtomicUsize::new(0)));
            let waker = Waker::from(counter.clone());
            let mut cx = Context::from_waker(&waker);
            let w = if multishot { FdWatch::new(fd) } else { FdWatch::oneshot(fd) }.unwrap();
            let p = if multishot { FdWatch::new(read_end) } else { FdWatch::oneshot(read_end) }.unwrap();
            {
                let mut f = pin!(w.readable());
                assert!(f.as_mut().poll(&mut cx).is_pending());
                let mut g = pin!(p.readable());
                assert!(g.as_mut().poll(&mut cx).is_pending());
                turn_until(|| with_ring(|r| r.pending()) == 0).await;
                assert_eq!(in_flight(), base + 2, "two polls armed");
            }
            drop((w, p));
            // The cancels complete; the polls' slots are freed.
            turn_until(|| in_flight() == base).await;
            // Written after the drop: nothing may fire.
            eventfd::signal(writer.as_fd()).unwrap();
            for _ in 0..20 {
                sleep(Duration::from_millis(1)).await;
            }
            // The pipe's read end was closed with its watch: a write finds no reader.
            // SAFETY: writes one byte from a local to our pipe's write end.
            let n = unsafe { libc::write(write_end.as_raw_fd(), b"x".as_ptr().cast(), 1) };
            let closed = n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE);
            assert!(closed, "the watched descriptor is closed once its poll ended");
            (counter.0.load(Ordering::SeqCst), in_flight() - base)
        });
        assert_eq!((wakes, leftover), (0, 0), "multishot {multishot}: no wake and no entry left");
        stop(e);
    }
}

#[test]
fn close_wakes_the_waiter_with_an_error_and_hang_up_wakes_it() {
    let e = engine(ReactorMode::Adaptive);
    let (fd, _writer) = eventfd_pair();
    let (read_end, write_end) = pipe();
    let (closed, hup) = run(&e, LIMIT, move || async move {
        let w = Rc::new(FdWatch::new(fd).unwrap());
        let w2 = w.clone();
        let waiter = spawn_local(async move { w2.readable().await });
        let closer = spawn_local(async move {
            sleep(Duration::from_millis(5)).await;
            w.close();
        });
        let closed = waiter.await;
        closer.await;
        // A pipe whose writer goes away: the wait ends (the read then says end of file).
        let p = FdWatch::new(read_end).unwrap();
        let hup = spawn_local(async move {
            let r = p.readable().await;
            let mut b = [0u8; 1];
            // SAFETY: reads up to one byte into a local from the watched descriptor.
            let n = unsafe { libc::read(p.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            (r.is_ok(), n)
        });
        sleep(Duration::from_millis(5)).await;
        drop(write_end);
        (closed.map_err(|e| e.kind()), hup.await)
    });
    assert_eq!(closed, Err(std::io::ErrorKind::NotConnected));
    assert_eq!(hup, (true, 0));
    stop(e);
}

#[test]
fn a_poller_sees_readiness_without_a_task() {
    let e = engine(ReactorMode::Adaptive);
    let (fd, writer) = eventfd_pair();
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    e.call(0, move || {
        let w = FdWatch::new(fd).unwrap();
        register_poller(move || {
            if w.take_ready().unwrap() {
                s.fetch_add(w.drain().unwrap(), Ordering::SeqCst);
                return true;
            }
            false
        });
    })
    .wait()
    .unwrap();
    for i in 1..=3 {
        eventfd::signal(writer.as_fd()).unwrap();
        let t0 = std::time::Instant::now();
        while seen.load(Ordering::SeqCst) < i {
            assert!(t0.elapsed() < LIMIT, "the poller never saw signal {i}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop(e);
}

#[test]
fn the_reactor_sleeps_while_it_waits() {
    let e = engine(ReactorMode::Adaptive);
    let (fd, writer) = eventfd_pair();
    let turns = Arc::new(AtomicU64::new(0));
    let t = turns.clone();
    let (armed_tx, armed_rx) = mpsc::channel::<()>();
    let rx = e.run_async(0, move || async move {
        register_poller(move || {
            t.fetch_add(1, Ordering::Relaxed);
            false
        });
        let w = FdWatch::new(fd).unwrap();
        let mut f = pin!(w.readable());
        assert!(poll_once(&mut f).await.is_none());
        armed_tx.send(()).unwrap();
        f.await.unwrap();
        w.drain().unwrap()
    });
    armed_rx.recv_timeout(LIMIT).unwrap();
    // Wait for the reactor to fall asleep with the poll armed.
    let s0 = e.stats()[0].sleeps;
    let t0 = std::time::Instant::now();
    while e.stats()[0].sleeps == s0 {
        assert!(t0.elapsed() < LIMIT, "the reactor never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = turns.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    let during = turns.load(Ordering::Relaxed) - before;
    // Asleep: at most the turn that was ending when we looked, not a busy loop.
    assert!(during <= 2, "the reactor ran {during} turns while it waited");
    eventfd::signal(writer.as_fd()).unwrap();
    assert_eq!(rx.wait().unwrap(), 1);
    stop(e);
}
