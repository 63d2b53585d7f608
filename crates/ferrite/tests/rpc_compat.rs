//! SPDK compatibility of the control plane: the JSON-RPC dialect of SPDK's server, SPDK's
//! startup/runtime RPC states, its `*_set_options` methods, log and thread methods, and
//! configs crossing between SPDK's spdk_tgt and Ferrite in both directions, loaded by SPDK's own
//! rpc.py (v26.05 from $SPDK_DIR, and the PyPI package from $SPDK_RPC).

mod common;

use common::{raw_call, Daemon, TempDir};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FIXTURE: &str = include_str!("fixtures/spdk-v26.05-save_config.json");

/// The `config` array of subsystem `name` in a config document.
fn sub_config<'a>(doc: &'a Value, name: &str) -> Option<&'a Vec<Value>> {
    doc["subsystems"].as_array()?.iter().find(|s| s["subsystem"] == name)?["config"].as_array()
}

/// Option entries (everything but bdev creation and bdev_wait_for_examine) of a config.
fn option_entries(doc: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for s in doc["subsystems"].as_array().unwrap() {
        for e in s["config"].as_array().into_iter().flatten() {
            let m = e["method"].as_str().unwrap();
            if !m.ends_with("_create") && m != "bdev_wait_for_examine" {
                out.push((s["subsystem"].as_str().unwrap().to_string(), e.clone()));
            }
        }
    }
    out
}

