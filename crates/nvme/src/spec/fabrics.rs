//! Fabrics commands: Connect, Property Get/Set and Disconnect, their responses, and the Connect
//! data (NVMe over Fabrics 1.1, section 3 "Fabrics Command Set", figures 10-22; NVMe Base
//! Specification 2.0 section 6 for the same commands; SPDK `include/spdk/nvmf_spec.h`).
//!
//! Every Fabrics command is opcode 7Fh with the command type in byte 4 (FCTYPE) where other
//! commands have the NSID, an SGL in bytes 39:24, and its own fields in bytes 63:40.

use super::cqe::Cqe;
use super::le::{arr, put, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::nqn::{NqnError, NqnField, NQN_FIELD_LEN};
use super::opcode::FABRICS;
use super::sgl::SglDescriptor;
use super::status::{fabrics as sc, Status};

/// Fabrics Command Type values (FCTYPE, byte 4; NVMe-oF 1.1 figure 10).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    /// Disconnect (NVMe-oF 1.1; in libnvme and FreeBSD's `nvmf_proto.h`, not in SPDK's or
    /// Linux's headers).
    pub const DISCONNECT: u8 = 0x08;
    /// First vendor specific command type (C0h-FFh).
    pub const VENDOR_SPECIFIC_START: u8 = 0xc0;
}

/// Byte offset of CID in every Fabrics command.
pub const OFFSET_CID: usize = 2;
/// Byte offset of FCTYPE in every Fabrics command.
pub const OFFSET_FCTYPE: usize = 4;
/// Byte offset of SGL1 in the Fabrics commands that have one.
pub const OFFSET_SGL1: usize = 24;

/// The FCTYPE of a 64-byte command, if it is a Fabrics command (opcode 7Fh).
pub const fn fctype_of(b: &[u8; 64]) -> Option<u8> {
    if b[0] == FABRICS {
        Some(b[OFFSET_FCTYPE])
    } else {
        None
    }
}

/// Starts a Fabrics command: zeroes `out` and writes opcode, CID and FCTYPE.
fn header(out: &mut [u8; 64], cid: u16, fctype: u8) {
    out.fill(0);
    out[0] = FABRICS;
    put_u16(out, OFFSET_CID, cid);
    out[OFFSET_FCTYPE] = fctype;
}

fn sgl1(b: &[u8; 64]) -> SglDescriptor {
    SglDescriptor::decode(&arr(b, OFFSET_SGL1))
}

fn put_sgl1(out: &mut [u8; 64], d: &SglDescriptor) {
    put(out, OFFSET_SGL1, &d.to_bytes());
}

/// Connect (FCTYPE 01h; NVMe-oF 1.1 figure 19, SPDK `struct spdk_nvmf_fabric_connect_cmd`):
/// creates the admin queue (QID 0) and with it a controller, or an I/O queue of an existing
/// controller. Its data is a [`ConnectData`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectCommand {
    /// Command Identifier (bytes 3:2).
    pub cid: u16,
    /// SGL Descriptor 1 (bytes 39:24), pointing at the 1024 bytes of Connect data.
    pub sgl1: SglDescriptor,
    /// Record Format (RECFMT, bytes 41:40); 0 is the only format. SPDK answers anything else
    /// with [`sc::INCOMPATIBLE_FORMAT`].
    pub recfmt: u16,
    /// Queue Identifier (QID, bytes 43:42): 0 for the admin queue.
    pub qid: u16,
    /// Submission Queue Size (SQSIZE, bytes 45:44), 0-based; SPDK refuses 0.
    pub sqsize: u16,
    /// Connect Attributes (CATTR, byte 46); see [`cattr`].
    pub cattr: u8,
    /// Keep Alive Timeout (KATO, bytes 51:48) in milliseconds, admin queue only; 0 disables
    /// the timer.
    pub kato: u32,
}

