//! TCP listeners: one socket per address that any subsystem listens on, accepting on the first
//! reactor and placing each connection (a queue pair) on the reactors in turn, as SPDK's poll
//! groups do.

use super::model::Trid;
use ferrite_reactor::net::{Listener, Socket};
use ferrite_target::{spawn_acceptor, AcceptOptions};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

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
    let opts = AcceptOptions { what: format!("nvmf listener {addr}"), max_connections: MAX_CONNECTIONS };
    let t = trid.clone();
    spawn_acceptor(listener.clone(), stopped.clone(), opts, move |fd, peer, permit| {
        ferrite_reactor::spawn_local(super::qpair::serve(Socket::new(fd), peer, t.clone(), permit)).detach();
    });
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
