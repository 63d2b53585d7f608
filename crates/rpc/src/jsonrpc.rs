//! JSON-RPC 2.0 stream codec in SPDK's dialect.
//!
//! SPDK clients (`scripts/rpc.py` among them) write JSON objects to a unix socket back to back,
//! with no delimiter between them, and a request may arrive split across several reads. This
//! module finds complete values at the start of a byte buffer ([`split_value`]), validates them
//! as requests ([`parse_request`]) and encodes responses ([`encode_result`], [`encode_error`]),
//! each response being compact JSON followed by a single `\n`.
//!
//! As in SPDK's server (lib/jsonrpc/jsonrpc_server.c): the `"jsonrpc"` member is optional (if
//! present it must be `"2.0"`); a top-level array is a batch ([`parse_frame`]); any other valid
//! JSON value is an Invalid Request; ids are echoed byte for byte ([`Id`]), so integers beyond
//! 64 bits come back unchanged. Nothing here panics on any input.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Invalid JSON was received.
pub const PARSE_ERROR: i32 = -32700;
/// The JSON sent is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// The method does not exist or is not available.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Invalid method parameters.
pub const INVALID_PARAMS: i32 = -32602;
/// Internal JSON-RPC error.
pub const INTERNAL_ERROR: i32 = -32603;
/// Largest request accepted (bytes of one JSON value).
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// A JSON-RPC error object: a numeric code and a human-readable message.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Error code, e.g. [`INVALID_PARAMS`].
    pub code: i32,
    /// Human-readable description.
    pub message: String,
}

impl RpcError {
    /// An error with the given code and message.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// An [`INVALID_PARAMS`] error.
    pub fn invalid_params(msg: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, msg)
    }

    /// An [`INTERNAL_ERROR`] error.
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, msg)
    }

    /// A [`METHOD_NOT_FOUND`] error naming the method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("Method not found: {method}"))
    }

    fn invalid_request(msg: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, msg)
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}

/// A request id exactly as the client wrote it (a string, a number of any size, or null).
#[derive(Debug, Clone)]
pub struct Id(Box<RawValue>);

impl Id {
    /// The id `null`.
    pub fn null() -> Id {
        Id::from_value(&Value::Null)
    }

    /// The id written as `v` is (a number beyond 64 bits has already lost precision in a
    /// `Value`; [`parse_frame`] keeps the original text instead).
    pub fn from_value(v: &Value) -> Id {
        Id(RawValue::from_string(v.to_string()).unwrap_or_else(|_| Self::null_raw()))
    }

    fn null_raw() -> Box<RawValue> {
        RawValue::from_string("null".to_string()).expect("null is JSON")
    }

    /// The id's JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The id as a `Value` (lossy for numbers beyond 64 bits).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// A validated JSON-RPC 2.0 request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request id; `None` for a notification (no `"id"` member). An explicit `"id": null`
    /// is `Some` of the null id.
    pub id: Option<Id>,
    /// The method name.
    pub method: String,
    /// The parameters, an object or an array; `None` when absent or `null`.
    pub params: Option<Value>,
}

/// Result of looking for one complete JSON value at the start of a byte stream.
#[derive(Debug)]
pub enum Split {
    /// No complete value yet: read more bytes and try again.
    Incomplete,
    /// A complete value; `consumed` bytes (leading whitespace included) may be dropped.
    Complete {
        /// Bytes of the buffer used up by the value and the whitespace before it.
        consumed: usize,
        /// The parsed value (an object or an array).
        value: Value,
    },
    /// The stream is not valid; no later bytes can fix it, so the connection should be closed.
    Invalid {
        /// What is wrong.
        message: String,
    },
}