/// CATTR bits of [`ConnectCommand`].
pub mod cattr {
    /// Priority Class (bits 1:0) mask: the I/O queue's arbitration class.
    pub const PRIORITY_CLASS_MASK: u8 = 0x3;
    /// Disable SQ Flow Control (bit 2): the controller need not report SQHD (Linux
    /// `NVME_CONNECT_DISABLE_SQFLOW`, SPDK `dissqfc`).
    pub const DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;
    /// Bit 3: the host supports deleting individual I/O queues (FreeBSD
    /// `NVMF_CONNECT_ATTR_IO_QUEUE_DELETION`, SPDK `indivioqels`).
    pub const IO_QUEUE_DELETION: u8 = 1 << 3;
    /// Bit 4: SPDK's `connent` bit; not defined in NVMe-oF 1.1, no other source names it.
    pub const CONNENT: u8 = 1 << 4;
}

impl ConnectCommand {
    /// Byte offset of RECFMT.
    pub const OFFSET_RECFMT: usize = 40;
    /// Byte offset of QID.
    pub const OFFSET_QID: usize = 42;
    /// Byte offset of SQSIZE.
    pub const OFFSET_SQSIZE: usize = 44;
    /// Byte offset of CATTR.
    pub const OFFSET_CATTR: usize = 46;
    /// Byte offset of KATO.
    pub const OFFSET_KATO: usize = 48;

    /// Writes the command.
    pub fn encode(&self, out: &mut [u8; 64]) {
        header(out, self.cid, fctype::CONNECT);
        put_sgl1(out, &self.sgl1);
        put_u16(out, Self::OFFSET_RECFMT, self.recfmt);
        put_u16(out, Self::OFFSET_QID, self.qid);
        put_u16(out, Self::OFFSET_SQSIZE, self.sqsize);
        out[Self::OFFSET_CATTR] = self.cattr;
        put_u32(out, Self::OFFSET_KATO, self.kato);
    }

    /// Reads the command's fields (opcode and FCTYPE are not checked; see [`FabricsCommand`]).
    pub fn decode(b: &[u8; 64]) -> ConnectCommand {
        ConnectCommand {
            cid: u16_at(b, OFFSET_CID),
            sgl1: sgl1(b),
            recfmt: u16_at(b, Self::OFFSET_RECFMT),
            qid: u16_at(b, Self::OFFSET_QID),
            sqsize: u16_at(b, Self::OFFSET_SQSIZE),
            cattr: b[Self::OFFSET_CATTR],
            kato: u32_at(b, Self::OFFSET_KATO),
        }
    }
}

/// Controller ID a host puts in [`ConnectData::cntlid`] to ask for any controller of a
/// dynamic-model subsystem (SPDK's target only supports this model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// Controller ID asking for any free controller of a static-model subsystem.
pub const CNTLID_STATIC_ANY: u16 = 0xfffe;
/// Largest controller ID a controller can have (FFF0h-FFFFh are reserved).
pub const CNTLID_MAX: u16 = 0xffef;

/// Connect data (NVMe-oF 1.1 figure 20, SPDK `struct spdk_nvmf_fabric_connect_data`): 1024
/// bytes sent with [`ConnectCommand`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Host Identifier (HOSTID, bytes 15:0): a 128-bit UUID, the same on every queue of an
    /// association.
    pub hostid: [u8; 16],
    /// Controller ID (CNTLID, bytes 17:16): [`CNTLID_DYNAMIC`] on the admin queue of a
    /// dynamic subsystem; on I/O queues the controller the admin queue's Connect returned.
    pub cntlid: u16,
    /// NVM Subsystem NVMe Qualified Name (SUBNQN, bytes 511:256).
    pub subnqn: NqnField,
    /// Host NVMe Qualified Name (HOSTNQN, bytes 767:512).
    pub hostnqn: NqnField,
}

impl ConnectData {
    /// Size in bytes.
    pub const SIZE: usize = 1024;
    /// Byte offset of HOSTID.
    pub const OFFSET_HOSTID: usize = 0;
    /// Byte offset of CNTLID.
    pub const OFFSET_CNTLID: usize = 16;
    /// Byte offset of SUBNQN.
    pub const OFFSET_SUBNQN: usize = 256;
    /// Byte offset of HOSTNQN.
    pub const OFFSET_HOSTNQN: usize = 512;

