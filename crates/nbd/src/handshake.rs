//! Sans-I/O codec for the fixed newstyle handshake: the server greeting, the client flags, option
//! requests and option replies.
//!
//! Everything here is a pure function on byte slices; the connection code reads the fixed-size
//! headers, calls these, and writes what the encoders append. The flow is:
//!
//! 1. send [`server_greeting`], read 4 bytes and [`parse_client_flags`] (an `Err` closes);
//! 2. repeatedly read a 16-byte option header and [`parse_option_header`] (an `Err` closes), read
//!    its `len` data bytes and [`parse_option`]; answer an [`OptionError`] with [`encode_error`]
//!    (except after `NBD_OPT_EXPORT_NAME`, which cannot be answered and must close);
//! 3. enter transmission after `NBD_OPT_EXPORT_NAME` ([`encode_export_name_reply`]) or after a
//!    successful `NBD_OPT_GO` (`NBD_REP_INFO` replies, then [`encode_ack`]).

use std::fmt;

use crate::proto::{
    ProtoError, C_FIXED_NEWSTYLE, C_NO_ZEROES, FIXED_NEWSTYLE, IHAVEOPT, INFO_BLOCK_SIZE, INFO_DESCRIPTION,
    INFO_EXPORT, INFO_NAME, MAX_NAME_LEN, MAX_OPTION_LEN, NBDMAGIC, NO_ZEROES, OPTION_REPLY_MAGIC, OPT_ABORT,
    OPT_EXPORT_NAME, OPT_EXTENDED_HEADERS, OPT_GO, OPT_INFO, OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT,
    OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_INVALID, REP_INFO, REP_SERVER,
};

/// Length of the zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES` was agreed.
pub const EXPORT_NAME_ZEROES: usize = 124;

/// The 18 bytes the server sends first: `NBDMAGIC`, `IHAVEOPT`, and the u16 handshake flags
/// `NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES`.
pub fn server_greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FIXED_NEWSTYLE | NO_ZEROES).to_be_bytes());
    b
}

/// The client's answer to the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    /// `NBD_FLAG_C_FIXED_NEWSTYLE`: always true once parsed (we only speak fixed newstyle).
    pub fixed_newstyle: bool,
    /// `NBD_FLAG_C_NO_ZEROES`: omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub no_zeroes: bool,
}

/// Parses the client's 32-bit flags. Unknown bits are an error (the spec says the server MUST
/// close the connection), and so is a missing `NBD_FLAG_C_FIXED_NEWSTYLE`: this server only
/// speaks fixed newstyle. `NBD_FLAG_C_NO_ZEROES` is always acceptable because
/// [`server_greeting`] advertises `NBD_FLAG_NO_ZEROES`.
pub fn parse_client_flags(b: &[u8; 4]) -> Result<ClientFlags, ProtoError> {
    let flags = u32::from_be_bytes(*b);
    let known = C_FIXED_NEWSTYLE | C_NO_ZEROES;
    if flags & !known != 0 {
        return Err(ProtoError(format!("unknown client flags {flags:#x}")));
    }
    if flags & C_FIXED_NEWSTYLE == 0 {
        return Err(ProtoError("client does not speak fixed newstyle".into()));
    }
    Ok(ClientFlags { fixed_newstyle: true, no_zeroes: flags & C_NO_ZEROES != 0 })
}

/// Parses a 16-byte option header (`IHAVEOPT`, u32 option, u32 data length) into
/// `(option, len)`. A bad magic or a length above [`MAX_OPTION_LEN`] is an error, after which the
/// server closes the connection (it cannot resynchronise, or will not buffer that much).
pub fn parse_option_header(b: &[u8; 16]) -> Result<(u32, u32), ProtoError> {
    let [m0, m1, m2, m3, m4, m5, m6, m7, o0, o1, o2, o3, l0, l1, l2, l3] = *b;
    let magic = u64::from_be_bytes([m0, m1, m2, m3, m4, m5, m6, m7]);
    if magic != IHAVEOPT {
        return Err(ProtoError(format!("bad option magic {magic:#018x}")));
    }
    let option = u32::from_be_bytes([o0, o1, o2, o3]);
    let len = u32::from_be_bytes([l0, l1, l2, l3]);
    if len > MAX_OPTION_LEN {
        return Err(ProtoError(format!("option {option} has {len} bytes of data, more than {MAX_OPTION_LEN}")));
    }
    Ok((option, len))
}

