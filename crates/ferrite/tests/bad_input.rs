//! Malformed and invalid requests: each gets the right JSON-RPC error, and the daemon keeps
//! serving new connections afterwards.

mod common;

use common::{text, Daemon, TempDir};
use ferrite_rpc::client::{CallError, RpcClient};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Reads what the server sends on `s` until it closes the connection or `timeout` passes;
/// returns the bytes and whether the server closed (EOF, or a reset when it closed with
/// unread input).
fn read_until_close(s: &mut UnixStream, timeout: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let timed_out = matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
                return (out, !timed_out);
            }
        }
    }
}

#[test]
fn malformed_json_gets_parse_error() {
    let dir = TempDir::new("parse");
    let d = Daemon::start(&dir, &[]);
    let mut s = UnixStream::connect(&d.sock).unwrap();
    s.write_all(br#"{"jsonrpc":"2.0","method":]]"#).unwrap();
    let (bytes, closed) = read_until_close(&mut s, Duration::from_secs(5));
    let first_line = text(&bytes).lines().next().map(str::to_string).unwrap_or_default();
    let v: Value = serde_json::from_str(&first_line).unwrap_or_else(|e| panic!("reply {first_line:?}: {e}"));
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert_eq!(v["id"], Value::Null, "{v}");
    assert!(v.get("result").is_none(), "{v}");
    assert!(closed, "the server keeps a connection it cannot resynchronise");
    d.assert_serving();

    // Valid JSON that is not an object is an Invalid Request (as in SPDK), not a parse error,
    // and the connection stays usable.
    let mut c = d.client();
    c.send_raw(b"12345 ").unwrap();
    match c.read_value() {
        Ok(v) => assert_eq!(v["error"]["code"], -32600, "{v}"),
        Err(e) => panic!("no error response: {e}"),
    }
    assert!(common::call(&mut c, "bdev_get_bdevs", None).is_array());
    d.assert_serving();
}

#[test]
fn invalid_request_objects() {
    let dir = TempDir::new("invalidreq");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();
    // Valid JSON, not a valid request: -32600, and the connection stays usable.
    c.send_raw(br#"{"jsonrpc":"1.0","method":"bdev_get_bdevs","id":7}"#).unwrap();
    let v = c.read_value().unwrap();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert_eq!(v["id"], 7, "{v}");
    // A batch (SPDK v26.05 serves them): an array of replies.
    c.send_raw(br#"[{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":8}]"#).unwrap();
    let v = c.read_value().unwrap();
    assert_eq!(v[0]["id"], 8, "{v}");
    assert!(v[0]["result"].is_array(), "{v}");
    // Same connection still works.
    let r = common::call(&mut c, "bdev_get_bdevs", None);
    assert!(r.is_array());
    // Two requests in one write, answered in order.
    c.send_raw(
        br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":"a"}{"jsonrpc":"2.0","method":"nope_x","id":"b"}"#,
    )
    .unwrap();
    let a = c.read_value().unwrap();
    let b = c.read_value().unwrap();
    assert_eq!(a["id"], "a");
    assert!(a["result"]["version"].is_string(), "{a}");
    assert_eq!(b["id"], "b");
    assert_eq!(b["error"]["code"], -32601, "{b}");
    d.assert_serving();
}

#[test]
fn unknown_method() {
    let dir = TempDir::new("unknown");
    let d = Daemon::start(&dir, &[]);
    let e = d.call_err("bdev_frobnicate", Some(json!({"name": "x"})));
    assert_eq!(e.code, -32601, "{e:?}");
    assert!(e.message.contains("bdev_frobnicate"), "{e:?}");
    d.assert_serving();
}

#[test]
fn missing_and_unknown_parameters() {
    let dir = TempDir::new("params");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();

    let e = common::call_err(&mut c, "bdev_malloc_create", Some(json!({"num_blocks": 256})));
    assert_eq!(e.code, -32602, "{e:?}");
    assert!(e.message.contains("block_size"), "missing field not named: {e:?}");

    let e = common::call_err(&mut c, "bdev_null_create", Some(json!({"num_blocks": 256, "block_size": 512})));
    assert_eq!(e.code, -32602, "{e:?}");
    assert!(e.message.contains("name"), "missing field not named: {e:?}");

    let e = common::call_err(
        &mut c,
        "bdev_malloc_create",
        Some(json!({"num_blocks": 256, "block_size": 512, "frobnication": true})),
    );
    assert_eq!(e.code, -32602, "{e:?}");
    assert!(e.message.contains("frobnication"), "unknown field not named: {e:?}");

    let e = common::call_err(&mut c, "bdev_get_bdevs", Some(json!({"nmae": "Malloc0"})));
    assert_eq!(e.code, -32602, "{e:?}");
    assert!(e.message.contains("nmae"), "unknown field not named: {e:?}");

    let e = common::call_err(&mut c, "spdk_get_version", Some(json!({"x": 1})));
    assert_eq!(e.code, -32602, "{e:?}");

    // Nothing was created by any of these.
    assert!(d.bdevs().is_empty());
    d.assert_serving();
}

#[test]
fn wrong_parameter_type_is_invalid_params() {
    let dir = TempDir::new("types");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();
    for params in [
        json!({"num_blocks": "256", "block_size": 512}),
        json!({"num_blocks": -1, "block_size": 512}),
        json!({"num_blocks": 256, "block_size": 512, "name": 5}),
    ] {
        let e = common::call_err(&mut c, "bdev_malloc_create", Some(params.clone()));
        assert_eq!(e.code, -32602, "{params}: {e:?}");
    }
    // Params that are an array (positional) rather than an object: refused as such, whatever
    // the method's parameters are (a scalar is not a request at all: -32600).
    for (method, params) in [
        ("bdev_malloc_create", json!([256, 512])),
        ("bdev_malloc_create", json!(["M", 256, 512])),
        ("bdev_lvol_set_read_only", json!([])),
        ("bdev_get_bdevs", json!(["Malloc0"])),
        ("nvmf_get_stats", json!([])),
        ("nvmf_discovery_get_referrals", json!([1, 2])),
    ] {
        let e = common::call_err(&mut c, method, Some(params.clone()));
        assert_eq!(e.code, -32602, "{method} {params}: {e:?}");
        assert!(e.message.contains("must be an object"), "{method} {params}: {e:?}");
    }
    assert!(d.bdevs().is_empty());
    d.assert_serving();
}

#[test]
fn wrong_parameter_type_message_names_the_field() {
    let dir = TempDir::new("typename");
    let d = Daemon::start(&dir, &[]);
    let e = d.call_err("bdev_malloc_create", Some(json!({"num_blocks": "256", "block_size": 512})));
    assert_eq!(e.code, -32602, "{e:?}");
    assert!(e.message.contains("num_blocks"), "message does not name num_blocks: {:?}", e.message);
    let e = d.call_err("bdev_null_create", Some(json!({"name": "N", "num_blocks": 8, "block_size": "512"})));
    assert!(e.message.contains("block_size"), "message does not name block_size: {:?}", e.message);
}

#[test]
fn create_errors_leave_the_daemon_serving() {
    let dir = TempDir::new("createerr");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();

    // Duplicate names, across modules too: EEXIST.
    common::call(&mut c, "bdev_malloc_create", Some(json!({"name": "Dup", "num_blocks": 128, "block_size": 512})));
    let e = common::call_err(
        &mut c,
        "bdev_malloc_create",
        Some(json!({"name": "Dup", "num_blocks": 256, "block_size": 4096})),
    );
    assert_eq!(e.code, -17, "{e:?}");
    let e =
        common::call_err(&mut c, "bdev_null_create", Some(json!({"name": "Dup", "num_blocks": 8, "block_size": 512})));
    assert_eq!(e.code, -17, "{e:?}");
    // The original is unchanged.
    let b = common::call(&mut c, "bdev_get_bdevs", Some(json!({"name": "Dup"})));
    assert_eq!(b[0]["num_blocks"], 128);
    assert_eq!(b[0]["block_size"], 512);
    assert_eq!(b[0]["product_name"], "Malloc disk");
    d.assert_serving();

    // A uring bdev over a missing file: the message names the path.
    let missing = dir.join("does-not-exist.img");
    let e = common::call_err(
        &mut c,
        "bdev_uring_create",
        Some(json!({"name": "U", "filename": missing.to_str().unwrap()})),
    );
    assert!(e.code < 0, "{e:?}");
    assert!(e.message.contains(missing.to_str().unwrap()), "path not named: {e:?}");
    d.assert_serving();

    // An empty file holds no block; a block size below the file's 512 is refused.
    let empty = dir.file_filled("empty.img", 0, 0);
    let e =
        common::call_err(&mut c, "bdev_uring_create", Some(json!({"name": "U", "filename": empty.to_str().unwrap()})));
    assert!(e.code < 0 && e.message.contains(empty.to_str().unwrap()), "{e:?}");
    let small = dir.file_filled("small.img", 1 << 20, 0);
    let e = common::call_err(
        &mut c,
        "bdev_uring_create",
        Some(json!({"name": "U", "filename": small.to_str().unwrap(), "block_size": 256})),
    );
    assert!(e.code < 0 && e.message.contains("block_size"), "{e:?}");
    d.assert_serving();

    // Bad block sizes.
    for bs in [1000, 0, 256, 520, 1 << 20] {
        let e = common::call_err(
            &mut c,
            "bdev_malloc_create",
            Some(json!({"name": "Bs", "num_blocks": 128, "block_size": bs})),
        );
        assert!(e.code < 0, "block_size {bs}: {e:?}");
        assert!(e.message.contains("block_size"), "block_size {bs}: {e:?}");
        let e = common::call_err(
            &mut c,
            "bdev_null_create",
            Some(json!({"name": "Bs", "num_blocks": 128, "block_size": bs})),
        );
        assert!(e.code < 0, "null block_size {bs}: {e:?}");
    }
    d.assert_serving();

    // Zero blocks, bad uuid, duplicate uuid.
    let e =
        common::call_err(&mut c, "bdev_malloc_create", Some(json!({"name": "Z", "num_blocks": 0, "block_size": 512})));
    assert!(e.code < 0, "{e:?}");
    let e = common::call_err(
        &mut c,
        "bdev_malloc_create",
        Some(json!({"name": "Ub", "num_blocks": 8, "block_size": 512, "uuid": "not-a-uuid"})),
    );
    assert!(e.code < 0, "{e:?}");
    let dup_uuid = d.bdevs()[0]["uuid"].as_str().unwrap().to_string();
    let e = common::call_err(
        &mut c,
        "bdev_null_create",
        Some(json!({"name": "Uu", "num_blocks": 8, "block_size": 512, "uuid": dup_uuid})),
    );
    assert_eq!(e.code, -17, "{e:?}");

    // Only the first bdev exists.
    assert_eq!(d.bdev_names(), ["Dup"]);
    d.assert_serving();
}

#[test]
fn half_requests_and_abrupt_disconnects() {
    let dir = TempDir::new("halfreq");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "Keep", "num_blocks": 64, "block_size": 512})));
    for i in 0..20 {
        let mut s = UnixStream::connect(&d.sock).unwrap();
        let full = json!({"jsonrpc": "2.0", "method": "bdev_malloc_create", "id": i,
            "params": {"name": format!("Half{i}"), "num_blocks": 64, "block_size": 512}})
        .to_string();
        s.write_all(&full.as_bytes()[..full.len() / 2]).unwrap();
        if i % 2 == 0 {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(s);
    }
    // Connect and leave without writing anything, and connect, send a request and leave
    // without reading the reply.
    for _ in 0..5 {
        drop(UnixStream::connect(&d.sock).unwrap());
        let mut s = UnixStream::connect(&d.sock).unwrap();
        s.write_all(br#"{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":1}"#).unwrap();
    }
    // A half request on a connection that stays open does not block others.
    let mut pending = UnixStream::connect(&d.sock).unwrap();
    pending.write_all(br#"{"jsonrpc":"2.0","method":"bdev_get"#).unwrap();
    d.assert_serving();
    assert_eq!(d.bdev_names(), ["Keep"], "a half request created something");
    // The pending one can still finish its request.
    pending.write_all(br#"_bdevs","id":42}"#).unwrap();
    pending.set_read_timeout(Some(common::RPC_TIMEOUT)).unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        assert_eq!(pending.read(&mut byte).expect("reply to the completed request"), 1, "connection closed");
        line.push(byte[0]);
    }
    let v: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["id"], 42, "{v}");
    assert_eq!(v["result"][0]["name"], "Keep", "{v}");
    drop(pending);
    d.assert_serving();
}

#[test]
fn many_connections_at_once() {
    let dir = TempDir::new("manyconn");
    let d = Daemon::start(&dir, &[]);
    let clients: Vec<RpcClient> = (0..40).map(|_| d.client()).collect();
    for (i, mut c) in clients.into_iter().enumerate() {
        let r = c.call("spdk_get_version", None);
        assert!(matches!(r, Ok(Value::Object(_))), "client {i}: {r:?}");
    }
    d.assert_serving();
}

#[test]
fn cli_reports_errors() {
    let dir = TempDir::new("clierr");
    let d = Daemon::start(&dir, &[]);

    let out = d.cli(&["bdev_get_bdevs", "--name", "Missing0"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("bdev Missing0 not found"), "{err}");
    assert!(err.contains("-19"), "{err}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));

    let out = d.cli(&["bdev_malloc_create", "--num-blocks", "256"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("missing field `block_size`") && err.contains("-32602"), "{err}");

    let out = d.cli(&["no_such_method"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("Method not found: no_such_method"), "{}", text(&out.stderr));

    let out = d.cli(&["bdev_malloc_create", "{\"num_blocks\": 1"]);
    assert!(!out.status.success(), "invalid JSON params accepted");
    assert!(text(&out.stderr).contains("not valid JSON"), "{}", text(&out.stderr));

    // No daemon on that socket.
    let nowhere = dir.join("nowhere.sock");
    let out = common::run_ferrite(&["rpc", "-s", nowhere.to_str().unwrap(), "bdev_get_bdevs"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(nowhere.to_str().unwrap()), "{}", text(&out.stderr));

    // A success after all of that, through the CLI.
    let out = d.cli(&["bdev_get_bdevs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), json!([]));
}

#[test]
fn client_library_reports_rpc_errors_as_such() {
    let dir = TempDir::new("libclient");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();
    match c.call("bdev_get_bdevs", Some(json!({"name": "Nope"}))) {
        Err(CallError::Rpc(e)) => assert_eq!(e.code, -19),
        other => panic!("{other:?}"),
    }
    // The same connection keeps working after an error.
    assert!(c.call("bdev_get_bdevs", None).unwrap().is_array());
}

#[test]
fn garbage_of_other_kinds_gets_parse_errors() {
    let dir = TempDir::new("garbage");
    let d = Daemon::start(&dir, &[]);
    let deep = vec![b'['; 10_000];
    let cases: [&[u8]; 4] = [b"tru!", b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\xfe\"}", &deep, b"}{"];
    for bytes in cases {
        let mut s = UnixStream::connect(&d.sock).unwrap();
        s.write_all(bytes).unwrap();
        let (reply, closed) = read_until_close(&mut s, Duration::from_secs(5));
        let v: Value = serde_json::from_slice(reply.split(|&b| b == b'\n').next().unwrap())
            .unwrap_or_else(|e| panic!("reply {:?}: {e}", text(&reply)));
        assert_eq!(v["error"]["code"], -32700, "{v}");
        assert!(closed);
        d.assert_serving();
    }
}

#[test]
fn oversized_input_is_refused() {
    let dir = TempDir::new("oversized");
    let d = Daemon::start(&dir, &[]);
    // Endless whitespace before a request is not buffered forever. (A partial request object
    // over 4 MiB is refused the same way; both take seconds in a debug build because the
    // server re-scans the whole buffer after every 16 KiB read.)
    let mut s = UnixStream::connect(&d.sock).unwrap();
    let flood = vec![b' '; ferrite_rpc::jsonrpc::MAX_REQUEST + (64 << 10)];
    // The server may close the connection before it has read everything.
    let _ = s.write_all(&flood);
    let (reply, closed) = read_until_close(&mut s, Duration::from_secs(20));
    let v: Value = serde_json::from_slice(reply.split(|&b| b == b'\n').next().unwrap())
        .unwrap_or_else(|e| panic!("reply {:?}: {e}", text(&reply)));
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("too large"), "{v}");
    assert!(closed, "the server kept a connection it refused");
    d.assert_serving();
}

#[test]
fn request_sent_byte_by_byte() {
    let dir = TempDir::new("bytewise");
    let d = Daemon::start(&dir, &[]);
    let mut s = UnixStream::connect(&d.sock).unwrap();
    let req = json!({"jsonrpc": "2.0", "method": "bdev_malloc_create", "id": "slow",
        "params": {"name": "Slow0", "num_blocks": 64, "block_size": 512}})
    .to_string();
    for b in req.as_bytes() {
        s.write_all(std::slice::from_ref(b)).unwrap();
        s.flush().unwrap();
    }
    s.set_read_timeout(Some(common::RPC_TIMEOUT)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.ends_with(b"\n") {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed: {:?}", text(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
    let v: Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v, json!({"jsonrpc": "2.0", "id": "slow", "result": "Slow0"}));
    assert_eq!(d.bdev_names(), ["Slow0"]);
}

#[test]
fn notifications_get_no_reply() {
    let dir = TempDir::new("notify");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();
    // No id: a notification. It runs, but nothing is sent back, not even for an error.
    c.send_raw(
        br#"{"jsonrpc":"2.0","method":"bdev_null_create","params":{"name":"Quiet0","num_blocks":8,"block_size":512}}"#,
    )
    .unwrap();
    c.send_raw(br#"{"jsonrpc":"2.0","method":"no_such_method"}"#).unwrap();
    // The next reply on this connection is the one for the next call.
    let r = common::call(&mut c, "bdev_get_bdevs", None);
    let names: Vec<&str> = r.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Quiet0"]);
    // An explicit null id is echoed.
    c.send_raw(br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":null}"#).unwrap();
    let v = c.read_value().unwrap();
    assert_eq!(v["id"], Value::Null, "{v}");
    assert!(v["result"]["version"].is_string(), "{v}");
}

// Connections beyond the limit: see rpc_hardening.rs (they wait, and idle ones make room).
