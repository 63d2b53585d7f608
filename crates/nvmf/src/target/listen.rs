//! TCP listeners: one socket per address that any subsystem listens on, accepting on the first
//! reactor and placing each connection (a queue pair) on the reactors in turn, as SPDK's poll
//! groups do.

use super::model::Trid;
use ferrite_reactor::net::{Listener, Socket};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Connections (queue pairs) a listener serves at once; more are accepted and closed.
pub const MAX_CONNECTIONS: usize = 16_384;
const LISTEN_BACKLOG: i32 = 4096;

struct Listening {
    listener: Rc<Listener>,
    stopped: Rc<Cell<bool>>,
}

ferrite_reactor::reactor_local! {
    /// Listening sockets by transport address (on the first reactor).
    static LISTENING: RefCell<BTreeMap<Trid, Listening>> = const { RefCell::new(BTreeMap::new()) };
}

/// Gives a listener's place back when a connection ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// True if a socket listens on `trid`.
pub fn is_listening(trid: &Trid) -> bool {
    LISTENING.with(|l| l.borrow().contains_key(trid))
}

/// Starts listening on `trid` (on the first reactor); Ok if it already listens.
pub fn listen(trid: &Trid) -> Result<(), String> {
    if is_listening(trid) {
        return Ok(());
    }
    let addr = trid.socket_addr();
    // Each connection is a descriptor: the usual soft limit (1,024) would stop the target long
    // before MAX_CONNECTIONS.
    ferrite_reactor::net::raise_fd_limit();
    let std_listener = std::net::TcpListener::bind(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let fd: OwnedFd = std_listener.into();
    // SAFETY: listen on the socket we just bound (std's backlog is 128; this raises it).
    unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) };
    let listener = Rc::new(Listener::new(fd));
    let stopped = Rc::new(Cell::new(false));
    let (l, st, t) = (listener.clone(), stopped.clone(), trid.clone());
    ferrite_reactor::spawn_local(async move {
        let engine = ferrite_reactor::engine();
        let count = Arc::new(AtomicUsize::new(0));
        let mut next = 0usize;
        let mut refused = 0u64;
        let mut errors = ferrite_reactor::net::AcceptErrors::new();
        let what = format!("nvmf listener {}", t.socket_addr());
        loop {
            match l.accept().await {
                Ok(fd) => {
                    errors.ok(&what);
                    if count.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                        if refused == 0 {
                            log::warn!(
                                "nvmf listener {}: {MAX_CONNECTIONS} connections; refusing more",
                                t.socket_addr()
                            );
                        }
                        refused += 1;
                        continue;
                    }
                    refused = 0;
                    count.fetch_add(1, Ordering::Relaxed);
                    let slot = Slot(count.clone());
                    ferrite_reactor::net::set_nodelay(fd.as_raw_fd());
                    let peer = ferrite_reactor::net::peer_name(fd.as_raw_fd());
                    let target = next % engine.count();
                    next += 1;
                    let trid = t.clone();
                    engine.send(target, move || {
                        ferrite_reactor::spawn_local(super::qpair::serve(Socket::new(fd), peer, trid, slot)).detach();
                    });
                }
                Err(_) if st.get() => break,
                Err(e) => {
                    // E.g. out of descriptors (the connection stays in the backlog): back off
                    // rather than spin or flood the log.
                    let wait = errors.failed(&what, &e);
                    ferrite_reactor::sleep(wait).await;
                }
            }
        }
        log::info!("nvmf listener {}: stopped", t.socket_addr());
    })
    .detach();
    log::info!("NVMe/TCP target listening on {addr}");
    LISTENING.with(|l| l.borrow_mut().insert(trid.clone(), Listening { listener, stopped }));
    Ok(())
}

/// Stops listening on `trid` (connections made through it stay).
pub fn unlisten(trid: &Trid) {
    if let Some(l) = LISTENING.with(|l| l.borrow_mut().remove(trid)) {
        l.stopped.set(true);
        l.listener.shutdown();
    }
}

/// Stops every listener.
pub fn unlisten_all() {
    let all: Vec<Trid> = LISTENING.with(|l| l.borrow().keys().cloned().collect());
    for t in all {
        unlisten(&t);
    }
}
