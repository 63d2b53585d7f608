//! Bdev and framework JSON-RPC methods against a real `ferrite serve` over its unix socket.

mod common;

use common::{find_bdev, text, Daemon, TempDir};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const NULL_UUID: &str = "0d6f4c3a-6a4e-4b5e-9c1d-2f3e4a5b6c7d";
const MALLOC_UUID: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const URING_UUID: &str = "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e";

fn assert_uuid_like(v: &Value) {
    let s = v.as_str().unwrap_or_else(|| panic!("uuid is not a string: {v}"));
    assert_eq!(s.len(), 36, "{s}");
    assert_eq!(s.matches('-').count(), 4, "{s}");
}

#[test]
fn create_list_and_delete_null_malloc_uring() {
    let dir = TempDir::new("bdevs");
    let img = dir.file_filled("uring.img", 8 << 20, 0);
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();

    // Create one of each (malloc twice: named and unnamed).
    let r = common::call(
        &mut c,
        "bdev_null_create",
        Some(json!({"name": "Null0", "num_blocks": 2048, "block_size": 4096, "uuid": NULL_UUID})),
    );
    assert_eq!(r, json!("Null0"));
    let r = common::call(&mut c, "bdev_malloc_create", Some(json!({"num_blocks": 256, "block_size": 512})));
    assert_eq!(r, json!("Malloc0"), "an unnamed malloc bdev is called Malloc0");
    let r = common::call(
        &mut c,
        "bdev_malloc_create",
        Some(json!({"name": "Mnamed", "num_blocks": 1024, "block_size": 4096, "uuid": MALLOC_UUID})),
    );
    assert_eq!(r, json!("Mnamed"));
    let r = common::call(
        &mut c,
        "bdev_uring_create",
        Some(json!({"name": "Uring0", "filename": img.to_str().unwrap(), "uuid": URING_UUID})),
    );
    assert_eq!(r, json!("Uring0"));

    // Read everything back.
    let bdevs = d.bdevs();
    let mut names: Vec<&str> = bdevs.iter().map(|b| b["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["Malloc0", "Mnamed", "Null0", "Uring0"]);

    let null = find_bdev(&bdevs, "Null0").unwrap();
    assert_eq!(null["block_size"], 4096);
    assert_eq!(null["num_blocks"], 2048);
    assert_eq!(null["product_name"], "Null disk");
    assert_eq!(null["uuid"], NULL_UUID);

    let m0 = find_bdev(&bdevs, "Malloc0").unwrap();
    assert_eq!(m0["block_size"], 512);
    assert_eq!(m0["num_blocks"], 256);
    assert_eq!(m0["product_name"], "Malloc disk");
    assert_uuid_like(&m0["uuid"]);

    let mn = find_bdev(&bdevs, "Mnamed").unwrap();
    assert_eq!(mn["block_size"], 4096);
    assert_eq!(mn["num_blocks"], 1024);
    assert_eq!(mn["product_name"], "Malloc disk");
    assert_eq!(mn["uuid"], MALLOC_UUID);

    let u = find_bdev(&bdevs, "Uring0").unwrap();
    assert_eq!(u["block_size"], 512, "a file's default block size is 512");
    assert_eq!(u["num_blocks"], (8u64 << 20) / 512);
    assert_eq!(u["product_name"], "URING bdev");
    assert_eq!(u["uuid"], URING_UUID);
    assert_eq!(u["driver_specific"]["uring"]["filename"], img.to_str().unwrap());

    // Every uuid is distinct.
    let mut uuids: Vec<&str> = bdevs.iter().map(|b| b["uuid"].as_str().unwrap()).collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), 4);

    // Single-bdev queries, by name and by uuid.
    let one = common::call(&mut c, "bdev_get_bdevs", Some(json!({"name": "Mnamed"})));
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["uuid"], MALLOC_UUID);
    let by_uuid = common::call(&mut c, "bdev_get_bdevs", Some(json!({"name": URING_UUID})));
    assert_eq!(by_uuid[0]["name"], "Uring0");

    // A missing bdev is ENODEV.
    let e = common::call_err(&mut c, "bdev_get_bdevs", Some(json!({"name": "NoSuchBdev"})));
    assert_eq!(e.code, -19, "{e:?}");
    assert!(e.message.contains("NoSuchBdev"), "{e:?}");

    // bdev_get_iostat knows every bdev and nothing wrote yet (examine, as SPDK's, read the
    // first page of each to look for an lvstore, and its first blocks for a RAID superblock).
    let st = common::call(&mut c, "bdev_get_iostat", None);
    let st_bdevs = st["bdevs"].as_array().unwrap();
    assert_eq!(st_bdevs.len(), 4, "{st}");
    for b in st_bdevs {
        assert!(b["num_read_ops"].as_u64().unwrap() <= 2, "{b}");
        assert_eq!(b["num_write_ops"], 0, "{b}");
    }
    assert!(st["tick_rate"].as_u64().unwrap() > 0, "{st}");

    // Deleting with another module's method fails and leaves the bdev alone.
    for (method, victim) in [
        ("bdev_null_delete", "Mnamed"),
        ("bdev_malloc_delete", "Null0"),
        ("bdev_uring_delete", "Malloc0"),
        ("bdev_malloc_delete", "Uring0"),
    ] {
        let e = common::call_err(&mut c, method, Some(json!({"name": victim})));
        assert!(e.code < 0, "{method} {victim}: {e:?}");
        assert!(e.message.contains(victim), "{method} {victim}: {e:?}");
    }
    assert_eq!(d.bdevs().len(), 4, "a failed delete removed something");

    // Delete each with the right method; each is gone afterwards.
    for (method, victim) in [
        ("bdev_null_delete", "Null0"),
        ("bdev_malloc_delete", "Malloc0"),
        ("bdev_malloc_delete", "Mnamed"),
        ("bdev_uring_delete", "Uring0"),
    ] {
        let r = common::call(&mut c, method, Some(json!({"name": victim})));
        assert_eq!(r, json!(true), "{method} {victim}");
        let e = common::call_err(&mut c, "bdev_get_bdevs", Some(json!({"name": victim})));
        assert_eq!(e.code, -19, "{victim} still found after {method}: {e:?}");
        assert!(!d.bdev_names().iter().any(|n| n == victim), "{victim} still listed after {method}");
        // Deleting again: not found.
        let e = common::call_err(&mut c, method, Some(json!({"name": victim})));
        assert_eq!(e.code, -19, "second {method} {victim}: {e:?}");
    }
    assert!(d.bdevs().is_empty());
    // The backing file is untouched by create and delete.
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 8 << 20);

    // Names are free again: an unnamed malloc bdev is Malloc0 once more.
    let r = common::call(&mut c, "bdev_malloc_create", Some(json!({"num_blocks": 128, "block_size": 512})));
    assert_eq!(r, json!("Malloc0"));
    let r = common::call(&mut c, "bdev_malloc_create", Some(json!({"num_blocks": 128, "block_size": 512})));
    assert_eq!(r, json!("Malloc1"));
    assert_eq!(d.bdev_names(), ["Malloc0", "Malloc1"]);
}

