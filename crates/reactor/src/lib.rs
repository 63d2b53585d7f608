//! Ferrite's engine: one pinned reactor thread per core. Each reactor owns a local executor for
//! tasks that need not be `Send`, pollers, timers, one io_uring, a buffer pool and a lock-free
//! mailbox with an eventfd doorbell. Cores talk only by messages.

pub mod blocking;
pub mod buf;
pub mod context;
pub mod cpumask;
pub mod eventfd;
pub mod fdwatch;
pub mod fixedmem;
#[doc(hidden)]
pub mod local;
pub mod mailbox;
pub mod net;
pub mod oneshot;
mod panic;
pub mod pbuf;
pub mod ratelog;
mod reactor;
pub mod ring;
pub mod sim;
pub mod tsc;
pub mod turnlock;

pub use async_task::Task;
pub use blocking::{spawn_blocking, Blocking, BlockingPanic};
pub use buf::{BufPool, BufPoolConfig, IoBuf, Lender};
pub use context::{current_engine, engine_state, lock_state, EnterGuard, StateGuard};
pub use fdwatch::{FdWatch, Readable};
pub use fixedmem::{FixedMem, LocalMem};
#[doc(hidden)]
pub use linkme;
pub use net::RecvStream;
pub use pbuf::{RecvBufConfig, RecvBufStats, RecvChunk};
pub use reactor::{
    after, alloc_buf, buf_pool, current, engine, next_turn, pending_timers, recv_buf_stats, register_poller,
    register_sleep_hook, resize_buf_pool, sleep, spawn_local, try_alloc_buf, try_with_ring, unregister_poller,
    unregister_sleep_hook, with_ring, Engine, EngineConfig, NextTurn, PollerId, ReactorMode, ReactorStats, Sleep,
};
pub use sim::{Sim, SimRng};
pub use turnlock::{TurnGuard, TurnLock};
