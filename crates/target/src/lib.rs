//! The target kit: what every target (NBD, NVMe/TCP, and the iSCSI and vhost targets to come)
//! and the initiators (NVMe/TCP, iSCSI) need around their protocol engine, written once.
//!
//! - [`accept`]: a listener's accept loop, with a bound on its connections and the
//!   connections placed on the reactors in turn.
//! - [`conn`]: the core of one connection: its socket, closing and dead flags, the wakers of its
//!   reader and writer tasks, and the progress of its sends and receives that a watchdog checks.
//! - [`table`]: a reactor's connections of one target, with a per-reactor watchdog (one timer per
//!   reactor, none per connection or command) and handshake deadlines.
//! - [`slots`]: a connection's table of outstanding commands, bounded, reused without
//!   allocation, and the end of a session (every bdev request of the connection aborted).
//! - [`close`]: the two ends of a connection: graceful (no new work, outstanding commands
//!   drained, then closed) and forced (every outstanding command ended exactly once).
//! - [`rx`]: a connection's receive side: bytes in chunks from the reactor's provided buffer
//!   ring, and payloads placed into command buffers (copied when small, received straight into
//!   the buffer when large).
//! - [`phase`]: every phase change of a command through one function that checks the
//!   transition is legal and can trace it.
//! - [`host`]: what initiators (the NVMe/TCP host, the iSCSI initiator) share: a command's
//!   phase that waits for the send of its data, the writer task, and a read's data received
//!   straight into the command's buffers.

pub mod accept;
pub mod close;
pub mod conn;
pub mod host;
pub mod phase;
pub mod rx;
pub mod slots;
pub mod table;

pub use accept::{spawn_acceptor, AcceptOptions, ConnPermit};
pub use close::{close_gracefully, end_all};
pub use conn::{ConnCore, Progress};
pub use phase::{transition, Phase};
pub use slots::{abort_all, SlotTable};
pub use table::{ConnTable, Served};
