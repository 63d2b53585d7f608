//! The typed BHS of every opcode and the codes carried in their fields.
//!
//! Each struct holds the fields its opcode defines (RFC 7143 sections 11.2 to 11.19), not the
//! framing ones (TotalAHSLength, DataSegmentLength: the encoder and decoder deal with those),
//! and nothing on the heap: a SCSI Command, Data-Out or Data-In decodes onto the stack.
//! Fields whose reserved values call for an answer other than a Reject PDU (the login stages,
//! a task management function, a Reject's reason) are kept raw, with a typed accessor.

use std::fmt;

use super::offset::*;
use super::{be16, be32, be64, put16, put32, put64, PduError, Role, BHS_LEN, RESERVED_TAG};

/// Immediate delivery bit in byte 0.
pub const IMMEDIATE_BIT: u8 = 0x40;
/// The opcode's bits in byte 0.
pub const OPCODE_MASK: u8 = 0x3f;
/// The final bit (F) in byte 1; also the "1" bit of opcodes whose byte 1 has no F.
pub const FINAL_BIT: u8 = 0x80;

/// The opcodes of RFC 7143.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// 0x00 NOP-Out (initiator).
    NopOut = 0x00,
    /// 0x01 SCSI Command (initiator).
    ScsiCommand = 0x01,
    /// 0x02 SCSI Task Management Function Request (initiator).
    TaskMgmtRequest = 0x02,
    /// 0x03 Login Request (initiator).
    LoginRequest = 0x03,
    /// 0x04 Text Request (initiator).
    TextRequest = 0x04,
    /// 0x05 SCSI Data-Out (initiator).
    DataOut = 0x05,
    /// 0x06 Logout Request (initiator).
    LogoutRequest = 0x06,
    /// 0x10 SNACK Request (initiator).
    Snack = 0x10,
    /// 0x20 NOP-In (target).
    NopIn = 0x20,
    /// 0x21 SCSI Response (target).
    ScsiResponse = 0x21,
    /// 0x22 SCSI Task Management Function Response (target).
    TaskMgmtResponse = 0x22,
    /// 0x23 Login Response (target).
    LoginResponse = 0x23,
    /// 0x24 Text Response (target).
    TextResponse = 0x24,
    /// 0x25 SCSI Data-In (target).
    DataIn = 0x25,
    /// 0x26 Logout Response (target).
    LogoutResponse = 0x26,
    /// 0x31 Ready To Transfer (target).
    R2t = 0x31,
    /// 0x32 Asynchronous Message (target).
    AsyncMessage = 0x32,
    /// 0x3f Reject (target).
    Reject = 0x3f,
}

impl Opcode {
    /// The opcode for the low 6 bits of byte 0, if RFC 7143 defines it (vendor-specific
    /// opcodes 0x1c..=0x1e and 0x3c..=0x3e are not).
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v & OPCODE_MASK {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::Snack,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            _ => return None,
        })
    }

    /// The opcode's 6 bits.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// Who sends PDUs of this opcode: opcodes below 0x20 are the initiator's.
    pub fn sender(self) -> Role {
        if self.to_u8() < 0x20 {
            Role::Initiator
        } else {
            Role::Target
        }
    }

    /// Whether the opcode may carry a data segment. RFC 7143 fixes DataSegmentLength at 0 for
    /// task management requests and responses, Logout requests and responses, and R2T.
    pub fn may_carry_data(self) -> bool {
        !matches!(
            self,
            Opcode::TaskMgmtRequest
                | Opcode::TaskMgmtResponse
                | Opcode::LogoutRequest
                | Opcode::LogoutResponse
                | Opcode::R2t
        )
    }

    /// Whether the opcode may carry AHS: TotalAHSLength is fixed at 0 for the same opcodes
    /// that carry no data. Only a SCSI Command gives AHS a meaning.
    pub fn may_carry_ahs(self) -> bool {
        self.may_carry_data()
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Opcode::NopOut => "NOP-Out",
            Opcode::ScsiCommand => "SCSI Command",
            Opcode::TaskMgmtRequest => "Task Management Request",
            Opcode::LoginRequest => "Login Request",
            Opcode::TextRequest => "Text Request",
            Opcode::DataOut => "SCSI Data-Out",
            Opcode::LogoutRequest => "Logout Request",
            Opcode::Snack => "SNACK Request",
            Opcode::NopIn => "NOP-In",
            Opcode::ScsiResponse => "SCSI Response",
            Opcode::TaskMgmtResponse => "Task Management Response",
            Opcode::LoginResponse => "Login Response",
            Opcode::TextResponse => "Text Response",
            Opcode::DataIn => "SCSI Data-In",
            Opcode::LogoutResponse => "Logout Response",
            Opcode::R2t => "R2T",
            Opcode::AsyncMessage => "Asynchronous Message",
            Opcode::Reject => "Reject",
        };
        f.write_str(name)
    }
}

