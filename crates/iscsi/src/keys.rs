//! Text key=value pairs (RFC 7143 sections 6.1 and 6.2): parsing the data of Login and Text
//! PDUs (also across PDUs joined by the C bit), building answers, and the value encodings
//! (numbers, booleans, lists, hex and base64 binary values).
//!
//! The data is a sequence of `key=value` strings, each followed by one NUL. Keys are 1..=63
//! characters of letters, digits and `.-+@_`; values are at most 255 bytes except large
//! binary values such as CHAP_C and CHAP_R (up to 8192 characters here, which holds the
//! 1024-byte binary limit in hex). Repeated and unknown keys are the negotiation's business
//! ([`crate::negotiate`]); here they are only parsed. Login and text PDUs are rare and
//! small, so this module allocates.

use std::fmt;

/// Longest key name.
pub const MAX_KEY_LEN: usize = 63;
/// Longest simple value (RFC 7143 section 6.1).
pub const MAX_SIMPLE_VALUE_LEN: usize = 255;
/// Longest value of any key (large binary values: CHAP_C, CHAP_R).
pub const MAX_VALUE_LEN: usize = 8192;
/// Most text bytes one negotiation step may collect across C-bit continuations.
pub const MAX_TEXT_LEN: usize = 64 * 1024;

/// The answer for a key the responder does not know.
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
/// The answer for a key that does not apply in the context (a discovery session, say).
pub const IRRELEVANT: &str = "Irrelevant";
/// The answer for a value the responder does not accept.
pub const REJECT: &str = "Reject";
/// The "no value" of list keys (AuthMethod=None, HeaderDigest=None).
pub const NONE: &str = "None";

/// One key=value pair as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value (possibly empty).
    pub value: String,
}

impl KeyValue {
    /// A pair.
    pub fn new(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.to_string(), value: value.to_string() }
    }
}

/// Text that is not a sequence of key=value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextError {
    /// A string without `=`, at byte `at` of the text.
    MissingEquals {
        /// Offset of the string.
        at: usize,
    },
    /// An empty key, or one with characters RFC 7143 does not allow in keys.
    BadKey {
        /// Offset of the string.
        at: usize,
    },
    /// A key over 63 characters.
    KeyTooLong {
        /// Offset of the string.
        at: usize,
    },
    /// A value over [`MAX_VALUE_LEN`] bytes.
    ValueTooLong {
        /// The key.
        key: String,
    },
    /// A value that is not UTF-8.
    NotUtf8 {
        /// The key.
        key: String,
    },
    /// More than [`MAX_TEXT_LEN`] bytes of text in one step.
    TooLong {
        /// Bytes collected.
        len: usize,
    },
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::MissingEquals { at } => write!(f, "text string at byte {at} has no '='"),
            TextError::BadKey { at } => write!(f, "invalid key at byte {at}"),
            TextError::KeyTooLong { at } => write!(f, "key at byte {at} longer than {MAX_KEY_LEN}"),
            TextError::ValueTooLong { key } => write!(f, "value of {key} longer than {MAX_VALUE_LEN}"),
            TextError::NotUtf8 { key } => write!(f, "value of {key} is not UTF-8"),
            TextError::TooLong { len } => write!(f, "{len} bytes of text, over {MAX_TEXT_LEN}"),
        }
    }
}

impl std::error::Error for TextError {}

fn key_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'@' | b'_')
}

/// Parses key=value text. Empty strings (consecutive NULs, such as trailing padding) are
/// skipped, and a last pair without its NUL is taken as if it had one.
pub fn parse_text(data: &[u8]) -> Result<Vec<KeyValue>, TextError> {
    if data.len() > MAX_TEXT_LEN {
        return Err(TextError::TooLong { len: data.len() });
    }
    let mut pairs = Vec::new();
    let mut at = 0;
    for s in data.split(|b| *b == 0) {
        let start = at;
        at += s.len() + 1;
        if s.is_empty() {
            continue;
        }
        let eq = s.iter().position(|b| *b == b'=').ok_or(TextError::MissingEquals { at: start })?;
        let (k, v) = (&s[..eq], &s[eq + 1..]);
        if k.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong { at: start });
        }
        if k.is_empty() || !k.iter().all(|c| key_char_ok(*c)) {
            return Err(TextError::BadKey { at: start });
        }
        let key = String::from_utf8(k.to_vec()).map_err(|_| TextError::BadKey { at: start })?;
        if v.len() > MAX_VALUE_LEN {
            return Err(TextError::ValueTooLong { key });
        }
        let value = match std::str::from_utf8(v) {
            Ok(v) => v.to_string(),
            Err(_) => return Err(TextError::NotUtf8 { key }),
        };
        pairs.push(KeyValue { key, value });
    }
    Ok(pairs)
}

/// Joins the data of PDUs sent with the C bit (a pair may be split anywhere, even inside its
/// key) and parses the whole once the last PDU is in.
#[derive(Debug, Clone, Default)]
pub struct TextAssembler {
    buf: Vec<u8>,
}

