//! Ferrite's iSCSI initiator: a LUN of a remote iSCSI target as a bdev, SPDK's bdev_iscsi
//! (`bdev_iscsi_create`), written on `ferrite-iscsi` (PDU codec, digests, login, CHAP) rather
//! than on libiscsi. No thread of its own: each reactor that submits to the bdev has its own
//! session (one connection), polled by the reactor like the NVMe/TCP host's queue pairs.
//!
//! - [`url`]: libiscsi's URL (`iscsi://[user[%password]@]host[:port]/iqn/lun`);
//! - [`scsi`]: the CDBs sent and the data and sense parsed; [`command`]: bdev requests as
//!   SCSI commands;
//! - [`seq`]: the CmdSN window and StatSN; [`plan`]: how a command's data moves (immediate,
//!   unsolicited, R2T) and the checks of Data-In and R2T;
//! - [`conn`]: one connection (login, tasks, reader and writer);
//! - [`session`]: a reactor's session (requests waiting for the window or a connection,
//!   reconnection, timeouts); [`channel`]: the bdev layer's channel on it;
//! - [`lun`]: the bdev; [`attach`]: what `bdev_iscsi_create` does;
//! - [`options`]: `bdev_iscsi_set_options`; [`rpc`]: `bdev_iscsi_create`, `bdev_iscsi_delete`.
#![warn(missing_docs)]

pub mod attach;
mod channel;
pub mod command;
pub mod conn;
pub mod lun;
pub mod options;
pub mod plan;
pub mod rpc;
pub mod scsi;
pub mod seq;
mod session;
pub mod url;
