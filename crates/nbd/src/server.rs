//! Listeners: TCP or unix sockets accepting on the first reactor and handing each connection
//! to a reactor in turn.

use crate::conn::{self, ConnSettings};
use ferrite_reactor::net::{Listener, Socket};
use ferrite_target::{spawn_acceptor, AcceptOptions};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

/// Default time a client has to finish the handshake (nbdkit and QEMU use 10 s too).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default limit of connections per listener (handshaking or connected).
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;

/// Listen backlog: connections the kernel completes before the accept loop takes them.
const LISTEN_BACKLOG: i32 = 4096;

/// Settings of one listener (`nbd_server_start` parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// Time from accept to the end of the handshake; a client slower than that is disconnected
    /// (None: no limit).
    pub handshake_timeout: Option<Duration>,
    /// Connections (handshaking or connected) the listener serves at once; more are accepted
    /// and closed at once, with a log line.
    pub max_connections: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self { handshake_timeout: Some(DEFAULT_HANDSHAKE_TIMEOUT), max_connections: DEFAULT_MAX_CONNECTIONS }
    }
}

/// Where a server listens: `host:port` for TCP, or a path (starting with `/`) for a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// TCP address.
    Tcp(String),
    /// Unix socket path.
    Unix(String),
}

impl ListenAddr {
    /// Parses the `address` parameter of `nbd_server_start`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.starts_with('/') {
            Ok(Self::Unix(s.to_string()))
        } else if let Some(p) = s.strip_prefix("unix:") {
            Ok(Self::Unix(p.to_string()))
        } else if s.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) {
            Ok(Self::Tcp(s.to_string()))
        } else {
            Err(format!("address {s:?} is neither host:port nor an absolute unix socket path"))
        }
    }
}

struct Server {
    listener: Rc<Listener>,
    addr: ListenAddr,
    /// The address as given to `nbd_server_start` (e.g. with port 0).
    requested: String,
    options: ServerOptions,
    stopped: Rc<Cell<bool>>,
    /// The socket file a unix listener created (removed at stop if it is still that file).
    file: Option<ferrite_rpc::sockfile::SocketFile>,
}

ferrite_reactor::reactor_local! {
    /// Servers by address (kept on the first reactor, which runs every accept loop).
    static SERVERS: RefCell<BTreeMap<String, Server>> = const { RefCell::new(BTreeMap::new()) };
}

fn bind(addr: &ListenAddr) -> std::io::Result<(OwnedFd, Option<ferrite_rpc::sockfile::SocketFile>)> {
    match addr {
        ListenAddr::Tcp(a) => Ok((std::net::TcpListener::bind(a)?.into(), None)),
        // Private (0600) from the start; replaces only a stale socket, never another file.
        ListenAddr::Unix(p) => {
            let b = ferrite_rpc::sockfile::bind(std::path::Path::new(p), 0o600)?;
            Ok((b.listener.into(), Some(b.file)))
        }
    }
}

/// Starts listening on `address` (call on the first reactor) and returns the address it is
/// bound to (for TCP port 0, the port the kernel picked). Connections go to the reactors in turn.
pub fn start(address: &str, options: ServerOptions) -> Result<String, String> {
    let addr = ListenAddr::parse(address)?;
    if options.max_connections == 0 {
        return Err("max_connections must be at least 1".into());
    }
    if SERVERS.with(|s| s.borrow().contains_key(address)) {
        return Err(format!("an NBD server already listens on {address}"));
    }
    ferrite_reactor::net::raise_fd_limit();
    let (fd, file) = bind(&addr).map_err(|e| format!("cannot listen on {address}: {e}"))?;
    // std listens with a backlog of 128: a burst of connections beyond it waits for SYN-ACK
    // retransmissions (seconds). Listening again only raises the backlog (the kernel caps it
    // at net.core.somaxconn).
    // SAFETY: listen on the socket we just bound.
    unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) };
    let bound = match &addr {
        ListenAddr::Tcp(_) => ferrite_reactor::net::local_name(fd.as_raw_fd()).unwrap_or_else(|| address.to_string()),
        ListenAddr::Unix(p) => p.clone(),
    };
    if SERVERS.with(|s| s.borrow().contains_key(&bound)) {
        return Err(format!("an NBD server already listens on {bound}"));
    }
    let listener = Rc::new(Listener::new(fd));
    let stopped = Rc::new(Cell::new(false));
    let settings = ConnSettings { handshake_timeout: options.handshake_timeout };
    let opts = AcceptOptions { what: format!("nbd server {bound}"), max_connections: options.max_connections };
    let name = bound.clone();
    spawn_acceptor(listener.clone(), stopped.clone(), opts, move |fd, peer, permit| {
        let listen = name.clone();
        ferrite_reactor::spawn_local(conn::serve(Socket::new(fd), peer, listen, settings, permit)).detach();
    });
    log::info!("nbd server listening on {bound}");
    SERVERS.with(|s| {
        s.borrow_mut()
            .insert(bound.clone(), Server { listener, addr, requested: address.to_string(), options, stopped, file })
    });
    Ok(bound)
}

/// The key of the server listening on `address`: its bound address, or the address it was
/// started with (e.g. `127.0.0.1:0`) if only one server was started with it.
fn find(address: &str) -> Option<String> {
    SERVERS.with(|s| {
        let s = s.borrow();
        if s.contains_key(address) {
            return Some(address.to_string());
        }
        let mut by_request = s.iter().filter(|(_, v)| v.requested == address);
        match (by_request.next(), by_request.next()) {
            (Some((k, _)), None) => Some(k.clone()),
            _ => None,
        }
    })
}

/// Stops the server on `address` (existing connections stay). Call on the first reactor.
pub fn stop(address: &str) -> Result<(), String> {
    let key = find(address).ok_or_else(|| format!("no NBD server listens on {address}"))?;
    let s =
        SERVERS.with(|s| s.borrow_mut().remove(&key)).ok_or_else(|| format!("no NBD server listens on {address}"))?;
    s.stopped.set(true);
    s.listener.shutdown();
    if let (ListenAddr::Unix(p), Some(file)) = (&s.addr, &s.file) {
        // Only the socket file this server made: whatever took the path since is not ours.
        file.remove(std::path::Path::new(p));
    }
    Ok(())
}

/// Bound addresses of the running servers with their options.
pub fn servers() -> Vec<(String, ServerOptions)> {
    SERVERS.with(|s| s.borrow().iter().map(|(k, v)| (k.clone(), v.options)).collect())
}

/// Bound addresses of the running servers.
pub fn addresses() -> Vec<String> {
    SERVERS.with(|s| s.borrow().keys().cloned().collect())
}

/// Stops every server (at daemon shutdown; call on the first reactor).
pub fn stop_all() {
    for a in addresses() {
        let _ = stop(&a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(ListenAddr::parse("127.0.0.1:10809").unwrap(), ListenAddr::Tcp("127.0.0.1:10809".into()));
        assert_eq!(ListenAddr::parse("[::1]:10809").unwrap(), ListenAddr::Tcp("[::1]:10809".into()));
        assert_eq!(ListenAddr::parse("/tmp/n.sock").unwrap(), ListenAddr::Unix("/tmp/n.sock".into()));
        assert_eq!(ListenAddr::parse("unix:/tmp/n.sock").unwrap(), ListenAddr::Unix("/tmp/n.sock".into()));
        for bad in ["", "localhost", ":80", "h:99999", "rel/path"] {
            assert!(ListenAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