#[test]
fn framework_methods() {
    let dir = TempDir::new("framework");
    let d = Daemon::start(&dir, &[]);
    let mut c = d.client();

    let methods = common::call(&mut c, "rpc_get_methods", None);
    let methods: Vec<&str> = methods.as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    for m in [
        "spdk_get_version",
        "rpc_get_methods",
        "bdev_get_bdevs",
        "bdev_get_iostat",
        "bdev_null_create",
        "bdev_null_delete",
        "bdev_malloc_create",
        "bdev_malloc_delete",
        "bdev_uring_create",
        "bdev_uring_delete",
        "framework_get_reactors",
        "framework_get_subsystems",
        "framework_get_config",
        "save_config",
        "spdk_kill_instance",
    ] {
        assert!(methods.contains(&m), "rpc_get_methods lacks {m}: {methods:?}");
    }

    let v = common::call(&mut c, "spdk_get_version", None);
    let version = v["version"].as_str().unwrap_or_else(|| panic!("no version string: {v}"));
    assert!(!version.is_empty() && version.chars().any(|ch| ch.is_ascii_digit()), "{v}");
    assert!(v["fields"]["major"].is_u64(), "{v}");

    let r = common::call(&mut c, "framework_get_reactors", None);
    let reactors = r["reactors"].as_array().unwrap();
    assert_eq!(reactors.len(), 1, "-m 0x1 runs one reactor: {r}");
    assert_eq!(reactors[0]["lcore"], 0, "{r}");
    assert!(reactors[0]["busy"].is_u64() && reactors[0]["idle"].is_u64(), "{r}");
    assert!(reactors[0]["busy"].as_u64().unwrap() + reactors[0]["idle"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["pid"], d.proc.pid(), "{r}");

    let subs = common::call(&mut c, "framework_get_subsystems", None);
    assert!(subs.as_array().unwrap().iter().any(|s| s["subsystem"] == "bdev"), "{subs}");
}

#[test]
fn framework_get_reactors_one_per_core() {
    // Two cores without pinning, so the test needs no particular CPU.
    let dir = TempDir::new("reactors");
    let d = Daemon::start_with(&dir, "rpc.sock", "0x3", &["--no-pin"]);
    // Give the reactors a moment so both counters move.
    std::thread::sleep(Duration::from_millis(50));
    let r = d.call("framework_get_reactors", None);
    let reactors = r["reactors"].as_array().unwrap();
    let mut cores: Vec<u64> = reactors.iter().map(|x| x["lcore"].as_u64().unwrap()).collect();
    cores.sort_unstable();
    assert_eq!(cores, [0, 1], "{r}");
    for x in reactors {
        let (busy, idle) = (x["busy"].as_u64(), x["idle"].as_u64());
        assert!(busy.is_some() && idle.is_some(), "{x}");
        assert!(busy.unwrap() + idle.unwrap() > 0, "{x}");
    }
}

#[test]
fn socket_is_private() {
    let dir = TempDir::new("mode");
    let d = Daemon::start(&dir, &[]);
    let meta = std::fs::metadata(&d.sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode {:o}", meta.permissions().mode());
    d.assert_serving();
}

#[test]
fn spdk_kill_instance_sigterm_exits_cleanly() {
    let dir = TempDir::new("kill");
    let mut d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "M", "num_blocks": 128, "block_size": 512})));
    let r = d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    assert_eq!(r, json!(true));
    let st = d.proc.expect_exit(Duration::from_secs(5), "daemon after spdk_kill_instance SIGTERM");
    assert_eq!(st.code(), Some(0), "exit status {st:?}; stderr:\n{}", d.proc.stderr());
    assert!(!d.sock.exists(), "socket {} left behind", d.sock.display());
}

