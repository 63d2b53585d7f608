//! Portals: the engine's [`PortalListener`]. Each portal of a portal group gets a listening
//! socket on the first reactor (bound when the group is created, all or none); its accept
//! loop (`ferrite_target::spawn_acceptor`, at most [`super::MAX_CONNECTIONS`] connections)
//! starts at once, or at `iscsi_start_portal_group` for a group created with `wait`
//! (connections wait in the backlog meanwhile). Each connection is served on the reactors in
//! turn. Deleting a group stops its listeners; its connections stay.

use crate::hooks::PortalListener;
use crate::model::PortalGroup;
use ferrite_reactor::net::{Listener, Socket};
use ferrite_target::{spawn_acceptor, AcceptOptions};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

const LISTEN_BACKLOG: i32 = 4096;

/// One portal's listening socket.
struct Listening {
    listener: Rc<Listener>,
    stopped: Rc<Cell<bool>>,
    addr: SocketAddr,
    accepting: bool,
}

ferrite_reactor::reactor_local! {
    /// Listening sockets by portal group tag (on the first reactor).
    static GROUPS: RefCell<BTreeMap<i32, Vec<Listening>>> = const { RefCell::new(BTreeMap::new()) };
}

/// The engine's portal listener.
pub(crate) struct Portals;

/// Runs `f` on the first reactor: here if this is it, else by a message, waiting for it (a
/// plain thread at startup).
fn on_first<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    match ferrite_reactor::current() {
        Some(0) => Some(f()),
        Some(r) => {
            log::error!("iscsi: a portal change asked on reactor {r}, not the first; ignored");
            None
        }
        None => ferrite_reactor::current_engine()?.call(0, f).wait().ok(),
    }
}

impl PortalListener for Portals {
    fn open(&self, pg: &PortalGroup, paused: bool) -> Result<(), String> {
        let pg = pg.clone();
        on_first(move || open(&pg, paused)).unwrap_or_else(|| Err("the first reactor is gone".into()))
    }

    fn resume(&self, tag: i32) {
        on_first(move || resume(tag));
    }

    fn close(&self, tag: i32) {
        on_first(move || close(tag));
    }
}

fn bind(addr: SocketAddr) -> Result<OwnedFd, String> {
    let l = std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let fd: OwnedFd = l.into();
    // SAFETY: listen on the socket just bound (std's backlog is 128; this raises it).
    unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) };
    Ok(fd)
}

fn open(pg: &PortalGroup, paused: bool) -> Result<(), String> {
    if GROUPS.with(|g| g.borrow().contains_key(&pg.tag)) {
        return Err(format!("portal group {} listens already", pg.tag));
    }
    let tag = u16::try_from(pg.tag).map_err(|_| format!("portal group tag {} is not 16-bit", pg.tag))?;
    // Each connection is a descriptor: the usual soft limit (1,024) would stop the target
    // long before its connection bound.
    ferrite_reactor::net::raise_fd_limit();
    let mut bound = Vec::new();
    for p in &pg.portals {
        let addr = p.socket_addr().ok_or_else(|| format!("portal ({}, {}) is not an address", p.host, p.port))?;
        // All or none: what was bound before a failure is closed when `bound` drops.
        bound.push((addr, bind(addr)?));
    }
    let mut listening = Vec::new();
    for (addr, fd) in bound {
        let mut l = Listening {
            listener: Rc::new(Listener::new(fd)),
            stopped: Rc::new(Cell::new(false)),
            addr,
            accepting: false,
        };
        if !paused {
            start(&mut l, tag);
        }
        log::info!("iSCSI portal group {} listening on {addr}{}", pg.tag, if paused { " (paused)" } else { "" });
        listening.push(l);
    }
    GROUPS.with(|g| g.borrow_mut().insert(pg.tag, listening));
    Ok(())
}

fn start(l: &mut Listening, tag: u16) {
    if l.accepting {
        return;
    }
    l.accepting = true;
    let opts = AcceptOptions {
        what: format!("iscsi portal {} (group {tag})", l.addr),
        max_connections: super::MAX_CONNECTIONS,
    };
    spawn_acceptor(l.listener.clone(), l.stopped.clone(), opts, move |fd, peer, permit| {
        ferrite_reactor::spawn_local(super::conn::serve(Socket::new(fd), peer, tag, permit, None)).detach();
    });
}

fn resume(tag: i32) {
    let Ok(t) = u16::try_from(tag) else { return };
    GROUPS.with(|g| {
        if let Some(ls) = g.borrow_mut().get_mut(&tag) {
            for l in ls {
                start(l, t);
            }
        }
    });
}

fn close(tag: i32) {
    let Some(ls) = GROUPS.with(|g| g.borrow_mut().remove(&tag)) else { return };
    for l in ls {
        l.stopped.set(true);
        l.listener.shutdown();
        log::info!("iSCSI portal group {tag} stopped listening on {}", l.addr);
    }
}