    /// Writes the data.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put(out, Self::OFFSET_HOSTID, &self.hostid);
        put_u16(out, Self::OFFSET_CNTLID, self.cntlid);
        put(out, Self::OFFSET_SUBNQN, &self.subnqn.0);
        put(out, Self::OFFSET_HOSTNQN, &self.hostnqn.0);
    }

    /// The data's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads the data; the NQNs are kept as sent (see [`ConnectData::names`]).
    pub fn decode(b: &[u8; Self::SIZE]) -> ConnectData {
        ConnectData {
            hostid: arr(b, Self::OFFSET_HOSTID),
            cntlid: u16_at(b, Self::OFFSET_CNTLID),
            subnqn: NqnField(arr::<NQN_FIELD_LEN>(b, Self::OFFSET_SUBNQN)),
            hostnqn: NqnField(arr::<NQN_FIELD_LEN>(b, Self::OFFSET_HOSTNQN)),
        }
    }

    /// The subsystem and host NQNs, each NUL-terminated within 224 bytes and UTF-8. When one is
    /// not, the error is the invalid-parameter response that names it (IATTR 1, IPO its
    /// offset), as SPDK answers.
    pub fn names(&self) -> Result<(&str, &str), (InvalidParameter, NqnError)> {
        let sub = self.subnqn.as_str().map_err(|e| (InvalidParameter::in_data(Self::OFFSET_SUBNQN as u16), e))?;
        let host = self.hostnqn.as_str().map_err(|e| (InvalidParameter::in_data(Self::OFFSET_HOSTNQN as u16), e))?;
        Ok((sub, host))
    }
}

/// Dword 0 of a successful Connect's completion (NVMe-oF 1.1 figure 21).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectSuccess {
    /// Controller ID (CNTLID, bits 15:0) the queue is now part of.
    pub cntlid: u16,
    /// Authentication Required (AUTHREQ bit 1 = dword 0 bit 17, Linux
    /// `NVME_CONNECT_AUTHREQ_ATR`): in-band authentication must follow.
    pub atr: bool,
    /// Secure Channel Concatenation Required (AUTHREQ bit 2 = dword 0 bit 18, Linux
    /// `NVME_CONNECT_AUTHREQ_ASCR`).
    pub ascr: bool,
}

impl ConnectSuccess {
    /// The completion's dword 0.
    pub const fn to_dw0(&self) -> u32 {
        self.cntlid as u32 | (self.atr as u32) << 17 | (self.ascr as u32) << 18
    }

    /// The fields of a completion's dword 0.
    pub const fn from_dw0(v: u32) -> ConnectSuccess {
        ConnectSuccess { cntlid: v as u16, atr: v & 1 << 17 != 0, ascr: v & 1 << 18 != 0 }
    }
}

/// Dword 0 of a Connect that failed with Connect Invalid Parameters (status 82h; NVMe-oF 1.1
/// figure 22): which byte of the command or of the data was wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InvalidParameter {
    /// Invalid Attributes (IATTR, bits 23:16): bit 0 clear means the offset is into the
    /// command (SQE), set means into the Connect data.
    pub iattr: u8,
    /// Invalid Parameter Offset (IPO, bits 15:0): byte offset of the offending field.
    pub ipo: u16,
}

impl InvalidParameter {
    /// IATTR: the offset points into the command.
    pub const IATTR_COMMAND: u8 = 0;
    /// IATTR: the offset points into the Connect data.
    pub const IATTR_DATA: u8 = 1;

    /// A field of the command at byte `ipo` (for example [`ConnectCommand::OFFSET_SQSIZE`]).
    pub const fn in_command(ipo: u16) -> InvalidParameter {
        InvalidParameter { iattr: Self::IATTR_COMMAND, ipo }
    }

    /// A field of the Connect data at byte `ipo` (for example [`ConnectData::OFFSET_CNTLID`]).
    pub const fn in_data(ipo: u16) -> InvalidParameter {
        InvalidParameter { iattr: Self::IATTR_DATA, ipo }
    }

    /// The completion's dword 0.
    pub const fn to_dw0(&self) -> u32 {
        self.ipo as u32 | (self.iattr as u32) << 16
    }

    /// The fields of a completion's dword 0.
    pub const fn from_dw0(v: u32) -> InvalidParameter {
        InvalidParameter { iattr: (v >> 16) as u8, ipo: v as u16 }
    }