impl TextAssembler {
    /// An empty assembler.
    pub fn new() -> TextAssembler {
        TextAssembler::default()
    }

    /// Adds a PDU's data; `more` is its C bit. Returns the pairs once a PDU without C ends
    /// the text, `None` while more is to come.
    pub fn push(&mut self, data: &[u8], more: bool) -> Result<Option<Vec<KeyValue>>, TextError> {
        if self.buf.len() + data.len() > MAX_TEXT_LEN {
            let len = self.buf.len() + data.len();
            self.buf.clear();
            return Err(TextError::TooLong { len });
        }
        self.buf.extend_from_slice(data);
        if more {
            return Ok(None);
        }
        let text = std::mem::take(&mut self.buf);
        parse_text(&text).map(Some)
    }

    /// Whether a continued text is being collected.
    pub fn is_collecting(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Drops what was collected.
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// Builds key=value text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextWriter {
    buf: Vec<u8>,
}

impl TextWriter {
    /// An empty text.
    pub fn new() -> TextWriter {
        TextWriter::default()
    }

    /// Appends `key=value` and its NUL.
    pub fn push(&mut self, key: &str, value: &str) {
        debug_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(key_char_ok), "key {key:?}");
        debug_assert!(!value.as_bytes().contains(&0));
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(b'=');
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
    }

    /// Appends `key=` and a number in decimal.
    pub fn push_num(&mut self, key: &str, value: u64) {
        self.push(key, &value.to_string());
    }

    /// Appends `key=Yes` or `key=No`.
    pub fn push_bool(&mut self, key: &str, value: bool) {
        self.push(key, bool_str(value));
    }

    /// The text so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The text.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The pairs written so far (for tests and logs).
    pub fn pairs(&self) -> Vec<KeyValue> {
        parse_text(&self.buf).unwrap_or_default()
    }
}

/// `"Yes"` or `"No"`.
pub fn bool_str(v: bool) -> &'static str {
    if v {
        "Yes"
    } else {
        "No"
    }
}

/// A boolean value: exactly `Yes` or `No` (values are case-sensitive).
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// A numerical value below 2^64: a decimal constant, a hex constant (`0x`/`0X`) or a base64
/// constant (`0b`/`0B`, at most 8 bytes, big-endian).
pub fn parse_number(v: &str) -> Option<u64> {
    let b = v.as_bytes();
    if b.len() > 2 && b[0] == b'0' && matches!(b[1], b'x' | b'X' | b'b' | b'B') {
        let bytes = parse_binary(v)?;
        if bytes.len() > 8 {
            // Leading zero bytes are still a number below 2^64.
            let (high, low) = bytes.split_at(bytes.len() - 8);
            if high.iter().any(|x| *x != 0) {
                return None;
            }
            return Some(low.iter().fold(0, |acc, x| (acc << 8) | u64::from(*x)));
        }
        return Some(bytes.iter().fold(0, |acc, x| (acc << 8) | u64::from(*x)));
    }
    if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.parse().ok()
}

/// A binary value: `0x` + hex digits (an odd count has an implied leading zero) or `0b` +
/// base64 (RFC 4648, with padding).
pub fn parse_binary(v: &str) -> Option<Vec<u8>> {
    let b = v.as_bytes();
    if b.len() < 3 || b[0] != b'0' {
        return None;
    }
    match b[1] {
        b'x' | b'X' => hex_decode(&b[2..]),
        b'b' | b'B' => base64_decode(&b[2..]),
        _ => None,
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn hex_decode(digits: &[u8]) -> Option<Vec<u8>> {
    if digits.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len().div_ceil(2));
    let mut rest = digits;
    if digits.len() % 2 == 1 {
        out.push(hex_val(digits[0])?);
        rest = &digits[1..];
    }
    for pair in rest.chunks_exact(2) {
        out.push((hex_val(pair[0])? << 4) | hex_val(pair[1])?);
    }
    Some(out)
}

/// `bytes` as a hex constant: `0x` and two lowercase digits a byte.
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * bytes.len());
    s.push_str("0x");
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_val(c: u8) -> Option<u32> {
    B64.iter().position(|x| *x == c).map(|p| p as u32)
}

fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let quads = s.len() / 4;
    for (i, q) in s.chunks_exact(4).enumerate() {
        let last = i + 1 == quads;
        let pad = q.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for c in &q[..4 - pad] {
            n = (n << 6) | b64_val(*c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Some(out)
}

/// `bytes` as a base64 constant: `0b` and RFC 4648 base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len().div_ceil(3) * 4);
    s.push_str("0b");
    for chunk in bytes.chunks(3) {
        let mut n = 0u32;
        for (i, b) in chunk.iter().enumerate() {
            n |= u32::from(*b) << (16 - 8 * i);
        }
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The values of a list value, in order (`a,b,c`).
pub fn list_values(v: &str) -> impl Iterator<Item = &str> {
    v.split(',')
}

/// Splits text to send into data segments of at most `max` bytes (the receiver's
/// MaxRecvDataSegmentLength): all but the last go in PDUs with the C bit set.
pub fn split_text(text: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    debug_assert!(max > 0);
    text.chunks(max.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs() {
        let t = b"InitiatorName=iqn.2007-01.org.example:x\0SessionType=Normal\0Empty=\0\0\0";
        let p = parse_text(t).unwrap();
        assert_eq!(
            p,
            vec![
                KeyValue::new("InitiatorName", "iqn.2007-01.org.example:x"),
                KeyValue::new("SessionType", "Normal"),
                KeyValue::new("Empty", "")
            ]
        );
        // A value may contain '='.
        assert_eq!(parse_text(b"X-a=b=c\0").unwrap(), vec![KeyValue::new("X-a", "b=c")]);
        // The last NUL may be missing.
        assert_eq!(parse_text(b"A=1").unwrap(), vec![KeyValue::new("A", "1")]);
        assert_eq!(parse_text(b"").unwrap(), vec![]);
    }

    #[test]
    fn refuses_malformed_text() {
        assert_eq!(parse_text(b"A=1\0junk\0"), Err(TextError::MissingEquals { at: 4 }));
        assert_eq!(parse_text(b"=1\0"), Err(TextError::BadKey { at: 0 }));
        assert_eq!(parse_text(b"A B=1\0"), Err(TextError::BadKey { at: 0 }));
        let long = format!("{}=1\0", "K".repeat(64));
        assert_eq!(parse_text(long.as_bytes()), Err(TextError::KeyTooLong { at: 0 }));
        let ok = format!("{}=1\0", "K".repeat(63));
        assert!(parse_text(ok.as_bytes()).is_ok());
        let big = format!("CHAP_C=0x{}\0", "a".repeat(MAX_VALUE_LEN));
        assert!(matches!(parse_text(big.as_bytes()), Err(TextError::ValueTooLong { .. })));
        assert!(matches!(parse_text(b"A=\xff\0"), Err(TextError::NotUtf8 { .. })));
    }

    #[test]
    fn continuation_joins_anywhere() {
        let whole = b"MaxBurstLength=262144\0FirstBurstLength=65536\0";
        for cut in 0..=whole.len() {
            let mut a = TextAssembler::new();
            assert_eq!(a.push(&whole[..cut], true).unwrap(), None);
            let p = a.push(&whole[cut..], false).unwrap().unwrap();
            assert_eq!(p.len(), 2, "cut {cut}");
            assert_eq!(p[1], KeyValue::new("FirstBurstLength", "65536"));
            assert!(!a.is_collecting());
        }
        let mut a = TextAssembler::new();
        assert!(a.push(&vec![b'a'; MAX_TEXT_LEN + 1], true).is_err());
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Some(8192));
        assert_eq!(parse_number("0"), Some(0));
        assert_eq!(parse_number("0x2000"), Some(8192));
        assert_eq!(parse_number("0X2000"), Some(8192));
        assert_eq!(parse_number("0x200"), Some(512)); // odd digit count
        assert_eq!(parse_number("0bAAAgAA=="), Some(8192)); // 00 00 20 00
        assert_eq!(parse_number("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_number("18446744073709551616"), None);
        assert_eq!(parse_number("0x00000000000000000001"), Some(1));
        assert_eq!(parse_number("0x010000000000000000"), None);
        for bad in ["", "-1", "1.5", "0x", "0xg", "12a", " 1", "Yes"] {
            assert_eq!(parse_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn binary_values() {
        assert_eq!(parse_binary("0x0a0B"), Some(vec![0x0a, 0x0b]));
        assert_eq!(parse_binary("0xabc"), Some(vec![0x0a, 0xbc]));
        assert_eq!(hex_encode(&[0, 0xff, 0x1a]), "0x00ff1a");
        // RFC 4648 section 10 vectors.
        for (plain, enc) in [
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), format!("0b{enc}"));
            assert_eq!(parse_binary(&format!("0b{enc}")).unwrap(), plain.as_bytes());
        }
        for bad in ["0b", "0bZg=", "0bZ===", "0bZg==Zg==", "0b!!!!", "0y00", "x00"] {
            assert_eq!(parse_binary(bad), None, "{bad}");
        }
    }

    #[test]
    fn writer_and_split() {
        let mut w = TextWriter::new();
        w.push("HeaderDigest", "None");
        w.push_num("MaxBurstLength", 262144);
        w.push_bool("InitialR2T", true);
        assert_eq!(w.as_bytes(), b"HeaderDigest=None\0MaxBurstLength=262144\0InitialR2T=Yes\0");
        assert_eq!(w.pairs().len(), 3);
        let parts: Vec<&[u8]> = split_text(w.as_bytes(), 16).collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts.concat(), w.as_bytes());
        assert_eq!(parse_bool("Yes"), Some(true));
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(list_values("CRC32C,None").collect::<Vec<_>>(), ["CRC32C", "None"]);
    }
}