/// SCSI task attributes (ATTR, SCSI Command byte 1 bits 0..3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TaskAttr {
    /// 0: untagged.
    Untagged = 0,
    /// 1: simple.
    Simple = 1,
    /// 2: ordered.
    Ordered = 2,
    /// 3: head of queue.
    HeadOfQueue = 3,
    /// 4: ACA.
    Aca = 4,
}

impl TaskAttr {
    /// The attribute for an ATTR value; 5..=7 are reserved.
    pub fn from_u8(v: u8) -> Option<TaskAttr> {
        Some(match v {
            0 => TaskAttr::Untagged,
            1 => TaskAttr::Simple,
            2 => TaskAttr::Ordered,
            3 => TaskAttr::HeadOfQueue,
            4 => TaskAttr::Aca,
            _ => return None,
        })
    }
}

/// Task management functions (RFC 7143 section 11.5.1; 9..=12 are RFC 7144's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TmfFunction {
    /// 1 ABORT TASK.
    AbortTask = 1,
    /// 2 ABORT TASK SET.
    AbortTaskSet = 2,
    /// 3 CLEAR ACA.
    ClearAca = 3,
    /// 4 CLEAR TASK SET.
    ClearTaskSet = 4,
    /// 5 LOGICAL UNIT RESET.
    LogicalUnitReset = 5,
    /// 6 TARGET WARM RESET.
    TargetWarmReset = 6,
    /// 7 TARGET COLD RESET.
    TargetColdReset = 7,
    /// 8 TASK REASSIGN.
    TaskReassign = 8,
    /// 9 QUERY TASK (RFC 7144).
    QueryTask = 9,
    /// 10 QUERY TASK SET (RFC 7144).
    QueryTaskSet = 10,
    /// 11 I_T NEXUS RESET (RFC 7144).
    ItNexusReset = 11,
    /// 12 QUERY ASYNCHRONOUS EVENT (RFC 7144).
    QueryAsyncEvent = 12,
}

impl TmfFunction {
    /// The function for a Function value; others are answered "Function rejected" (255).
    pub fn from_u8(v: u8) -> Option<TmfFunction> {
        Some(match v {
            1 => TmfFunction::AbortTask,
            2 => TmfFunction::AbortTaskSet,
            3 => TmfFunction::ClearAca,
            4 => TmfFunction::ClearTaskSet,
            5 => TmfFunction::LogicalUnitReset,
            6 => TmfFunction::TargetWarmReset,
            7 => TmfFunction::TargetColdReset,
            8 => TmfFunction::TaskReassign,
            9 => TmfFunction::QueryTask,
            10 => TmfFunction::QueryTaskSet,
            11 => TmfFunction::ItNexusReset,
            12 => TmfFunction::QueryAsyncEvent,
            _ => return None,
        })
    }
}

/// Task management responses (RFC 7143 section 11.6.1).
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    /// LUN does not exist.
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    /// Task still allegiant.
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTHORIZATION_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// Logout reasons (RFC 7143 section 11.14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LogoutReason {
    /// 0: close the session.
    CloseSession = 0,
    /// 1: close the connection.
    CloseConnection = 1,
    /// 2: remove the connection for recovery.
    RemoveForRecovery = 2,
}

impl LogoutReason {
    /// The reason for a ReasonCode; 3..=127 are reserved.
    pub fn from_u8(v: u8) -> Option<LogoutReason> {
        Some(match v {
            0 => LogoutReason::CloseSession,
            1 => LogoutReason::CloseConnection,
            2 => LogoutReason::RemoveForRecovery,
            _ => return None,
        })
    }
}

/// Logout responses (RFC 7143 section 11.15.1).
pub mod logout_response {
    /// Connection or session closed successfully.
    pub const SUCCESS: u8 = 0;
    /// CID not found.
    pub const CID_NOT_FOUND: u8 = 1;
    /// Connection recovery is not supported.
    pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
    /// Cleanup failed for various reasons.
    pub const CLEANUP_FAILED: u8 = 3;
}

/// SNACK types (RFC 7143 section 11.16.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SnackType {
    /// 0: Data/R2T SNACK.
    DataR2t = 0,
    /// 1: Status SNACK.
    Status = 1,
    /// 2: DataACK.
    DataAck = 2,
    /// 3: R-Data SNACK.
    RData = 3,
}

impl SnackType {
    /// The type for a Type value; 4..=15 are reserved.
    pub fn from_u8(v: u8) -> Option<SnackType> {
        Some(match v {
            0 => SnackType::DataR2t,
            1 => SnackType::Status,
            2 => SnackType::DataAck,
            3 => SnackType::RData,
            _ => return None,
        })
    }
}

/// SCSI Response "Response" codes (RFC 7143 section 11.4.3).
pub mod scsi_response {
    /// Command completed at target (the Status field says how).
    pub const COMPLETED: u8 = 0x00;
    /// Target failure.
    pub const TARGET_FAILURE: u8 = 0x01;
}

