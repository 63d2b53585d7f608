//! QoS, histogram and iostat JSON-RPC methods against the real binary: a `ferrite perf` run
//! whose config sets a QoS limit and enables the histogram (as a config saved by SPDK would),
//! inspected over its RPC socket while it runs; and the methods' parameter errors on
//! `ferrite serve`.

mod common;

use common::{call, find_bdev, wait_for_socket, Daemon, Proc, TempDir};
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::time::Duration;

/// Decodes base64 as Python's base64.b64decode does.
fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let mut out = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q.iter().filter(|&&c| c != b'=').fold(0u32, |n, &c| n << 6 | val(c)) << (6 * pad);
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

#[test]
fn qos_histogram_and_iostat_on_a_running_perf() {
    let dir = TempDir::new("statsrpc");
    let cfg = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 16384, "block_size": 512}},
            {"method": "bdev_set_qos_limit", "params": {"name": "Malloc0", "rw_ios_per_sec": 2000}},
            {"method": "bdev_enable_histogram", "params": {"name": "Malloc0", "enable": true}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let sock = dir.join("perf.sock");
    let results = dir.join("results.json");
    let mut perf = Proc::spawn(
        &dir,
        "perf",
        &[
            "perf",
            "--json",
            cfg.to_str().unwrap(),
            "-q",
            "32",
            "-o",
            "4096",
            "-w",
            "randread",
            "-t",
            "3",
            "-m",
            "0x3",
            "--no-pin",
            "-r",
            sock.to_str().unwrap(),
            "--results-json",
            results.to_str().unwrap(),
        ],
    );
    wait_for_socket(&mut perf, &sock, Duration::from_secs(10));
    let mut c = RpcClient::connect(&sock, Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(1000));

    // bdev_get_bdevs shows the limit; save_config writes it, and the histogram, after the create.
    let bdevs = call(&mut c, "bdev_get_bdevs", None);
    let m = find_bdev(bdevs.as_array().unwrap(), "Malloc0").unwrap();
    assert_eq!(
        m["assigned_rate_limits"],
        json!({"rw_ios_per_sec": 2000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0})
    );
    let saved = call(&mut c, "save_config", None);
    let bdev_cfg = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "bdev").unwrap()["config"]
        .as_array()
        .unwrap()
        .clone();
    let methods: Vec<&str> = bdev_cfg.iter().map(|e| e["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["bdev_malloc_create", "bdev_set_qos_limit", "bdev_enable_histogram", "bdev_wait_for_examine"]);
    assert_eq!(bdev_cfg[1]["params"], json!({"name": "Malloc0", "rw_ios_per_sec": 2000}), "only the limits set");
    assert_eq!(bdev_cfg[2]["params"], json!({"name": "Malloc0", "enable": true}));

    // The histogram in SPDK's form: counts of about a second of I/O at 2000/s.
    let h = call(&mut c, "bdev_get_histogram", Some(json!({"name": "Malloc0"})));
    let (g, lo, hi) =
        (h["granularity"].as_u64().unwrap(), h["min_range"].as_u64().unwrap(), h["max_range"].as_u64().unwrap());
    assert_eq!(g, 7);
    assert!(h["tsc_rate"].as_u64().unwrap() > 1_000_000);
    let data = b64decode(h["histogram"].as_str().unwrap());
    assert_eq!(data.len() as u64, ((hi - lo + 1) << g) * 8, "one u64 per bucket");
    let total: u64 = data.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).sum();
    assert!((1000..=4000).contains(&total), "about 1 s of I/O at 2000/s: {total}");

    // Per-channel statistics: one entry per core, with SPDK's fields.
    let pc = call(&mut c, "bdev_get_iostat", Some(json!({"name": "Malloc0", "per_channel": true})));
    assert_eq!(pc["name"], "Malloc0");
    let chans = pc["channels"].as_array().unwrap();
    let mut threads: Vec<u64> = chans.iter().map(|c| c["thread_id"].as_u64().unwrap()).collect();
    threads.sort_unstable();
    assert_eq!(threads, [0, 1], "both reactors: {pc}");
    let per_core: Vec<u64> = chans.iter().map(|c| c["num_read_ops"].as_u64().unwrap()).collect();
    assert!(per_core.iter().all(|n| *n > 0), "{per_core:?}");
    assert!(chans[0].get("read_latency_ticks").is_some() && chans[0].get("io_error").is_some());

    // reset_mode and bdev_reset_iostat.
    let before = call(&mut c, "bdev_get_iostat", Some(json!({"name": "Malloc0", "reset_mode": "maxmin"})));
    let b0 = &before["bdevs"][0];
    assert!(b0["num_read_ops"].as_u64().unwrap() > 1000 && b0["max_read_latency_ticks"].as_u64().unwrap() > 0);
    call(&mut c, "bdev_reset_iostat", Some(json!({"name": "Malloc0", "mode": "all"})));
    let after = call(&mut c, "bdev_get_iostat", Some(json!({"name": "Malloc0"})));
    let ops = after["bdevs"][0]["num_read_ops"].as_u64().unwrap();
    assert!(ops < 500, "counters restarted from zero: {ops} (were {})", b0["num_read_ops"]);

    let st = perf.expect_exit(Duration::from_secs(30), "perf ends");
    assert!(st.success(), "{}", perf.stderr());
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let iops: f64 = doc["results"].as_array().unwrap().iter().map(|j| j["iops"].as_f64().unwrap()).sum();
    assert!((1800.0..=2200.0).contains(&iops), "two cores at QD 32 under a 2000 IOPS limit: {iops}");
}