#[test]
fn spdk_kill_instance_rejects_unknown_signal() {
    let dir = TempDir::new("killbad");
    let d = Daemon::start(&dir, &[]);
    let e = d.call_err("spdk_kill_instance", Some(json!({"sig_name": "SIGFROB"})));
    assert_eq!(e.code, -32602, "{e:?}");
    d.assert_serving();
}

#[test]
fn cli_calls_methods() {
    let dir = TempDir::new("cli");
    let img = dir.file_filled("u.img", 1 << 20, 0);
    let d = Daemon::start(&dir, &[]);

    // Flags become params; a string result is printed bare.
    let out = d.cli(&["bdev_malloc_create", "--num-blocks", "256", "--block-size", "512", "--name", "CliM"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "CliM");
    // A JSON object works too.
    let params = json!({"name": "CliU", "filename": img.to_str().unwrap(), "block_size": 4096}).to_string();
    let out = d.cli(&["bdev_uring_create", &params]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "CliU");

    // Other results are JSON on stdout.
    let out = d.cli(&["bdev_get_bdevs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("bdev_get_bdevs prints JSON");
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(find_bdev(list, "CliM").unwrap()["num_blocks"], 256);
    let u = find_bdev(list, "CliU").unwrap();
    assert_eq!(u["block_size"], 4096);
    assert_eq!(u["num_blocks"], 256);

    let out = d.cli(&["bdev_uring_delete", "--name", "CliU"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "true");
    assert_eq!(d.bdev_names(), ["CliM"]);
}

#[test]
fn socket_in_use_is_not_taken_over() {
    let dir = TempDir::new("inuse");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "First", "num_blocks": 64, "block_size": 512})));
    // A second daemon on the same socket refuses to start and leaves the first one alone.
    let mut second = Daemon::spawn(&dir, "rpc.sock", "0x1", &[]);
    let st = second.proc.expect_exit(Duration::from_secs(10), "second daemon on a busy socket");
    assert!(!st.success(), "second daemon started on a socket in use");
    assert!(second.proc.stderr().contains("in use"), "{}", second.proc.stderr());
    assert_eq!(d.bdev_names(), ["First"], "the socket no longer reaches the first daemon");
}