/// Asynchronous events (RFC 7143 section 11.9.1).
pub mod async_event {
    /// A SCSI asynchronous event; sense data follows.
    pub const SCSI: u8 = 0;
    /// The target asks for a logout.
    pub const LOGOUT_REQUEST: u8 = 1;
    /// The target will drop the connection (Parameter1 is its CID).
    pub const CONNECTION_DROP: u8 = 2;
    /// The target will drop all connections of the session.
    pub const SESSION_DROP: u8 = 3;
    /// The target asks for parameter negotiation (a Text Request).
    pub const NEGOTIATION_REQUEST: u8 = 4;
    /// All active tasks of a LU with iSCSI layer state will be terminated.
    pub const TASK_TERMINATION: u8 = 5;
    /// Vendor-specific.
    pub const VENDOR: u8 = 255;
}

/// The three login stages (CSG and NSG, RFC 7143 section 11.12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Stage {
    /// 0: SecurityNegotiation.
    Security = 0,
    /// 1: LoginOperationalNegotiation.
    Operational = 1,
    /// 3: FullFeaturePhase (2 is reserved).
    FullFeature = 3,
}

impl Stage {
    /// The stage for a 2-bit CSG or NSG value; 2 is reserved.
    pub fn from_bits(v: u8) -> Option<Stage> {
        Some(match v & 3 {
            0 => Stage::Security,
            1 => Stage::Operational,
            3 => Stage::FullFeature,
            _ => return None,
        })
    }

    /// The stage's 2 bits.
    pub fn bits(self) -> u8 {
        self as u8
    }
}

/// Login flags: T and C bits.
pub mod login_flags {
    /// T: transit to NSG.
    pub const TRANSIT: u8 = 0x80;
    /// C: the text continues in the next PDU.
    pub const CONTINUE: u8 = 0x40;
}

/// Text flags: C bit (F is [`super::FINAL_BIT`]).
pub const TEXT_CONTINUE: u8 = 0x40;

/// The Initiator Session ID (6 bytes: T, A, B, C, D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Isid(pub [u8; 6]);

impl Isid {
    /// The T field (top 2 bits): 0 OUI format, 1 IANA enterprise number, 2 random, 3 reserved.
    pub fn kind(&self) -> u8 {
        self.0[0] >> 6
    }

    /// The ISID as a 48-bit number (for names such as "iqn...,i,0x80123456abcd").
    pub fn to_u64(&self) -> u64 {
        self.0.iter().fold(0, |acc, b| (acc << 8) | u64::from(*b))
    }
}

/// NOP-Out (RFC 7143 section 11.18): a ping, or the answer to a NOP-In.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopOut {
    /// I: immediate delivery.
    pub immediate: bool,
    /// LUN (with a TTT answering a NOP-In).
    pub lun: u64,
    /// ITT (0xffffffff when answering a NOP-In; then `immediate` must be set).
    pub itt: u32,
    /// TTT (the NOP-In's, or 0xffffffff).
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SCSI Command (RFC 7143 section 11.3). The CDB's first 16 bytes are here; a longer CDB
/// continues in an extended CDB AHS, and a bidirectional command's read length is in an AHS
/// too (see [`super::AhsInfo`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiCommand {
    /// I: immediate delivery.
    pub immediate: bool,
    /// F: no unsolicited Data-Out follows.
    pub final_: bool,
    /// R: the command reads (data to the initiator).
    pub read: bool,
    /// W: the command writes (data from the initiator).
    pub write: bool,
    /// ATTR, checked (0..=4).
    pub attr: TaskAttr,
    /// LUN.
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// Expected Data Transfer Length (the write length for a bidirectional command).
    pub expected_data_transfer_length: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The CDB's first 16 bytes.
    pub cdb: [u8; 16],
}

/// SCSI Response (RFC 7143 section 11.4). Sense or response data, if any, is the data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiResponse {
    /// o: bidirectional read residual overflow.
    pub bidi_overflow: bool,
    /// u: bidirectional read residual underflow.
    pub bidi_underflow: bool,
    /// O: residual overflow.
    pub overflow: bool,
    /// U: residual underflow.
    pub underflow: bool,
    /// Response ([`scsi_response`]).
    pub response: u8,
    /// SCSI Status (valid with Response 0).
    pub status: u8,
    /// ITT.
    pub itt: u32,
    /// SNACK Tag (0 unless answering a R-Data SNACK).
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// ExpDataSN: Data-In and R2T PDUs sent for the command.
    pub exp_data_sn: u32,
    /// Bidirectional Read Residual Count.
    pub bidi_read_residual_count: u32,
    /// Residual Count.
    pub residual_count: u32,
}

/// Task Management Function Request (RFC 7143 section 11.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// I: immediate delivery.
    pub immediate: bool,
    /// Function, raw ([`TmfFunction::from_u8`]; unknown ones are answered 255).
    pub function: u8,
    /// LUN.
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// Referenced Task Tag (ABORT TASK, TASK REASSIGN), else 0xffffffff.
    pub referenced_task_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// RefCmdSN.
    pub ref_cmd_sn: u32,
    /// ExpDataSN (TASK REASSIGN).
    pub exp_data_sn: u32,
}