#[test]
fn bad_params_get_json_rpc_errors() {
    let dir = TempDir::new("statsrpcerr");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 64, "block_size": 512})));
    d.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 64, "block_size": 512})));
    let cases = [
        ("bdev_set_qos_limit", json!({"name": "M0"}), -libc::EINVAL),
        ("bdev_set_qos_limit", json!({"name": "nope", "rw_ios_per_sec": 1000}), -libc::ENODEV),
        ("bdev_set_qos_limit", json!({"name": "M0", "rw_ios_per_sec": -1}), -32602),
        ("bdev_set_qos_limit", json!({"name": "M0", "iops": 1000}), -32602),
        ("bdev_enable_histogram", json!({"name": "M0", "enable": true, "opc": "sideways"}), -libc::EINVAL),
        ("bdev_enable_histogram", json!({"name": "M0", "enable": true, "granularity": 40}), -libc::EINVAL),
        ("bdev_enable_histogram", json!({"name": "M0", "enable": true, "min_nsec": 9, "max_nsec": 9}), -libc::EINVAL),
        ("bdev_enable_histogram", json!({"name": "M0"}), -32602),
        ("bdev_get_histogram", json!({"name": "M0"}), -32603),
        ("bdev_get_histogram", json!({"name": "nope"}), -libc::ENODEV),
        ("bdev_reset_iostat", json!({"mode": "most"}), -libc::EINVAL),
        ("bdev_reset_iostat", json!({"name": "nope"}), -libc::ENODEV),
        ("bdev_get_iostat", json!({"reset_mode": "most"}), -libc::EINVAL),
        ("bdev_get_iostat", json!({"per_channel": true}), -libc::EINVAL),
        ("bdev_get_iostat", json!({"names": ["M0", "M1"], "per_channel": true}), -libc::EINVAL),
    ];
    for (method, params, code) in cases {
        let e = d.call_err(method, Some(params.clone()));
        assert_eq!(e.code, code, "{method} {params}: {}", e.message);
    }
    // The good forms.
    assert_eq!(d.call("bdev_set_qos_limit", Some(json!({"name": "M0", "rw_ios_per_sec": 1500}))), json!(true));
    let m0 = find_bdev(&d.bdevs(), "M0").unwrap().clone();
    assert_eq!(m0["assigned_rate_limits"]["rw_ios_per_sec"], 2000, "rounded up as SPDK");
    d.call("bdev_set_qos_limit", Some(json!({"name": "M0", "rw_ios_per_sec": 0})));
    assert_eq!(find_bdev(&d.bdevs(), "M0").unwrap()["assigned_rate_limits"]["rw_ios_per_sec"], 0);
    d.call("bdev_enable_histogram", Some(json!({"name": "M0", "enable": true, "opc": "write"})));
    let h = d.call("bdev_get_histogram", Some(json!({"name": "M0"})));
    assert_eq!(b64decode(h["histogram"].as_str().unwrap()).iter().filter(|b| **b != 0).count(), 0, "nothing yet");
    let saved = d.call("save_config", None);
    let text = saved.to_string();
    assert!(
        text.contains(r#"{"method":"bdev_enable_histogram","params":{"enable":true,"name":"M0","opc":"write"}}"#),
        "{text}"
    );
    assert!(!text.contains("bdev_set_qos_limit"), "no entry once the limits are cleared");
    assert_eq!(d.call("bdev_reset_iostat", None), json!(true));
    // Only examine (the lvol module reads the first page of every new bdev, as SPDK's does)
    // has touched M1: after the reset, every core that did shows nothing.
    let pc = d.call("bdev_get_iostat", Some(json!({"names": ["M1"], "per_channel": true})));
    for ch in pc["channels"].as_array().unwrap() {
        for k in ["num_read_ops", "num_write_ops", "bytes_read", "bytes_written"] {
            assert_eq!(ch[k], json!(0), "{k} on M1 after the reset: {ch}");
        }
    }
}
