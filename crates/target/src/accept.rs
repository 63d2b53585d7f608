//! A listener's accept loop: accepts on the reactor it runs on, refuses connections beyond the
//! listener's bound (closing them at once, with one log line per refusal streak), backs off on
//! accept errors (out of descriptors), and places each connection on the reactors in turn, as
//! SPDK's poll groups do.

use ferrite_reactor::net::Listener;
use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A connection's place in its listener's bound: given back when dropped (when the
/// connection's task ends).
pub struct ConnPermit(Arc<AtomicUsize>);

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a listener accepts.
#[derive(Debug, Clone)]
pub struct AcceptOptions {
    /// What the log calls the listener ("nbd server NAME", "nvmf listener ADDR").
    pub what: String,
    /// Connections served at once; more are accepted and closed.
    pub max_connections: usize,
}

/// Runs `listener`'s accept loop as a task on this reactor until `stopped` is set and the
/// listener is shut down. Each accepted connection gets TCP_NODELAY (ignored on other sockets),
/// its peer's name, and a permit, and `serve(fd, peer, permit)` runs on the next reactor in
/// turn (it spawns the connection's task there).
pub fn spawn_acceptor<F>(listener: Rc<Listener>, stopped: Rc<Cell<bool>>, opts: AcceptOptions, serve: F)
where
    F: Fn(OwnedFd, String, ConnPermit) + Send + Sync + Clone + 'static,
{
    ferrite_reactor::spawn_local(async move {
        let engine = ferrite_reactor::engine();
        let count = Arc::new(AtomicUsize::new(0));
        let (mut refused, mut next) = (0u64, 0usize);
        let mut errors = ferrite_reactor::net::AcceptErrors::new();
        let (what, max) = (opts.what, opts.max_connections);
        loop {
            match listener.accept().await {
                Ok(fd) => {
                    errors.ok(&what);
                    let peer = ferrite_reactor::net::peer_name(fd.as_raw_fd());
                    if count.load(Ordering::Relaxed) >= max {
                        if refused == 0 {
                            log::warn!(
                                "{what}: connection limit ({max}) reached; refusing new connections (first: {peer}) \
                                 until one closes"
                            );
                        }
                        refused += 1;
                        drop(fd);
                        continue;
                    }
                    if refused > 0 {
                        log::warn!("{what}: accepting again; {refused} connection(s) were refused");
                        refused = 0;
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    let permit = ConnPermit(count.clone());
                    ferrite_reactor::net::set_nodelay(fd.as_raw_fd());
                    let target = next % engine.count();
                    next += 1;
                    let serve = serve.clone();
                    engine.send(target, move || serve(fd, peer, permit));
                }
                Err(_) if stopped.get() => break,
                Err(e) => {
                    // E.g. out of descriptors (the connection stays in the backlog): back off
                    // rather than spin or flood the log.
                    let wait = errors.failed(&what, &e);
                    ferrite_reactor::sleep(wait).await;
                }
            }
        }
        log::info!("{what}: stopped");
    })
    .detach();
}