    /// The whole completion of Connect command `cid`: status Connect Invalid Parameters
    /// (command specific 82h) with this dword 0.
    pub const fn to_cqe(&self, cid: u16) -> Cqe {
        let mut c = Cqe::new(cid, Status::command_specific(sc::CONNECT_INVALID_PARAMETERS));
        c.dw0 = self.to_dw0();
        c
    }
}

/// ATTRIB.SIZE value of a 4-byte property.
pub const PROPERTY_SIZE_4: u8 = 0;
/// ATTRIB.SIZE value of an 8-byte property.
pub const PROPERTY_SIZE_8: u8 = 1;

/// Bytes a Property Get/Set ATTRIB.SIZE value names, or `None` for the reserved values.
pub const fn property_size_bytes(size: u8) -> Option<u8> {
    match size {
        PROPERTY_SIZE_4 => Some(4),
        PROPERTY_SIZE_8 => Some(8),
        _ => None,
    }
}

/// Property Get (FCTYPE 04h; NVMe-oF 1.1 figure 16, SPDK `struct
/// spdk_nvmf_fabric_prop_get_cmd`). The value comes back in the completion's dwords 0-1
/// ([`Cqe::set_result_u64`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PropertyGetCommand {
    /// Command Identifier (bytes 3:2).
    pub cid: u16,
    /// ATTRIB.SIZE (byte 40 bits 2:0): [`PROPERTY_SIZE_4`] or [`PROPERTY_SIZE_8`].
    pub size: u8,
    /// Offset (OFST, bytes 47:44) of the property; see [`super::registers::offset`].
    pub ofst: u32,
}

impl PropertyGetCommand {
    /// Byte offset of ATTRIB.
    pub const OFFSET_ATTRIB: usize = 40;
    /// Byte offset of OFST.
    pub const OFFSET_OFST: usize = 44;

    /// Writes the command.
    pub fn encode(&self, out: &mut [u8; 64]) {
        header(out, self.cid, fctype::PROPERTY_GET);
        out[Self::OFFSET_ATTRIB] = self.size & 0x7;
        put_u32(out, Self::OFFSET_OFST, self.ofst);
    }

    /// Reads the command's fields.
    pub fn decode(b: &[u8; 64]) -> PropertyGetCommand {
        PropertyGetCommand {
            cid: u16_at(b, OFFSET_CID),
            size: b[Self::OFFSET_ATTRIB] & 0x7,
            ofst: u32_at(b, Self::OFFSET_OFST),
        }
    }
}

/// Property Set (FCTYPE 00h; NVMe-oF 1.1 figure 18, SPDK `struct
/// spdk_nvmf_fabric_prop_set_cmd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PropertySetCommand {
    /// Command Identifier (bytes 3:2).
    pub cid: u16,
    /// ATTRIB.SIZE (byte 40 bits 2:0): [`PROPERTY_SIZE_4`] or [`PROPERTY_SIZE_8`].
    pub size: u8,
    /// Offset (OFST, bytes 47:44) of the property.
    pub ofst: u32,
    /// Value (bytes 55:48); only the low 4 bytes for a 4-byte property.
    pub value: u64,
}

impl PropertySetCommand {
    /// Byte offset of ATTRIB.
    pub const OFFSET_ATTRIB: usize = 40;
    /// Byte offset of OFST.
    pub const OFFSET_OFST: usize = 44;
    /// Byte offset of VALUE.
    pub const OFFSET_VALUE: usize = 48;

    /// Writes the command.
    pub fn encode(&self, out: &mut [u8; 64]) {
        header(out, self.cid, fctype::PROPERTY_SET);
        out[Self::OFFSET_ATTRIB] = self.size & 0x7;
        put_u32(out, Self::OFFSET_OFST, self.ofst);
        put_u64(out, Self::OFFSET_VALUE, self.value);
    }

    /// Reads the command's fields.
    pub fn decode(b: &[u8; 64]) -> PropertySetCommand {
        PropertySetCommand {
            cid: u16_at(b, OFFSET_CID),
            size: b[Self::OFFSET_ATTRIB] & 0x7,
            ofst: u32_at(b, Self::OFFSET_OFST),
            value: u64_at(b, Self::OFFSET_VALUE),
        }
    }
}

