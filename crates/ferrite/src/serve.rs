//! `ferrite serve`: start the reactors, load a config, serve JSON-RPC, stop cleanly on a signal.

use ferrite_reactor::{cpumask::parse_cpumask, Engine, EngineConfig, ReactorMode};
use ferrite_rpc::registry::{MethodDoc, RUNTIME};
use ferrite_rpc::{server::RpcServer, Ctx};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `ferrite serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Cores to run reactors on: SPDK's hexadecimal mask (0x3) or a core list (0-1, [0,2]).
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,
    /// Path of the JSON-RPC unix socket (created with mode 0600).
    #[arg(short = 'r', long = "rpc-socket", default_value = ferrite_rpc::server::DEFAULT_SOCKET)]
    rpc_socket: PathBuf,
    /// SPDK-format JSON config to load at startup (e.g. one written by save_config).
    #[arg(short = 'c', long = "json", value_name = "FILE")]
    json: Option<PathBuf>,
    /// Reactor idle behaviour: poll (busy loop), interrupt (sleep when idle) or adaptive
    /// (poll while busy, sleep after 500 us idle).
    #[arg(long, default_value = "adaptive")]
    reactor_mode: ReactorMode,
    /// Do not pin reactor threads to their cores.
    #[arg(long)]
    no_pin: bool,
    /// Run without huge pages (SPDK's --no-huge): malloc bdevs do not ask for transparent huge
    /// pages (Ferrite reserves no hugepages either way).
    #[arg(long = "no-huge")]
    no_huge: bool,
    /// Log level: error, warn, info, debug or trace (FERRITE_LOG overrides).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// How log lines are written: text (`[time] LEVEL thread component: message`) or json
    /// (one object per line, for log collectors).
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::logger::LogFormat,
    /// Start in SPDK's startup RPC state: only startup methods (`*_set_options`, ...) are
    /// allowed until `framework_start_init` (with --json, its runtime entries run then).
    #[arg(long)]
    wait_for_rpc: bool,
    /// MiB per reactor that the bdev layer's requests may take from the heap when a buffer
    /// class is empty; past it they wait (NoMem). Shown by thread_get_stats (`buffers`).
    #[arg(long = "buf-heap-budget", value_name = "MIB", default_value_t = 64)]
    buf_heap_budget: usize,
    /// Folder for vhost controllers' sockets: controller NAME listens on DIR/NAME (SPDK's
    /// vhost `-S`; default: the working directory).
    #[arg(short = 'S', long = "vhost-sock-dir", value_name = "DIR")]
    vhost_sock_dir: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address (`127.0.0.1:9100`; GET /metrics).
    /// `framework_set_metrics` changes or stops it at runtime.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Seconds an RPC connection may stay idle before it is closed.
    #[arg(long, hide = true, default_value_t = 60.0)]
    rpc_idle_timeout: f64,
    /// Seconds a request may take to arrive whole.
    #[arg(long, hide = true, default_value_t = 10.0)]
    rpc_request_timeout: f64,
}

/// Converts a timeout option to a Duration (0.001 s to one day).
fn seconds(name: &str, v: f64) -> Result<Duration, String> {
    if !(0.001..=86400.0).contains(&v) {
        return Err(format!("--{name} must be between 0.001 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Starts the engine and loads `json` (shared by serve and perf); the RPC state ends as runtime
/// unless `wait` (`--wait-for-rpc`).
pub fn start_engine(
    cpumask: &str,
    mode: ReactorMode,
    pin: bool,
    json: Option<&PathBuf>,
    wait: bool,
    heap_budget_mib: usize,
) -> Result<(Engine, Ctx), String> {
    let cores = parse_cpumask(cpumask).map_err(|e| e.to_string())?;
    let heap_budget = heap_budget_mib.checked_mul(1 << 20).ok_or("--buf-heap-budget is too large")?;
    let bufs = ferrite_reactor::BufPoolConfig { heap_budget, ..Default::default() };
    let engine =
        Engine::start(EngineConfig { cores, mode, pin, bufs, ..Default::default() }).map_err(|e| e.to_string())?;
    // The iSCSI target's engine listens on the portal groups the configuration creates
    // (this thread is entered into the engine: the hooks are the engine's).
    ferrite_iscsi_target::engine::install();
    let mut registry = crate::registry();
    add_test_panic_method(&mut registry);
    let ctx = Ctx { engine: engine.clone(), registry: Arc::new(registry) };
    // This thread is entered into the engine (Engine::start does it): bdevs it registers are
    // the engine's, and are examined on reactor 0.
    if let Some(path) = json {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let doc: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
        let c = ctx.clone();
        let res = engine
            .run_async(0, move || async move { ferrite_rpc::config::load(&c, &doc, wait).await })
            .wait()
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match res {
            Ok(n) => log::info!("loaded {n} config entries from {}", path.display()),
            Err(e) => {
                shutdown(&engine);
                return Err(format!("config {}: {e}", path.display()));
            }
        }
    } else if !wait {
        let c = ctx.clone();
        let res = engine
            .run_async(0, move || async move { ferrite_rpc::config::start_framework(&c).await })
            .wait()
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(e) = res {
            shutdown(&engine);
            return Err(e);
        }
    }
    Ok((engine, ctx))
}

/// Test hook for the reactor panic policy (a panic on a reactor aborts the process; see
/// `ferrite_reactor`'s panic hook, installed by `Engine::start`). With
/// `FERRITE_TEST_PANIC_ON=<name>` naming a method that does not otherwise exist, the daemon
/// serves a method of that name that panics on reactor `params.reactor` (default 0, the RPC
/// reactor, while its client waits for the answer). Never set in normal use.
fn add_test_panic_method(reg: &mut ferrite_rpc::Registry) {
    let Ok(name) = std::env::var("FERRITE_TEST_PANIC_ON") else { return };
    if name.is_empty() || reg.method_names().contains(&name.as_str()) {
        log::warn!("FERRITE_TEST_PANIC_ON={name:?} ignored: empty or an existing method");
        return;
    }
    log::warn!("FERRITE_TEST_PANIC_ON: method {name} panics a reactor (test hook)");
    let name: &'static str = Box::leak(name.into_boxed_str());
    let doc = MethodDoc::of::<PanicParams>("Test hook: panics a reactor (FERRITE_TEST_PANIC_ON).");
    reg.raw(name, RUNTIME, doc, |ctx, params| async move {
        let reactor = params.0.as_ref().and_then(|p| p.get("reactor")).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        if reactor == 0 {
            panic!("FERRITE_TEST_PANIC_ON: requested panic on reactor 0");
        }
        // Reactor 0 waits for an answer that never comes.
        let _ = ctx
            .engine
            .call(reactor, move || panic!("FERRITE_TEST_PANIC_ON: requested panic on reactor {reactor}"))
            .await;
        Ok(serde_json::Value::Bool(true))
    });
}

/// What the test hook of `FERRITE_TEST_PANIC_ON` reads of its params (by hand: anything else
/// is ignored).
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct PanicParams {
    /// The reactor to panic (0 by default).
    reactor: Option<u64>,
}

/// Deletes every bdev (waiting for openers to close, at most a few seconds) and stops the reactors.
pub fn shutdown(engine: &Engine) {
    ferrite_fuse::rpc::shutdown(engine);
    let closed = engine
        .run_async(0, || async {
            // Stop accepting and close the targets' connections first, then the bdevs.
            // Remote controllers first (their keep-alives stop; no reconnection to a target
            // that is going away, ours included). Nexuses before them: each records a clean
            // shutdown while its remote children are still there.
            ferrite_nexus::nexus::shutdown().await;
            ferrite_nvmf_host::rpc::shutdown().await;
            ferrite_iscsi_host::rpc::shutdown();
            ferrite_nbd::rpc::shutdown(&ferrite_reactor::engine()).await;
            ferrite_vhost::rpc::shutdown().await;
            ferrite_nvmf::target::rpc::shutdown(&ferrite_reactor::engine()).await;
            // iSCSI portal groups stop listening; target nodes close their LUNs' bdevs; the
            // connections close with their SCSI devices.
            ferrite_iscsi_target::shutdown();
            ferrite_iscsi_target::engine::shutdown().await;
            // Lvol bdevs go and their lvstores are unloaded cleanly while their bases remain.
            ferrite_lvol::rpc::shutdown().await;
            let mut waits = Vec::new();
            // Newest first: virtual bdevs go before the bdevs they stand on.
            for b in ferrite_bdev::list().into_iter().rev() {
                if let Ok(rx) = ferrite_bdev::unregister(b.name(), None) {
                    waits.push((b.name().to_string(), rx));
                }
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            for (name, rx) in waits {
                let wait = async { rx.await.is_ok() };
                let timeout = async {
                    ferrite_reactor::sleep(deadline.saturating_duration_since(Instant::now())).await;
                    false
                };
                if !ferrite_reactor::net::race(wait, timeout).await {
                    log::warn!("bdev {name} still open at shutdown");
                }
            }
        })
        .wait();
    if closed.is_err() {
        log::warn!("reactor 0 did not finish closing bdevs");
    }
    ferrite_bdev::module::fini_all();
    engine.stop();
    engine.join();
}

/// Runs the daemon until SIGINT, SIGTERM, SIGQUIT or SIGHUP; returns the exit code.
pub fn run(a: ServeArgs) -> i32 {
    crate::logger::init(&a.log_level, a.log_format);
    let t0 = Instant::now();
    crate::signals::block();
    if a.no_huge {
        ferrite_modules::malloc::set_huge_pages(false);
    }
    let limits = match (
        seconds("rpc-idle-timeout", a.rpc_idle_timeout),
        seconds("rpc-request-timeout", a.rpc_request_timeout),
    ) {
        (Ok(idle_timeout), Ok(request_timeout)) => {
            ferrite_rpc::server::Limits { idle_timeout, request_timeout, ..Default::default() }
        }
        (Err(e), _) | (_, Err(e)) => {
            log::error!("{e}");
            return 1;
        }
    };
    if let Some(dir) = &a.vhost_sock_dir {
        if let Err(e) = ferrite_vhost::control::check_dir(dir) {
            log::error!("-S: {e}");
            return 1;
        }
        ferrite_vhost::control::set_socket_dir(dir.clone());
    }
    // Refuse a path we would not bind before starting anything.
    if let Err(e) = ferrite_rpc::sockfile::check_bindable(&a.rpc_socket) {
        log::error!("{e}");
        return 1;
    }
    let (engine, ctx) =
        match start_engine(&a.cpumask, a.reactor_mode, !a.no_pin, a.json.as_ref(), a.wait_for_rpc, a.buf_heap_budget) {
            Ok(v) => v,
            Err(e) => {
                log::error!("{e}");
                return 1;
            }
        };
    let mut server = match RpcServer::start_with(&a.rpc_socket, ctx.clone(), limits) {
        Ok(s) => s,
        Err(e) => {
            log::error!("{e}");
            shutdown(&engine);
            return 1;
        }
    };
    if let Some(addr) = &a.metrics {
        if let Err(e) = crate::metrics::set(&ctx, Some(addr)) {
            log::error!("--metrics: {e}");
            server.stop();
            shutdown(&engine);
            return 1;
        }
    }
    if a.wait_for_rpc {
        log::info!("waiting for framework_start_init (--wait-for-rpc)");
    }
    log::info!(
        "ferrite serving: {} reactor(s) on cores {}, mode {}, started in {:.1} ms",
        engine.count(),
        a.cpumask,
        a.reactor_mode.as_str(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    let sig = crate::signals::wait();
    log::info!("{sig}: shutting down");
    server.stop();
    crate::metrics::stop(&ctx);
    shutdown(&engine);
    log::info!("stopped");
    0
}
