//! Fuzzes the JSON-RPC stream codec: arbitrary bytes are split into values, parsed as requests
//! and answered, exactly as the server's connection loop does. Nothing may panic, the codec must
//! always make progress, and every response must be one line of valid JSON.

#![no_main]

use ferrite_rpc::jsonrpc::{
    encode_error, encode_result, parse_request, split_value, RpcError, Split, MAX_REQUEST, PARSE_ERROR,
};
use libfuzzer_sys::fuzz_target;

fn check_response(out: &[u8]) {
    assert_eq!(out.last(), Some(&b'\n'));
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    let v: serde_json::Value = serde_json::from_slice(out).expect("response is valid JSON");
    assert_eq!(v["jsonrpc"], "2.0");
}

fuzz_target!(|data: &[u8]| {
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