/// Disconnect (FCTYPE 08h; NVMe-oF 1.1 section 3.4, figure 14 in FreeBSD's reading): deletes
/// the I/O queue it is sent on. On the admin queue the answer is [`sc::INVALID_QUEUE_TYPE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DisconnectCommand {
    /// Command Identifier (bytes 3:2).
    pub cid: u16,
    /// Record Format (RECFMT, bytes 41:40); 0 is the only format.
    pub recfmt: u16,
}

impl DisconnectCommand {
    /// Byte offset of RECFMT.
    pub const OFFSET_RECFMT: usize = 40;

    /// Writes the command.
    pub fn encode(&self, out: &mut [u8; 64]) {
        header(out, self.cid, fctype::DISCONNECT);
        put_u16(out, Self::OFFSET_RECFMT, self.recfmt);
    }

    /// Reads the command's fields.
    pub fn decode(b: &[u8; 64]) -> DisconnectCommand {
        DisconnectCommand { cid: u16_at(b, OFFSET_CID), recfmt: u16_at(b, Self::OFFSET_RECFMT) }
    }
}

/// A decoded Fabrics command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FabricsCommand {
    /// Connect.
    Connect(ConnectCommand),
    /// Property Get.
    PropertyGet(PropertyGetCommand),
    /// Property Set.
    PropertySet(PropertySetCommand),
    /// Disconnect.
    Disconnect(DisconnectCommand),
    /// Any other command type (authentication, vendor specific, reserved).
    Other {
        /// Command type (FCTYPE).
        fctype: u8,
        /// Command Identifier.
        cid: u16,
    },
}

impl FabricsCommand {
    /// Reads a Fabrics command, or `None` if the opcode is not 7Fh.
    pub fn decode(b: &[u8; 64]) -> Option<FabricsCommand> {
        Some(match fctype_of(b)? {
            fctype::CONNECT => FabricsCommand::Connect(ConnectCommand::decode(b)),
            fctype::PROPERTY_GET => FabricsCommand::PropertyGet(PropertyGetCommand::decode(b)),
            fctype::PROPERTY_SET => FabricsCommand::PropertySet(PropertySetCommand::decode(b)),
            fctype::DISCONNECT => FabricsCommand::Disconnect(DisconnectCommand::decode(b)),
            fctype => FabricsCommand::Other { fctype, cid: u16_at(b, OFFSET_CID) },
        })
    }

    /// Writes the command (an `Other` is written as its header alone).
    pub fn encode(&self, out: &mut [u8; 64]) {
        match self {
            FabricsCommand::Connect(c) => c.encode(out),
            FabricsCommand::PropertyGet(c) => c.encode(out),
            FabricsCommand::PropertySet(c) => c.encode(out),
            FabricsCommand::Disconnect(c) => c.encode(out),
            FabricsCommand::Other { fctype, cid } => header(out, *cid, *fctype),
        }
    }

