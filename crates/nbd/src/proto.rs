//! Constants and small shared types of the NBD protocol (see the NBD project's `doc/proto.md`).
//!
//! Every value here travels on the wire in network byte order (big-endian). Constants drop the
//! spec's `NBD_` prefix and, for handshake and transmission flags, its `FLAG_` too: `OPT_GO`
//! is `NBD_OPT_GO`, `SEND_FUA` is `NBD_FLAG_SEND_FUA`, `C_NO_ZEROES` is `NBD_FLAG_C_NO_ZEROES`,
//! while `FLAG_FUA` is the command flag `NBD_CMD_FLAG_FUA`. The error values (`EPERM`, `EIO`, ...)
//! are the protocol's wire values, not the host's errno (`libc::EPERM` etc.), which the server
//! must map to these before sending them.

use std::fmt;

// ---------------------------------------------------------------------------------------------
// Magics
// ---------------------------------------------------------------------------------------------

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second magic of the newstyle greeting, and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`: magic of every transmission-phase request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`: magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`: magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------------------------
// Handshake flags (16 bits, server to client) and client flags (32 bits, client to server)
// ---------------------------------------------------------------------------------------------

/// Handshake flag `NBD_FLAG_FIXED_NEWSTYLE`: the server speaks fixed newstyle.
pub const FIXED_NEWSTYLE: u16 = 1;
/// Handshake flag `NBD_FLAG_NO_ZEROES`: the server can omit the 124 zero bytes after
/// `NBD_OPT_EXPORT_NAME`.
pub const NO_ZEROES: u16 = 2;
/// Client flag `NBD_FLAG_C_FIXED_NEWSTYLE`: the client speaks fixed newstyle.
pub const C_FIXED_NEWSTYLE: u32 = 1;
/// Client flag `NBD_FLAG_C_NO_ZEROES`: the server must not send the 124 zero bytes.
pub const C_NO_ZEROES: u32 = 2;

// ---------------------------------------------------------------------------------------------
// Options (client requests during option haggling)
// ---------------------------------------------------------------------------------------------

/// `NBD_OPT_EXPORT_NAME`: choose an export and enter transmission (no option reply).
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`: the client ends the negotiation (soft disconnect).
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`: list the exports.
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`: upgrade the connection to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`: describe an export without entering transmission.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`: use structured replies during transmission.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// `NBD_OPT_LIST_META_CONTEXT`: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// `NBD_OPT_SET_META_CONTEXT`: select metadata contexts.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// `NBD_OPT_EXTENDED_HEADERS`: use 64-bit extended request and reply headers.
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------------------------------------
// Option reply types
// ---------------------------------------------------------------------------------------------

/// `NBD_REP_ACK`: the option succeeded (or a list has ended).
pub const REP_ACK: u32 = 1;
/// `NBD_REP_SERVER`: one export, in reply to `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// `NBD_REP_INFO`: one piece of export information, in reply to `NBD_OPT_INFO`/`NBD_OPT_GO`.
pub const REP_INFO: u32 = 3;
/// `NBD_REP_META_CONTEXT`: one metadata context.
pub const REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every option error reply type.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
/// `NBD_REP_ERR_UNSUP`: the option is unknown to this server.
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR + 1;
/// `NBD_REP_ERR_POLICY`: the option is valid but forbidden by policy.
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR + 2;
/// `NBD_REP_ERR_INVALID`: the option is known but syntactically invalid.
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR + 3;
/// `NBD_REP_ERR_PLATFORM`: the option is not supported on this platform.
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR + 4;
/// `NBD_REP_ERR_TLS_REQD`: TLS must be negotiated first.
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR + 5;
/// `NBD_REP_ERR_UNKNOWN`: the requested export does not exist.
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR + 6;
/// `NBD_REP_ERR_SHUTDOWN`: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR + 7;
/// `NBD_REP_ERR_BLOCK_SIZE_REQD`: the client must request block size information.
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR + 8;
/// `NBD_REP_ERR_TOO_BIG`: the request or the reply is too large to process.
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR + 9;