/// Looks for one complete JSON value at the start of `buf`, after any ASCII whitespace.
///
/// Any JSON value is accepted (objects are requests, arrays batches, others Invalid Requests,
/// which [`parse_frame`] tells apart); bytes that cannot start a JSON value are
/// [`Split::Invalid`]. A number is complete only once a byte after it shows where it ends. A
/// value (not counting the leading whitespace) longer than `limit` bytes is [`Split::Invalid`],
/// as is a whitespace-only buffer longer than `limit`.
pub fn split_value(buf: &[u8], limit: usize) -> Split {
    let ws = buf.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(buf.len());
    let rest = &buf[ws..];
    let Some(&first) = rest.first() else {
        if ws > limit {
            return too_large();
        }
        return Split::Incomplete;
    };
    if !starts_value(first) {
        return Split::Invalid { message: "request must be a JSON object".to_string() };
    }
    // Parse at most `limit` bytes: a value that fits is complete within them, and one that
    // does not is rejected without scanning the rest of a huge buffer.
    let window = &rest[..rest.len().min(limit)];
    let mut stream = serde_json::Deserializer::from_slice(window).into_iter::<Value>();
    match stream.next() {
        Some(Ok(value)) => {
            let end = stream.byte_offset();
            if value.is_number() && end == rest.len() && rest.len() <= limit {
                // More digits may follow in the next read.
                return Split::Incomplete;
            }
            Split::Complete { consumed: ws + end, value }
        }
        Some(Err(e)) if e.is_eof() => {
            if rest.len() > limit {
                too_large()
            } else {
                Split::Incomplete
            }
        }
        Some(Err(e)) => Split::Invalid { message: e.to_string() },
        // Cannot happen: `window` starts a value (or is empty only when `limit` is 0).
        None => {
            if rest.len() > limit {
                too_large()
            } else {
                Split::Incomplete
            }
        }
    }
}

/// True if `b` can start a JSON value.
fn starts_value(b: u8) -> bool {
    matches!(b, b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
}

fn too_large() -> Split {
    Split::Invalid { message: "request too large".to_string() }
}

/// What one complete JSON value on the stream asks for.
#[derive(Debug)]
pub enum Incoming {
    /// A single request (or why it is invalid, with its id when one could be read).
    Single(Result<Request, (Option<Id>, RpcError)>),
    /// A batch: each element in order.
    Batch(Vec<Result<Request, (Option<Id>, RpcError)>>),
}

/// Validates a complete value found by [`split_value`]; `frame` is the text it was parsed from,
/// from which ids are taken verbatim. An empty batch is one Invalid Request (as in SPDK).
pub fn parse_frame(frame: &[u8], value: Value) -> Incoming {
    match value {
        Value::Array(items) if items.is_empty() => {
            Incoming::Single(Err((None, RpcError::invalid_request("empty batch"))))
        }
        Value::Array(items) => {
            let raws: Vec<&RawValue> = serde_json::from_slice(frame).unwrap_or_default();
            let out = items
                .into_iter()
                .enumerate()
                .map(|(i, v)| with_raw_id(parse_request(v), raws.get(i).map(|r| r.get().as_bytes())))
                .collect();
            Incoming::Batch(out)
        }
        v => Incoming::Single(with_raw_id(parse_request(v), Some(frame))),
    }
}

#[derive(Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

/// Replaces a numeric id by its original text.
fn with_raw_id(
    r: Result<Request, (Option<Id>, RpcError)>,
    text: Option<&[u8]>,
) -> Result<Request, (Option<Id>, RpcError)> {
    let raw = || -> Option<Id> {
        let only: IdOnly = serde_json::from_slice(text?).ok()?;
        let raw = only.id?;
        let t = raw.get();
        t.starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']).then(|| Id(raw.to_owned()))
    };
    match r {
        Ok(mut req) if req.id.is_some() => {
            if let Some(id) = raw() {
                req.id = Some(id);
            }
            Ok(req)
        }
        Err((Some(id), e)) => Err((Some(raw().unwrap_or(id)), e)),
        other => other,
    }
}

/// Validates a JSON value as a JSON-RPC 2.0 request.
///
/// On failure returns the request's id when one could be read (so the error response can echo
/// it) together with an [`INVALID_REQUEST`] error. Unknown extra members are ignored. A missing
/// `"jsonrpc"` member is accepted, as SPDK does.
pub fn parse_request(value: Value) -> Result<Request, (Option<Id>, RpcError)> {
    let mut obj: Map<String, Value> = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => return Err((None, RpcError::invalid_request("a batch cannot be nested"))),
        _ => return Err((None, RpcError::invalid_request("request must be a JSON object"))),
    };

    let id = match obj.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(Id::from_value(&id)),
        Some(_) => return Err((None, RpcError::invalid_request("\"id\" must be a string, number or null"))),
    };
    let fail = |id: Option<Id>, msg: &str| Err((id, RpcError::invalid_request(msg)));

    match obj.get("jsonrpc") {
        None => {}
        Some(Value::String(v)) if v == "2.0" => {}
        Some(_) => return fail(id, "\"jsonrpc\" must be \"2.0\""),
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return fail(id, "\"method\" must be a string"),
        None => return fail(id, "missing \"method\""),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => None,
        Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
        Some(_) => return fail(id, "\"params\" must be an object or an array"),
    };
    Ok(Request { id, method, params })
}

