//! Fuzzes the JSON-RPC stream codec: arbitrary bytes are split into values, parsed as requests
//! and answered, exactly as the server's connection loop does. Nothing may panic, the codec must
//! always make progress, and every response must be one line of valid JSON.

#![no_main]

use ferrite_rpc::jsonrpc::{
    encode_batch, encode_error, encode_result, parse_frame, split_value, FrameScanner, Id, Incoming, Request,
    RpcError, Split, MAX_REQUEST, PARSE_ERROR,
};
use libfuzzer_sys::fuzz_target;

fn check_response(out: &[u8]) {
    assert_eq!(out.last(), Some(&b'\n'));
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    let v: serde_json::Value = serde_json::from_slice(out).expect("response is valid JSON");
    match v.as_array() {
        Some(items) => items.iter().for_each(|i| assert_eq!(i["jsonrpc"], "2.0")),
        None => assert_eq!(v["jsonrpc"], "2.0"),
    }
}

fn answer(r: Result<Request, (Option<Id>, RpcError)>) -> Vec<u8> {
    match r {
        Ok(req) => {
            let id = req.id.clone().unwrap_or_else(Id::null);
            encode_result(&id, &serde_json::json!({"method": req.method, "params": req.params}))
        }
        Err((id, err)) => encode_error(id.as_ref(), &err),
    }
}

/// The server frames values with FrameScanner before parsing: fed in small pieces, it must agree
/// with split_value on where a complete value ends.
fn check_framing(data: &[u8]) {
    let mut sc = FrameScanner::default();
    let step = (data.first().copied().unwrap_or(1) as usize % 7) + 1;
    let mut end = None;
    let mut n = 0;
    while n < data.len() {
        n = (n + step).min(data.len());
        if let Some(e) = sc.scan(&data[..n]) {
            end = Some(e);
            break;
        }
    }
    if let Some(end) = end {
        assert!(end <= data.len());
        if let Split::Complete { consumed, .. } = split_value(&data[..end], MAX_REQUEST) {
            // A bare number or literal ends before the byte the scanner needed to see.
            let bare = !matches!(data.iter().find(|b| !b.is_ascii_whitespace()), Some(b'{' | b'[' | b'"'));
            assert!(consumed == end || (bare && consumed + 1 == end), "scanner and parser disagree on the value's end");
        }
    } else if let Split::Complete { .. } = split_value(data, MAX_REQUEST) {
        panic!("parser found a complete value the scanner missed");
    }
}

fuzz_target!(|data: &[u8]| {
    check_framing(data);
    let mut rest = data;
    loop {
        match split_value(rest, MAX_REQUEST) {
            Split::Incomplete => break,
            Split::Invalid { message } => {
                check_response(&encode_error(None, &RpcError::new(PARSE_ERROR, message)));
                break;
            }
            Split::Complete { consumed, value } => {
                assert!(consumed > 0 && consumed <= rest.len(), "no progress");
                let out = match parse_frame(&rest[..consumed], value) {
                    Incoming::Single(r) => answer(r),
                    Incoming::Batch(items) => encode_batch(&items.into_iter().map(answer).collect::<Vec<_>>()),
                };
                check_response(&out);
                rest = &rest[consumed..];
            }
        }
    }
});