/// Task Management Function Response (RFC 7143 section 11.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response ([`tmf_response`]).
    pub response: u8,
    /// ITT.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// SCSI Data-Out (RFC 7143 section 11.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOut {
    /// F: the last Data-Out of the sequence (of the R2T, or of the unsolicited burst).
    pub final_: bool,
    /// LUN (with a TTT other than 0xffffffff: the R2T's).
    pub lun: u64,
    /// ITT: the command's.
    pub itt: u32,
    /// TTT: the R2T's, or 0xffffffff for unsolicited data.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN: numbered per R2T (per command for unsolicited data) from 0.
    pub data_sn: u32,
    /// Buffer Offset: where this data goes in the command's data.
    pub buffer_offset: u32,
}

/// SCSI Data-In (RFC 7143 section 11.7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataIn {
    /// F: the last Data-In of the sequence.
    pub final_: bool,
    /// A: the target asks for a DataACK SNACK (ERL > 0).
    pub acknowledge: bool,
    /// O: residual overflow (with S).
    pub overflow: bool,
    /// U: residual underflow (with S).
    pub underflow: bool,
    /// S: the PDU carries the command's status (then F is set too).
    pub status_present: bool,
    /// SCSI Status (with S).
    pub status: u8,
    /// LUN (with A).
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT (with A), else 0xffffffff.
    pub ttt: u32,
    /// StatSN (with S).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Buffer Offset.
    pub buffer_offset: u32,
    /// Residual Count (with S).
    pub residual_count: u32,
}

/// Ready To Transfer (RFC 7143 section 11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// LUN.
    pub lun: u64,
    /// ITT: the command's.
    pub itt: u32,
    /// TTT: the tag the answering Data-Out PDUs carry (never 0xffffffff).
    pub ttt: u32,
    /// StatSN (the next one; not advanced).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN: numbered per command from 0, shared with the command's Data-In DataSN.
    pub r2t_sn: u32,
    /// Buffer Offset of the requested data.
    pub buffer_offset: u32,
    /// Desired Data Transfer Length (never 0).
    pub desired_data_transfer_length: u32,
}

/// Asynchronous Message (RFC 7143 section 11.9). Sense and iSCSI event data follow as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncMessage {
    /// LUN (for SCSI events).
    pub lun: u64,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent ([`async_event`]).
    pub async_event: u8,
    /// AsyncVCode (vendor code).
    pub async_vcode: u8,
    /// Parameter1.
    pub parameter1: u16,
    /// Parameter2.
    pub parameter2: u16,
    /// Parameter3.
    pub parameter3: u16,
}

/// Text Request (RFC 7143 section 11.10). Key=value text is the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextRequest {
    /// I: immediate delivery.
    pub immediate: bool,
    /// F: the last request of the exchange.
    pub final_: bool,
    /// C: the text continues in the next request (then F is 0).
    pub continue_: bool,
    /// LUN.
    pub lun: u64,
    /// ITT (the same for all PDUs of the exchange).
    pub itt: u32,
    /// TTT: 0xffffffff to start, else the last Text Response's.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Text Response (RFC 7143 section 11.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextResponse {
    /// F: the last response of the exchange.
    pub final_: bool,
    /// C: the text continues in the next response (then F is 0).
    pub continue_: bool,
    /// LUN.
    pub lun: u64,
    /// ITT.
    pub itt: u32,
    /// TTT: 0xffffffff with F, else a tag the next request returns.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Login Request (RFC 7143 section 11.12). Always immediate. CSG and NSG are kept raw: a
/// reserved stage is answered with a Login Response (initiator error), not a Reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRequest {
    /// T: the initiator is ready to transit to NSG.
    pub transit: bool,
    /// C: the text continues in the next request (then T is 0).
    pub continue_: bool,
    /// CSG, raw 2 bits ([`Stage::from_bits`]).
    pub csg: u8,
    /// NSG, raw 2 bits (meaningful with T).
    pub nsg: u8,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// ISID.
    pub isid: Isid,
    /// TSIH: 0 to start a session, else the session this connection joins.
    pub tsih: u16,
    /// ITT.
    pub itt: u32,
    /// CID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Login Response (RFC 7143 section 11.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginResponse {
    /// T: the target transits to NSG.
    pub transit: bool,
    /// C: the text continues in the next response.
    pub continue_: bool,
    /// CSG, raw 2 bits.
    pub csg: u8,
    /// NSG, raw 2 bits.
    pub nsg: u8,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID (the request's).
    pub isid: Isid,
    /// TSIH: the session's in the final response of a successful login, else the request's.
    pub tsih: u16,
    /// ITT (the request's).
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class (0 success, 1 redirection, 2 initiator error, 3 target error).
    pub status_class: u8,
    /// Status-Detail.
    pub status_detail: u8,
}