#[test]
fn jsonrpc_dialect_matches_spdk() {
    let dir = TempDir::new("dialect");
    let d = Daemon::start(&dir, &[]);
    // SPDK answers a request without "jsonrpc" (the member is optional in its decoder).
    let r: Value = serde_json::from_str(&raw_call(&d.sock, br#"{"method":"spdk_get_version","id":3}"#)).unwrap();
    assert_eq!(r["id"], 3, "{r}");
    assert!(r["result"]["version"].is_string(), "{r}");
    // Large integer ids come back exactly as sent, not as floats.
    for id in ["18446744073709551615", "1152921504606846977", "-9223372036854775808", "123456789012345678901234567890"]
    {
        let req = format!(r#"{{"jsonrpc":"2.0","method":"spdk_get_version","id":{id}}}"#);
        let line = raw_call(&d.sock, req.as_bytes());
        assert!(line.contains(&format!("\"id\":{id},")), "id {id} not echoed exactly: {line}");
    }
    // Valid JSON that is not an object: Invalid Request, and the connection stays usable.
    let mut c = d.client();
    for bad in [&b"42 "[..], b"\"str\"", b"true", b"null", b"[]"] {
        c.send_raw(bad).unwrap();
        let v = c.read_value().unwrap();
        assert_eq!(v["error"]["code"], -32600, "{}: {v}", String::from_utf8_lossy(bad));
        assert_eq!(v["id"], Value::Null);
    }
    assert!(common::call(&mut c, "bdev_get_bdevs", None).is_array());
    // Batches, as SPDK v26.05 serves them: one array of replies, none for notifications.
    c.send_raw(
        br#"[{"jsonrpc":"2.0","method":"spdk_get_version","id":1},{"jsonrpc":"2.0","method":"nope","id":2},
            {"jsonrpc":"2.0","method":"spdk_get_version"},7]"#,
    )
    .unwrap();
    let v = c.read_value().unwrap();
    let a = v.as_array().unwrap_or_else(|| panic!("batch reply is not an array: {v}"));
    assert_eq!(a.len(), 3, "{v}");
    assert_eq!(a[0]["id"], 1);
    assert_eq!(a[1]["error"]["code"], -32601);
    assert_eq!(a[2]["error"]["code"], -32600);
    // Ill-typed params member: Invalid Request like SPDK; missing required params: SPDK's code.
    c.send_raw(br#"{"jsonrpc":"2.0","method":"bdev_get_bdevs","params":5,"id":9}"#).unwrap();
    assert_eq!(c.read_value().unwrap()["error"]["code"], -32600);
    let e = common::call_err(&mut c, "framework_set_scheduler", Some(json!({})));
    assert_eq!(e.code, -32602, "{e:?}");
    d.assert_serving();
}

/// SPDK's option methods with parameters as its save_config writes them, the error code its
/// decoder gives for an unknown parameter, and an ill-typed parameter.
fn option_cases() -> Vec<(&'static str, Value, i64, Value)> {
    vec![
        (
            "iobuf_set_options",
            json!({"small_pool_count": 8192, "large_pool_count": 1024, "small_bufsize": 8192, "large_bufsize": 135168, "enable_numa": false}),
            -32602,
            json!({"small_pool_count": "many"}),
        ),
        (
            "accel_set_options",
            json!({"small_cache_size": 128, "large_cache_size": 16, "task_count": 2048, "sequence_count": 2048, "buf_count": 2048}),
            -32700,
            json!({"task_count": -1}),
        ),
        ("sock_set_default_impl", json!({"impl_name": "posix"}), -32602, json!({"impl_name": 1})),
        (
            "sock_impl_set_options",
            json!({"impl_name": "posix", "recv_buf_size": 2097152, "send_buf_size": 2097152, "enable_recv_pipe": true, "enable_quickack": false, "enable_placement_id": 0, "enable_zerocopy_send_server": true, "enable_zerocopy_send_client": false, "zerocopy_threshold": 0, "tls_version": 0, "enable_ktls": false}),
            -32602,
            json!({"impl_name": "posix", "recv_buf_size": 4294967296u64}),
        ),
        (
            "bdev_set_options",
            json!({"bdev_io_pool_size": 65535, "bdev_io_cache_size": 256, "bdev_auto_examine": true, "iobuf_small_cache_size": 128, "iobuf_large_cache_size": 16}),
            -32602,
            json!({"bdev_auto_examine": 1}),
        ),
        (
            "bdev_raid_set_options",
            json!({"process_window_size_kb": 1024, "process_max_bandwidth_mb_sec": 0}),
            -32700,
            json!({"process_window_size_kb": 1.5}),
        ),
        ("bdev_iscsi_set_options", json!({"timeout_sec": 30}), -32603, json!({"timeout_sec": "30"})),
        (
            "bdev_nvme_set_options",
            json!({"action_on_timeout": "none", "timeout_us": 0, "keep_alive_timeout_ms": 10000, "transport_ack_timeout": 0, "dhchap_digests": ["sha256"], "multipath_opts": {"policy": "active_passive"}}),
            -32603,
            json!({"transport_ack_timeout": 256}),
        ),
        ("bdev_nvme_set_hotplug", json!({"period_us": 100000, "enable": false}), -32602, json!({"enable": "no"})),
        (
            "nvmf_set_config",
            json!({"discovery_filter": "match_any", "admin_cmd_passthru": {"identify_ctrlr": false}, "dhchap_digests": ["sha256", "sha384", "sha512"], "dhchap_dhgroups": ["null", "ffdhe2048"], "dup_host_policy": "allow"}),
            -32602,
            json!({"discovery_filter": "everything"}),
        ),
        ("nvmf_set_max_subsystems", json!({"max_subsystems": 1024}), -32602, json!({"max_subsystems": true})),
        ("nvmf_set_crdt", json!({"crdt1": 0, "crdt2": 0, "crdt3": 0}), -32602, json!({"crdt1": 65536})),
        (
            "iscsi_set_options",
            json!({"node_base": "iqn.2016-06.io.spdk", "max_sessions": 128, "nop_timeout": 60, "immediate_data": true}),
            -32602,
            json!({"max_sessions": "128"}),
        ),
        ("framework_set_scheduler", json!({"name": "static"}), -32603, json!({"name": "static", "load_limit": 20})),
        ("scheduler_set_options", json!({"scheduling_core": 0}), -32602, json!({"scheduling_core": "zero"})),
        ("keyring_linux_set_options", json!({"enable": false}), -32602, json!({"enable": 0})),
        (
            "fsdev_set_opts",
            json!({"fsdev_io_pool_size": 65535, "fsdev_io_cache_size": 256}),
            -32602,
            json!({"fsdev_io_pool_size": -5}),
        ),
    ]
}

#[test]
fn spdk_option_methods_are_real_rpcs_with_spdk_schemas() {
    let dir = TempDir::new("options");
    let d = Daemon::start(&dir, &["--wait-for-rpc"]);
    let methods = d.call("rpc_get_methods", None);
    let startup = d.call("rpc_get_methods", Some(json!({"current": true})));
    let check = |m: &str, good: Value, code: i64, bad_type: &Value| {
        assert!(methods.as_array().unwrap().iter().any(|x| x == m), "{m} is not in rpc_get_methods");
        let mut unknown = good.clone();
        unknown["no_such_option"] = json!(1);
        let e = d.call_err(m, Some(unknown));
        assert_eq!(e.code as i64, code, "{m} with an unknown parameter: {e:?}");
        let e = d.call_err(m, Some(bad_type.clone()));
        assert_eq!(e.code as i64, code, "{m} with {bad_type}: {e:?}");
        assert_eq!(d.call(m, Some(good)), json!(true), "{m}");
    };
    // Those SPDK allows before framework_start_init, then the runtime-only ones.
    let in_startup = |m: &str| startup.as_array().unwrap().iter().any(|x| x == m);
    for (m, good, code, bad_type) in option_cases().into_iter().filter(|c| in_startup(c.0)) {
        check(m, good, code, &bad_type);
    }
    d.call("framework_start_init", None);
    for (m, good, code, bad_type) in option_cases().into_iter().filter(|c| !in_startup(c.0)) {
        check(m, good, code, &bad_type);
    }
    // What was accepted is reported back, in its subsystem, by framework_get_config and
    // save_config, so a saved config reproduces it.
    let saved = d.call("save_config", None);
    for (m, good, _, _) in option_cases() {
        // iscsi_set_options is written with every member, as SPDK writes it.
        let has = |e: &&Value| match m {
            "iscsi_set_options" => good.as_object().unwrap().iter().all(|(k, v)| &e["params"][k] == v),
            _ => e["params"] == good,
        };
        let found = common::saved_entries(&saved, m).iter().any(has);
        assert!(found, "{m} {good} not in save_config: {saved}");
    }
    for s in saved["subsystems"].as_array().unwrap() {
        let cfg = d.call("framework_get_config", Some(json!({"name": s["subsystem"]})));
        assert_eq!(cfg, s["config"], "framework_get_config {}", s["subsystem"]);
    }
    let cfg = dir.write_json("saved.json", &saved);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    assert_eq!(d2.call("save_config", None), saved, "save_config after a restart with it differs");
    // Only Ferrite's scheduler is accepted (threads stay on their reactors).
    let e = d2.call_err("framework_set_scheduler", Some(json!({"name": "dynamic"})));
    assert_eq!(e.code, -32603, "{e:?}");
    assert_eq!(d2.call("framework_get_scheduler", None)["scheduler_name"], "static");
    // A value that would turn on behaviour Ferrite does not have is refused, by name; SPDK's
    // default of the same member is taken.
    for (m, bad, good) in [
        ("bdev_nvme_set_options", json!({"generate_uuids": true}), json!({"generate_uuids": false})),
        ("bdev_nvme_set_hotplug", json!({"enable": true}), json!({"enable": false})),
    ] {
        let e = d2.call_err(m, Some(bad.clone()));
        let field = bad.as_object().unwrap().keys().next().unwrap().clone();
        assert!(e.code == -32602 && e.message.contains(&field), "{m} {bad}: {e:?}");
        assert_eq!(d2.call(m, Some(good)), json!(true), "{m}: SPDK's default");
    }
}

#[test]
fn startup_state_like_wait_for_rpc() {
    let dir = TempDir::new("startup");
    let d = Daemon::start(&dir, &["--wait-for-rpc"]);
    let e = d.call_err("bdev_get_bdevs", None);
    assert_eq!(e.code, -1, "{e:?}");
    assert!(e.message.contains("framework_start_init"), "{e:?}");
    let current = d.call("rpc_get_methods", Some(json!({"current": true})));
    let current: Vec<&str> = current.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(current.contains(&"framework_start_init") && current.contains(&"bdev_set_options"), "{current:?}");
    assert!(!current.contains(&"bdev_malloc_create"), "{current:?}");
    // framework_wait_init answers once another client starts the framework.
    let sock = d.sock.clone();
    let waiter = std::thread::spawn(move || {
        let mut c = ferrite_rpc::client::RpcClient::connect(&sock, Duration::from_secs(10)).unwrap();
        let t0 = Instant::now();
        let r = c.call("framework_wait_init", None).unwrap();
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.call("framework_start_init", None), json!(true));
    let (r, waited) = waiter.join().unwrap();
    assert_eq!(r, json!(true));
    assert!(waited >= Duration::from_millis(250), "framework_wait_init returned before init: {waited:?}");
    let e = d.call_err("framework_start_init", None);
    assert_eq!(e.code, -1, "{e:?}");
    let e = d.call_err("bdev_set_options", Some(json!({"bdev_io_pool_size": 1024})));
    assert_eq!(e.code, -1, "{e:?}");
    assert!(d.bdevs().is_empty());
    assert_eq!(d.call("framework_wait_init", None), json!(true));
}

#[test]
fn log_methods() {
    let dir = TempDir::new("logm");
    let d = Daemon::start(&dir, &[]);
    assert_eq!(d.call("log_get_print_level", None), "INFO");
    for lvl in ["ERROR", "WARNING", "NOTICE", "INFO", "DEBUG"] {
        assert_eq!(d.call("log_set_level", Some(json!({"level": lvl}))), json!(true));
        assert_eq!(d.call("log_get_level", None), lvl);
        assert_eq!(d.call("log_set_print_level", Some(json!({"level": lvl.to_lowercase()}))), json!(true));
        assert_eq!(d.call("log_get_print_level", None), lvl);
    }
    // SPDK: an unknown level is -32602 "invalid log level"; params that do not decode, -32603.
    assert_eq!(d.call_err("log_set_level", Some(json!({"level": "LOUD"}))).code, -32602);
    assert_eq!(d.call_err("log_set_level", Some(json!({"lvl": "INFO"}))).code, -32603);
    let flags = d.call("log_get_flags", None);
    assert_eq!(flags["bdev"], false, "{flags}");
    assert_eq!(d.call("log_set_flag", Some(json!({"flag": "bdev"}))), json!(true));
    assert_eq!(d.call("log_get_flags", None)["bdev"], true);
    assert_eq!(d.call("log_clear_flag", Some(json!({"flag": "bdev"}))), json!(true));
    assert_eq!(d.call("log_get_flags", None)["bdev"], false);
    assert_eq!(d.call_err("log_set_flag", Some(json!({"flag": "nonsense"}))).code, -32602);
    // Print level ERROR silences an info line the daemon would otherwise log.
    d.call("log_set_print_level", Some(json!({"level": "ERROR"})));
    d.call("bdev_null_create", Some(json!({"name": "Quiet", "num_blocks": 8, "block_size": 512})));
    d.call("bdev_null_delete", Some(json!({"name": "Quiet"})));
    d.call("log_set_print_level", Some(json!({"level": "INFO"})));
    d.call("bdev_null_create", Some(json!({"name": "Loud", "num_blocks": 8, "block_size": 512})));
    d.call("bdev_null_delete", Some(json!({"name": "Loud"})));
    std::thread::sleep(Duration::from_millis(100));
    let err = d.proc.stderr();
    assert!(!err.contains("bdev Quiet"), "{err}");
    assert!(err.contains("bdev Loud"), "{err}");
    // Lines carry SPDK's wall-clock time, the level, the thread and the component.
    let loud = err.lines().find(|l| l.contains("bdev Loud")).unwrap();
    assert!(timestamped(loud), "{loud}");
    assert!(loud[29..].starts_with("INFO ") && loud.contains(" bdev: "), "{loud}");
    assert_eq!(d.call("log_enable_timestamps", Some(json!({"enabled": false}))), json!(true));
    assert_eq!(d.call_err("log_enable_timestamps", Some(json!({"on": false}))).code, -32603);
    d.call("bdev_null_create", Some(json!({"name": "Untimed", "num_blocks": 8, "block_size": 512})));
    std::thread::sleep(Duration::from_millis(100));
    let err = d.proc.stderr();
    let untimed = err.lines().find(|l| l.contains("bdev Untimed")).unwrap();
    assert!(untimed.starts_with("INFO "), "{untimed}");
}

/// True if `line` starts with a time as SPDK prints it: `[2026-11-28 23:50:29.490081] `.
fn timestamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 29
        && b[0] == b'['
        && b[27] == b']'
        && [5, 8, 11, 14, 17, 20].iter().zip(b"-- ::.").all(|(&i, &c)| b[i] == c)
        && line[1..5].parse::<u32>().is_ok()
}

#[test]
fn json_log_lines_for_collectors() {
    let dir = TempDir::new("logjson");
    let d = Daemon::start(&dir, &["--log-format", "json"]);
    d.call("bdev_null_create", Some(json!({"name": "Jsonl", "num_blocks": 8, "block_size": 512})));
    std::thread::sleep(Duration::from_millis(100));
    let err = d.proc.stderr();
    let mut seen = false;
    for line in err.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        for k in ["time", "level", "thread", "component", "message"] {
            assert!(v.get(k).is_some(), "{k} missing: {line}");
        }
        if v["message"].as_str().unwrap().contains("bdev Jsonl") {
            assert_eq!((v["level"].as_str(), v["component"].as_str()), (Some("INFO"), Some("bdev")), "{line}");
            seen = true;
        }
    }
    assert!(seen, "no line for the new bdev: {err}");
}

#[test]
fn thread_methods() {
    let dir = TempDir::new("threads");
    let d = Daemon::start_with(&dir, "rpc.sock", "0x3", &["--no-pin", "--buf-heap-budget", "16"]);
    std::thread::sleep(Duration::from_millis(50));
    let s = d.call("thread_get_stats", None);
    assert!(s["tick_rate"].as_u64().unwrap() > 0, "{s}");
    let threads = s["threads"].as_array().unwrap();
    let names: Vec<&str> = threads.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["app_thread", "reactor_1"], "{s}");
    for (i, t) in threads.iter().enumerate() {
        assert_eq!(t["id"], i as u64 + 1, "{t}");
        assert!(t["busy"].as_u64().unwrap() + t["idle"].as_u64().unwrap() > 0, "{t}");
        for k in ["cpumask", "active_pollers_count", "timed_pollers_count", "paused_pollers_count"] {
            assert!(!t[k].is_null(), "{k} missing: {t}");
        }
        // Ferrite's addition: the reactor's buffer pool and its heap budget.
        assert_eq!(t["buffers"]["heap_budget"], 16u64 << 20, "--buf-heap-budget is applied: {t}");
        assert!(t["buffers"]["small_free"].as_u64().unwrap() > 0, "{t}");
    }
    assert_eq!(threads[1]["cpumask"], "2");
    let p = d.call("thread_get_pollers", None);
    assert_eq!(p["threads"].as_array().unwrap().len(), 2, "{p}");
    for k in ["active_pollers", "timed_pollers", "paused_pollers"] {
        assert!(p["threads"][0][k].is_array(), "{p}");
    }
    let c = d.call("thread_get_io_channels", None);
    assert_eq!(c["threads"][1]["name"], "reactor_1", "{c}");
    assert!(c["threads"][0]["io_channels"].is_array(), "{c}");
    let r = d.call("framework_get_reactors", None);
    assert_eq!(r["reactors"][0]["lw_threads"][0]["name"], "app_thread", "{r}");
}

// ---- SPDK itself ----

/// A running spdk_tgt, killed on drop.
struct SpdkTgt {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl SpdkTgt {
    fn start(spdk: &Path, dir: &TempDir, name: &str, json: Option<&Path>) -> SpdkTgt {
        let sock = dir.join(&format!("{name}.sock"));
        let log = dir.join(&format!("{name}.log"));
        let mut cmd = Command::new(spdk.join("build/bin/spdk_tgt"));
        cmd.args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()));
        if let Some(j) = json {
            cmd.arg("--json").arg(j);
        }
        let child = cmd.spawn().expect("spawn spdk_tgt");
        let mut t = SpdkTgt { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = t.child.try_wait().unwrap() {
                panic!("spdk_tgt exited ({st}); log:\n{}", t.log());
            }
            if t.sock.exists() && spdk_rpc_py(spdk, &t.sock, &["framework_wait_init"], None).status.success() {
                return t;
            }
            assert!(Instant::now() < deadline, "spdk_tgt did not start; log:\n{}", t.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SpdkTgt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs SPDK v26.05's own scripts/rpc.py.
fn spdk_rpc_py(spdk: &Path, sock: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new("python3");
    cmd.arg(spdk.join("scripts/rpc.py")).arg("-s").arg(sock).args(args).env("PYTHONPATH", spdk.join("python"));
    run_with_stdin(cmd, stdin)
}

fn run_with_stdin(mut cmd: Command, stdin: Option<&str>) -> Output {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut pipe = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        pipe.write_all(s.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn ok(out: Output, what: &str) -> String {
    let text = common::text(&out.stdout);
    assert!(out.status.success(), "{what} failed: {text}{}", common::text(&out.stderr));
    text
}

/// Per subsystem, each entry's method and parameter names.
type Shape = Vec<(String, Vec<(String, Vec<String>)>)>;

/// A client command line for a socket.
type ClientCmd = Box<dyn Fn(&Path) -> Command>;

/// The methods and parameter names of each subsystem's entries (values differ between runs).
fn shape(doc: &Value) -> Shape {
    doc["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let entries = s["config"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let mut keys: Vec<String> =
                        e["params"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
                    keys.sort();
                    (e["method"].as_str().unwrap().to_string(), keys)
                })
                .collect();
            (s["subsystem"].as_str().unwrap().to_string(), entries)
        })
        .collect()
}

/// SPDK's save_config with a malloc and a null bdev: made by spdk_tgt now when $SPDK_DIR is
/// set (and checked against the committed fixture, which it was captured from), else the
/// fixture.
fn spdk_saved_config(dir: &TempDir) -> Value {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let spdk = match common::spdk_dir() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("note: using the committed spdk_tgt save_config fixture ({why})");
            return fixture;
        }
    };
    let tgt = SpdkTgt::start(&spdk, dir, "spdk-src", None);
    ok(spdk_rpc_py(&spdk, &tgt.sock, &["bdev_malloc_create", "-b", "Malloc0", "16", "512"], None), "malloc");
    ok(spdk_rpc_py(&spdk, &tgt.sock, &["bdev_null_create", "Null0", "64", "512"], None), "null");
    let fresh: Value = serde_json::from_str(&ok(spdk_rpc_py(&spdk, &tgt.sock, &["save_config"], None), "save_config"))
        .expect("SPDK's save_config is JSON");
    assert_eq!(shape(&fresh), shape(&fixture), "spdk_tgt's save_config no longer matches the fixture");
    fresh
}

/// Checks that Ferrite applied everything in SPDK's config: its bdevs and, reported back by
/// save_config in the same subsystem, every option entry.
fn assert_applied(d: &Daemon, spdk_cfg: &Value) {
    let bdevs = d.bdevs();
    for (name, module) in [("Malloc0", "bdev_malloc_create"), ("Null0", "bdev_null_create")] {
        let b = common::find_bdev(&bdevs, name).unwrap_or_else(|| panic!("{name} missing: {bdevs:?}"));
        let entry = sub_config(spdk_cfg, "bdev").unwrap().iter().find(|e| e["method"] == module).unwrap();
        assert_eq!(b["uuid"], entry["params"]["uuid"], "{name}");
        assert_eq!(b["num_blocks"], entry["params"]["num_blocks"], "{name}");
    }
    let ours = d.call("save_config", None);
    for (sub, entry) in option_entries(spdk_cfg) {
        let cfg = sub_config(&ours, &sub).unwrap_or_else(|| panic!("subsystem {sub} missing: {ours}"));
        assert!(cfg.contains(&entry), "{sub}: {entry} not reported back: {cfg:?}");
    }
}

#[test]
fn spdk_save_config_loads_in_ferrite() {
    let dir = TempDir::new("spdk2fer");
    let spdk_cfg = spdk_saved_config(&dir);
    let text = serde_json::to_string_pretty(&spdk_cfg).unwrap();

    // 1. ferrite serve --json.
    let path = dir.write_json("spdk.json", &spdk_cfg);
    let d = Daemon::start(&dir, &["--json", path.to_str().unwrap()]);
    assert_applied(&d, &spdk_cfg);
    drop(d);

    // 2. SPDK's rpc.py load_config into a daemon waiting in the startup state (the methods
    //    only allowed before framework_start_init are applied too), by both clients.
    let mut clients: Vec<(String, ClientCmd)> = Vec::new();
    match common::spdk_python_dir() {
        Ok(spdk) => clients.push((
            "rpc.py v26.05".into(),
            Box::new(move |sock: &Path| {
                let mut c = Command::new("python3");
                c.arg(spdk.join("scripts/rpc.py")).arg("-s").arg(sock).env("PYTHONPATH", spdk.join("python"));
                c
            }),
        )),
        Err(why) => eprintln!("SKIP rpc.py v26.05 load_config: {why}"),
    }
    match std::env::var("SPDK_RPC") {
        Ok(bin) => clients.push((
            "spdk-rpc (PyPI)".into(),
            Box::new(move |sock: &Path| {
                let mut c = Command::new(&bin);
                c.arg("-s").arg(sock);
                c
            }),
        )),
        Err(_) => eprintln!("SKIP spdk-rpc (PyPI) load_config: SPDK_RPC is not set (scripts/test.sh sets it)"),
    }
    for (i, (what, client)) in clients.iter().enumerate() {
        let d = Daemon::start_with(&dir, &format!("w{i}.sock"), "0x1", &["--wait-for-rpc"]);
        let mut cmd = client(&d.sock);
        cmd.arg("load_config");
        let out = run_with_stdin(cmd, Some(&text));
        let says = common::text(&out.stdout) + &common::text(&out.stderr);
        assert!(out.status.success(), "{what} load_config: {says}");
        assert!(!says.contains("skipped"), "{what} skipped entries: {says}");
        assert_applied(&d, &spdk_cfg);
        // And into a running daemon: the startup-only entries are skipped (as SPDK does),
        // the bdevs are created.
        let r = Daemon::start_with(&dir, &format!("r{i}.sock"), "0x1", &[]);
        let mut cmd = client(&r.sock);
        cmd.arg("load_config");
        let out = run_with_stdin(cmd, Some(&text));
        assert!(out.status.success(), "{what} load_config at runtime: {}", common::text(&out.stderr));
        let mut names = r.bdev_names();
        names.sort();
        assert_eq!(names, ["Malloc0", "Null0"], "{what}");
    }
}

#[test]
fn ferrite_save_config_loads_in_spdk_tgt() {
    let spdk = match common::spdk_dir() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIP ferrite_save_config_loads_in_spdk_tgt: {why}");
            return;
        }
    };
    let dir = TempDir::new("fer2spdk");
    let d = Daemon::start(&dir, &[]);
    let file = dir.file_filled("disk.img", 4 << 20, 0);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 4096})));
    d.call("bdev_null_create", Some(json!({"name": "N0", "num_blocks": 1024, "block_size": 512})));
    d.call("bdev_uring_create", Some(json!({"name": "U0", "filename": file.to_str().unwrap(), "block_size": 512})));
    d.call("bdev_nvme_set_hotplug", Some(json!({"enable": false, "period_us": 200000})));
    d.call("framework_set_scheduler", Some(json!({"name": "static"})));
    let saved = d.call("save_config", None);
    let cfg = dir.write_json("ferrite.json", &saved);

    let tgt = SpdkTgt::start(&spdk, &dir, "spdk-load", Some(&cfg));
    let bdevs: Value =
        serde_json::from_str(&ok(spdk_rpc_py(&spdk, &tgt.sock, &["bdev_get_bdevs"], None), "bdev_get_bdevs")).unwrap();
    let ours = d.bdevs();
    for name in ["M0", "N0", "U0"] {
        let theirs = common::find_bdev(bdevs.as_array().unwrap(), name)
            .unwrap_or_else(|| panic!("spdk_tgt lacks {name}; log:\n{}", tgt.log()));
        let mine = common::find_bdev(&ours, name).unwrap();
        for k in ["uuid", "num_blocks", "block_size"] {
            assert_eq!(theirs[k], mine[k], "{name}.{k}");
        }
    }
    let hotplug = ok(spdk_rpc_py(&spdk, &tgt.sock, &["framework_get_config", "bdev"], None), "framework_get_config");
    assert!(hotplug.contains("200000"), "bdev_nvme_set_hotplug not applied by SPDK: {hotplug}");
    // rpc.py load_config into a running spdk_tgt works too.
    let tgt2 = SpdkTgt::start(&spdk, &dir, "spdk-rpcload", None);
    let text = serde_json::to_string(&saved).unwrap();
    ok(spdk_rpc_py(&spdk, &tgt2.sock, &["load_config"], Some(&text)), "rpc.py load_config into spdk_tgt");
    let names = ok(spdk_rpc_py(&spdk, &tgt2.sock, &["bdev_get_bdevs"], None), "bdev_get_bdevs");
    for name in ["M0", "N0", "U0"] {
        assert!(names.contains(&format!("\"{name}\"")), "{name} missing: {names}");
    }
}