// ---------------------------------------------------------------------------------------------
// Info types (first u16 of an REP_INFO payload, and the items of an INFO/GO request)
// ---------------------------------------------------------------------------------------------

/// `NBD_INFO_EXPORT`: size and transmission flags (always sent).
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`: the export's canonical name.
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`: a human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------------------------
// Transmission flags (16 bits, sent with the export's size)
// ---------------------------------------------------------------------------------------------

/// `NBD_FLAG_HAS_FLAGS`: must always be set.
pub const HAS_FLAGS: u16 = 1;
/// `NBD_FLAG_READ_ONLY`: the export is read-only.
pub const READ_ONLY: u16 = 2;
/// `NBD_FLAG_SEND_FLUSH`: `NBD_CMD_FLUSH` is supported.
pub const SEND_FLUSH: u16 = 4;
/// `NBD_FLAG_SEND_FUA`: `NBD_CMD_FLAG_FUA` is supported.
pub const SEND_FUA: u16 = 8;
/// `NBD_FLAG_ROTATIONAL`: the export behaves like a rotational medium.
pub const ROTATIONAL: u16 = 16;
/// `NBD_FLAG_SEND_TRIM`: `NBD_CMD_TRIM` is supported.
pub const SEND_TRIM: u16 = 32;
/// `NBD_FLAG_SEND_WRITE_ZEROES`: `NBD_CMD_WRITE_ZEROES` is supported.
pub const SEND_WRITE_ZEROES: u16 = 64;
/// `NBD_FLAG_SEND_DF`: `NBD_CMD_FLAG_DF` is supported on reads.
pub const SEND_DF: u16 = 128;
/// `NBD_FLAG_CAN_MULTI_CONN`: flushes and FUA are visible across all connections.
pub const CAN_MULTI_CONN: u16 = 256;
/// `NBD_FLAG_SEND_RESIZE`: `NBD_CMD_RESIZE` is supported.
pub const SEND_RESIZE: u16 = 512;
/// `NBD_FLAG_SEND_CACHE`: `NBD_CMD_CACHE` is supported.
pub const SEND_CACHE: u16 = 1024;
/// `NBD_FLAG_SEND_FAST_ZERO`: `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const SEND_FAST_ZERO: u16 = 2048;

// ---------------------------------------------------------------------------------------------
// Commands and command flags
// ---------------------------------------------------------------------------------------------