/// Logout Request (RFC 7143 section 11.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutRequest {
    /// I: immediate delivery.
    pub immediate: bool,
    /// Reason Code, checked (0..=2).
    pub reason: LogoutReason,
    /// ITT.
    pub itt: u32,
    /// CID of the connection to close (reasons 1 and 2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Logout Response (RFC 7143 section 11.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutResponse {
    /// Response ([`logout_response`]).
    pub response: u8,
    /// ITT.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait.
    pub time2wait: u16,
    /// Time2Retain.
    pub time2retain: u16,
}

/// SNACK Request (RFC 7143 section 11.16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snack {
    /// Type, checked (0..=3).
    pub snack_type: SnackType,
    /// LUN (DataACK).
    pub lun: u64,
    /// ITT (0xffffffff for Status SNACK and DataACK).
    pub itt: u32,
    /// TTT (DataACK) or SNACK Tag (R-Data).
    pub ttt_or_snack_tag: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// BegRun.
    pub beg_run: u32,
    /// RunLength.
    pub run_length: u32,
}

/// Reject (RFC 7143 section 11.17). The data is the rejected PDU's BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    /// Reason, raw ([`super::RejectReason::from_u8`]).
    pub reason: u8,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (for a rejected SNACK), else 0.
    pub data_sn: u32,
}

/// NOP-In (RFC 7143 section 11.19): the answer to a NOP-Out, or the target's ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopIn {
    /// LUN (with a TTT).
    pub lun: u64,
    /// ITT (the NOP-Out's, or 0xffffffff for the target's ping).
    pub itt: u32,
    /// TTT (0xffffffff unless the target wants an answer).
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// A typed BHS: everything but the framing fields, AHS, data and digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu {
    /// NOP-Out.
    NopOut(NopOut),
    /// SCSI Command.
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request.
    TaskMgmtRequest(TaskMgmtRequest),
    /// Login Request.
    LoginRequest(LoginRequest),
    /// Text Request.
    TextRequest(TextRequest),
    /// SCSI Data-Out.
    DataOut(DataOut),
    /// Logout Request.
    LogoutRequest(LogoutRequest),
    /// SNACK Request.
    Snack(Snack),
    /// NOP-In.
    NopIn(NopIn),
    /// SCSI Response.
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response.
    TaskMgmtResponse(TaskMgmtResponse),
    /// Login Response.
    LoginResponse(LoginResponse),
    /// Text Response.
    TextResponse(TextResponse),
    /// SCSI Data-In.
    DataIn(DataIn),
    /// Logout Response.
    LogoutResponse(LogoutResponse),
    /// R2T.
    R2t(R2t),
    /// Asynchronous Message.
    AsyncMessage(AsyncMessage),
    /// Reject.
    Reject(Reject),
}

fn bit(set: bool, mask: u8) -> u8 {
    if set {
        mask
    } else {
        0
    }
}

fn invalid(opcode: Opcode, offset: u8, value: u32) -> PduError {
    PduError::InvalidField { opcode, offset: u16::from(offset), value }
}

impl Pdu {
    /// The PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NopOut,
            Pdu::ScsiCommand(_) => Opcode::ScsiCommand,
            Pdu::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Pdu::LoginRequest(_) => Opcode::LoginRequest,
            Pdu::TextRequest(_) => Opcode::TextRequest,
            Pdu::DataOut(_) => Opcode::DataOut,
            Pdu::LogoutRequest(_) => Opcode::LogoutRequest,
            Pdu::Snack(_) => Opcode::Snack,
            Pdu::NopIn(_) => Opcode::NopIn,
            Pdu::ScsiResponse(_) => Opcode::ScsiResponse,
            Pdu::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Pdu::LoginResponse(_) => Opcode::LoginResponse,
            Pdu::TextResponse(_) => Opcode::TextResponse,
            Pdu::DataIn(_) => Opcode::DataIn,
            Pdu::LogoutResponse(_) => Opcode::LogoutResponse,
            Pdu::R2t(_) => Opcode::R2t,
            Pdu::AsyncMessage(_) => Opcode::AsyncMessage,
            Pdu::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag (0xffffffff for Asynchronous Message and Reject).
    pub fn itt(&self) -> u32 {
        match self {
            Pdu::NopOut(p) => p.itt,
            Pdu::ScsiCommand(p) => p.itt,
            Pdu::TaskMgmtRequest(p) => p.itt,
            Pdu::LoginRequest(p) => p.itt,
            Pdu::TextRequest(p) => p.itt,
            Pdu::DataOut(p) => p.itt,
            Pdu::LogoutRequest(p) => p.itt,
            Pdu::Snack(p) => p.itt,
            Pdu::NopIn(p) => p.itt,
            Pdu::ScsiResponse(p) => p.itt,
            Pdu::TaskMgmtResponse(p) => p.itt,
            Pdu::LoginResponse(p) => p.itt,
            Pdu::TextResponse(p) => p.itt,
            Pdu::DataIn(p) => p.itt,
            Pdu::LogoutResponse(p) => p.itt,
            Pdu::R2t(p) => p.itt,
            Pdu::AsyncMessage(_) | Pdu::Reject(_) => RESERVED_TAG,
        }
    }