#[test]
fn stale_socket_is_replaced() {
    let dir = TempDir::new("stale");
    let mut d = Daemon::start(&dir, &[]);
    // SIGKILL leaves the socket file behind.
    d.proc.signal(libc::SIGKILL);
    d.proc.expect_exit(Duration::from_secs(5), "daemon after SIGKILL");
    assert!(d.sock.exists());
    let d2 = Daemon::start(&dir, &[]);
    d2.call("bdev_null_create", Some(json!({"name": "Fresh", "num_blocks": 64, "block_size": 512})));
    assert_eq!(d2.bdev_names(), ["Fresh"]);
    let meta = std::fs::metadata(&d2.sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn socket_in_missing_directory_fails_startup() {
    let dir = TempDir::new("nodir");
    let mut d = Daemon::spawn(&dir, "no/such/dir/rpc.sock", "0x1", &[]);
    let st = d.proc.expect_exit(Duration::from_secs(10), "daemon with an impossible socket path");
    assert!(!st.success());
    assert!(d.proc.stderr().contains("no/such/dir/rpc.sock"), "{}", d.proc.stderr());
}

#[test]
fn concurrent_clients_create_and_delete() {
    let dir = TempDir::new("concurrent");
    let d = Daemon::start(&dir, &[]);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let sock = d.sock.clone();
            std::thread::spawn(move || {
                let mut c = ferrite_rpc::client::RpcClient::connect(&sock, common::RPC_TIMEOUT).unwrap();
                for i in 0..25 {
                    let name = format!("T{t}x{i}");
                    let (create, delete) = if i % 2 == 0 {
                        ("bdev_malloc_create", "bdev_malloc_delete")
                    } else {
                        ("bdev_null_create", "bdev_null_delete")
                    };
                    let r = common::call(
                        &mut c,
                        create,
                        Some(json!({"name": name, "num_blocks": 64 + i, "block_size": 512})),
                    );
                    assert_eq!(r, json!(name));
                    let b = common::call(&mut c, "bdev_get_bdevs", Some(json!({"name": name})));
                    assert_eq!(b[0]["num_blocks"], 64 + i);
                    // Keep every fifth bdev.
                    if i % 5 != 0 {
                        assert_eq!(common::call(&mut c, delete, Some(json!({"name": name}))), json!(true));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread failed");
    }
    let mut names = d.bdev_names();
    names.sort();
    let mut expected: Vec<String> = (0..4).flat_map(|t| (0..25).step_by(5).map(move |i| format!("T{t}x{i}"))).collect();
    expected.sort();
    assert_eq!(names, expected);
    // save_config lists exactly those.
    let saved = d.call("save_config", None);
    let bdev = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "bdev").unwrap();
    let mut cfg_names: Vec<String> = bdev["config"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["params"]["name"].as_str().map(str::to_string))
        .collect();
    cfg_names.sort();
    assert_eq!(cfg_names, expected);
}

/// The `THPeligible` field of the mapping of `pid` exactly `len` bytes long (a malloc bdev's).
fn thp_eligible_of_mapping(pid: libc::pid_t, len: usize) -> Option<String> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut in_it = false;
    for l in smaps.lines() {
        let range = l.split_whitespace().next().unwrap_or_default();
        if let Some((a, b)) = range.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                in_it = b - a == len;
                continue;
            }
        }
        if in_it {
            if let Some(v) = l.strip_prefix("THPeligible:") {
                return Some(v.trim().to_string());
            }
        }
    }
    None
}

#[test]
fn malloc_memory_asks_for_huge_pages_unless_no_huge() {
    let policy = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if policy.is_empty() || policy.contains("[never]") {
        eprintln!("SKIP: transparent huge pages are off here ({policy:?}), nothing to ask for");
        return;
    }
    // 37 MiB: an odd size, so its mapping is told apart from the reactor's buffer regions.
    let blocks = 37 * 256;
    let len = blocks * 4096;
    for (flags, want) in [(&[][..], "1"), (&["--no-huge"][..], "0")] {
        let dir = TempDir::new("thp");
        let d = Daemon::start(&dir, flags);
        let mut c = d.client();
        common::call(
            &mut c,
            "bdev_malloc_create",
            Some(json!({"name": "M0", "num_blocks": blocks, "block_size": 4096})),
        );
        assert_eq!(
            thp_eligible_of_mapping(d.proc.pid(), len).as_deref(),
            Some(want),
            "THPeligible of the malloc bdev's memory with {flags:?}"
        );
        common::call(&mut c, "bdev_malloc_delete", Some(json!({"name": "M0"})));
        // The memory goes with the bdev's last channel, at most a moment after the answer.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while thp_eligible_of_mapping(d.proc.pid(), len).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(thp_eligible_of_mapping(d.proc.pid(), len), None, "the memory is unmapped with the bdev");
    }
}