/// `NBD_CMD_READ`.
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE` (the request is followed by `length` bytes of data).
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`: disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`.
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`.
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_CACHE`: prefetch hint.
pub const CMD_CACHE: u16 = 5;
/// `NBD_CMD_WRITE_ZEROES`.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// `NBD_CMD_BLOCK_STATUS`.
pub const CMD_BLOCK_STATUS: u16 = 7;
/// `NBD_CMD_RESIZE`.
pub const CMD_RESIZE: u16 = 8;

/// `NBD_CMD_FLAG_FUA`: force unit access.
pub const FLAG_FUA: u16 = 1;
/// `NBD_CMD_FLAG_NO_HOLE`: `NBD_CMD_WRITE_ZEROES` must not punch a hole.
pub const FLAG_NO_HOLE: u16 = 2;
/// `NBD_CMD_FLAG_DF`: don't fragment a structured read reply.
pub const FLAG_DF: u16 = 4;
/// `NBD_CMD_FLAG_REQ_ONE`: one extent per context in a block status reply.
pub const FLAG_REQ_ONE: u16 = 8;
/// `NBD_CMD_FLAG_FAST_ZERO`: fail `NBD_CMD_WRITE_ZEROES` rather than zero slowly.
pub const FLAG_FAST_ZERO: u16 = 16;

// ---------------------------------------------------------------------------------------------
// Structured replies
// ---------------------------------------------------------------------------------------------

/// `NBD_REPLY_FLAG_DONE`: this chunk is the last of its reply.
pub const REPLY_FLAG_DONE: u16 = 1;
/// `NBD_REPLY_TYPE_NONE`: an empty final chunk.
pub const REPLY_TYPE_NONE: u16 = 0;
/// `NBD_REPLY_TYPE_OFFSET_DATA`: u64 offset followed by data.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// `NBD_REPLY_TYPE_OFFSET_HOLE`: u64 offset and u32 size of a range reading as zeroes.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// `NBD_REPLY_TYPE_ERROR`: u32 error, u16 message length, message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// `NBD_REPLY_TYPE_ERROR_OFFSET`: as `NBD_REPLY_TYPE_ERROR`, then a u64 offset.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// ---------------------------------------------------------------------------------------------
// Error values (the wire values, independent of the host's errno numbering)
// ---------------------------------------------------------------------------------------------

/// `EPERM` on the wire: operation not permitted (e.g. a write to a read-only export).
pub const EPERM: u32 = 1;
/// `EIO` on the wire: input/output error.
pub const EIO: u32 = 5;
/// `ENOMEM` on the wire: cannot allocate memory.
pub const ENOMEM: u32 = 12;
/// `EINVAL` on the wire: invalid argument (unknown command or flag, out-of-range read, ...).
pub const EINVAL: u32 = 22;
/// `ENOSPC` on the wire: no space left (e.g. a write beyond the end of the export).
pub const ENOSPC: u32 = 28;
/// `EOVERFLOW` on the wire: value too large (e.g. a `DF` read too large to send unfragmented).
pub const EOVERFLOW: u32 = 75;
/// `ENOTSUP` on the wire: operation not supported (e.g. a `FAST_ZERO` write-zeroes that would be slow).
pub const ENOTSUP: u32 = 95;
/// `ESHUTDOWN` on the wire: the server is shutting down.
pub const ESHUTDOWN: u32 = 108;

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

/// Largest option payload the server accepts; larger options make it close the connection.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Longest string (export name, message) the spec allows, in bytes.
pub const MAX_NAME_LEN: usize = 4096;

/// A protocol violation that leaves the server no better answer than closing the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NBD protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtoError {}

/// Returns the longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_names() {
        assert_eq!(&NBDMAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    }

    #[test]
    fn error_reply_types_have_bit_31() {
        for t in [
            REP_ERR_UNSUP,
            REP_ERR_POLICY,
            REP_ERR_INVALID,
            REP_ERR_PLATFORM,
            REP_ERR_TLS_REQD,
            REP_ERR_UNKNOWN,
            REP_ERR_SHUTDOWN,
            REP_ERR_BLOCK_SIZE_REQD,
            REP_ERR_TOO_BIG,
        ] {
            assert_ne!(t & REP_FLAG_ERROR, 0);
        }
        assert_eq!(REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(REP_ERR_TOO_BIG, 0x8000_0009);
        assert_eq!(REPLY_TYPE_ERROR, 0x8001);
        assert_eq!(REPLY_TYPE_ERROR_OFFSET, 0x8002);
    }

    #[test]
    fn proto_error_displays_its_message() {
        let e = ProtoError("bad magic".into());
        assert_eq!(e.to_string(), "NBD protocol error: bad magic");
        let _: &dyn std::error::Error = &e;
    }

    #[test]
    fn truncate_str_respects_char_boundaries() {
        assert_eq!(truncate_str("hello", 10), "hello");
        assert_eq!(truncate_str("hello", 3), "hel");
        assert_eq!(truncate_str("héllo", 2), "h"); // 'é' is 2 bytes at 1..3
        assert_eq!(truncate_str("héllo", 3), "hé");
        assert_eq!(truncate_str("€", 2), "");
        assert_eq!(truncate_str("", 0), "");
    }
}