#[derive(Serialize)]
struct Success<'a> {
    jsonrpc: &'static str,
    id: &'a Id,
    result: &'a Value,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: i32,
    message: &'a str,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    id: Option<&'a Id>,
    error: ErrorBody<'a>,
}

/// Encodes a success response: `{"jsonrpc":"2.0","id":<id>,"result":<result>}` and `\n`.
pub fn encode_result(id: &Id, result: &Value) -> Vec<u8> {
    finish(serde_json::to_vec(&Success { jsonrpc: "2.0", id, result }))
}

/// Encodes an error response: `{"jsonrpc":"2.0","id":<id or null>,"error":{"code":..,
/// "message":".."}}` and `\n`.
pub fn encode_error(id: Option<&Id>, err: &RpcError) -> Vec<u8> {
    finish(serde_json::to_vec(&Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorBody { code: err.code, message: &err.message },
    }))
}

/// Encodes a batch response: the elements (each as [`encode_result`] or [`encode_error`] made
/// it) as one JSON array, and `\n`.
pub fn encode_batch(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum::<usize>() + 2);
    out.push(b'[');
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(p.strip_suffix(b"\n").unwrap_or(p));
    }
    out.extend_from_slice(b"]\n");
    out
}

fn finish(encoded: serde_json::Result<Vec<u8>>) -> Vec<u8> {
    match encoded {
        Ok(mut out) => {
            out.push(b'\n');
            out
        }
        // Serializing a `Value` cannot fail; answer with a fixed error rather than panic.
        Err(e) => {
            log::error!("failed to encode a JSON-RPC response: {e}");
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{{\"code\":{INTERNAL_ERROR},\
                 \"message\":\"failed to encode response\"}}}}\n"
            )
            .into_bytes()
        }
    }
}

/// Nesting depth beyond which serde_json refuses a document (its recursion limit).
const MAX_DEPTH: u32 = 128;

/// Finds where the first top-level JSON value of a byte stream ends, looking at each byte once
/// across calls, so that a large request arriving in many reads is parsed once (with
/// [`split_value`]) instead of once per read.
#[derive(Debug, Default, Clone)]
pub struct FrameScanner {
    pos: usize,
    depth: u32,
    started: bool,
    in_string: bool,
    escaped: bool,
    /// A top-level number or literal: it ends at the first byte that cannot belong to it.
    bare: bool,
    /// For a top-level literal, its text and where it started: it ends when complete.
    literal: Option<(&'static [u8], usize)>,
}

impl FrameScanner {
    /// Continues scanning `buf` (which only grew since the last call) and returns the end of the
    /// first complete value (for a bare number or literal, including the byte after it), or of
    /// its first byte if that cannot start a value (so that `split_value` reports the error).
    pub fn scan(&mut self, buf: &[u8]) -> Option<usize> {
        while self.pos < buf.len() {
            let b = buf[self.pos];
            self.pos += 1;
            if !self.started {
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => continue,
                    b'{' | b'[' => {
                        self.started = true;
                        self.depth = 1;
                        continue;
                    }
                    b'"' => {
                        self.started = true;
                        self.in_string = true;
                        continue;
                    }
                    b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                        self.started = true;
                        self.bare = true;
                        self.literal = match b {
                            b't' => Some((b"true", self.pos - 1)),
                            b'f' => Some((b"false", self.pos - 1)),
                            b'n' => Some((b"null", self.pos - 1)),
                            _ => None,
                        };
                        continue;
                    }
                    _ => return Some(self.pos),
                }
            }
            if self.bare {
                if let Some((lit, start)) = self.literal {
                    if buf[start..self.pos] == *lit {
                        return Some(self.pos);
                    }
                    if !lit.starts_with(&buf[start..self.pos]) {
                        return Some(self.pos); // not a literal: let the parser say so
                    }
                    continue;
                }
                if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-') {
                    continue;
                }
                return Some(self.pos);
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        // Deeper than the parser accepts: hand over now so it reports the error.
                        return Some(self.pos);
                    }
                }
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Forgets the scanned value (call after removing it from the front of the buffer).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Bytes scanned so far.
    pub fn scanned(&self) -> usize {
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn complete(buf: &[u8]) -> (usize, Value) {
        match split_value(buf, MAX_REQUEST) {
            Split::Complete { consumed, value } => (consumed, value),
            other => panic!("expected Complete for {:?}, got {other:?}", String::from_utf8_lossy(buf)),
        }
    }

    fn invalid(buf: &[u8], limit: usize) -> String {
        match split_value(buf, limit) {
            Split::Invalid { message } => message,
            other => panic!("expected Invalid for {:?}, got {other:?}", String::from_utf8_lossy(buf)),
        }
    }

    fn is_incomplete(buf: &[u8]) -> bool {
        matches!(split_value(buf, MAX_REQUEST), Split::Incomplete)
    }

    fn request(text: &str) -> Result<Request, (Option<Id>, RpcError)> {
        parse_request(serde_json::from_str(text).expect("test JSON"))
    }

    fn rejected(text: &str) -> (Option<Value>, RpcError) {
        match request(text) {
            Ok(r) => panic!("expected an error for {text}, got {r:?}"),
            Err((id, e)) => (id.map(|i| i.to_value()), e),
        }
    }

    fn vid(v: Value) -> Option<Id> {
        Some(Id::from_value(&v))
    }

    #[test]
    fn two_requests_back_to_back() {
        let a = r#"{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":1}"#;
        let b = r#"{"jsonrpc":"2.0","method":"spdk_get_version","id":2}"#;
        let buf = format!("{a}{b}");
        let (n, v) = complete(buf.as_bytes());
        assert_eq!(n, a.len());
        assert_eq!(parse_request(v).unwrap().method, "bdev_get_bdevs");
        let (m, v) = complete(&buf.as_bytes()[n..]);
        assert_eq!(m, b.len());
        let r = parse_request(v).unwrap();
        assert_eq!(r.method, "spdk_get_version");
        assert_eq!(r.id, vid(json!(2)));
        assert!(is_incomplete(&buf.as_bytes()[n + m..]));
    }

    #[test]
    fn split_at_every_byte() {
        let text = r#"{"jsonrpc":"2.0","method":"bdev_malloc_create","id":"x-7","params":{"name":"Malloc0","num_blocks":262144,"block_size":512,"uuid":"é✓"}}"#;
        let expected = request(text).unwrap();
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            assert!(is_incomplete(&bytes[..cut]), "cut at {cut}");
        }
        let (n, v) = complete(bytes);
        assert_eq!(n, bytes.len());
        assert_eq!(parse_request(v).unwrap(), expected);
    }

    #[test]
    fn whitespace_between_requests() {
        let a = r#"{"jsonrpc":"2.0","method":"a"}"#;
        let b = r#"{"jsonrpc":"2.0","method":"b"}"#;
        let text = format!(" \n\t{a}\r\n  \n{b}\n");
        let buf = text.as_bytes();
        let (n, v) = complete(buf);
        assert_eq!(n, 3 + a.len());
        assert_eq!(parse_request(v).unwrap().method, "a");
        let (m, v) = complete(&buf[n..]);
        assert_eq!(m, 5 + b.len());
        assert_eq!(parse_request(v).unwrap().method, "b");
        assert!(is_incomplete(&buf[n + m..]));
        assert!(is_incomplete(b""));
        assert!(is_incomplete(b"  \n\t\r "));
    }

    #[test]
    fn invalid_json() {
        invalid(br#"{"jsonrpc":"2.0",,}"#, MAX_REQUEST);
        invalid(br#"{"method" 1}"#, MAX_REQUEST);
        invalid(b"{\"a\":tru }", MAX_REQUEST);
        invalid(b"[1,]", MAX_REQUEST);
        invalid(b"{\"a\":\"\xff\"}", MAX_REQUEST);
        // Deep nesting hits serde_json's recursion limit rather than the stack.
        invalid(&[b'['; 10_000], MAX_REQUEST);
        // A complete, valid value followed by garbage: the value is fine, the garbage is not.
        let (n, _) = complete(b"{}xyz");
        assert_eq!(n, 2);
        invalid(b"xyz", MAX_REQUEST);
    }

    #[test]
    fn non_object_top_level() {
        // Bytes that cannot start a JSON value: a parse error.
        for text in ["}", "x", "]", ":"] {
            assert_eq!(invalid(text.as_bytes(), MAX_REQUEST), "request must be a JSON object", "{text}");
        }
        // Valid scalars are complete values (a number once something follows it)...
        for (text, len) in [("12 ", 2), ("\"str\"", 5), ("true", 4), ("null\n", 4), ("-3}", 2)] {
            assert_eq!(complete(text.as_bytes()).0, len, "{text}");
        }
        for text in ["12", "-", "\"unterminated", "tru"] {
            assert!(is_incomplete(text.as_bytes()), "{text}");
        }
        invalid(b"-x", MAX_REQUEST);
        // ...which parse_frame answers with Invalid Request.
        let (n, v) = complete(b"42 ");
        match parse_frame(&b"42 "[..n], v) {
            Incoming::Single(Err((None, e))) => assert_eq!(e.code, INVALID_REQUEST),
            other => panic!("{other:?}"),
        }
        let (_, e) = rejected("42");
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) = rejected("\"bdev_get_bdevs\"");
        assert_eq!(e.code, INVALID_REQUEST);
    }

    #[test]
    fn batches_and_raw_ids() {
        let text = r#"[{"jsonrpc":"2.0","method":"a","id":123456789012345678901234567890},7,
            {"method":"b","id":"x"},{"jsonrpc":"2.0","method":"c"}]"#;
        let (n, v) = complete(text.as_bytes());
        assert_eq!(n, text.len());
        let Incoming::Batch(items) = parse_frame(text.as_bytes(), v) else { panic!("not a batch") };
        assert_eq!(items.len(), 4);
        assert_eq!(items[0].as_ref().unwrap().id.as_ref().unwrap().as_str(), "123456789012345678901234567890");
        assert_eq!(items[1].as_ref().unwrap_err().1.code, INVALID_REQUEST);
        assert_eq!(items[2].as_ref().unwrap().method, "b");
        assert!(items[3].as_ref().unwrap().id.is_none());
        let (n, v) = complete(b"[]");
        match parse_frame(&b"[]"[..n], v) {
            Incoming::Single(Err((None, e))) => assert_eq!(e.code, INVALID_REQUEST),
            other => panic!("{other:?}"),
        }
        // A single request keeps its id's text too, and so does its error.
        let text = br#" {"method":"m","id":18446744073709551616.0e0}"#;
        let (n, v) = complete(text);
        let Incoming::Single(Ok(r)) = parse_frame(&text[..n], v) else { panic!() };
        assert_eq!(r.id.unwrap().as_str(), "18446744073709551616.0e0");
        let text = br#"{"jsonrpc":"1","method":"m","id":-99999999999999999999}"#;
        let (n, v) = complete(text);
        let Incoming::Single(Err((Some(id), _))) = parse_frame(&text[..n], v) else { panic!() };
        assert_eq!(id.as_str(), "-99999999999999999999");
        let out = encode_batch(&[encode_result(&Id::null(), &json!(1)), encode_error(None, &RpcError::internal("x"))]);
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back.as_array().unwrap().len(), 2);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn wrong_jsonrpc_version() {
        // Missing is fine (SPDK's decoder makes the member optional).
        assert_eq!(request(r#"{"method":"a","id":5}"#).unwrap().method, "a");
        for text in [r#"{"jsonrpc":"1.0","method":"a","id":5}"#, r#"{"jsonrpc":2.0,"method":"a","id":5}"#] {
            let (id, e) = rejected(text);
            assert_eq!(id, Some(json!(5)), "{text}");
            assert_eq!(e.code, INVALID_REQUEST);
            assert!(e.message.contains("jsonrpc"), "{}", e.message);
        }
    }

    #[test]
    fn method_missing_or_not_a_string() {
        let (id, e) = rejected(r#"{"jsonrpc":"2.0","id":"abc"}"#);
        assert_eq!(id, Some(json!("abc")));
        assert_eq!(e.code, INVALID_REQUEST);
        assert!(e.message.contains("method"));
        for m in ["1", "null", "[\"a\"]", "{}", "true"] {
            let (id, e) = rejected(&format!(r#"{{"jsonrpc":"2.0","id":3,"method":{m}}}"#));
            assert_eq!(id, Some(json!(3)));
            assert_eq!(e.code, INVALID_REQUEST);
            assert!(e.message.contains("method"), "{}", e.message);
        }
    }

    #[test]
    fn params_types() {
        for p in ["1", "\"s\"", "true", "false", "-3.5"] {
            let (id, e) = rejected(&format!(r#"{{"jsonrpc":"2.0","id":3,"method":"m","params":{p}}}"#));
            assert_eq!(id, Some(json!(3)));
            assert_eq!(e.code, INVALID_REQUEST);
            assert!(e.message.contains("params"), "{}", e.message);
        }
        let r = request(r#"{"jsonrpc":"2.0","method":"m","params":null}"#).unwrap();
        assert_eq!(r.params, None);
        let r = request(r#"{"jsonrpc":"2.0","method":"m","params":[1,"a"]}"#).unwrap();
        assert_eq!(r.params, Some(json!([1, "a"])));
        let r = request(r#"{"jsonrpc":"2.0","method":"m","params":{"name":"Nvme0"}}"#).unwrap();
        assert_eq!(r.params, Some(json!({"name": "Nvme0"})));
        let r = request(r#"{"jsonrpc":"2.0","method":"m"}"#).unwrap();
        assert_eq!(r.params, None);
    }

    #[test]
    fn id_kinds() {
        for (id, expected) in [
            ("1", json!(1)),
            ("-7", json!(-7)),
            ("1.5", json!(1.5)),
            ("18446744073709551615", json!(u64::MAX)),
            ("\"req-1\"", json!("req-1")),
            ("\"\"", json!("")),
            ("null", Value::Null),
        ] {
            let r = request(&format!(r#"{{"jsonrpc":"2.0","method":"m","id":{id}}}"#)).unwrap();
            assert_eq!(r.id, vid(expected), "{id}");
        }
        for id in ["true", "[1]", "{\"a\":1}"] {
            let (got, e) = rejected(&format!(r#"{{"jsonrpc":"2.0","method":"m","id":{id}}}"#));
            assert_eq!(got, None, "{id}");
            assert_eq!(e.code, INVALID_REQUEST);
            assert!(e.message.contains("id"));
        }
    }

    #[test]
    fn notification_and_extra_members() {
        let r = request(r#"{"jsonrpc":"2.0","method":"framework_start_init"}"#).unwrap();
        assert_eq!(r, Request { id: None, method: "framework_start_init".into(), params: None });
        let r = request(r#"{"x":1,"jsonrpc":"2.0","method":"m","id":2,"extra":[true]}"#).unwrap();
        assert_eq!(r.id, vid(json!(2)));
        assert_eq!(r.method, "m");
        // An error in a notification carries no id.
        let (id, _) = rejected(r#"{"jsonrpc":"2.0","method":7}"#);
        assert_eq!(id, None);
    }

    #[test]
    fn oversized_input() {
        let text = r#"{"jsonrpc":"2.0","method":"m","id":1}"#;
        let len = text.len();
        // Exactly at the limit is fine, even with leading whitespace.
        let (n, _) = match split_value(format!("\n {text}").as_bytes(), len) {
            Split::Complete { consumed, value } => (consumed, value),
            other => panic!("{other:?}"),
        };
        assert_eq!(n, len + 2);
        // One byte over is rejected, complete or not.
        assert_eq!(invalid(text.as_bytes(), len - 1), "request too large");
        assert_eq!(invalid(&text.as_bytes()[..len - 1], len - 2), "request too large");
        assert!(matches!(split_value(&text.as_bytes()[..len - 1], len - 1), Split::Incomplete));
        // A huge unterminated request.
        let mut big = b"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"data\":\"".to_vec();
        big.resize(MAX_REQUEST + 10, b'a');
        assert_eq!(invalid(&big, MAX_REQUEST), "request too large");
        assert!(is_incomplete(&big[..MAX_REQUEST]));
        // Endless whitespace is not buffered forever.
        assert_eq!(invalid(&[b' '; 65], 64), "request too large");
        assert!(matches!(split_value(&[b' '; 64], 64), Split::Incomplete));
        // Zero limit rejects everything that is not empty.
        assert!(matches!(split_value(b"", 0), Split::Incomplete));
        assert_eq!(invalid(b"{}", 0), "request too large");
    }

    #[test]
    fn encoders() {
        let out = encode_result(&Id::from_value(&json!(1)), &json!({"bdevs": [{"name": "Malloc0"}]}));
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"bdevs\":[{\"name\":\"Malloc0\"}]}}\n"
        );
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, json!({"jsonrpc": "2.0", "id": 1, "result": {"bdevs": [{"name": "Malloc0"}]}}));

        let out = encode_result(&Id::from_value(&json!("s\n\"q\"")), &json!(true));
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, json!({"jsonrpc": "2.0", "id": "s\n\"q\"", "result": true}));

        let err = RpcError::method_not_found("nope");
        assert_eq!(err.code, METHOD_NOT_FOUND);
        assert_eq!(err.message, "Method not found: nope");
        let out = encode_error(Some(&Id::from_value(&json!("a"))), &err);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            back,
            json!({"jsonrpc": "2.0", "id": "a",
                   "error": {"code": -32601, "message": "Method not found: nope"}})
        );

        let out = encode_error(None, &RpcError::new(PARSE_ERROR, "bad \"json\"\n"));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"bad \\\"json\\\"\\n\"}}\n"
        );
        assert_eq!(RpcError::invalid_params("x").code, INVALID_PARAMS);
        assert_eq!(RpcError::internal("x").code, INTERNAL_ERROR);
        assert_eq!(RpcError::internal("boom").to_string(), "boom (code -32603)");
    }

    fn arb_id() -> impl Strategy<Value = Option<Id>> {
        prop_oneof![
            Just(None),
            Just(Some(Id::null())),
            any::<i64>().prop_map(|n| vid(json!(n))),
            any::<u64>().prop_map(|n| vid(json!(n))),
            any::<String>().prop_map(|s| vid(Value::String(s))),
        ]
    }

    fn arb_params() -> impl Strategy<Value = Option<Value>> {
        let leaf = prop_oneof![any::<i64>().prop_map(Value::from), "[ -~é✓]{0,12}".prop_map(Value::String),];
        prop_oneof![
            Just(None),
            prop::collection::btree_map("[a-z_]{1,8}", leaf.clone(), 0..6)
                .prop_map(|m| Some(Value::Object(m.into_iter().collect()))),
            prop::collection::vec(leaf, 0..4).prop_map(|v| Some(Value::Array(v))),
        ]
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        (arb_id(), any::<String>(), arb_params()).prop_map(|(id, method, params)| Request { id, method, params })
    }

    fn to_json(r: &Request) -> Vec<u8> {
        let mut obj = Map::new();
        obj.insert("jsonrpc".into(), json!("2.0"));
        obj.insert("method".into(), json!(r.method));
        if let Some(id) = &r.id {
            obj.insert("id".into(), id.to_value());
        }
        if let Some(p) = &r.params {
            obj.insert("params".into(), p.clone());
        }
        serde_json::to_vec(&Value::Object(obj)).unwrap()
    }

    proptest! {
        #[test]
        fn roundtrip_with_trailing_prefix(
            req in arb_request(),
            next in arb_request(),
            lead in "[ \t\r\n]{0,3}",
            pretty in any::<bool>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let body = if pretty {
                let v: Value = serde_json::from_slice(&to_json(&req)).unwrap();
                serde_json::to_vec_pretty(&v).unwrap()
            } else {
                to_json(&req)
            };
            let next = to_json(&next);
            let tail = &next[..cut.index(next.len() + 1)];
            let mut buf = lead.clone().into_bytes();
            buf.extend_from_slice(&body);
            buf.extend_from_slice(tail);

            match split_value(&buf, MAX_REQUEST) {
                Split::Complete { consumed, value } => {
                    prop_assert_eq!(consumed, lead.len() + body.len());
                    prop_assert_eq!(parse_request(value).unwrap(), req.clone());
                }
                other => prop_assert!(false, "expected Complete, got {:?}", other),
            }
            // Any strict prefix of the request (with its whitespace) is incomplete.
            let strict = &buf[..lead.len() + body.len() - 1];
            prop_assert!(matches!(split_value(strict, MAX_REQUEST), Split::Incomplete));
            // What follows is an incomplete request, or the complete next one.
            let after = &buf[lead.len() + body.len()..];
            match split_value(after, MAX_REQUEST) {
                Split::Incomplete => prop_assert!(tail.len() < next.len()),
                Split::Complete { consumed, .. } => prop_assert_eq!(consumed, next.len()),
                Split::Invalid { message } => prop_assert!(false, "Invalid: {}", message),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            buf in prop::collection::vec(any::<u8>(), 0..256),
            limit in 0usize..300,
        ) {
            let mut rest = &buf[..];
            while let Split::Complete { consumed, value } = split_value(rest, limit) {
                prop_assert!(consumed > 0 && consumed <= rest.len());
                match parse_request(value) {
                    Ok(r) => {
                        let _ = encode_result(r.id.as_ref().unwrap_or(&Id::null()), &json!(null));
                    }
                    Err((id, e)) => {
                        let _ = encode_error(id.as_ref(), &e);
                    }
                }
                rest = &rest[consumed..];
            }
        }

        #[test]
        fn json_ish_bytes_never_panic(
            buf in prop::collection::vec(
                prop::sample::select(b"{}[]\":,0123456789.eE-+ \ntrufalsn\\a".to_vec()),
                0..128,
            ),
        ) {
            if let Split::Complete { consumed, value } = split_value(&buf, MAX_REQUEST) {
                prop_assert!(consumed > 0 && consumed <= buf.len());
                let _ = parse_request(value);
            }
        }
    }

    #[test]
    fn frame_scanner_finds_value_ends_incrementally() {
        let text = br#"  {"a":"}{\"]","b":[1,{"c":2}]} {"x":1}"#;
        let mut sc = FrameScanner::default();
        let mut found = None;
        for n in 1..=text.len() {
            if let Some(end) = sc.scan(&text[..n]) {
                found = Some(end);
                break;
            }
        }
        let end = found.expect("value end found");
        let v: Value = serde_json::from_slice(&text[..end]).unwrap();
        assert_eq!(v["b"][1]["c"], 2);
        assert_eq!(v["a"], "}{\"]");
        sc.reset();
        let rest = &text[end..];
        let end2 = sc.scan(rest).expect("second value");
        assert_eq!(serde_json::from_slice::<Value>(&rest[..end2]).unwrap()["x"], 1);
        let mut sc = FrameScanner::default();
        assert_eq!(sc.scan(b"  }"), Some(3), "a byte that cannot start a value ends the frame at once");
        let mut sc = FrameScanner::default();
        assert_eq!(sc.scan(b"  7"), None, "a number may go on");
        assert_eq!(sc.scan(b"  72 "), Some(5), "a bare value ends after the byte that ends it");
        let mut sc = FrameScanner::default();
        assert_eq!(sc.scan(br#" "a\"}" "#), Some(7));
        let mut sc = FrameScanner::default();
        assert_eq!(sc.scan(b" tr"), None);
        assert_eq!(sc.scan(b" true"), Some(5), "a literal ends when complete");
        let mut sc = FrameScanner::default();
        assert_eq!(sc.scan(b"nux"), Some(3));
    }
}
