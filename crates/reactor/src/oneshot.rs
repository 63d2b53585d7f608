//! A one-value channel whose receiver is a future (control plane only: it takes a lock).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

struct State<T> {
    value: Option<T>,
    waker: Option<Waker>,
    sender_gone: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    cond: Condvar,
}

/// Sends the value.
pub struct Sender<T>(Arc<Shared<T>>);
/// Receives the value: `.await` it on a reactor, or `wait()` on a plain thread.
pub struct Receiver<T>(Arc<Shared<T>>);

/// The sender was dropped without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canceled;

impl std::fmt::Display for Canceled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reactor dropped the request before answering")
    }
}

impl std::error::Error for Canceled {}

/// Makes a connected pair.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let s = Arc::new(Shared {
        state: Mutex::new(State { value: None, waker: None, sender_gone: false }),
        cond: Condvar::new(),
    });
    (Sender(s.clone()), Receiver(s))
}

impl<T> Sender<T> {
    /// Delivers the value and wakes the receiver.
    pub fn send(self, v: T) {
        self.0.state.lock().unwrap().value = Some(v);
        // Drop wakes.
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.0.state.lock().unwrap();
            st.sender_gone = true;
            st.waker.take()
        };
        self.0.cond.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Blocks the calling thread until the value arrives (never call this on a reactor).
    pub fn wait(self) -> Result<T, Canceled> {
        let mut st = self.0.state.lock().unwrap();
        loop {
            if let Some(v) = st.value.take() {
                return Ok(v);
            }
            if st.sender_gone {
                return Err(Canceled);
            }
            st = self.0.cond.wait(st).unwrap();
        }
    }
}

impl<T> Receiver<T> {
    /// As [`Receiver::wait`], but for at most `limit`: None if the value has not come by then
    /// (it may still come; call again).
    pub fn wait_for(&mut self, limit: std::time::Duration) -> Option<Result<T, Canceled>> {
        let deadline = std::time::Instant::now() + limit;
        let mut st = self.0.state.lock().unwrap();
        loop {
            if let Some(v) = st.value.take() {
                return Some(Ok(v));
            }
            if st.sender_gone {
                return Some(Err(Canceled));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self.0.cond.wait_timeout(st, left).unwrap().0;
        }
    }

    /// The value if it arrived, `Err(Canceled)` if it never will, None while it may still come.
    pub fn try_recv(&mut self) -> Option<Result<T, Canceled>> {
        let mut st = self.0.state.lock().unwrap();
        if let Some(v) = st.value.take() {
            return Some(Ok(v));
        }
        st.sender_gone.then_some(Err(Canceled))
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Canceled>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.0.state.lock().unwrap();
        if let Some(v) = st.value.take() {
            return Poll::Ready(Ok(v));
        }
        if st.sender_gone {
            return Poll::Ready(Err(Canceled));
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