// ---- every method Ferrite shares with SPDK, through SPDK v26.05's rpc.py ----

/// SPDK v26.05's rpc.py against one daemon socket.
struct Py<'a> {
    spdk: &'a Path,
    sock: PathBuf,
}

impl Py<'_> {
    /// Runs `args`; it must succeed. Its output as JSON, or as a JSON string if it is not JSON.
    fn ok(&self, args: &[&str]) -> Value {
        let out = ok(spdk_rpc_py(self.spdk, &self.sock, args, None), &format!("rpc.py {args:?}"));
        serde_json::from_str(out.trim()).unwrap_or_else(|_| json!(out.trim()))
    }

    /// Runs `args`; it must fail with JSON-RPC `code` and a message containing `says`.
    fn refused(&self, args: &[&str], code: i64, says: &str) {
        let out = spdk_rpc_py(self.spdk, &self.sock, args, None);
        let text = common::text(&out.stdout) + &common::text(&out.stderr);
        assert!(!out.status.success(), "rpc.py {args:?} was accepted: {text}");
        assert!(text.contains(&format!("\"code\": {code}")) && text.contains(says), "rpc.py {args:?}: {text}");
    }

    fn bdev(&self, name: &str) -> Value {
        self.ok(&["bdev_get_bdevs", "-b", name])[0].clone()
    }
}

