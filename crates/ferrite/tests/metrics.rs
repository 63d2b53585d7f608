//! Prometheus metrics (`--metrics`, `framework_set_metrics`): a scrape passes Prometheus's own
//! `promtool check metrics`, the endpoint follows the RPC and save_config, and a real
//! Prometheus scraping `ferrite perf` each second stores the values `bdev_get_iostat` reports.

mod common;

use common::{free_port, Daemon, Proc, TempDir};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `GET path` on `addr`; the status code and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<(u32, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_string()))
}

fn which(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The value of the sample `name{labels}` in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

#[test]
fn scrape_passes_promtool_and_follows_framework_set_metrics() {
    let dir = TempDir::new("metrics");
    let d = Daemon::start_with(&dir, "rpc.sock", "0x3", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "Malloc0", "num_blocks": 8192, "block_size": 512})));
    d.call("bdev_enable_histogram", Some(json!({"name": "Malloc0", "enable": true})));
    // Port 0: the answer names the port bound.
    let r = d.call("framework_set_metrics", Some(json!({"address": "127.0.0.1:0"})));
    let addr = r["address"].as_str().expect("bound address").to_string();
    // Some I/O: an lvstore writes its metadata.
    d.call(
        "bdev_lvol_create_lvstore",
        Some(json!({"bdev_name": "Malloc0", "lvs_name": "lvs0", "cluster_sz": 1048576})),
    );
    let (code, text) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("# TYPE ferrite_bdev_read_ops_total counter"), "{text}");
    let io = d.call("bdev_get_iostat", Some(json!({"name": "Malloc0"})));
    let writes = io["bdevs"][0]["num_write_ops"].as_u64().unwrap();
    assert!(writes > 0);
    assert_eq!(sample(&text, "ferrite_bdev_write_ops_total{bdev=\"Malloc0\"}"), Some(writes as f64), "{text}");
    assert!(sample(&text, "ferrite_bdev_latency_seconds_count{bdev=\"Malloc0\"}").unwrap() >= writes as f64);
    let clusters = sample(&text, "ferrite_lvstore_clusters{lvstore=\"lvs0\"}").unwrap();
    let free = sample(&text, "ferrite_lvstore_free_clusters{lvstore=\"lvs0\"}").unwrap();
    assert!(clusters > 0.0 && free == clusters, "{text}");
    for r in ["0", "1"] {
        let turns = sample(&text, &format!("ferrite_reactor_loop_turns_total{{reactor=\"{r}\",core=\"{r}\"}}"));
        assert!(turns.unwrap() > 0.0, "{text}");
    }
    // Scrapes count themselves and what they cost reactor 0.
    let scrapes = sample(&text, "ferrite_metrics_scrapes_total").unwrap();
    let (_, again) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(sample(&again, "ferrite_metrics_scrapes_total"), Some(scrapes + 1.0), "{again}");
    let cost = sample(&again, "ferrite_metrics_gather_seconds_total").unwrap();
    assert!(cost > 0.0 && cost < 1.0, "{again}");
    assert_eq!(http_get(&addr, "/nothing").unwrap().0, 404);
    // An absolute-form target (what a client sends through a proxy) names the same page.
    let (code, absolute) = http_get(&addr, &format!("http://{addr}/metrics")).unwrap();
    assert_eq!(code, 200, "{absolute}");
    assert!(absolute.contains("ferrite_bdev_read_ops_total"), "{absolute}");
    // A head longer than the endpoint reads is answered 431, not dropped.
    let (code, _) = http_get(&addr, &format!("/metrics?{}", "a".repeat(9000))).unwrap();
    assert_eq!(code, 431);
    if which("promtool") {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        println!("SKIP promtool check: promtool not installed (apt-get install prometheus)");
    }
    // Kept by save_config; null stops it.
    let saved = d.call("save_config", None);
    let entries: Vec<&Value> =
        saved["subsystems"].as_array().unwrap().iter().flat_map(|s| s["config"].as_array().unwrap()).collect();
    assert!(
        entries.iter().any(|e| e["method"] == "framework_set_metrics" && e["params"]["address"] == "127.0.0.1:0"),
        "{saved}"
    );
    d.call("framework_set_metrics", Some(json!({"address": null})));
    assert!(http_get(&addr, "/metrics").is_err(), "still serving after framework_set_metrics null");
    assert_eq!(d.call("framework_get_metrics", None)["address"], Value::Null);
}

