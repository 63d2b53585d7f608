//! Fuzzes the JSON-RPC stream codec: arbitrary bytes are split into values, parsed as requests
//! and answered, exactly as the server's connection loop does. Nothing may panic, the codec must
//! always make progress, and every response must be one line of valid JSON.

#![no_main]

use ferrite_rpc::jsonrpc::{
    encode_error, encode_result, parse_request, split_value, FrameScanner, RpcError, Split, MAX_REQUEST,
    PARSE_ERROR,
};
use libfuzzer_sys::fuzz_target;

fn check_response(out: &[u8]) {
    assert_eq!(out.last(), Some(&b'\n'));
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    let v: serde_json::Value = serde_json::from_slice(out).expect("response is valid JSON");
    assert_eq!(v["jsonrpc"], "2.0");
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
            assert_eq!(consumed, end, "scanner and parser disagree on the value's end");
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
                let out = match parse_request(value) {
                    Ok(req) => {
                        let id = req.id.clone().unwrap_or(serde_json::Value::Null);
                        let result = serde_json::json!({
                            "method": req.method,
                            "params": req.params,
                        });
                        encode_result(&id, &result)
                    }
                    Err((id, err)) => encode_error(id.as_ref(), &err),
                };
                check_response(&out);
                rest = &rest[consumed..];
            }
        }
    }
});