/// The params of `method` in a framework_get_config answer.
fn entry<'a>(cfg: &'a Value, method: &str) -> &'a Value {
    let e = cfg.as_array().unwrap().iter().find(|e| e["method"] == method);
    &e.unwrap_or_else(|| panic!("{method} not in {cfg}"))["params"]
}

/// Every method Ferrite shares with SPDK v26.05, driven by SPDK's rpc.py with the options it
/// offers (the defaults it always sends included), and the effect checked. Parameters asking
/// for what Ferrite lacks are refused naming the parameter (docs/RPC_COMPAT.md lists them all).
#[test]
fn every_shared_method_through_spdk_rpc_py() {
    let spdk = match common::spdk_dir() {
        Ok(s) => s,
        Err(why) => {
            println!("SKIP every_shared_method_through_spdk_rpc_py: {why}");
            return;
        }
    };
    let dir = TempDir::new("pyall");
    let d = Daemon::start_with(&dir, "t.sock", "0x1", &["--wait-for-rpc"]);
    let py = Py { spdk: &spdk, sock: d.sock.clone() };

    // Startup state: the option methods.
    let startup = py.ok(&["rpc_get_methods", "--current"]);
    assert!(startup.as_array().unwrap().iter().any(|m| m == "framework_start_init"), "{startup}");
    let all = py.ok(&["rpc_get_methods", "--include-aliases"]);
    assert!(all.as_array().unwrap().iter().any(|m| m == "bdev_aio_create"), "{all}");
    py.ok(&[
        "iobuf_set_options",
        "--small-pool-count",
        "8192",
        "--large-pool-count",
        "1024",
        "--small-bufsize",
        "8192",
        "--large-bufsize",
        "135168",
    ]);
    py.ok(&[
        "accel_set_options",
        "--small-cache-size",
        "128",
        "--large-cache-size",
        "16",
        "--task-count",
        "2048",
        "--sequence-count",
        "2048",
        "--buf-count",
        "2048",
    ]);
    py.ok(&["sock_set_default_impl", "-i", "posix"]);
    py.ok(&[
        "sock_impl_set_options",
        "-i",
        "posix",
        "-r",
        "2097152",
        "-s",
        "2097152",
        "-p",
        "0",
        "--recv-pipe",
        "--no-quickack",
        "--zerocopy-send-server",
        "--no-zerocopy-send-client",
        "--zerocopy-threshold",
        "0",
        "--tls-version",
        "0",
        "--no-ktls",
    ]);
    py.ok(&[
        "bdev_set_options",
        "-p",
        "65535",
        "-c",
        "256",
        "--auto-examine",
        "--iobuf-small-cache-size",
        "128",
        "--iobuf-large-cache-size",
        "16",
    ]);
    // Behaviour Ferrite does not have: refused by name; SPDK's default is taken.
    py.refused(&["keyring_linux_set_options", "--enable"], -32602, "enable");
    py.ok(&["scheduler_set_options", "-s", "0"]);
    py.ok(&["framework_set_scheduler", "static"]);
    py.ok(&["bdev_raid_set_options", "-w", "2048", "-b", "0"]);
    py.ok(&["bdev_raid_set_options", "-w", "1024", "-b", "0"]);
    py.ok(&["bdev_iscsi_set_options", "-t", "30"]);
    py.ok(&[
        "bdev_nvme_set_options",
        "-a",
        "none",
        "-t",
        "0",
        "-k",
        "10000",
        "-e",
        "0",
        "--dhchap-digests",
        "sha256",
        "--policy",
        "active_passive",
    ]);
    py.ok(&[
        "nvmf_set_config",
        "-d",
        "match_any",
        "--dhchap-digests",
        "sha256,sha384",
        "--dhchap-dhgroups",
        "null",
        "--dup-host-policy",
        "allow",
    ]);
    py.ok(&["nvmf_set_max_subsystems", "-x", "1024"]);
    py.ok(&["nvmf_set_crdt", "-t1", "0", "-t2", "0", "-t3", "0"]);
    py.ok(&["iscsi_set_options", "-b", "iqn.2016-06.io.spdk", "-a", "128", "-o", "60", "-i"]);
    py.ok(&["framework_start_init"]);
    py.ok(&["framework_wait_init"]);
    py.ok(&["fsdev_set_opts", "65535", "256"]);
    // Runtime option methods.
    py.ok(&["bdev_nvme_set_hotplug", "--no-hotplug", "-r", "200000"]);
    let subs = py.ok(&["framework_get_subsystems"]);
    assert!(subs.as_array().unwrap().iter().any(|s| s["subsystem"] == "bdev"), "{subs}");
    let cfg = |name: &str| py.ok(&["framework_get_config", name, "--no-with-batches"]);
    assert_eq!(entry(&cfg("iobuf"), "iobuf_set_options")["small_pool_count"], 8192);
    assert_eq!(entry(&cfg("accel"), "accel_set_options")["task_count"], 2048);
    assert_eq!(entry(&cfg("sock"), "sock_impl_set_options")["recv_buf_size"], 2097152);
    assert_eq!(entry(&cfg("bdev"), "bdev_set_options")["bdev_io_pool_size"], 65535);
    assert_eq!(entry(&cfg("bdev"), "bdev_raid_set_options")["process_window_size_kb"], 1024);
    assert_eq!(entry(&cfg("bdev"), "bdev_iscsi_set_options")["timeout_sec"], 30);
    assert_eq!(entry(&cfg("bdev"), "bdev_nvme_set_options")["keep_alive_timeout_ms"], 10000);
    assert_eq!(entry(&cfg("bdev"), "bdev_nvme_set_hotplug")["period_us"], 200000);
    assert_eq!(entry(&cfg("nvmf"), "nvmf_set_max_subsystems")["max_subsystems"], 1024);
    assert_eq!(entry(&cfg("nvmf"), "nvmf_set_config")["dup_host_policy"], "allow");
    assert_eq!(entry(&cfg("nvmf"), "nvmf_set_crdt")["crdt1"], 0);
    assert_eq!(entry(&cfg("iscsi"), "iscsi_set_options")["max_sessions"], 128);
    assert_eq!(entry(&cfg("fsdev"), "fsdev_set_opts")["fsdev_io_pool_size"], 65535);
    assert!(
        !cfg("keyring").to_string().contains("keyring_linux_set_options"),
        "a refused call is not kept: {}",
        cfg("keyring")
    );
    assert_eq!(py.ok(&["framework_get_scheduler"])["scheduler_name"], "static");
    assert!(py.ok(&["spdk_get_version"])["version"].as_str().unwrap().contains("Ferrite"));

    // aio: rpc.py always sends nowait (false), and --no-wait sends true; both are accepted.
    let img = dir.file_filled("aio.img", 4 << 20, 0x5a);
    let img = img.to_str().unwrap();
    let img2 = dir.file_filled("aio2.img", 2 << 20, 0);
    let img2 = img2.to_str().unwrap();
    let u = "0d3b1e6c-9d59-4f34-8a48-9c9b8d7b2a11";
    assert_eq!(py.ok(&["bdev_aio_create", img, "A0", "4096", "-u", u]), "A0");
    assert_eq!(py.ok(&["bdev_aio_create", img2, "A1", "512", "--no-wait", "--fallocate"]), "A1");
    let a0 = py.bdev("A0");
    assert_eq!(
        (a0["num_blocks"].as_u64(), a0["block_size"].as_u64(), a0["uuid"].as_str()),
        (Some(1024), Some(4096), Some(u))
    );
    assert_eq!(py.bdev("A1")["num_blocks"], 4096);
    py.ok(&["bdev_aio_create", img, "RO", "-r"]);
    assert_eq!(py.bdev("RO")["driver_specific"]["aio"]["readonly"], true, "{}", py.bdev("RO"));
    std::fs::OpenOptions::new().write(true).open(img2).unwrap().set_len(3 << 20).unwrap();
    py.ok(&["bdev_aio_rescan", "A1"]);
    assert_eq!(py.bdev("A1")["num_blocks"], 6144);
    let uimg = dir.file_filled("uring.img", 1 << 20, 0);
    let uimg = uimg.to_str().unwrap();
    assert_eq!(py.ok(&["bdev_uring_create", uimg, "U0", "512", "-u", "6f1c5e2a-1111-4a2b-9c3d-000000000001"]), "U0");
    std::fs::OpenOptions::new().write(true).open(uimg).unwrap().set_len(2 << 20).unwrap();
    py.ok(&["bdev_uring_rescan", "U0"]);
    assert_eq!(py.bdev("U0")["num_blocks"], 4096);

    // malloc and null with their layout options: the defaults rpc.py sends are accepted,
    // metadata/DIF (not in Ferrite) refused naming the parameter.
    py.ok(&[
        "bdev_malloc_create",
        "-b",
        "M0",
        "-u",
        "11111111-2222-3333-4444-555555555555",
        "32",
        "512",
        "-p",
        "4096",
        "-o",
        "128",
    ]);
    let m0 = py.bdev("M0");
    assert_eq!((m0["num_blocks"].as_u64(), m0["block_size"].as_u64()), (Some(65536), Some(512)), "{m0}");
    assert_eq!(m0["optimal_io_boundary"], 128, "{m0}");
    py.refused(&["bdev_malloc_create", "-b", "M1", "8", "512", "-m", "8"], -32602, "md_size");
    py.ok(&["bdev_null_create", "N0", "64", "512", "-u", "22222222-2222-3333-4444-555555555555", "-p", "4096"]);
    assert_eq!(py.bdev("N0")["num_blocks"], 131072);
    py.refused(&["bdev_null_create", "N1", "8", "512", "-t", "1", "-m", "8"], -32602, "md_size");
    py.ok(&["bdev_null_resize", "N0", "128"]);
    assert_eq!(py.bdev("N0")["num_blocks"], 262144);

    // Virtual bdevs.
    py.ok(&["bdev_passthru_create", "-b", "A1", "-p", "P0", "-u", "33333333-2222-3333-4444-555555555555"]);
    assert_eq!(py.bdev("P0")["uuid"], "33333333-2222-3333-4444-555555555555");
    py.ok(&["bdev_delay_create", "-b", "P0", "-d", "D0", "-r", "10", "-t", "20", "-w", "30", "-n", "40"]);
    py.ok(&["bdev_delay_update_latency", "D0", "p99_write", "50"]);
    let dly = py.bdev("D0")["driver_specific"]["delay"].clone();
    assert_eq!((dly["avg_read_latency"].as_u64(), dly["p99_write_latency"].as_u64()), (Some(10), Some(50)), "{dly}");
    py.ok(&["bdev_error_create", "D0"]);
    py.ok(&["bdev_error_inject_error", "EE_D0", "write", "failure", "-n", "2"]);
    py.ok(&["bdev_error_resume_pending", "EE_D0"]);
    py.ok(&["bdev_error_delete", "EE_D0"]);
    py.ok(&["bdev_delay_delete", "D0"]);
    py.ok(&["bdev_passthru_delete", "P0"]);

    // Statistics, QoS, histograms.
    py.ok(&[
        "bdev_set_qos_limit",
        "M0",
        "--rw-ios-per-sec",
        "10000",
        "--rw-mbytes-per-sec",
        "100",
        "--r-mbytes-per-sec",
        "50",
        "--w-mbytes-per-sec",
        "50",
    ]);
    assert_eq!(py.bdev("M0")["assigned_rate_limits"]["rw_ios_per_sec"], 10000);
    py.ok(&[
        "bdev_enable_histogram",
        "M0",
        "--histogram",
        "--granularity",
        "7",
        "--min-nsec",
        "0",
        "--max-nsec",
        "1000000000",
    ]);
    assert!(py.ok(&["bdev_get_histogram", "M0"])["histogram"].is_string());
    py.ok(&["bdev_enable_histogram", "M0", "--no-histogram"]);
    let st = py.ok(&["bdev_get_iostat", "--names", "M0", "-c"]);
    assert_eq!(st["name"], "M0", "{st}");
    py.ok(&["bdev_reset_iostat", "-b", "M0", "-m", "all"]);
    py.ok(&["bdev_get_bdevs", "-b", "M0", "-t", "100"]);
    py.ok(&["bdev_wait_for_examine"]);
    py.refused(&["bdev_examine", "-b", "M0"], -22, "auto examine");

    // Logical volumes.
    py.ok(&[
        "bdev_lvol_create_lvstore",
        "M0",
        "lvs",
        "-c",
        "1048576",
        "--clear-method",
        "unmap",
        "-m",
        "100",
        "-s",
        "4096",
    ]);
    let lvs = py.ok(&["bdev_lvol_get_lvstores", "-l", "lvs"]);
    assert_eq!(lvs[0]["cluster_size"], 1048576, "{lvs}");
    let lvs_uuid = lvs[0]["uuid"].as_str().unwrap().to_string();
    py.ok(&["bdev_lvol_create", "-l", "lvs", "-t", "-c", "none", "lv1", "4"]);
    assert_eq!(py.bdev("lvs/lv1")["num_blocks"], 8192);
    py.ok(&["bdev_lvol_create", "-u", &lvs_uuid, "-t", "lv2", "4"]);
    py.ok(&["bdev_lvol_snapshot", "lvs/lv1", "snap1"]);
    py.ok(&["bdev_lvol_clone", "lvs/snap1", "clone1"]);
    py.ok(&["bdev_lvol_inflate", "lvs/clone1"]);
    py.ok(&["bdev_lvol_set_parent", "lvs/lv2", "lvs/snap1"]);
    py.ok(&["bdev_lvol_decouple_parent", "lvs/lv2"]);
    py.ok(&["bdev_lvol_resize", "lvs/lv1", "8"]);
    assert_eq!(py.bdev("lvs/lv1")["num_blocks"], 16384);
    py.ok(&["bdev_lvol_rename", "lvs/lv1", "lv1b"]);
    py.ok(&["bdev_lvol_set_read_only", "lvs/lv1b"]);
    let lvols = py.ok(&["bdev_lvol_get_lvols", "-l", "lvs"]);
    assert!(lvols.as_array().unwrap().iter().any(|l| l["name"] == "lv1b"), "{lvols}");
    py.ok(&["bdev_lvol_get_lvols", "-u", &lvs_uuid]);
    py.ok(&["bdev_lvol_clone_bdev", "RO", "lvs", "eclone"]);
    assert_eq!(py.bdev("lvs/eclone")["num_blocks"], 8192);
    py.ok(&["bdev_lvol_rename_lvstore", "lvs", "lvs2"]);
    py.ok(&["bdev_lvol_grow_lvstore", "-l", "lvs2"]);
    py.ok(&["bdev_lvol_get_lvstores", "-u", &lvs_uuid]);
    for l in ["lvs2/eclone", "lvs2/clone1", "lvs2/lv2", "lvs2/lv1b", "lvs2/snap1"] {
        py.ok(&["bdev_lvol_delete", l]);
    }
    py.ok(&["bdev_lvol_delete_lvstore", "-l", "lvs2"]);

    // NVMe/TCP target, served to a second daemon that attaches with bdev_nvme.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let nqn = "nqn.2016-06.io.spdk:cnode1";
    let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:0b2d2b66-4f0a-4b7c-8a27-2a7a0d4e0c01";
    py.ok(&[
        "nvmf_create_transport",
        "-t",
        "TCP",
        "-q",
        "128",
        "-m",
        "7",
        "-c",
        "4096",
        "-i",
        "131072",
        "-u",
        "131072",
        "-a",
        "128",
        "-y",
        "0",
        "-x",
        "1",
        "-z",
        "--masked-oncs",
        "reservs,nvmcpys",
    ]);
    py.refused(&["nvmf_create_transport", "-t", "TCP", "--masked-oncs", "all"], -32602, "masked_oncs");
    let tr = py.ok(&["nvmf_get_transports", "--trtype", "TCP"]);
    assert_eq!((tr[0]["max_queue_depth"].as_u64(), tr[0]["c2h_success"].as_bool()), (Some(128), Some(true)), "{tr}");
    py.ok(&[
        "nvmf_create_subsystem",
        nqn,
        "-s",
        "SPDK001",
        "-d",
        "Ferrite ctrl",
        "-m",
        "8",
        "-r",
        "-i",
        "1",
        "-I",
        "100",
        "--dmrsl",
        "0",
        "--wzsl",
        "0",
    ]);
    py.refused(&["nvmf_create_subsystem", "nqn.2016-06.io.spdk:cnode2", "--dmrsl", "16"], -32602, "dmrsl");
    // SPDK's own defaults, which its save_config writes for every subsystem, load.
    py.ok(&["nvmf_create_subsystem", "nqn.2016-06.io.spdk:cnode3", "--dmrsl", "2097152", "--wzsl", "12"]);
    py.ok(&["nvmf_delete_subsystem", "nqn.2016-06.io.spdk:cnode3"]);
    py.refused(&["nvmf_create_subsystem", "nqn.2016-06.io.spdk:cnode2", "-p"], -32602, "passthrough");
    py.ok(&["nvmf_subsystem_add_ns", nqn, "A0", "-n", "3", "-e", "0102030405060708", "-a", "3", "-N"]);
    py.refused(&["nvmf_subsystem_add_ns", nqn, "N0", "-i"], -32602, "no_auto_visible");
    // A ptpl_file is read when the namespace is added: one that is not SPDK's JSON is refused.
    let bad_ptpl = dir.join("bad.ptpl");
    std::fs::write(&bad_ptpl, "not json").unwrap();
    py.refused(&["nvmf_subsystem_add_ns", nqn, "N0", "-p", bad_ptpl.to_str().unwrap()], -32602, "ptpl_file");
    py.ok(&[
        "nvmf_subsystem_add_listener",
        nqn,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-f",
        "ipv4",
        "-s",
        &port,
        "-n",
        "optimized",
        "-S",
        "posix",
        "--numa-id",
        "0",
    ]);
    py.refused(
        &["nvmf_subsystem_add_listener", nqn, "-t", "tcp", "-a", "127.0.0.1", "-s", "1", "-k"],
        -32602,
        "secure_channel",
    );
    py.ok(&[
        "nvmf_subsystem_listener_set_ana_state",
        nqn,
        "-n",
        "optimized",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-f",
        "ipv4",
        "-s",
        &port,
        "-g",
        "3",
    ]);
    py.ok(&["nvmf_subsystem_add_host", nqn, host_nqn]);
    py.refused(&["nvmf_subsystem_add_host", nqn, host_nqn, "--psk", "key0"], -32602, "psk");
    py.refused(&["nvmf_subsystem_add_host", nqn, host_nqn, "--dhchap-key", "key0"], -32602, "dhchap_key");
    py.ok(&["nvmf_subsystem_allow_any_host", nqn, "--no-allow-any-host"]);
    py.ok(&["nvmf_discovery_add_referral", "-t", "tcp", "-a", "127.0.0.2", "-f", "ipv4", "-s", "4420", "-n", nqn]);
    assert_eq!(py.ok(&["nvmf_discovery_get_referrals"])[0]["subnqn"], nqn);
    py.ok(&["nvmf_discovery_remove_referral", "-t", "tcp", "-a", "127.0.0.2", "-f", "ipv4", "-s", "4420", "-n", nqn]);
    let s = py.ok(&["nvmf_get_subsystems", nqn]);
    assert_eq!((s[0]["serial_number"].as_str(), s[0]["max_namespaces"].as_u64()), (Some("SPDK001"), Some(8)), "{s}");
    assert_eq!(s[0]["namespaces"][0]["nsid"], 3, "{s}");
    assert_eq!(s[0]["namespaces"][0]["eui64"], "0102030405060708", "{s}");
    assert_eq!(py.ok(&["nvmf_subsystem_get_listeners", nqn])[0]["address"]["trsvcid"], port.as_str());

    let h = Daemon::start_with(&dir, "h.sock", "0x1", &[]);
    let hp = Py { spdk: &spdk, sock: h.sock.clone() };
    hp.refused(
        &[
            "bdev_nvme_attach_controller",
            "-b",
            "X",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            nqn,
            "-k",
            "key0",
        ],
        -32602,
        "psk",
    );
    hp.refused(
        &[
            "bdev_nvme_attach_controller",
            "-b",
            "X",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            nqn,
            "--dhchap-key",
            "key0",
        ],
        -32602,
        "dhchap_key",
    );
    let names = hp.ok(&[
        "bdev_nvme_attach_controller",
        "-b",
        "Nv",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-f",
        "ipv4",
        "-s",
        &port,
        "-n",
        nqn,
        "-q",
        host_nqn,
        "-p",
        "0",
        "-x",
        "multipath",
        "-l",
        "-1",
        "-o",
        "1",
        "-u",
        "0",
        "--fabrics-timeout",
        "1000000",
        "--num-io-queues",
        "2",
        "-m",
        "8",
        "--policy",
        "active_active",
        "--selector",
        "round_robin",
        "--min-io",
        "1",
    ]);
    // rpc.py prints the names space-separated.
    assert_eq!(names, "Nvn3", "{names}");
    let nv = hp.bdev("Nvn3");
    assert_eq!((nv["num_blocks"].as_u64(), nv["block_size"].as_u64()), (Some(1024), Some(4096)), "{nv}");
    let ctrl = hp.ok(&["bdev_nvme_get_controllers", "-n", "Nv"]);
    assert_eq!(ctrl[0]["name"], "Nv", "{ctrl}");
    hp.ok(&["bdev_nvme_set_multipath_policy", "-b", "Nvn3", "-p", "active_passive", "-s", "round_robin", "-r", "1"]);
    hp.ok(&["bdev_nvme_reset_controller", "Nv"]);
    let qp = py.ok(&["nvmf_subsystem_get_qpairs", nqn]);
    assert!(!qp.as_array().unwrap().is_empty(), "{qp}");
    let ctrls = py.ok(&["nvmf_subsystem_get_controllers", nqn]);
    assert_eq!(ctrls[0]["hostnqn"], host_nqn, "{ctrls}");
    assert!(py.ok(&["nvmf_get_stats"])["poll_groups"].is_array());
    hp.ok(&["bdev_nvme_detach_controller", "Nv", "-t", "tcp", "-a", "127.0.0.1", "-f", "ipv4", "-s", &port, "-n", nqn]);
    assert!(hp.ok(&["bdev_nvme_get_controllers"]).as_array().unwrap().is_empty());
    // A host removed: its connections go (timeout_ms bounds SPDK's wait; Ferrite's is immediate).
    py.ok(&["nvmf_subsystem_remove_host", nqn, host_nqn, "-T", "1000"]);
    py.ok(&["nvmf_subsystem_remove_listener", nqn, "-t", "tcp", "-a", "127.0.0.1", "-f", "ipv4", "-s", &port]);
    py.ok(&["nvmf_subsystem_remove_ns", nqn, "3"]);
    py.ok(&["nvmf_delete_subsystem", nqn]);
    assert_eq!(py.ok(&["nvmf_get_subsystems"]).as_array().unwrap().len(), 1);

    // iSCSI target (its management plane: nothing listens without the connection engine).
    let iport = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let portal = format!("127.0.0.1:{iport}");
    let tnode = "iqn.2016-06.io.spdk:disk1";
    py.ok(&["iscsi_create_auth_group", "1", "-c", "user:u1 secret:s1 muser:mu1 msecret:ms1,user:u2 secret:s2"]);
    py.ok(&["iscsi_auth_group_add_secret", "1", "-u", "u3", "-s", "s3", "-m", "mu3", "-r", "ms3"]);
    py.ok(&["iscsi_auth_group_remove_secret", "1", "-u", "u2"]);
    py.refused(&["iscsi_auth_group_remove_secret", "1", "-u", "u2"], -32602, "Could not delete secret");
    assert_eq!(py.ok(&["iscsi_get_auth_groups"])[0]["secrets"].as_array().unwrap().len(), 2);
    py.ok(&["iscsi_set_discovery_auth", "-r", "-m", "-g", "1"]);
    py.refused(&["iscsi_set_discovery_auth", "-m"], -32602, "Invalid combination of CHAP params");
    py.ok(&["iscsi_create_portal_group", "1", &portal, "-w"]);
    py.ok(&["iscsi_start_portal_group", "1"]);
    py.refused(&["iscsi_create_portal_group", "2", &portal], -32602, "Invalid parameters");
    py.ok(&["iscsi_portal_group_set_auth", "1", "-r", "-g", "1"]);
    py.ok(&["iscsi_create_initiator_group", "1", "ANY", "127.0.0.1/32"]);
    py.ok(&["iscsi_initiator_group_add_initiators", "1", "-n", "iqn.x", "-m", "10.0.0.0/8"]);
    py.ok(&["iscsi_initiator_group_remove_initiators", "1", "-n", "iqn.x", "-m", "10.0.0.0/8"]);
    py.ok(&["iscsi_create_initiator_group", "2", "!iqn.evil ANY", "ANY"]);
    py.ok(&["iscsi_create_target_node", "disk1", "Disk 1", "N0:0", "1:1", "64", "-g", "1", "-r", "-m", "-H"]);
    py.refused(&["iscsi_create_target_node", "disk2", "x", "N0:1", "1:1", "64"], -32602, "Invalid parameters");
    py.ok(&["iscsi_target_node_add_lun", tnode, "M0", "-i", "3"]);
    py.ok(&["iscsi_target_node_add_pg_ig_maps", tnode, "1:2"]);
    py.ok(&["iscsi_target_node_remove_pg_ig_maps", tnode, "1:2"]);
    py.ok(&["iscsi_target_node_set_auth", tnode, "-d"]);
    py.ok(&["iscsi_target_node_set_redirect", tnode, "1", "-a", "127.0.0.2", "-p", "3260"]);
    py.ok(&["iscsi_target_node_set_redirect", tnode, "1"]);
    py.ok(&["iscsi_target_node_request_logout", tnode, "-t", "1"]);
    let nodes = py.ok(&["iscsi_get_target_nodes"]);
    assert_eq!(
        nodes[0]["luns"],
        json!([{"bdev_name": "N0", "lun_id": 0}, {"bdev_name": "M0", "lun_id": 3}]),
        "{nodes}"
    );
    assert_eq!((nodes[0]["disable_chap"].as_bool(), nodes[0]["header_digest"].as_bool()), (Some(true), Some(true)));
    assert_eq!(py.ok(&["iscsi_get_portal_groups"])[0]["portals"][0]["port"], iport.as_str());
    assert_eq!(py.ok(&["iscsi_get_initiator_groups"])[1]["initiators"], json!(["!iqn.evil", "ANY"]));
    assert_eq!(py.ok(&["iscsi_get_options"])["chap_group"], 1);
    assert_eq!(py.ok(&["iscsi_get_connections"]), json!([]));
    assert_eq!(py.ok(&["iscsi_get_stats"])["running"], 0);
    let saved = py.ok(&["save_config"]);
    assert_eq!(common::saved_entries(&saved, "iscsi_create_target_node").len(), 1, "{saved}");
    py.ok(&["iscsi_delete_target_node", tnode]);
    py.ok(&["iscsi_delete_initiator_group", "2"]);
    py.ok(&["iscsi_delete_initiator_group", "1"]);
    py.ok(&["iscsi_delete_portal_group", "1"]);
    py.ok(&["iscsi_delete_auth_group", "1"]);

    // Logs, threads, reactors.
    py.ok(&["log_set_flag", "bdev"]);
    assert_eq!(py.ok(&["log_get_flags"])["bdev"], true);
    py.ok(&["log_clear_flag", "bdev"]);
    py.ok(&["log_set_level", "DEBUG"]);
    assert_eq!(py.ok(&["log_get_level"]), "DEBUG");
    py.ok(&["log_set_print_level", "ERROR"]);
    assert_eq!(py.ok(&["log_get_print_level"]), "ERROR");
    assert!(py.ok(&["thread_get_stats"])["threads"].is_array());
    assert!(py.ok(&["thread_get_pollers"])["threads"].is_array());
    assert!(py.ok(&["thread_get_io_channels"])["threads"].is_array());
    assert!(py.ok(&["framework_get_reactors"])["reactors"].is_array());

    // Teardown by the delete methods, save_config, then spdk_kill_instance.
    for (m, b) in [
        ("bdev_aio_delete", "A0"),
        ("bdev_aio_delete", "A1"),
        ("bdev_aio_delete", "RO"),
        ("bdev_uring_delete", "U0"),
        ("bdev_null_delete", "N0"),
        ("bdev_malloc_delete", "M0"),
    ] {
        py.ok(&[m, b]);
    }
    let saved = py.ok(&["save_config"]);
    assert!(saved["subsystems"].is_array(), "{saved}");
    assert!(py.ok(&["bdev_get_bdevs"]).as_array().unwrap().is_empty());
    py.ok(&["spdk_kill_instance", "SIGTERM"]);
    let mut d = d;
    assert!(d.proc.expect_exit(Duration::from_secs(10), "daemon after spdk_kill_instance").success());
}