/// An instant vector or range query on Prometheus's HTTP API.
fn prom_query(prom: &str, query: &str) -> Value {
    let enc: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={enc}")).unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn prometheus_scrapes_perf_and_stores_what_iostat_reports() {
    if !which("prometheus") {
        println!("SKIP: prometheus not installed (apt-get install prometheus; scripts/test.sh does)");
        return;
    }
    let dir = TempDir::new("prom");
    let metrics = format!("127.0.0.1:{}", free_port());
    let prom = format!("127.0.0.1:{}", free_port());
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: ferrite\n    \
             static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let tsdb = dir.join("tsdb");
    let args = [
        format!("--config.file={}", cfg.display()),
        format!("--storage.tsdb.path={}", tsdb.display()),
        format!("--web.listen-address={prom}"),
    ];
    let mut p = Command::new("prometheus");
    p.args(&args).stdout(Stdio::null()).stderr(std::fs::File::create(dir.join("prom.log")).unwrap());
    let mut prometheus = Proc {
        child: p.spawn().unwrap(),
        stdout_path: dir.join("prom.log"),
        stderr_path: dir.join("prom.log"),
        started: Instant::now(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http_get(&prom, "/-/ready").is_ok_and(|(c, _)| c == 200) {
        assert!(Instant::now() < deadline, "prometheus not ready: {}", prometheus.stderr());
        std::thread::sleep(Duration::from_millis(200));
    }
    let bdevs = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 262144, "block_size": 512}}]}]}),
    );
    let sock = dir.join("perf.sock");
    let perf_args = [
        "perf",
        "-c",
        bdevs.to_str().unwrap(),
        "-q",
        "8",
        "-o",
        "4k",
        "-w",
        "randread",
        "-t",
        "15",
        "-m",
        "0x3",
        "--no-pin",
        "-r",
        sock.to_str().unwrap(),
        "--metrics",
        &metrics,
    ];
    let mut perf = Proc::spawn(&dir, "perf", &perf_args);
    common::wait_for_socket(&mut perf, &sock, Duration::from_secs(10));
    let iostat = || -> u64 {
        let mut c = ferrite_rpc::client::RpcClient::connect(&sock, Duration::from_secs(10)).unwrap();
        let v = common::call(&mut c, "bdev_get_iostat", Some(json!({"name": "Null0"})));
        v["bdevs"][0]["num_read_ops"].as_u64().unwrap()
    };
    std::thread::sleep(Duration::from_secs(2));
    // A: read before t_a; B: read after a scrape that started after t_a has been stored.
    // That scrape's value lies between them (the counter only rises).
    let a = iostat();
    let t_a = now_secs();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (ts, v) = loop {
        let r = prom_query(&prom, "ferrite_bdev_read_ops_total{bdev=\"Null0\"}[10s]");
        let found = r["data"]["result"][0]["values"].as_array().and_then(|vals| {
            vals.iter()
                .map(|s| (s[0].as_f64().unwrap(), s[1].as_str().unwrap().parse::<f64>().unwrap()))
                .find(|(ts, _)| *ts > t_a)
        });
        if let Some(f) = found {
            break f;
        }
        assert!(Instant::now() < deadline, "no scrape after {t_a}: {r}\n{}", prometheus.stderr());
        std::thread::sleep(Duration::from_millis(200));
    };
    let b = iostat();
    println!("iostat {a} <= prometheus {v} (scraped at {ts}) <= iostat {b}");
    assert!(a > 0, "no reads counted");
    assert!(a as f64 <= v && v <= b as f64, "iostat {a} <= prometheus {v} <= iostat {b}");
    let up = prom_query(&prom, "up");
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
    let st = perf.expect_exit(Duration::from_secs(30), "perf");
    assert!(st.success(), "{}{}", perf.stdout(), perf.stderr());
    prometheus.sigterm();
    let _ = prometheus.wait_timeout(Duration::from_secs(10));
}

/// Hostile and careless clients of the endpoint: clients that trickle their request a byte at
/// a time or send nothing neither keep a scrape out nor block the daemon (its RPC, a change of
/// the endpoint, or its shutdown); a call without `address` or with a bad one changes nothing.
#[test]
fn slow_and_idle_clients_block_neither_scrapes_nor_the_daemon() {
    let dir = TempDir::new("metrics-slow");
    let mut d = Daemon::start_with(&dir, "rpc.sock", "0x1", &["--no-pin"]);
    let r = d.call("framework_set_metrics", Some(json!({"address": "127.0.0.1:0"})));
    let addr = r["address"].as_str().unwrap().to_string();
    let slow = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            for b in b"GET /metrics HTTP/1.1\r\nX-Pad: aaaaaaaaaaaaaaaaaaaa" {
                if s.write_all(&[*b]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            false
        })
    };
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let (code, _) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "a scrape beside them took {:?}", t0.elapsed());
    let t0 = Instant::now();
    assert_eq!(d.call("framework_get_metrics", None)["address"], "127.0.0.1:0");
    d.call("bdev_get_bdevs", None);
    // Refused, and the endpoint stays: no address, a bad one.
    assert_eq!(d.call_err("framework_set_metrics", Some(json!({}))).code, -32602);
    assert_eq!(d.call_err("framework_set_metrics", Some(json!({"address": "127.0.0.1:99999"}))).code, -libc::EINVAL);
    assert_eq!(http_get(&addr, "/metrics").unwrap().0, 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "RPC beside them took {:?}", t0.elapsed());
    // The trickler is dropped by its deadline.
    assert!(slow.join().unwrap(), "a client trickling its request head was not dropped");
    drop(idle);
    let t0 = Instant::now();
    d.proc.sigterm();
    d.proc.expect_exit(Duration::from_secs(10), "SIGTERM");
    assert!(t0.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t0.elapsed());
}
