//! Sans-I/O codec for the transmission phase: parsing 28-byte requests, checking them against
//! what the export advertised, and encoding simple replies and structured reply chunks.
//!
//! Only the compact (non-extended) headers are implemented: requests carry a 32-bit length and
//! structured chunks a 20-byte header.

use crate::proto::{
    truncate_str, ProtoError, CMD_BLOCK_STATUS, CMD_CACHE, CMD_DISC, CMD_FLUSH, CMD_READ, CMD_RESIZE, CMD_TRIM,
    CMD_WRITE, CMD_WRITE_ZEROES, EINVAL, ENOSPC, EPERM, FLAG_DF, FLAG_FAST_ZERO, FLAG_FUA, FLAG_NO_HOLE, MAX_NAME_LEN,
    REPLY_FLAG_DONE, REPLY_TYPE_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC,
    STRUCTURED_REPLY_MAGIC,
};

/// Length of a (compact) request header; an `NBD_CMD_WRITE` is followed by `length` data bytes.
pub const REQUEST_LEN: usize = 28;
/// Length of a simple reply header; a successful read's data follows it.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header; `length` payload bytes follow it.
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// A request's command type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`.
    Write,
    /// `NBD_CMD_DISC`.
    Disc,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// `NBD_CMD_RESIZE`.
    Resize,
    /// Any other type value.
    Unknown(u16),
}

impl Command {
    /// Decodes a request's 16-bit type field.
    pub fn from_u16(v: u16) -> Self {
        match v {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            CMD_RESIZE => Command::Resize,
            other => Command::Unknown(other),
        }
    }

    /// The 16-bit type field for this command (the inverse of [`Command::from_u16`]).
    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Resize => CMD_RESIZE,
            Command::Unknown(v) => v,
        }
    }
}

/// A parsed request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The `NBD_CMD_FLAG_*` bits.
    pub flags: u16,
    /// The command type.
    pub command: Command,
    /// The client's opaque handle, echoed in every reply to this request.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length (for `NBD_CMD_WRITE`, the number of data bytes following the header).
    pub length: u32,
}

/// Parses a 28-byte request header: u32 magic, u16 flags, u16 type, u64 cookie, u64 offset,
/// u32 length. A bad magic is an error, after which the caller closes the connection (it cannot
/// find the next request). Everything else is accepted here and judged by [`validate`].
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let [m0, m1, m2, m3, f0, f1, t0, t1, c0, c1, c2, c3, c4, c5, c6, c7, o0, o1, o2, o3, o4, o5, o6, o7, l0, l1, l2, l3] =
        *b;
    let magic = u32::from_be_bytes([m0, m1, m2, m3]);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError(format!("bad request magic {magic:#010x}")));
    }
    Ok(Request {
        flags: u16::from_be_bytes([f0, f1]),
        command: Command::from_u16(u16::from_be_bytes([t0, t1])),
        cookie: u64::from_be_bytes([c0, c1, c2, c3, c4, c5, c6, c7]),
        offset: u64::from_be_bytes([o0, o1, o2, o3, o4, o5, o6, o7]),
        length: u32::from_be_bytes([l0, l1, l2, l3]),
    })
}

/// What an export allows, for validating requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The export's size in bytes.
    pub size: u64,
    /// Minimum alignment advertised (`NBD_INFO_BLOCK_SIZE` minimum) for offsets and lengths;
    /// 0 and 1 mean no alignment is required.
    pub block_size: u32,
    /// Largest `NBD_CMD_READ`/`NBD_CMD_WRITE` length accepted.
    pub max_payload: u32,
    /// `NBD_FLAG_READ_ONLY` was advertised: writes, trims and write-zeroes fail with `EPERM`.
    pub read_only: bool,
    /// `NBD_FLAG_SEND_FLUSH` was advertised.
    pub flush: bool,
    /// `NBD_FLAG_SEND_FUA` was advertised.
    pub fua: bool,
    /// `NBD_FLAG_SEND_TRIM` was advertised.
    pub trim: bool,
    /// `NBD_FLAG_SEND_WRITE_ZEROES` was advertised.
    pub write_zeroes: bool,
    /// Structured replies were negotiated (and so `NBD_FLAG_SEND_DF` advertised).
    pub structured: bool,
}