    /// Whether the I bit is set (initiator opcodes; a Login Request always has it).
    pub fn immediate(&self) -> bool {
        match self {
            Pdu::NopOut(p) => p.immediate,
            Pdu::ScsiCommand(p) => p.immediate,
            Pdu::TaskMgmtRequest(p) => p.immediate,
            Pdu::LoginRequest(_) => true,
            Pdu::TextRequest(p) => p.immediate,
            Pdu::LogoutRequest(p) => p.immediate,
            _ => false,
        }
    }

    /// Reads the typed header from a BHS, checking the fields that have reserved or
    /// contradictory values independent of AHS, data and session state. The framing fields
    /// (TotalAHSLength, DataSegmentLength) and reserved bytes are not looked at.
    pub fn parse(b: &[u8; BHS_LEN]) -> Result<Pdu, PduError> {
        let op = Opcode::from_u8(b[0]).ok_or(PduError::UnknownOpcode { opcode: b[0] & OPCODE_MASK })?;
        let imm = b[0] & IMMEDIATE_BIT != 0;
        let f = b[1];
        let fin = f & FINAL_BIT != 0;
        let lun = be64(b, LUN);
        let itt = be32(b, ITT);
        let w20 = be32(b, WORD20);
        let w24 = be32(b, WORD24);
        let w28 = be32(b, WORD28);
        let w32 = be32(b, WORD32);
        let w36 = be32(b, WORD36);
        let w40 = be32(b, WORD40);
        let w44 = be32(b, WORD44);
        Ok(match op {
            Opcode::NopOut => {
                if itt == RESERVED_TAG && !imm {
                    return Err(invalid(op, OPCODE, u32::from(b[0])));
                }
                Pdu::NopOut(NopOut { immediate: imm, lun, itt, ttt: w20, cmd_sn: w24, exp_stat_sn: w28 })
            }
            Opcode::ScsiCommand => {
                let read = f & 0x40 != 0;
                let write = f & 0x20 != 0;
                let attr = TaskAttr::from_u8(f & 0x07).ok_or(invalid(op, FLAGS, u32::from(f)))?;
                if !write && !fin {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                if !read && !write && w20 != 0 {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&b[32..48]);
                Pdu::ScsiCommand(ScsiCommand {
                    immediate: imm,
                    final_: fin,
                    read,
                    write,
                    attr,
                    lun,
                    itt,
                    expected_data_transfer_length: w20,
                    cmd_sn: w24,
                    exp_stat_sn: w28,
                    cdb,
                })
            }
            Opcode::TaskMgmtRequest => Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: f & 0x7f,
                lun,
                itt,
                referenced_task_tag: w20,
                cmd_sn: w24,
                exp_stat_sn: w28,
                ref_cmd_sn: w32,
                exp_data_sn: w36,
            }),
            Opcode::LoginRequest => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Pdu::LoginRequest(LoginRequest {
                    transit: f & login_flags::TRANSIT != 0,
                    continue_: f & login_flags::CONTINUE != 0,
                    csg: (f >> 2) & 3,
                    nsg: f & 3,
                    version_max: b[2],
                    version_min: b[3],
                    isid: Isid(isid),
                    tsih: be16(b, 14),
                    itt,
                    cid: be16(b, WORD20),
                    cmd_sn: w24,
                    exp_stat_sn: w28,
                })
            }
            Opcode::TextRequest => {
                let cont = f & TEXT_CONTINUE != 0;
                if fin && cont {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                Pdu::TextRequest(TextRequest {
                    immediate: imm,
                    final_: fin,
                    continue_: cont,
                    lun,
                    itt,
                    ttt: w20,
                    cmd_sn: w24,
                    exp_stat_sn: w28,
                })
            }
            Opcode::DataOut => Pdu::DataOut(DataOut {
                final_: fin,
                lun,
                itt,
                ttt: w20,
                exp_stat_sn: w28,
                data_sn: w36,
                buffer_offset: w40,
            }),
            Opcode::LogoutRequest => {
                let reason = LogoutReason::from_u8(f & 0x7f).ok_or(invalid(op, FLAGS, u32::from(f)))?;
                Pdu::LogoutRequest(LogoutRequest {
                    immediate: imm,
                    reason,
                    itt,
                    cid: be16(b, WORD20),
                    cmd_sn: w24,
                    exp_stat_sn: w28,
                })
            }
            Opcode::Snack => {
                let snack_type = SnackType::from_u8(f & 0x0f).ok_or(invalid(op, FLAGS, u32::from(f)))?;
                Pdu::Snack(Snack {
                    snack_type,
                    lun,
                    itt,
                    ttt_or_snack_tag: w20,
                    exp_stat_sn: w28,
                    beg_run: w40,
                    run_length: w44,
                })
            }
            Opcode::NopIn => Pdu::NopIn(NopIn { lun, itt, ttt: w20, stat_sn: w24, exp_cmd_sn: w28, max_cmd_sn: w32 }),
            Opcode::ScsiResponse => {
                let r = ScsiResponse {
                    bidi_overflow: f & 0x10 != 0,
                    bidi_underflow: f & 0x08 != 0,
                    overflow: f & 0x04 != 0,
                    underflow: f & 0x02 != 0,
                    response: b[2],
                    status: b[3],
                    itt,
                    snack_tag: w20,
                    stat_sn: w24,
                    exp_cmd_sn: w28,
                    max_cmd_sn: w32,
                    exp_data_sn: w36,
                    bidi_read_residual_count: w40,
                    residual_count: w44,
                };
                if (r.bidi_overflow && r.bidi_underflow) || (r.overflow && r.underflow) {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                Pdu::ScsiResponse(r)
            }
            Opcode::TaskMgmtResponse => Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: b[2],
                itt,
                stat_sn: w24,
                exp_cmd_sn: w28,
                max_cmd_sn: w32,
            }),
            Opcode::LoginResponse => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Pdu::LoginResponse(LoginResponse {
                    transit: f & login_flags::TRANSIT != 0,
                    continue_: f & login_flags::CONTINUE != 0,
                    csg: (f >> 2) & 3,
                    nsg: f & 3,
                    version_max: b[2],
                    version_active: b[3],
                    isid: Isid(isid),
                    tsih: be16(b, 14),
                    itt,
                    stat_sn: w24,
                    exp_cmd_sn: w28,
                    max_cmd_sn: w32,
                    status_class: b[36],
                    status_detail: b[37],
                })
            }
            Opcode::TextResponse => {
                let cont = f & TEXT_CONTINUE != 0;
                if fin && cont {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                Pdu::TextResponse(TextResponse {
                    final_: fin,
                    continue_: cont,
                    lun,
                    itt,
                    ttt: w20,
                    stat_sn: w24,
                    exp_cmd_sn: w28,
                    max_cmd_sn: w32,
                })
            }
            Opcode::DataIn => {
                let d = DataIn {
                    final_: fin,
                    acknowledge: f & 0x40 != 0,
                    overflow: f & 0x04 != 0,
                    underflow: f & 0x02 != 0,
                    status_present: f & 0x01 != 0,
                    status: b[3],
                    lun,
                    itt,
                    ttt: w20,
                    stat_sn: w24,
                    exp_cmd_sn: w28,
                    max_cmd_sn: w32,
                    data_sn: w36,
                    buffer_offset: w40,
                    residual_count: w44,
                };
                if (d.status_present && !d.final_) || (d.overflow && d.underflow) {
                    return Err(invalid(op, FLAGS, u32::from(f)));
                }
                Pdu::DataIn(d)
            }
            Opcode::LogoutResponse => Pdu::LogoutResponse(LogoutResponse {
                response: b[2],
                itt,
                stat_sn: w24,
                exp_cmd_sn: w28,
                max_cmd_sn: w32,
                time2wait: be16(b, WORD40),
                time2retain: be16(b, WORD40 + 2),
            }),
            Opcode::R2t => {
                if w20 == RESERVED_TAG {
                    return Err(invalid(op, WORD20, w20));
                }
                if w44 == 0 {
                    return Err(invalid(op, WORD44, w44));
                }
                Pdu::R2t(R2t {
                    lun,
                    itt,
                    ttt: w20,
                    stat_sn: w24,
                    exp_cmd_sn: w28,
                    max_cmd_sn: w32,
                    r2t_sn: w36,
                    buffer_offset: w40,
                    desired_data_transfer_length: w44,
                })
            }
            Opcode::AsyncMessage => Pdu::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: w24,
                exp_cmd_sn: w28,
                max_cmd_sn: w32,
                async_event: b[36],
                async_vcode: b[37],
                parameter1: be16(b, 38),
                parameter2: be16(b, WORD40),
                parameter3: be16(b, 42),
            }),
            Opcode::Reject => {
                Pdu::Reject(Reject { reason: b[2], stat_sn: w24, exp_cmd_sn: w28, max_cmd_sn: w32, data_sn: w36 })
            }
        })
    }

    /// Writes the whole BHS: the typed fields, `total_ahs_words` and `data_len` (at most
    /// 2^24 - 1), reserved bytes zeroed, the fixed "1" bits set.
    pub fn write_bhs(&self, b: &mut [u8; BHS_LEN], total_ahs_words: u8, data_len: u32) {
        debug_assert!(data_len <= super::MAX_DATA_SEGMENT_LENGTH);
        b.fill(0);
        b[0] = self.opcode().to_u8() | bit(self.immediate(), IMMEDIATE_BIT);
        b[TOTAL_AHS_LENGTH as usize] = total_ahs_words;
        super::put24(b, DATA_SEGMENT_LENGTH, data_len);
        put32(b, ITT, self.itt());
        match self {
            Pdu::NopOut(p) => {
                b[1] = FINAL_BIT;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
            }
            Pdu::ScsiCommand(p) => {
                b[1] = bit(p.final_, FINAL_BIT) | bit(p.read, 0x40) | bit(p.write, 0x20) | p.attr as u8;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.expected_data_transfer_length);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
                b[32..48].copy_from_slice(&p.cdb);
            }
            Pdu::TaskMgmtRequest(p) => {
                b[1] = FINAL_BIT | (p.function & 0x7f);
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.referenced_task_tag);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
                put32(b, WORD32, p.ref_cmd_sn);
                put32(b, WORD36, p.exp_data_sn);
            }
            Pdu::LoginRequest(p) => {
                b[1] = login_byte1(p.transit, p.continue_, p.csg, p.nsg);
                b[2] = p.version_max;
                b[3] = p.version_min;
                b[8..14].copy_from_slice(&p.isid.0);
                put16(b, 14, p.tsih);
                put16(b, WORD20, p.cid);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
            }
            Pdu::TextRequest(p) => {
                b[1] = bit(p.final_, FINAL_BIT) | bit(p.continue_, TEXT_CONTINUE);
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
            }
            Pdu::DataOut(p) => {
                b[1] = bit(p.final_, FINAL_BIT);
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD28, p.exp_stat_sn);
                put32(b, WORD36, p.data_sn);
                put32(b, WORD40, p.buffer_offset);
            }
            Pdu::LogoutRequest(p) => {
                b[1] = FINAL_BIT | p.reason as u8;
                put16(b, WORD20, p.cid);
                put32(b, WORD24, p.cmd_sn);
                put32(b, WORD28, p.exp_stat_sn);
            }
            Pdu::Snack(p) => {
                b[1] = FINAL_BIT | p.snack_type as u8;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt_or_snack_tag);
                put32(b, WORD28, p.exp_stat_sn);
                put32(b, WORD40, p.beg_run);
                put32(b, WORD44, p.run_length);
            }
            Pdu::NopIn(p) => {
                b[1] = FINAL_BIT;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
            }
            Pdu::ScsiResponse(p) => {
                b[1] = FINAL_BIT
                    | bit(p.bidi_overflow, 0x10)
                    | bit(p.bidi_underflow, 0x08)
                    | bit(p.overflow, 0x04)
                    | bit(p.underflow, 0x02);
                b[2] = p.response;
                b[3] = p.status;
                put32(b, WORD20, p.snack_tag);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                put32(b, WORD36, p.exp_data_sn);
                put32(b, WORD40, p.bidi_read_residual_count);
                put32(b, WORD44, p.residual_count);
            }
            Pdu::TaskMgmtResponse(p) => {
                b[1] = FINAL_BIT;
                b[2] = p.response;
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
            }
            Pdu::LoginResponse(p) => {
                b[1] = login_byte1(p.transit, p.continue_, p.csg, p.nsg);
                b[2] = p.version_max;
                b[3] = p.version_active;
                b[8..14].copy_from_slice(&p.isid.0);
                put16(b, 14, p.tsih);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                b[36] = p.status_class;
                b[37] = p.status_detail;
            }
            Pdu::TextResponse(p) => {
                b[1] = bit(p.final_, FINAL_BIT) | bit(p.continue_, TEXT_CONTINUE);
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
            }
            Pdu::DataIn(p) => {
                b[1] = bit(p.final_, FINAL_BIT)
                    | bit(p.acknowledge, 0x40)
                    | bit(p.overflow, 0x04)
                    | bit(p.underflow, 0x02)
                    | bit(p.status_present, 0x01);
                b[3] = p.status;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                put32(b, WORD36, p.data_sn);
                put32(b, WORD40, p.buffer_offset);
                put32(b, WORD44, p.residual_count);
            }
            Pdu::LogoutResponse(p) => {
                b[1] = FINAL_BIT;
                b[2] = p.response;
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                put16(b, WORD40, p.time2wait);
                put16(b, WORD40 + 2, p.time2retain);
            }
            Pdu::R2t(p) => {
                b[1] = FINAL_BIT;
                put64(b, LUN, p.lun);
                put32(b, WORD20, p.ttt);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                put32(b, WORD36, p.r2t_sn);
                put32(b, WORD40, p.buffer_offset);
                put32(b, WORD44, p.desired_data_transfer_length);
            }
            Pdu::AsyncMessage(p) => {
                b[1] = FINAL_BIT;
                put64(b, LUN, p.lun);
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                b[36] = p.async_event;
                b[37] = p.async_vcode;
                put16(b, 38, p.parameter1);
                put16(b, WORD40, p.parameter2);
                put16(b, 42, p.parameter3);
            }
            Pdu::Reject(p) => {
                b[1] = FINAL_BIT;
                b[2] = p.reason;
                put32(b, WORD24, p.stat_sn);
                put32(b, WORD28, p.exp_cmd_sn);
                put32(b, WORD32, p.max_cmd_sn);
                put32(b, WORD36, p.data_sn);
            }
        }
    }
}

fn login_byte1(transit: bool, cont: bool, csg: u8, nsg: u8) -> u8 {
    debug_assert!(csg <= 3 && nsg <= 3);
    bit(transit, login_flags::TRANSIT) | bit(cont, login_flags::CONTINUE) | ((csg & 3) << 2) | (nsg & 3)
}
