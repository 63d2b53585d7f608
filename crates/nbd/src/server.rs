//! Listeners: TCP or unix sockets accepting on the first reactor and handing each connection
//! to a reactor in turn.

use crate::conn;
use ferrite_reactor::net::{Listener, Socket};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

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
    stopped: Rc<Cell<bool>>,
}

thread_local! {
    /// Servers by address (kept on the first reactor, which runs every accept loop).
    static SERVERS: RefCell<BTreeMap<String, Server>> = const { RefCell::new(BTreeMap::new()) };
}

fn bind(addr: &ListenAddr) -> std::io::Result<OwnedFd> {
    match addr {
        ListenAddr::Tcp(a) => Ok(std::net::TcpListener::bind(a)?.into()),
        // Private (0600) from the start; replaces only a stale socket, never another file.
        ListenAddr::Unix(p) => Ok(ferrite_rpc::sockfile::bind(std::path::Path::new(p), 0o600)?.listener.into()),
    }
}

fn peer_of(fd: &OwnedFd) -> String {
    // SAFETY: getpeername writes at most `len` bytes into the storage we own.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd.as_raw_fd(), &mut ss as *mut _ as *mut libc::sockaddr, &mut len) != 0 {
            return "?".into();
        }
        match ss.ss_family as i32 {
            libc::AF_INET => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                format!("{ip}:{}", u16::from_be(a.sin_port))
            }
            libc::AF_INET6 => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in6);
                let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
                format!("[{ip}]:{}", u16::from_be(a.sin6_port))
            }
            _ => "unix".into(),
        }
    }
}

fn set_nodelay(fd: &OwnedFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int; failure (e.g. on a unix socket) is harmless.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Starts listening on `address` (call on the first reactor). Connections go to the reactors in
/// turn.
pub fn start(address: &str) -> Result<(), String> {
    let addr = ListenAddr::parse(address)?;
    if SERVERS.with(|s| s.borrow().contains_key(address)) {
        return Err(format!("an NBD server already listens on {address}"));
    }
    let fd = bind(&addr).map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let listener = Rc::new(Listener::new(fd));
    let stopped = Rc::new(Cell::new(false));
    let (l, st, name) = (listener.clone(), stopped.clone(), address.to_string());
    ferrite_reactor::spawn_local(async move {
        let engine = ferrite_reactor::engine();
        let mut next = 0usize;
        loop {
            match l.accept().await {
                Ok(fd) => {
                    set_nodelay(&fd);
                    let peer = peer_of(&fd);
                    let target = next % engine.count();
                    next += 1;
                    let listen = name.clone();
                    engine.send(target, move || {
                        ferrite_reactor::spawn_local(conn::serve(Socket::new(fd), peer, listen)).detach();
                    });
                }
                Err(_) if st.get() => break,
                Err(e) => {
                    log::warn!("nbd server {name}: accept: {e}");
                    ferrite_reactor::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
        log::info!("nbd server {name}: stopped");
    })
    .detach();
    log::info!("nbd server listening on {address}");
    SERVERS.with(|s| s.borrow_mut().insert(address.to_string(), Server { listener, addr, stopped }));
    Ok(())
}

/// Stops the server on `address` (existing connections stay). Call on the first reactor.
pub fn stop(address: &str) -> Result<(), String> {
    let s = SERVERS
        .with(|s| s.borrow_mut().remove(address))
        .ok_or_else(|| format!("no NBD server listens on {address}"))?;
    s.stopped.set(true);
    s.listener.shutdown();
    if let ListenAddr::Unix(p) = &s.addr {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Addresses of the running servers.
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