/// SPDK's checks of option values that its own start-up would refuse, so that `save_config`
/// never writes a config SPDK cannot load: a poll group mask that is no core mask (or names a
/// core not running), a bdev_io pool smaller than the caches; and `max_subsystems` 0, which
/// SPDK takes as its default.
#[test]
fn option_values_spdk_refuses_are_refused_and_zero_subsystems_is_the_default() {
    let dir = TempDir::new("options_values");
    let d = Daemon::start(&dir, &["--wait-for-rpc"]);
    for mask in ["zz", "0x", "0x10000"] {
        let e = d.call_err("nvmf_set_config", Some(json!({"poll_groups_mask": mask})));
        assert!(e.code == -32602 && e.message.contains("poll_groups_mask"), "{mask}: {e:?}");
    }
    assert_eq!(d.call("nvmf_set_config", Some(json!({"poll_groups_mask": "0x1"}))), json!(true));
    let e = d.call_err("bdev_set_options", Some(json!({"bdev_io_pool_size": 1, "bdev_io_cache_size": 1000})));
    assert_eq!((e.code, e.message.as_str()), (-32602, "Pool size 1 too small for cache size 1000"));
    assert_eq!(d.call("nvmf_set_max_subsystems", Some(json!({"max_subsystems": 0}))), json!(true));
    d.call("framework_start_init", None);
    d.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    for i in 0..3 {
        let nqn = format!("nqn.2016-06.io.spdk:zero{i}");
        assert_eq!(d.call("nvmf_create_subsystem", Some(json!({"nqn": nqn, "allow_any_host": true}))), json!(true));
    }
    let cfg = d.call("save_config", None).to_string();
    assert!(!cfg.contains("zz") && !cfg.contains("\"bdev_io_pool_size\":1,"), "nothing refused was kept: {cfg}");
}