    /// The command's bytes.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0; 64];
        self.encode(&mut b);
        b
    }

    /// The command's CID.
    pub const fn cid(&self) -> u16 {
        match self {
            FabricsCommand::Connect(c) => c.cid,
            FabricsCommand::PropertyGet(c) => c.cid,
            FabricsCommand::PropertySet(c) => c.cid,
            FabricsCommand::Disconnect(c) => c.cid,
            FabricsCommand::Other { cid, .. } => *cid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sgl::tests::sgl;
    use super::super::sqe::Sqe;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn connect_offsets_match_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvmf_fabric_connect_cmd) == 64); offsetof:
        // fctype 4, sgl1 24, recfmt 40, qid 42, sqsize 44, cattr 46, kato 48.
        let c = ConnectCommand {
            cid: 0x0201,
            sgl1: SglDescriptor::in_capsule(0, 1024),
            recfmt: 0x0403,
            qid: 0x0605,
            sqsize: 0x0807,
            cattr: cattr::DISABLE_SQ_FLOW_CONTROL,
            kato: 0x0c0b_0a09,
        };
        let mut b = [0xaa; 64];
        c.encode(&mut b);
        assert_eq!(&b[..6], &[0x7f, 0, 1, 2, 0x01, 0]);
        assert_eq!(&b[24..40], &SglDescriptor::in_capsule(0, 1024).to_bytes());
        assert_eq!(&b[40..52], &[3, 4, 5, 6, 7, 8, 4, 0, 9, 10, 11, 12]);
        assert!(b[52..].iter().all(|&x| x == 0));
        assert_eq!(ConnectCommand::decode(&b), c);
        assert_eq!(FabricsCommand::decode(&b), Some(FabricsCommand::Connect(c)));
        // An SQE view of the same bytes sees FCTYPE in the NSID's low byte.
        assert_eq!(Sqe::decode(&b).nsid, 1);
    }

    #[test]
    fn connect_data_offsets_match_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvmf_fabric_connect_data) == 1024); offsetof:
        // cntlid 16, subnqn 256, hostnqn 512.
        let d = ConnectData {
            hostid: [0x11; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: NqnField::new("nqn.2016-06.io.spdk:cnode1").unwrap(),
            hostnqn: NqnField::new("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555").unwrap(),
        };
        let b = d.to_bytes();
        assert_eq!(&b[..16], &[0x11; 16]);
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..282], b"nqn.2016-06.io.spdk:cnode1");
        assert_eq!(&b[512..522], b"nqn.2014-0");
        assert!(b[768..].iter().all(|&x| x == 0));
        assert_eq!(ConnectData::decode(&b), d);
        assert_eq!(
            d.names(),
            Ok(("nqn.2016-06.io.spdk:cnode1", "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"))
        );
    }

    #[test]
    fn connect_data_bad_names_point_at_the_field() {
        let mut b = [0u8; 1024];
        b[512..512 + 240].fill(b'h'); // HOSTNQN without a NUL in its first 224 bytes
        let d = ConnectData::decode(&b);
        assert_eq!(d.names(), Err((InvalidParameter::in_data(512), NqnError::TooLong)));
        b[256] = 0xc3; // SUBNQN not UTF-8
        let d = ConnectData::decode(&b);
        assert_eq!(d.names(), Err((InvalidParameter::in_data(256), NqnError::NotUtf8)));
    }

    #[test]
    fn connect_responses() {
        // SPDK struct spdk_nvmf_fabric_connect_rsp: success.cntlid at 0, authreq at 2 with
        // atr bit 1; invalid.ipo at 0, iattr at 2.
        let ok = ConnectSuccess { cntlid: 0x0001, atr: true, ascr: false };
        assert_eq!(ok.to_dw0().to_le_bytes(), [1, 0, 2, 0]);
        assert_eq!(ConnectSuccess::from_dw0(ok.to_dw0()), ok);
        assert_eq!(ConnectSuccess { ascr: true, ..ConnectSuccess::default() }.to_dw0(), 1 << 18);
        let bad = InvalidParameter::in_command(ConnectCommand::OFFSET_SQSIZE as u16);
        assert_eq!(bad.to_dw0().to_le_bytes(), [44, 0, 0, 0]);
        let bad = InvalidParameter::in_data(ConnectData::OFFSET_CNTLID as u16);
        assert_eq!(bad.to_dw0().to_le_bytes(), [16, 0, 1, 0]);
        assert_eq!(InvalidParameter::from_dw0(bad.to_dw0()), bad);
        let cqe = bad.to_cqe(9).to_bytes();
        // Status 82h command specific: (0x82 << 1) | (1 << 9) in bytes 15:14.
        assert_eq!(&cqe[12..16], &[9, 0, 0x04, 0x03]);
    }

    #[test]
    fn property_commands_match_spdk() {
        // prop_get: attrib 40, ofst 44; prop_set: attrib 40, ofst 44, value 48.
        let g = PropertyGetCommand { cid: 3, size: PROPERTY_SIZE_8, ofst: 0 };
        let mut b = [0u8; 64];
        g.encode(&mut b);
        assert_eq!((b[0], b[2], b[4], b[40], &b[44..48]), (0x7f, 3, 0x04, 1, &[0u8, 0, 0, 0][..]));
        assert_eq!(FabricsCommand::decode(&b), Some(FabricsCommand::PropertyGet(g)));
        let s = PropertySetCommand { cid: 4, size: PROPERTY_SIZE_4, ofst: 0x14, value: 0x0046_0001 };
        s.encode(&mut b);
        assert_eq!((b[4], b[40], b[44]), (0x00, 0, 0x14));
        assert_eq!(&b[48..56], &[1, 0, 0x46, 0, 0, 0, 0, 0]);
        assert_eq!(FabricsCommand::decode(&b), Some(FabricsCommand::PropertySet(s)));
        assert_eq!(property_size_bytes(PROPERTY_SIZE_4), Some(4));
        assert_eq!(property_size_bytes(PROPERTY_SIZE_8), Some(8));
        assert_eq!(property_size_bytes(2), None);
    }

    #[test]
    fn disconnect_and_others() {
        let d = DisconnectCommand { cid: 5, recfmt: 0 };
        let b = FabricsCommand::Disconnect(d).to_bytes();
        assert_eq!((b[0], b[4]), (0x7f, 0x08));
        assert_eq!(FabricsCommand::decode(&b), Some(FabricsCommand::Disconnect(d)));
        let a = FabricsCommand::Other { fctype: fctype::AUTHENTICATION_SEND, cid: 7 };
        assert_eq!(FabricsCommand::decode(&a.to_bytes()), Some(a));
        assert_eq!(a.cid(), 7);
        let mut io = [0u8; 64];
        io[0] = 0x02;
        assert_eq!(FabricsCommand::decode(&io), None);
        assert_eq!(fctype_of(&io), None);
    }

    fn fabrics_command() -> impl Strategy<Value = FabricsCommand> {
        let connect = (any::<(u16, u16, u16, u16, u8, u32)>(), sgl()).prop_map(
            |((cid, recfmt, qid, sqsize, cattr, kato), sgl1)| {
                FabricsCommand::Connect(ConnectCommand { cid, sgl1, recfmt, qid, sqsize, cattr, kato })
            },
        );
        let get = (any::<u16>(), 0u8..8, any::<u32>())
            .prop_map(|(cid, size, ofst)| FabricsCommand::PropertyGet(PropertyGetCommand { cid, size, ofst }));
        let set = (any::<u16>(), 0u8..8, any::<u32>(), any::<u64>()).prop_map(|(cid, size, ofst, value)| {
            FabricsCommand::PropertySet(PropertySetCommand { cid, size, ofst, value })
        });
        let disc =
            any::<(u16, u16)>().prop_map(|(cid, recfmt)| FabricsCommand::Disconnect(DisconnectCommand { cid, recfmt }));
        let other = (any::<u8>(), any::<u16>())
            .prop_filter("known types", |(t, _)| ![0u8, 1, 4, 8].contains(t))
            .prop_map(|(fctype, cid)| FabricsCommand::Other { fctype, cid });
        prop_oneof![connect, get, set, disc, other]
    }

    proptest! {
        #[test]
        fn round_trip(c in fabrics_command()) {
            prop_assert_eq!(FabricsCommand::decode(&c.to_bytes()), Some(c));
        }

        #[test]
        fn connect_data_round_trip(hostid in any::<[u8; 16]>(), cntlid in any::<u16>(),
                                   sub in "[a-z0-9.:-]{0,223}", host in "[a-z0-9.:-]{0,223}") {
            let d = ConnectData {
                hostid,
                cntlid,
                subnqn: NqnField::new(&sub).unwrap(),
                hostnqn: NqnField::new(&host).unwrap(),
            };
            prop_assert_eq!(ConnectData::decode(&d.to_bytes()), d);
            prop_assert_eq!(d.names(), Ok((sub.as_str(), host.as_str())));
        }

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 64>(any::<u8>()),
                      data in proptest::array::uniform::<_, 1024>(any::<u8>())) {
            if let Some(c) = FabricsCommand::decode(&b) {
                prop_assert_eq!(FabricsCommand::decode(&c.to_bytes()), Some(c));
            }
            let d = ConnectData::decode(&data);
            prop_assert_eq!(ConnectData::decode(&d.to_bytes()), d);
            let _ = d.names();
        }
    }
}