/// Checks a request against the export; Err carries the NBD error to reply with.
///
/// In order:
/// - `NBD_CMD_DISC` is always `Ok` (it has no reply);
/// - unknown commands and the unadvertised `NBD_CMD_BLOCK_STATUS`/`NBD_CMD_RESIZE` are `EINVAL`,
///   as are `NBD_CMD_FLUSH`, `NBD_CMD_TRIM` and `NBD_CMD_WRITE_ZEROES` when not advertised;
/// - flags not documented for the command are `EINVAL`: `FUA` is accepted on every command (the
///   spec says the server MUST accept it on all commands once `NBD_FLAG_SEND_FUA` is advertised,
///   and some clients set it on `NBD_CMD_FLUSH`), `NO_HOLE` and `FAST_ZERO` only on
///   `NBD_CMD_WRITE_ZEROES`, `DF` only on `NBD_CMD_READ` with structured replies; `REQ_ONE` never
///   (block status is not offered). `FUA` without `NBD_FLAG_SEND_FUA` is `EINVAL`;
/// - write, trim and write-zeroes on a read-only export are `EPERM`;
/// - `NBD_CMD_FLUSH` stops here (its offset and length are not checked);
/// - a zero length is `EINVAL`; a read or write longer than `max_payload` is `EINVAL`;
/// - a range past the end of the export (or overflowing u64) is `ENOSPC` for write and
///   write-zeroes, `EINVAL` otherwise;
/// - an offset or length that is not a multiple of `block_size` is `EINVAL`.
pub fn validate(req: &Request, l: &Limits) -> Result<(), u32> {
    let allowed = match req.command {
        Command::Disc => return Ok(()),
        Command::Unknown(_) | Command::BlockStatus | Command::Resize => return Err(EINVAL),
        Command::Flush if !l.flush => return Err(EINVAL),
        Command::Trim if !l.trim => return Err(EINVAL),
        Command::WriteZeroes if !l.write_zeroes => return Err(EINVAL),
        Command::Read if l.structured => FLAG_FUA | FLAG_DF,
        Command::WriteZeroes => FLAG_FUA | FLAG_NO_HOLE | FLAG_FAST_ZERO,
        Command::Read | Command::Write | Command::Flush | Command::Trim | Command::Cache => FLAG_FUA,
    };
    if req.flags & !allowed != 0 {
        return Err(EINVAL);
    }
    if req.flags & FLAG_FUA != 0 && !l.fua {
        return Err(EINVAL);
    }
    let writes = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
    if writes && l.read_only {
        return Err(EPERM);
    }
    if req.command == Command::Flush {
        return Ok(());
    }
    if req.length == 0 {
        return Err(EINVAL);
    }
    if matches!(req.command, Command::Read | Command::Write) && req.length > l.max_payload {
        return Err(EINVAL);
    }
    let in_range = req.offset.checked_add(u64::from(req.length)).is_some_and(|end| end <= l.size);
    if !in_range {
        return Err(if matches!(req.command, Command::Write | Command::WriteZeroes) { ENOSPC } else { EINVAL });
    }
    if l.block_size > 1 {
        let bs = u64::from(l.block_size);
        if !req.offset.is_multiple_of(bs) || !u64::from(req.length).is_multiple_of(bs) {
            return Err(EINVAL);
        }
    }
    Ok(())
}

/// Encodes a simple reply header: u32 simple reply magic, u32 error (0 for success), u64 cookie.
/// A successful read's data follows it.
pub fn encode_simple_reply(out: &mut [u8; 16], error: u32, cookie: u64) {
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
}

/// Encodes a structured reply chunk header: u32 structured reply magic, u16 flags, u16 type,
/// u64 cookie, u32 payload length.
pub fn encode_structured_header(out: &mut [u8; 20], flags: u16, reply_type: u16, cookie: u64, length: u32) {
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&reply_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&length.to_be_bytes());
}