/// A parsed option request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionRequest {
    /// `NBD_OPT_EXPORT_NAME` with the export's name (empty: the default export).
    ExportName(String),
    /// `NBD_OPT_ABORT`: answer `NBD_REP_ACK`, then close.
    Abort,
    /// `NBD_OPT_LIST`: one `NBD_REP_SERVER` per export, then `NBD_REP_ACK`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO` for export `name`, with the `NBD_INFO_*` items the client asked for.
    Info {
        /// The export's name (empty: the default export).
        name: String,
        /// The requested `NBD_INFO_*` types, in the client's order (possibly empty).
        requests: Vec<u16>,
    },
    /// `NBD_OPT_GO`: as [`OptionRequest::Info`], then enter transmission on `NBD_REP_ACK`.
    Go {
        /// The export's name (empty: the default export).
        name: String,
        /// The requested `NBD_INFO_*` types, in the client's order (possibly empty).
        requests: Vec<u16>,
    },
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT` (data not parsed).
    ListMetaContext,
    /// `NBD_OPT_SET_META_CONTEXT` (data not parsed).
    SetMetaContext,
    /// `NBD_OPT_EXTENDED_HEADERS`.
    ExtendedHeaders,
    /// Any other option number; answer `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

/// An option the server must refuse, with the reply type and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The `NBD_REP_ERR_*` reply type to send.
    pub reply: u32,
    /// A human-readable message to send as the error reply's data.
    pub message: String,
}

impl OptionError {
    fn invalid(message: impl Into<String>) -> Self {
        OptionError { reply: REP_ERR_INVALID, message: message.into() }
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "option refused ({:#x}): {}", self.reply, self.message)
    }
}

impl std::error::Error for OptionError {}

/// Checks an export name: at most [`MAX_NAME_LEN`] bytes, UTF-8, no NUL (spec: strings MUST NOT
/// contain NUL).
fn parse_name(bytes: &[u8]) -> Result<String, OptionError> {
    if bytes.len() > MAX_NAME_LEN {
        return Err(OptionError::invalid(format!("export name of {} bytes exceeds {MAX_NAME_LEN}", bytes.len())));
    }
    let name = std::str::from_utf8(bytes).map_err(|_| OptionError::invalid("export name is not UTF-8"))?;
    if name.contains('\0') {
        return Err(OptionError::invalid("export name contains NUL"));
    }
    Ok(name.to_owned())
}

