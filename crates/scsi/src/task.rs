//! What a transport hands the SCSI layer (a [`Task`]) and what it gets back (a [`Response`]),
//! with the residual of the transfer against the transport's expected length.

use crate::sense::SenseBuf;
use ferrite_bdev::IoBufs;

/// Longest CDB kept inline (iSCSI carries 16 bytes, more in an additional header segment).
pub const CDB_MAX: usize = 32;

/// A CDB, inline (no allocation per command).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cdb {
    bytes: [u8; CDB_MAX],
    len: u8,
}

impl Cdb {
    /// A CDB of `b` (bytes beyond [`CDB_MAX`] are dropped: no supported command is that long,
    /// and its opcode still decides the answer).
    pub fn new(b: &[u8]) -> Cdb {
        let n = b.len().min(CDB_MAX);
        let mut bytes = [0; CDB_MAX];
        bytes[..n].copy_from_slice(&b[..n]);
        Cdb { bytes, len: n as u8 }
    }

    /// The CDB's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Cdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cdb({:02x?})", self.as_slice())
    }
}

/// SAM-5 task attribute. The layer runs every task as it comes (the transport orders what it
/// must before submitting); the attribute is kept for the transport's own ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttr {
    /// SIMPLE.
    #[default]
    Simple,
    /// ORDERED.
    Ordered,
    /// HEAD OF QUEUE.
    HeadOfQueue,
    /// ACA.
    Aca,
}

/// A command as the transport received it.
#[derive(Debug)]
pub struct Task {
    /// The logical unit it addresses.
    pub lun: u64,
    /// The CDB.
    pub cdb: Cdb,
    /// Task attribute.
    pub attr: TaskAttr,
    /// The transport's expected data transfer length, in bytes (iSCSI EDTL): data-in is cut
    /// at it, and the residual is counted against it.
    pub expected_len: u32,
    /// The data-out the transport gathered: at most [`crate::Session::data_out_len`] bytes.
    pub data_out: IoBufs,
}

impl Task {
    /// A task of `cdb` to `lun` expecting `expected_len` bytes, without data-out.
    pub fn new(lun: u64, cdb: &[u8], expected_len: u32) -> Task {
        Task { lun, cdb: Cdb::new(cdb), attr: TaskAttr::Simple, expected_len, data_out: IoBufs::new() }
    }

    /// The same task with `data` as its data-out.
    pub fn with_data(mut self, data: ferrite_reactor::IoBuf) -> Task {
        self.data_out.push(data);
        self
    }
}

/// How the transfer compares with the expected length (iSCSI's U and O flags and residual
/// count; SAM-5 5.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residual {
    /// Exactly the expected length.
    #[default]
    None,
    /// Less was transferred than expected, by this many bytes.
    Under(u32),
    /// The command would have transferred this many bytes more than expected.
    Over(u32),
}

impl Residual {
    /// The residual of a command that would transfer `would` bytes against `expected`.
    pub fn of(expected: u32, would: u64) -> Residual {
        let e = u64::from(expected);
        if would > e {
            Residual::Over((would - e).min(u64::from(u32::MAX)) as u32)
        } else if would < e {
            Residual::Under((e - would) as u32)
        } else {
            Residual::None
        }
    }
}

/// What a task ended with.
#[derive(Debug, Default)]
pub struct Response {
    /// SCSI status.
    pub status: u8,
    /// Sense data (CHECK CONDITION only), in the format the control mode page asks for.
    pub sense: SenseBuf,
    /// Data-in: the bdev's own buffers for reads (lent memory where the bdev lends it), a
    /// buffer built here for the rest. Send the first `data_len` bytes.
    pub data: IoBufs,
    /// Bytes of `data` to send (at most the expected length).
    pub data_len: u32,
    /// Residual against the expected length.
    pub residual: Residual,
    /// The task was ended by a task management function: send no response for it (iSCSI
    /// sends none for an aborted task).
    pub aborted: bool,
}

impl Response {
    /// True for GOOD status.
    pub fn is_good(&self) -> bool {
        self.status == crate::sense::STATUS_GOOD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals() {
        assert_eq!(Residual::of(512, 512), Residual::None);
        assert_eq!(Residual::of(0, 512), Residual::Over(512));
        assert_eq!(Residual::of(10000, 512), Residual::Under(10000 - 512));
        assert_eq!(Residual::of(0, u64::MAX), Residual::Over(u32::MAX));
    }

    #[test]
    fn a_long_cdb_is_cut() {
        let c = Cdb::new(&[7; 40]);
        assert_eq!(c.as_slice().len(), CDB_MAX);
    }
}