/// Structured OFFSET_DATA chunk header (20-byte header + u64 offset) — the data follows.
///
/// The chunk's payload length is `data_len + 8`; callers must keep `data_len` at most
/// `u32::MAX - 8` (the spec makes larger reads split into several chunks; the sum saturates).
/// `done` sets `NBD_REPLY_FLAG_DONE`, which the spec allows only if no error can follow.
pub fn encode_offset_data_header(out: &mut [u8; 28], cookie: u64, offset: u64, data_len: u32, done: bool) {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let mut header = [0u8; STRUCTURED_HEADER_LEN];
    encode_structured_header(&mut header, flags, REPLY_TYPE_OFFSET_DATA, cookie, data_len.saturating_add(8));
    out[..STRUCTURED_HEADER_LEN].copy_from_slice(&header);
    out[STRUCTURED_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
}

/// Structured ERROR chunk with DONE set and an optional message.
///
/// Appends the 20-byte header and the payload: u32 error, u16 message length, message. The
/// message is cut to [`MAX_NAME_LEN`] bytes on a character boundary (the spec's string limit);
/// an empty message sends none.
pub fn encode_structured_error(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let message = truncate_str(message, MAX_NAME_LEN);
    let mut header = [0u8; STRUCTURED_HEADER_LEN];
    // MAX_NAME_LEN (4096) keeps both lengths far inside their fields.
    let length = (6 + message.len()) as u32;
    encode_structured_header(&mut header, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, length);
    out.reserve(STRUCTURED_HEADER_LEN + 6 + message.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// Structured NONE chunk with DONE set (ends a reply whose data chunks had no DONE).
pub fn encode_structured_done(out: &mut [u8; 20], cookie: u64) {
    encode_structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;
    use proptest::prelude::*;

    fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&r.flags.to_be_bytes());
        b[6..8].copy_from_slice(&r.command.to_u16().to_be_bytes());
        b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&r.offset.to_be_bytes());
        b[24..28].copy_from_slice(&r.length.to_be_bytes());
        b
    }

    const SIZE: u64 = 1 << 20;

    /// An export that allows everything: 1 MiB, 512-byte blocks, 64 KiB payloads.
    fn full() -> Limits {
        Limits {
            size: SIZE,
            block_size: 512,
            max_payload: 64 << 10,
            read_only: false,
            flush: true,
            fua: true,
            trim: true,
            write_zeroes: true,
            structured: true,
        }
    }

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request { flags, command, cookie: 7, offset, length }
    }

    fn check(command: Command, flags: u16, offset: u64, length: u32, l: &Limits) -> Result<(), u32> {
        validate(&req(command, flags, offset, length), l)
    }

    const RANGED: [Command; 5] = [Command::Read, Command::Write, Command::Trim, Command::Cache, Command::WriteZeroes];

    #[test]
    fn parse_request_bytes() {
        #[rustfmt::skip]
        let raw = [
            0x25, 0x60, 0x95, 0x13,
            0x00, 0x01,
            0x00, 0x01,
            1, 2, 3, 4, 5, 6, 7, 8,
            0, 0, 0, 0, 0, 0, 0x10, 0,
            0, 0, 0x02, 0,
        ];
        assert_eq!(
            parse_request(&raw),
            Ok(Request {
                flags: FLAG_FUA,
                command: Command::Write,
                cookie: 0x0102_0304_0506_0708,
                offset: 4096,
                length: 512
            })
        );
        let mut bad = raw;
        bad[0] = 0x26;
        assert!(parse_request(&bad).is_err());
        // The simple reply magic is not a request magic.
        bad[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert!(parse_request(&bad).is_err());
    }

    #[test]
    fn command_codes() {
        let all = [
            (0, Command::Read),
            (1, Command::Write),
            (2, Command::Disc),
            (3, Command::Flush),
            (4, Command::Trim),
            (5, Command::Cache),
            (6, Command::WriteZeroes),
            (7, Command::BlockStatus),
            (8, Command::Resize),
            (9, Command::Unknown(9)),
            (0xffff, Command::Unknown(0xffff)),
        ];
        for (code, cmd) in all {
            assert_eq!(Command::from_u16(code), cmd);
            assert_eq!(cmd.to_u16(), code);
        }
    }

    #[test]
    fn validate_accepts_well_formed_requests() {
        let l = full();
        for cmd in RANGED {
            assert_eq!(check(cmd, 0, 0, 512, &l), Ok(()), "{cmd:?}");
            assert_eq!(check(cmd, 0, SIZE - 4096, 4096, &l), Ok(()), "{cmd:?} at the end");
            assert_eq!(check(cmd, FLAG_FUA, 512, 1024, &l), Ok(()), "{cmd:?} with FUA");
        }
        assert_eq!(check(Command::Flush, 0, 0, 0, &l), Ok(()));
        assert_eq!(check(Command::Read, 0, 0, 64 << 10, &l), Ok(()));
        assert_eq!(check(Command::Write, 0, 0, 64 << 10, &l), Ok(()));
    }

    #[test]
    fn validate_disc_is_always_ok() {
        let l = Limits { read_only: true, flush: false, fua: false, structured: false, ..full() };
        assert_eq!(check(Command::Disc, 0, 0, 0, &l), Ok(()));
        assert_eq!(check(Command::Disc, 0xffff, u64::MAX, u32::MAX, &l), Ok(()));
    }

    #[test]
    fn validate_unadvertised_commands() {
        let l = full();
        for cmd in [Command::BlockStatus, Command::Resize, Command::Unknown(9), Command::Unknown(0xffff)] {
            assert_eq!(check(cmd, 0, 0, 512, &l), Err(EINVAL), "{cmd:?}");
        }
        assert_eq!(check(Command::Flush, 0, 0, 0, &Limits { flush: false, ..full() }), Err(EINVAL));
        assert_eq!(check(Command::Trim, 0, 0, 512, &Limits { trim: false, ..full() }), Err(EINVAL));
        assert_eq!(check(Command::WriteZeroes, 0, 0, 512, &Limits { write_zeroes: false, ..full() }), Err(EINVAL));
        // An unadvertised command is EINVAL even on a read-only export.
        let ro = Limits { read_only: true, trim: false, write_zeroes: false, ..full() };
        assert_eq!(check(Command::Trim, 0, 0, 512, &ro), Err(EINVAL));
        assert_eq!(check(Command::WriteZeroes, 0, 0, 512, &ro), Err(EINVAL));
    }

    #[test]
    fn validate_flags_table() {
        use Command::*;
        let l = full();
        let ok = Ok(());
        let inval = Err(EINVAL);
        // (command, flag, expected with structured replies negotiated)
        let table = [
            (Read, FLAG_FUA, ok),
            (Read, FLAG_NO_HOLE, inval),
            (Read, FLAG_DF, ok),
            (Read, FLAG_REQ_ONE, inval),
            (Read, FLAG_FAST_ZERO, inval),
            (Write, FLAG_FUA, ok),
            (Write, FLAG_NO_HOLE, inval),
            (Write, FLAG_DF, inval),
            (Write, FLAG_REQ_ONE, inval),
            (Write, FLAG_FAST_ZERO, inval),
            (Flush, FLAG_FUA, ok),
            (Flush, FLAG_NO_HOLE, inval),
            (Flush, FLAG_DF, inval),
            (Flush, FLAG_REQ_ONE, inval),
            (Flush, FLAG_FAST_ZERO, inval),
            (Trim, FLAG_FUA, ok),
            (Trim, FLAG_NO_HOLE, inval),
            (Trim, FLAG_DF, inval),
            (Trim, FLAG_REQ_ONE, inval),
            (Trim, FLAG_FAST_ZERO, inval),
            (Cache, FLAG_FUA, ok),
            (Cache, FLAG_NO_HOLE, inval),
            (Cache, FLAG_DF, inval),
            (Cache, FLAG_REQ_ONE, inval),
            (Cache, FLAG_FAST_ZERO, inval),
            (WriteZeroes, FLAG_FUA, ok),
            (WriteZeroes, FLAG_NO_HOLE, ok),
            (WriteZeroes, FLAG_DF, inval),
            (WriteZeroes, FLAG_REQ_ONE, inval),
            (WriteZeroes, FLAG_FAST_ZERO, ok),
        ];
        for (cmd, flag, want) in table {
            let len = if cmd == Flush { 0 } else { 512 };
            assert_eq!(check(cmd, flag, 0, len, &l), want, "{cmd:?} flag {flag}");
        }
        // Undefined bits are refused on every command.
        for cmd in [Read, Write, Flush, Trim, Cache, WriteZeroes] {
            let len = if cmd == Flush { 0 } else { 512 };
            for bit in 5..16 {
                assert_eq!(check(cmd, 1 << bit, 0, len, &l), inval, "{cmd:?} bit {bit}");
            }
        }
        // All allowed flags together.
        assert_eq!(check(WriteZeroes, FLAG_FUA | FLAG_NO_HOLE | FLAG_FAST_ZERO, 0, 512, &l), ok);
        assert_eq!(check(Read, FLAG_FUA | FLAG_DF, 0, 512, &l), ok);
        // DF needs structured replies.
        let simple = Limits { structured: false, ..full() };
        assert_eq!(check(Read, FLAG_DF, 0, 512, &simple), inval);
        assert_eq!(check(Read, 0, 0, 512, &simple), ok);
        assert_eq!(check(Read, FLAG_FUA, 0, 512, &simple), ok);
    }

    #[test]
    fn validate_fua_needs_send_fua() {
        let l = Limits { fua: false, ..full() };
        for cmd in RANGED {
            assert_eq!(check(cmd, FLAG_FUA, 0, 512, &l), Err(EINVAL), "{cmd:?}");
            assert_eq!(check(cmd, 0, 0, 512, &l), Ok(()), "{cmd:?}");
        }
        assert_eq!(check(Command::Flush, FLAG_FUA, 0, 0, &l), Err(EINVAL));
    }

    #[test]
    fn validate_read_only() {
        let l = Limits { read_only: true, ..full() };
        for cmd in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(check(cmd, 0, 0, 512, &l), Err(EPERM), "{cmd:?}");
            assert_eq!(check(cmd, FLAG_FUA, 0, 512, &l), Err(EPERM), "{cmd:?}");
        }
        for cmd in [Command::Read, Command::Cache] {
            assert_eq!(check(cmd, 0, 0, 512, &l), Ok(()), "{cmd:?}");
        }
        assert_eq!(check(Command::Flush, 0, 0, 0, &l), Ok(()));
    }

    #[test]
    fn validate_flush_ignores_range() {
        let l = full();
        assert_eq!(check(Command::Flush, 0, 0, 0, &l), Ok(()));
        assert_eq!(check(Command::Flush, 0, u64::MAX, u32::MAX, &l), Ok(()));
        assert_eq!(check(Command::Flush, 0, 3, 5, &l), Ok(()));
    }

    #[test]
    fn validate_zero_length() {
        let l = full();
        for cmd in RANGED {
            assert_eq!(check(cmd, 0, 0, 0, &l), Err(EINVAL), "{cmd:?}");
        }
    }

    #[test]
    fn validate_range() {
        let l = full();
        for cmd in RANGED {
            let past = if matches!(cmd, Command::Write | Command::WriteZeroes) { ENOSPC } else { EINVAL };
            assert_eq!(check(cmd, 0, SIZE - 512, 1024, &l), Err(past), "{cmd:?} straddling the end");
            assert_eq!(check(cmd, 0, SIZE, 512, &l), Err(past), "{cmd:?} at the end");
            assert_eq!(check(cmd, 0, u64::MAX - 511, 512, &l), Err(past), "{cmd:?} ending at u64::MAX+1");
            assert_eq!(check(cmd, 0, !511u64, 1024, &l), Err(past), "{cmd:?} overflowing u64");
        }
        // An empty export refuses every ranged request.
        let empty = Limits { size: 0, ..full() };
        assert_eq!(check(Command::Read, 0, 0, 512, &empty), Err(EINVAL));
        assert_eq!(check(Command::Write, 0, 0, 512, &empty), Err(ENOSPC));
        // With no alignment, the last byte is reachable and one past it is not.
        let bytes = Limits { block_size: 1, size: 1000, ..full() };
        assert_eq!(check(Command::Read, 0, 999, 1, &bytes), Ok(()));
        assert_eq!(check(Command::Read, 0, 1000, 1, &bytes), Err(EINVAL));
    }

    #[test]
    fn validate_alignment() {
        let l = full();
        for cmd in RANGED {
            assert_eq!(check(cmd, 0, 1, 512, &l), Err(EINVAL), "{cmd:?} offset");
            assert_eq!(check(cmd, 0, 512, 511, &l), Err(EINVAL), "{cmd:?} length");
            assert_eq!(check(cmd, 0, 256, 256, &l), Err(EINVAL), "{cmd:?} both");
        }
        for bs in [0, 1] {
            let any = Limits { block_size: bs, ..full() };
            for cmd in RANGED {
                assert_eq!(check(cmd, 0, 3, 5, &any), Ok(()), "{cmd:?} block_size {bs}");
            }
        }
        let big = Limits { block_size: 4096, ..full() };
        assert_eq!(check(Command::Read, 0, 512, 4096, &big), Err(EINVAL));
        assert_eq!(check(Command::Read, 0, 4096, 8192, &big), Ok(()));
    }

    #[test]
    fn validate_max_payload() {
        let l = full();
        assert_eq!(check(Command::Read, 0, 0, (64 << 10) + 512, &l), Err(EINVAL));
        assert_eq!(check(Command::Write, 0, 0, (64 << 10) + 512, &l), Err(EINVAL));
        // Commands without a payload are not limited by max_payload.
        for cmd in [Command::Trim, Command::WriteZeroes, Command::Cache] {
            assert_eq!(check(cmd, 0, 0, 512 << 10, &l), Ok(()), "{cmd:?}");
        }
        // A write too large and past the end is refused as too large.
        assert_eq!(check(Command::Write, 0, SIZE, !511u32, &l), Err(EINVAL));
    }

    #[test]
    fn simple_reply_bytes() {
        let mut out = [0xffu8; 16];
        encode_simple_reply(&mut out, EIO, 0x0102_0304_0506_0708);
        assert_eq!(out, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8]);
        encode_simple_reply(&mut out, 0, 0);
        assert_eq!(out, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn structured_header_bytes() {
        let mut out = [0xffu8; 20];
        encode_structured_header(&mut out, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, 9, 12);
        #[rustfmt::skip]
        let want = [
            0x66, 0x8e, 0x33, 0xef,
            0, 1,
            0, 2,
            0, 0, 0, 0, 0, 0, 0, 9,
            0, 0, 0, 12,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn offset_data_header_bytes() {
        let mut out = [0xffu8; 28];
        encode_offset_data_header(&mut out, 0xaabb, 0x1000, 512, false);
        #[rustfmt::skip]
        let want = [
            0x66, 0x8e, 0x33, 0xef,
            0, 0,
            0, 1,
            0, 0, 0, 0, 0, 0, 0xaa, 0xbb,
            0, 0, 0x02, 0x08,
            0, 0, 0, 0, 0, 0, 0x10, 0,
        ];
        assert_eq!(out, want);
        encode_offset_data_header(&mut out, 0xaabb, 0x1000, 512, true);
        assert_eq!(&out[4..6], &[0, 1]);
        assert_eq!(&out[6..], &want[6..]);
        // The payload length saturates rather than wrapping.
        encode_offset_data_header(&mut out, 0, 0, u32::MAX, true);
        assert_eq!(&out[16..20], &[0xff; 4]);
    }

    #[test]
    fn structured_error_bytes() {
        let mut out = vec![0xee];
        encode_structured_error(&mut out, 3, EINVAL, "bad");
        #[rustfmt::skip]
        let want = [
            0xee,
            0x66, 0x8e, 0x33, 0xef,
            0, 1,
            0x80, 0x01,
            0, 0, 0, 0, 0, 0, 0, 3,
            0, 0, 0, 9,
            0, 0, 0, 22,
            0, 3,
            b'b', b'a', b'd',
        ];
        assert_eq!(out, want);

        let mut out = Vec::new();
        encode_structured_error(&mut out, 3, EIO, "");
        assert_eq!(out.len(), 26);
        assert_eq!(&out[16..], &[0, 0, 0, 6, 0, 0, 0, 5, 0, 0]);

        // Long messages are cut to MAX_NAME_LEN on a char boundary, lengths staying consistent.
        let mut out = Vec::new();
        encode_structured_error(&mut out, 3, EIO, &"€".repeat(2000));
        let msg_len = u16::from_be_bytes([out[24], out[25]]) as usize;
        assert_eq!(msg_len, MAX_NAME_LEN - MAX_NAME_LEN % 3);
        assert_eq!(u32::from_be_bytes([out[16], out[17], out[18], out[19]]) as usize, 6 + msg_len);
        assert_eq!(out.len(), 26 + msg_len);
        assert!(std::str::from_utf8(&out[26..]).is_ok());
    }

    #[test]
    fn structured_done_bytes() {
        let mut out = [0xffu8; 20];
        encode_structured_done(&mut out, 0x0102_0304_0506_0708);
        assert_eq!(out, [0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]);
    }

    fn arb_limits() -> impl Strategy<Value = Limits> {
        (
            prop_oneof![Just(0u64), Just(SIZE), any::<u64>()],
            prop_oneof![Just(0u32), Just(1), Just(512), Just(4096), any::<u32>()],
            prop_oneof![Just(64u32 << 10), any::<u32>()],
            any::<[bool; 6]>(),
        )
            .prop_map(|(size, block_size, max_payload, b)| Limits {
                size,
                block_size,
                max_payload,
                read_only: b[0],
                flush: b[1],
                fua: b[2],
                trim: b[3],
                write_zeroes: b[4],
                structured: b[5],
            })
    }

    proptest! {
        #[test]
        fn request_round_trip(flags in any::<u16>(), code in prop_oneof![0u16..10, any::<u16>()],
                              cookie in any::<u64>(), offset in any::<u64>(), length in any::<u32>()) {
            let r = Request { flags, command: Command::from_u16(code), cookie, offset, length };
            let bytes = encode_request(&r);
            prop_assert_eq!(parse_request(&bytes), Ok(r));
            prop_assert_eq!(r.command.to_u16(), code);
        }

        #[test]
        fn arbitrary_requests_never_panic(b in any::<[u8; REQUEST_LEN]>(), l in arb_limits()) {
            if let Ok(r) = parse_request(&b) {
                let _ = validate(&r, &l);
            }
            // Force the magic so that validate sees the arbitrary fields too.
            let mut b = b;
            b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            let r = parse_request(&b);
            prop_assert!(r.is_ok());
            if let Ok(r) = r {
                let _ = validate(&r, &l);
            }
        }

        #[test]
        fn valid_ranged_requests_are_in_bounds(cmd in prop::sample::select(RANGED.to_vec()),
                                               flags in any::<u16>(),
                                               offset in prop_oneof![0u64..(2 * SIZE), any::<u64>()],
                                               length in prop_oneof![0u32..(1 << 17), any::<u32>()],
                                               l in arb_limits()) {
            let r = req(cmd, flags, offset, length);
            if validate(&r, &l).is_ok() {
                prop_assert!(length > 0);
                prop_assert!(offset.checked_add(u64::from(length)).is_some_and(|end| end <= l.size));
                if l.block_size > 1 {
                    prop_assert_eq!(offset % u64::from(l.block_size), 0);
                    prop_assert_eq!(u64::from(length) % u64::from(l.block_size), 0);
                }
                if matches!(cmd, Command::Read | Command::Write) {
                    prop_assert!(length <= l.max_payload);
                }
                if l.read_only {
                    prop_assert!(matches!(cmd, Command::Read | Command::Cache));
                }
                if flags & FLAG_FUA != 0 {
                    prop_assert!(l.fua);
                }
            }
        }
    }
}