/// Splits `n` bytes off the front of `data`, or fails with `NBD_REP_ERR_INVALID`.
fn take<'a>(data: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], OptionError> {
    if data.len() < n {
        return Err(OptionError::invalid(format!("option data too short for {what}")));
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

fn take_u32(data: &mut &[u8], what: &str) -> Result<u32, OptionError> {
    let b = take(data, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn take_u16(data: &mut &[u8], what: &str) -> Result<u16, OptionError> {
    let b = take(data, 2, what)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

/// Parses `NBD_OPT_INFO`/`NBD_OPT_GO` data: u32 name length, name, u16 count, count × u16.
fn parse_info_request(mut data: &[u8]) -> Result<(String, Vec<u16>), OptionError> {
    let name_len = take_u32(&mut data, "the name length")?;
    let name_len = usize::try_from(name_len).map_err(|_| OptionError::invalid("export name too long"))?;
    if name_len > MAX_NAME_LEN {
        return Err(OptionError::invalid(format!("export name of {name_len} bytes exceeds {MAX_NAME_LEN}")));
    }
    let name = parse_name(take(&mut data, name_len, "the export name")?)?;
    let count = usize::from(take_u16(&mut data, "the number of information requests")?);
    if data.len() != count * 2 {
        return Err(OptionError::invalid(format!(
            "{count} information requests need {} bytes, option has {}",
            count * 2,
            data.len()
        )));
    }
    let requests = data.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    Ok((name, requests))
}

/// Parses the data of option `option`. Errors are options to refuse with the given reply type
/// (always `NBD_REP_ERR_INVALID` here); for `NBD_OPT_EXPORT_NAME`, which cannot be answered with
/// an error, the caller closes the connection instead.
///
/// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT` are returned without looking at
/// their data (the server answers them `NBD_REP_ERR_UNSUP`); unknown options are
/// [`OptionRequest::Unknown`].
pub fn parse_option(option: u32, data: &[u8]) -> Result<OptionRequest, OptionError> {
    let no_data = |req: OptionRequest, name: &str| {
        if data.is_empty() {
            Ok(req)
        } else {
            Err(OptionError::invalid(format!("{name} takes no data, got {} bytes", data.len())))
        }
    };
    match option {
        OPT_EXPORT_NAME => parse_name(data).map(OptionRequest::ExportName),
        OPT_ABORT => no_data(OptionRequest::Abort, "NBD_OPT_ABORT"),
        OPT_LIST => no_data(OptionRequest::List, "NBD_OPT_LIST"),
        OPT_STARTTLS => no_data(OptionRequest::StartTls, "NBD_OPT_STARTTLS"),
        OPT_INFO => parse_info_request(data).map(|(name, requests)| OptionRequest::Info { name, requests }),
        OPT_GO => parse_info_request(data).map(|(name, requests)| OptionRequest::Go { name, requests }),
        OPT_STRUCTURED_REPLY => no_data(OptionRequest::StructuredReply, "NBD_OPT_STRUCTURED_REPLY"),
        OPT_LIST_META_CONTEXT => Ok(OptionRequest::ListMetaContext),
        OPT_SET_META_CONTEXT => Ok(OptionRequest::SetMetaContext),
        OPT_EXTENDED_HEADERS => no_data(OptionRequest::ExtendedHeaders, "NBD_OPT_EXTENDED_HEADERS"),
        other => Ok(OptionRequest::Unknown(other)),
    }
}

/// Appends an option reply: the option reply magic, `option`, `reply_type`, the u32 length of
/// `data`, and `data`. `data` longer than `u32::MAX` bytes is cut to `u32::MAX` (no option reply
/// comes near that).
pub fn encode_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    let data = data.get(..u32::MAX as usize).unwrap_or(data);
    out.reserve(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an `NBD_REP_ACK` reply (no data) to `option`.
pub fn encode_ack(out: &mut Vec<u8>, option: u32) {
    encode_reply(out, option, REP_ACK, &[]);
}

/// Appends an error reply of type `reply` (an `NBD_REP_ERR_*`) to `option`, with `message` as its
/// data, cut to [`MAX_NAME_LEN`] bytes on a character boundary (the spec's string limit).
pub fn encode_error(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    let message = crate::proto::truncate_str(message, MAX_NAME_LEN);
    encode_reply(out, option, reply, message.as_bytes());
}

/// Appends one `NBD_REP_SERVER` reply to `NBD_OPT_LIST`: u32 name length, name, then the
/// description bytes (the rest of the reply).
pub fn encode_server(out: &mut Vec<u8>, name: &str, description: &str) {
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    encode_reply(out, OPT_LIST, REP_SERVER, &data);
}

/// Appends an `NBD_REP_INFO` reply of info type `info` with `payload` after the u16 type.
fn encode_info(out: &mut Vec<u8>, option: u32, info: u16, payload: &[u8]) {
    let mut data = Vec::with_capacity(2 + payload.len());
    data.extend_from_slice(&info.to_be_bytes());
    data.extend_from_slice(payload);
    encode_reply(out, option, REP_INFO, &data);
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_EXPORT`: u16 type 0, u64 export size, u16 transmission flags.
pub fn encode_info_export(out: &mut Vec<u8>, option: u32, size: u64, flags: u16) {
    let mut payload = [0u8; 10];
    payload[..8].copy_from_slice(&size.to_be_bytes());
    payload[8..].copy_from_slice(&flags.to_be_bytes());
    encode_info(out, option, INFO_EXPORT, &payload);
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_NAME`: u16 type 1, then the export's name.
pub fn encode_info_name(out: &mut Vec<u8>, option: u32, name: &str) {
    encode_info(out, option, INFO_NAME, name.as_bytes());
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_DESCRIPTION`: u16 type 2, then the description.
pub fn encode_info_description(out: &mut Vec<u8>, option: u32, d: &str) {
    encode_info(out, option, INFO_DESCRIPTION, d.as_bytes());
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`: u16 type 3, then u32 minimum, preferred and
/// maximum block sizes.
pub fn encode_info_block_size(out: &mut Vec<u8>, option: u32, min: u32, preferred: u32, max: u32) {
    let mut payload = [0u8; 12];
    payload[..4].copy_from_slice(&min.to_be_bytes());
    payload[4..8].copy_from_slice(&preferred.to_be_bytes());
    payload[8..].copy_from_slice(&max.to_be_bytes());
    encode_info(out, option, INFO_BLOCK_SIZE, &payload);
}

/// Appends the reply to a successful `NBD_OPT_EXPORT_NAME`: u64 size, u16 transmission flags, and
/// 124 zero bytes unless the client set `NBD_FLAG_C_NO_ZEROES` (134 or 10 bytes in all).
pub fn encode_export_name_reply(out: &mut Vec<u8>, size: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; EXPORT_NAME_ZEROES]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;
    use proptest::prelude::*;

    fn header(magic: u64, option: u32, len: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&magic.to_be_bytes());
        b[8..12].copy_from_slice(&option.to_be_bytes());
        b[12..].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// INFO/GO data: u32 name length, name, u16 count, the requests.
    fn info_data(name: &[u8], requests: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    fn invalid(r: Result<OptionRequest, OptionError>) -> OptionError {
        let e = r.expect_err("expected an option error");
        assert_eq!(e.reply, REP_ERR_INVALID, "{e}");
        e
    }

    #[test]
    fn greeting_bytes() {
        assert_eq!(
            server_greeting(),
            [
                b'N', b'B', b'D', b'M', b'A', b'G', b'I', b'C', //
                b'I', b'H', b'A', b'V', b'E', b'O', b'P', b'T', //
                0x00, 0x03,
            ]
        );
    }

    #[test]
    fn client_flags() {
        assert_eq!(parse_client_flags(&[0, 0, 0, 1]), Ok(ClientFlags { fixed_newstyle: true, no_zeroes: false }));
        assert_eq!(parse_client_flags(&[0, 0, 0, 3]), Ok(ClientFlags { fixed_newstyle: true, no_zeroes: true }));
        // Not fixed newstyle (plain newstyle, or only NO_ZEROES).
        assert!(parse_client_flags(&[0, 0, 0, 0]).is_err());
        assert!(parse_client_flags(&[0, 0, 0, 2]).is_err());
        // Unknown bits, alone or with known ones, in every byte.
        assert!(parse_client_flags(&[0, 0, 0, 4]).is_err());
        assert!(parse_client_flags(&[0, 0, 0, 7]).is_err());
        assert!(parse_client_flags(&[0, 0, 1, 1]).is_err());
        assert!(parse_client_flags(&[0x80, 0, 0, 1]).is_err());
        assert!(parse_client_flags(&[1, 0, 0, 0]).is_err()); // little-endian FIXED_NEWSTYLE
    }

    #[test]
    fn option_header() {
        assert_eq!(parse_option_header(&header(IHAVEOPT, OPT_GO, 12)), Ok((OPT_GO, 12)));
        assert_eq!(parse_option_header(&header(IHAVEOPT, 0xdead_beef, 0)), Ok((0xdead_beef, 0)));
        assert_eq!(parse_option_header(&header(IHAVEOPT, 1, MAX_OPTION_LEN)), Ok((1, MAX_OPTION_LEN)));
        assert!(parse_option_header(&header(IHAVEOPT, 1, MAX_OPTION_LEN + 1)).is_err());
        assert!(parse_option_header(&header(IHAVEOPT, 1, u32::MAX)).is_err());
        assert!(parse_option_header(&header(NBDMAGIC, 1, 0)).is_err());
        assert!(parse_option_header(&header(IHAVEOPT.swap_bytes(), 1, 0)).is_err());
        // Exact bytes: magic, option 7, length 0x0102.
        let raw = *b"IHAVEOPT\x00\x00\x00\x07\x00\x00\x01\x02";
        assert_eq!(parse_option_header(&raw), Ok((7, 0x102)));
    }

    #[test]
    fn export_name_option() {
        assert_eq!(parse_option(OPT_EXPORT_NAME, b"disk0"), Ok(OptionRequest::ExportName("disk0".into())));
        assert_eq!(parse_option(OPT_EXPORT_NAME, b""), Ok(OptionRequest::ExportName(String::new())));
        assert_eq!(parse_option(OPT_EXPORT_NAME, "dïsk".as_bytes()), Ok(OptionRequest::ExportName("dïsk".into())));
        let max = vec![b'a'; MAX_NAME_LEN];
        assert_eq!(parse_option(OPT_EXPORT_NAME, &max), Ok(OptionRequest::ExportName("a".repeat(MAX_NAME_LEN))));
        invalid(parse_option(OPT_EXPORT_NAME, &vec![b'a'; MAX_NAME_LEN + 1]));
        invalid(parse_option(OPT_EXPORT_NAME, b"\xff\xfe"));
        invalid(parse_option(OPT_EXPORT_NAME, b"ab\xc3")); // truncated UTF-8 sequence
        invalid(parse_option(OPT_EXPORT_NAME, b"a\0b"));
    }

    #[test]
    fn dataless_options() {
        let cases = [
            (OPT_ABORT, OptionRequest::Abort),
            (OPT_LIST, OptionRequest::List),
            (OPT_STARTTLS, OptionRequest::StartTls),
            (OPT_STRUCTURED_REPLY, OptionRequest::StructuredReply),
            (OPT_EXTENDED_HEADERS, OptionRequest::ExtendedHeaders),
        ];
        for (opt, want) in cases {
            assert_eq!(parse_option(opt, &[]), Ok(want), "option {opt}");
            invalid(parse_option(opt, &[0]));
            invalid(parse_option(opt, b"trailing"));
        }
    }

    #[test]
    fn meta_context_options_are_not_parsed() {
        assert_eq!(parse_option(OPT_LIST_META_CONTEXT, &[]), Ok(OptionRequest::ListMetaContext));
        assert_eq!(parse_option(OPT_LIST_META_CONTEXT, &[0xff; 7]), Ok(OptionRequest::ListMetaContext));
        assert_eq!(parse_option(OPT_SET_META_CONTEXT, &[]), Ok(OptionRequest::SetMetaContext));
        assert_eq!(parse_option(OPT_SET_META_CONTEXT, b"garbage"), Ok(OptionRequest::SetMetaContext));
    }

    #[test]
    fn unknown_options() {
        for opt in [0, 4, 12, 0x8000_0000, u32::MAX] {
            assert_eq!(parse_option(opt, &[]), Ok(OptionRequest::Unknown(opt)));
            assert_eq!(parse_option(opt, b"anything"), Ok(OptionRequest::Unknown(opt)));
        }
    }

    #[test]
    fn info_and_go_options() {
        let go = |name: &str, requests: &[u16]| OptionRequest::Go { name: name.into(), requests: requests.to_vec() };
        let info =
            |name: &str, requests: &[u16]| OptionRequest::Info { name: name.into(), requests: requests.to_vec() };

        // Exact bytes: name "ab", two requests (NAME, BLOCK_SIZE).
        let raw = [0, 0, 0, 2, b'a', b'b', 0, 2, 0, 1, 0, 3];
        assert_eq!(parse_option(OPT_GO, &raw), Ok(go("ab", &[INFO_NAME, INFO_BLOCK_SIZE])));
        assert_eq!(parse_option(OPT_INFO, &raw), Ok(info("ab", &[INFO_NAME, INFO_BLOCK_SIZE])));
        // Empty name, no requests (the minimum: 6 bytes).
        assert_eq!(parse_option(OPT_GO, &[0, 0, 0, 0, 0, 0]), Ok(go("", &[])));
        // Unknown info types are passed through for the server to ignore.
        assert_eq!(parse_option(OPT_INFO, &info_data(b"x", &[0xffff])), Ok(info("x", &[0xffff])));
        let max = "n".repeat(MAX_NAME_LEN);
        assert_eq!(parse_option(OPT_GO, &info_data(max.as_bytes(), &[])), Ok(go(&max, &[])));

        for opt in [OPT_INFO, OPT_GO] {
            // Every truncation of a valid request fails.
            for cut in 0..raw.len() {
                invalid(parse_option(opt, &raw[..cut]));
            }
            // Trailing bytes: one byte, or a whole extra request not counted.
            let mut long = raw.to_vec();
            long.push(0);
            invalid(parse_option(opt, &long));
            long.push(0);
            invalid(parse_option(opt, &long));
            // Name length beyond the data, and beyond MAX_NAME_LEN.
            invalid(parse_option(opt, &[0, 0, 0, 9, b'a', 0, 0]));
            invalid(parse_option(opt, &[0xff, 0xff, 0xff, 0xff, 0, 0]));
            invalid(parse_option(opt, &info_data(&vec![b'n'; MAX_NAME_LEN + 1], &[])));
            // Count larger than the requests present.
            invalid(parse_option(opt, &[0, 0, 0, 0, 0, 3, 0, 1]));
            // Non-UTF-8 and NUL-containing names.
            invalid(parse_option(opt, &info_data(b"\xc0\x80", &[])));
            invalid(parse_option(opt, &info_data(b"\xff", &[INFO_NAME])));
            invalid(parse_option(opt, &info_data(b"a\0", &[])));
        }
    }

    #[test]
    fn option_error_display() {
        let e = OptionError { reply: REP_ERR_UNSUP, message: "nope".into() };
        assert_eq!(e.to_string(), "option refused (0x80000001): nope");
    }

    #[test]
    fn encode_reply_bytes() {
        let mut out = vec![0xaa]; // appends, keeping what is there
        encode_reply(&mut out, OPT_GO, REP_INFO, &[1, 2, 3]);
        #[rustfmt::skip]
        let want = [
            0xaa,
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 7,
            0, 0, 0, 3,
            0, 0, 0, 3,
            1, 2, 3,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_ack_bytes() {
        let mut out = Vec::new();
        encode_ack(&mut out, OPT_STRUCTURED_REPLY);
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 8,
            0, 0, 0, 1,
            0, 0, 0, 0,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_error_bytes() {
        let mut out = Vec::new();
        encode_error(&mut out, OPT_LIST, REP_ERR_POLICY, "no");
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 3,
            0x80, 0, 0, 2,
            0, 0, 0, 2,
            b'n', b'o',
        ];
        assert_eq!(out, want);

        // Over-long messages are cut to MAX_NAME_LEN on a char boundary.
        let mut out = Vec::new();
        let msg = format!("a{}", "é".repeat(MAX_NAME_LEN));
        encode_error(&mut out, 99, REP_ERR_INVALID, &msg);
        assert_eq!(&out[16..20], &((MAX_NAME_LEN as u32 - 1).to_be_bytes()));
        assert_eq!(out.len(), 20 + MAX_NAME_LEN - 1);
        assert!(std::str::from_utf8(&out[20..]).is_ok());
    }

    #[test]
    fn encode_server_bytes() {
        let mut out = Vec::new();
        encode_server(&mut out, "d0", "ram");
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 3,
            0, 0, 0, 2,
            0, 0, 0, 9,
            0, 0, 0, 2, b'd', b'0', b'r', b'a', b'm',
        ];
        assert_eq!(out, want);

        let mut out = Vec::new();
        encode_server(&mut out, "", "");
        assert_eq!(&out[16..], &[0, 0, 0, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn encode_info_export_bytes() {
        let mut out = Vec::new();
        encode_info_export(&mut out, OPT_GO, 0x0102_0304_0506_0708, HAS_FLAGS | SEND_FLUSH);
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 7,
            0, 0, 0, 3,
            0, 0, 0, 12,
            0, 0,
            1, 2, 3, 4, 5, 6, 7, 8,
            0, 5,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_info_name_bytes() {
        let mut out = Vec::new();
        encode_info_name(&mut out, OPT_INFO, "xy");
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 6,
            0, 0, 0, 3,
            0, 0, 0, 4,
            0, 1, b'x', b'y',
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_info_description_bytes() {
        let mut out = Vec::new();
        encode_info_description(&mut out, OPT_GO, "RAM");
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 7,
            0, 0, 0, 3,
            0, 0, 0, 5,
            0, 2, b'R', b'A', b'M',
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_info_block_size_bytes() {
        let mut out = Vec::new();
        encode_info_block_size(&mut out, OPT_GO, 512, 4096, 32 << 20);
        #[rustfmt::skip]
        let want = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
            0, 0, 0, 7,
            0, 0, 0, 3,
            0, 0, 0, 14,
            0, 3,
            0, 0, 0x02, 0,
            0, 0, 0x10, 0,
            0x02, 0, 0, 0,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn encode_export_name_reply_bytes() {
        let mut out = Vec::new();
        encode_export_name_reply(&mut out, 1 << 30, HAS_FLAGS | READ_ONLY, true);
        assert_eq!(out, [0, 0, 0, 0, 0x40, 0, 0, 0, 0, 3]);

        let mut out = Vec::new();
        encode_export_name_reply(&mut out, 1 << 30, HAS_FLAGS | READ_ONLY, false);
        assert_eq!(out.len(), 134);
        assert_eq!(&out[..10], &[0, 0, 0, 0, 0x40, 0, 0, 0, 0, 3]);
        assert!(out[10..].iter().all(|&b| b == 0));
    }

    proptest! {
        #[test]
        fn option_parsing_never_panics(option in prop_oneof![0u32..16, any::<u32>()],
                                       data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_option(option, &data);
        }

        #[test]
        fn info_data_round_trips(name in "[a-zA-Z0-9 ._-]{0,40}",
                                 requests in proptest::collection::vec(any::<u16>(), 0..20)) {
            let data = info_data(name.as_bytes(), &requests);
            prop_assert_eq!(
                parse_option(OPT_GO, &data),
                Ok(OptionRequest::Go { name: name.clone(), requests: requests.clone() })
            );
            // Any one extra trailing byte is rejected.
            let mut long = data;
            long.push(0);
            prop_assert!(parse_option(OPT_GO, &long).is_err());
        }

        #[test]
        fn headers_and_flags_never_panic(h in any::<[u8; 16]>(), f in any::<[u8; 4]>()) {
            if let Ok((_, len)) = parse_option_header(&h) {
                prop_assert!(len <= MAX_OPTION_LEN);
            }
            let _ = parse_client_flags(&f);
        }
    }
}
