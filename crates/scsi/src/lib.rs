//! Ferrite's SCSI target layer: direct-access logical units (SPC-4, SBC-3) over any bdev,
//! independent of the transport (iSCSI sits on it; vhost-user-scsi can).
//!
//! # Shape
//!
//! - A [`Target`] has target ports ([`PortInfo`]: relative port, group, SCSI name, the
//!   transport's protocol identifier) and logical units by number ([`Lun`], made from a
//!   [`LunConfig`]: a bdev opened with a descriptor, its mode pages, its identity, its SPC-2
//!   reservation, its unit attention conditions per I_T nexus). Persistent reservations live in
//!   the bdev's registry (`ferrite_bdev::reservation`), shared with every other target.
//! - A [`Session`] is one I_T nexus (an `Initiator::Scsi` port through one target port) on the
//!   reactor that owns the connection. The transport builds a [`Task`] (LUN, CDB, attribute,
//!   expected transfer length, data-out as `IoBufs`), asks [`Session::data_out_len`] how much
//!   data-out to gather first (its R2Ts), and submits it with [`Session::submit`]; the
//!   [`Response`] (status, sense in fixed or descriptor format, data-in buffers and how much of
//!   them to send, residual) comes to its [`TaskDone`] on the same reactor.
//! - Task management is [`Session::abort_task`], [`Session::abort_task_set`],
//!   [`Session::clear_task_set`] and [`Session::lun_reset`] (a target reset is the transport's
//!   loop over the LUNs); dropping the session is the nexus's loss. An aborted task ends with
//!   [`Response::aborted`] set, and the function answers once the tasks it named have ended.
//! - [`cdb::decode`] is a pure function from CDB bytes to a [`Command`] or the [`Fault`] that
//!   refuses them (fuzzed: `fuzz/fuzz_targets/scsi_cdb.rs`).
//!
//! # Hot path
//!
//! READ and WRITE (6/10/12/16) are checked from the decoded CDB and relaxed loads of the
//! logical unit's atomics (unit attention pending, SPC-2 reservation held, write protection,
//! stopped) and the registry's, and go to the bdev with the session's slot as the tag: no
//! allocation, lock or syscall of their own. Reads are zero-copy: the bdev's buffers (lent
//! memory where it lends it) are the response's data-in. Every other command runs as a local
//! task (`exec`).
//!
//! # Modules
//!
//! `cdb` (decoder and the opcode table), `sense` (faults and sense data), `task` (tasks,
//! responses, residuals), `inquiry` (standard data, VPD pages, capacity data), `mode` (mode
//! pages), `pr` (persistent and SPC-2 reservations), `opcodes` (REPORT SUPPORTED OPERATION
//! CODES), `ua` (unit attentions), `lun`, `target`, `session` (tasks, hot path, task
//! management), `exec` (the other commands).

pub mod cdb;
mod exec;
pub mod inquiry;
pub mod lun;
pub mod mode;
pub mod opcodes;
pub mod pr;
pub mod sense;
pub mod session;
pub mod target;
pub mod task;
pub mod ua;

pub use cdb::{decode, Command};
pub use inquiry::PortInfo;
pub use lun::{Lun, LunConfig};
pub use sense::{Fault, SenseBuf};
pub use session::{Session, TaskDone, TmfResponse};
pub use target::{Target, TargetError};
pub use task::{Cdb, Residual, Response, Task, TaskAttr};
