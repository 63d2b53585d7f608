//! `ferrite perf`: bdevperf's command line over Ferrite's engine.

use ferrite_perf::{JobPlacement, JobResult, JobSpec, Progress, Workload, Workloads};
use ferrite_reactor::ReactorMode;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Options of `ferrite perf` (bdevperf's flags where bdevperf has them).
#[derive(clap::Args, Debug)]
pub struct PerfArgs {
    /// SPDK JSON config that creates the bdevs to test.
    #[arg(short = 'c', long = "json", value_name = "FILE")]
    json: PathBuf,
    /// Queue depth per job.
    #[arg(short = 'q', value_name = "DEPTH")]
    queue_depth: u32,
    /// I/O size in bytes (suffixes k, m accepted: 4k, 128K).
    #[arg(short = 'o', value_name = "SIZE", value_parser = parse_size)]
    io_size: u32,
    /// Workload: read, write, randread, randwrite, rw, randrw, verify, reset (verify with a bdev reset every 10 s), unmap, flush, compare_and_write (random compare-and-writes of versioned units, miscompares counted as data mismatches). A comma list gives the cores workloads in turn: `-w compare_and_write,randwrite -m 0x3` runs compare-and-writes on the first core and random writes on the second.
    #[arg(short = 'w', value_name = "TYPE")]
    workload: Workloads,
    /// Read percentage of rw and randrw.
    #[arg(short = 'M', value_name = "PERCENT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    rw_mix_read: u8,
    /// Run time in seconds.
    #[arg(short = 't', value_name = "SECONDS")]
    time: f64,
    /// Cores: hexadecimal mask (0x3) or list (0-1). One job per bdev per core.
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,
    /// Only test this bdev (default: every bdev in the config); repeat for several.
    #[arg(short = 'T', value_name = "BDEV")]
    target: Vec<String>,
    /// Run the bdevs one at a time, in turns of this many seconds, until each has run -t
    /// seconds: an A/B of bdevs within one process. Rounds alternate the order (A B, B A, ...)
    /// and the report adds each bdev's per-round IOPS against the first bdev's (the Total row
    /// still adds the bdevs' rates as if they had run together).
    #[arg(long, value_name = "SECONDS")]
    interleave: Option<f64>,
    /// Serve JSON-RPC on this socket during the run (to inspect or delete bdevs meanwhile).
    #[arg(short = 'r', long = "rpc-socket")]
    rpc_socket: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address during the run (GET /metrics).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Write machine-readable results to FILE ("-" for stdout): every job's result, the total,
    /// and the series of each -S interval (IOPS, MiB/s, mean latency).
    #[arg(long = "results-json", value_name = "FILE")]
    results_json: Option<String>,
    /// Draw IOPS over time and the latency histogram into this file: an SVG, or with a name
    /// ending in .html a self-contained page with the SVG inline and tables of the numbers.
    #[arg(long, value_name = "FILE.svg|FILE.html")]
    plot: Option<PathBuf>,
    /// Seconds between progress lines, printed only when stdout is a terminal, and between the
    /// points of the series (bdevperf's -S; here also fractions, 0.1 or more).
    #[arg(short = 'S', value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_interval)]
    stats_interval: f64,
    /// Every core runs a job on every bdev (bdevperf's -C; always the case here, accepted for
    /// compatibility).
    #[arg(short = 'C')]
    multi_core: bool,
    /// Keep going after failed I/O (bdevperf's -f; failed I/O never stops a job here except
    /// when its bdev is deleted).
    #[arg(short = 'f')]
    continue_on_failure: bool,
    /// Memory size in MiB (SPDK's -s; Ferrite needs no preallocated memory, ignored).
    #[arg(short = 's', value_name = "MiB")]
    mem_size: Option<String>,
    /// Run without huge pages (SPDK's --no-huge): malloc bdevs do not ask for transparent huge
    /// pages (Ferrite reserves no hugepages either way).
    #[arg(long = "no-huge")]
    no_huge: bool,
    /// Before the timed run, write every block of each tested bdev once (1 MiB writes, 8 at a
    /// time, one core): a thin volume is then fully allocated when the measurement starts. A
    /// bdev a module claimed (an lvstore's base) is left as its claimant wrote it
    #[arg(long)]
    fill: bool,
    /// Reactor idle behaviour: poll, interrupt or adaptive (polls while completions flow, waits
    /// in the kernel when only io_uring requests are outstanding).
    #[arg(long, default_value = "adaptive")]
    reactor_mode: ReactorMode,
    /// Do not pin reactor threads to their cores.
    #[arg(long)]
    no_pin: bool,
    /// Hold an LBA range lock on this block of every tested bdev for the whole run (taken
    /// before the jobs start, dropped after they end): the writes of every core then check
    /// the lock on their way (to measure what a held lock costs them; `bench/range_lock_cost.sh`).
    /// Jobs that write the block wait until the run ends. The end of the run reports each
    /// bdev's range lock counters.
    #[arg(long, value_name = "LBA")]
    hold_lock: Option<u64>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// How log lines are written: text or json (one object per line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::logger::LogFormat,
}

/// Longest run accepted (-t), in seconds: a week.
const MAX_RUN_SECS: f64 = 7.0 * 86400.0;
/// Most memory the jobs' I/O buffers may take together, whatever is available.
const MAX_BUFFER_BYTES: u64 = 4 << 30;

/// Most rounds an interleaved run (--interleave) may have.
const MAX_ROUNDS: u32 = 100_000;

/// How long stopped jobs may take to finish their outstanding I/O, after they aborted it
/// ([`ferrite_perf::job::DRAIN_GRACE`] after the run's end), before the run gives up on it: the
/// run ends at most `-t` + 5 s after it started, whatever the bdevs do.
const STUCK_GRACE: Duration = Duration::from_secs(3);
fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1024u64),
        Some('m' | 'M') => (&t[..t.len() - 1], 1024 * 1024),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    if n == 0 {
        return Err("the I/O size must be more than 0".into());
    }
    n.checked_mul(mult).and_then(|b| u32::try_from(b).ok()).ok_or_else(|| format!("{s:?} is too large an I/O size"))
}

/// MemAvailable of /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Checks that `jobs` jobs of `a` fit in memory: queue depth × I/O size × jobs at most
/// [`MAX_BUFFER_BYTES`] and half the available memory.
fn check_memory(a: &PerfArgs, jobs: u64) -> Result<(), String> {
    if a.workload.0.iter().all(|w| matches!(w, Workload::Unmap | Workload::Flush)) {
        return Ok(());
    }
    let need = a.queue_depth as u64 * a.io_size as u64 * jobs;
    let limit = available_memory().map_or(MAX_BUFFER_BYTES, |m| (m / 2).min(MAX_BUFFER_BYTES));
    if need > limit {
        return Err(format!(
            "queue depth {} × I/O size {} × {jobs} job(s) needs {} MiB of buffer memory; the limit is {} MiB \
             (at most {} MiB, and half the available memory)",
            a.queue_depth,
            a.io_size,
            need >> 20,
            limit >> 20,
            MAX_BUFFER_BYTES >> 20
        ));
    }
    Ok(())
}

/// Checks the arguments before anything starts.
fn check_args(a: &PerfArgs) -> Result<Duration, String> {
    if a.queue_depth == 0 || a.queue_depth > 4096 {
        return Err(format!("queue depth {} must be 1 to 4096", a.queue_depth));
    }
    if !a.time.is_finite() || a.time <= 0.0 || a.time > MAX_RUN_SECS {
        return Err(format!("run time (-t) {} must be more than 0 and at most {MAX_RUN_SECS} seconds", a.time));
    }
    if let Some(b) = a.target.iter().enumerate().find_map(|(i, b)| a.target[..i].contains(b).then_some(b)) {
        return Err(format!("bdev {b} is named twice with -T"));
    }
    if let Some(t) = a.interleave {
        if !t.is_finite() || t < 0.01 || t > a.time {
            return Err(format!("--interleave {t} must be at least 0.01 and at most the run time (-t {})", a.time));
        }
        if a.time / t > MAX_ROUNDS as f64 {
            return Err(format!("--interleave {t} with -t {} makes more than {MAX_ROUNDS} rounds", a.time));
        }
    }
    let cores = ferrite_reactor::cpumask::parse_cpumask(&a.cpumask).map_err(|e| e.to_string())?;
    check_memory(a, cores.len() as u64)?;
    // The outputs are tried before the run, so that a run is not lost to a typo in a path.
    let outputs = a.results_json.iter().filter(|p| *p != "-").map(std::path::Path::new);
    for path in outputs.chain(a.plot.as_deref()) {
        writable(path)?;
    }
    Ok(Duration::from_secs_f64(a.time))
}

/// Fails unless `path` can be opened for writing (made, empty, if it does not exist).
fn writable(path: &std::path::Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn fail(msg: String) -> i32 {
    eprintln!("ferrite perf: {msg}");
    1
}

/// Runs the benchmark; returns the exit code (non-zero on failed I/O or verify errors).
pub fn run(a: PerfArgs) -> i32 {
    crate::logger::init(&a.log_level, a.log_format);
    let duration = match check_args(&a) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let _ = (a.multi_core, a.continue_on_failure);
    if a.no_huge {
        ferrite_modules::malloc::set_huge_pages(false);
    }
    if let Some(m) = &a.mem_size {
        log::info!("-s {m}: Ferrite preallocates no memory; ignored");
    }
    crate::signals::block();
    let (engine, ctx) = match crate::serve::start_engine(
        &a.cpumask,
        a.reactor_mode,
        !a.no_pin,
        Some(&a.json),
        false,
        ferrite_reactor::BufPoolConfig::default().heap_budget >> 20,
    ) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let mut server = match a.rpc_socket.as_ref().map(|p| ferrite_rpc::server::RpcServer::start(p, ctx.clone())) {
        Some(Err(e)) => {
            crate::serve::shutdown(&engine);
            return fail(e.to_string());
        }
        Some(Ok(s)) => Some(s),
        None => None,
    };
    if let Some(addr) = &a.metrics {
        if let Err(e) = crate::metrics::set(&ctx, Some(addr)) {
            if let Some(s) = server.as_mut() {
                s.stop();
            }
            crate::serve::shutdown(&engine);
            return fail(format!("--metrics: {e}"));
        }
    }
    // As bdevperf: the config's bdevs are examined before the jobs start, so the bdevs that
    // examine makes (an lvstore's lvols) can be named with -T without a bdev_wait_for_examine
    // in the config.
    let _ = engine.run_async(0, || async { ferrite_bdev::module::wait_for_examine().await }).wait();
    let bdevs: Vec<String> = if a.target.is_empty() {
        ferrite_bdev::list().iter().map(|b| b.name().to_string()).collect()
    } else {
        a.target.clone()
    };
    if bdevs.is_empty() {
        crate::serve::shutdown(&engine);
        return fail(format!("{} creates no bdev", a.json.display()));
    }
    if let Err(e) = check_memory(&a, (engine.count() * bdevs.len()) as u64) {
        crate::serve::shutdown(&engine);
        return fail(e);
    }
    if a.fill {
        for bdev in &bdevs {
            // A claimed bdev (an lvstore's base) is written by its claimant only: read as it is.
            if let Some(m) = ferrite_bdev::lookup(bdev).and_then(|b| b.claimed_by()) {
                out(format_args!("Not filled {bdev}: claimed by module {m}, which alone writes it\n"));
                continue;
            }
            let t = Instant::now();
            let name = bdev.clone();
            let res = engine.run_async(0, move || async move { ferrite_perf::fill(&name).await }).wait();
            match res.unwrap_or_else(|e| Err(e.to_string())) {
                Ok(bytes) => {
                    out(format_args!("Filled {bdev}: {} MiB in {:.2} s\n", bytes >> 20, t.elapsed().as_secs_f64()))
                }
                Err(e) => {
                    crate::serve::shutdown(&engine);
                    return fail(e);
                }
            }
        }
    }
    let abort = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spec = JobSpec {
        workload: a.workload.of_core(0),
        per_core: if a.workload.0.len() > 1 { a.workload.0.clone() } else { Vec::new() },
        queue_depth: a.queue_depth,
        io_size: a.io_size,
        rw_mix_read: a.rw_mix_read,
        duration,
        abort: abort.clone(),
    };
    {
        let abort = abort.clone();
        std::thread::spawn(move || {
            let sig = crate::signals::wait();
            eprintln!("{sig}: stopping the run early");
            abort.store(true, Ordering::SeqCst);
            // A second signal does not wait for stuck I/O.
            let sig = crate::signals::wait();
            eprintln!("{sig} again: exiting without waiting for outstanding I/O");
            std::process::exit(1);
        });
    }
    let mut held = Vec::new();
    if let Some(lba) = a.hold_lock {
        for bdev in &bdevs {
            let Some(b) = ferrite_bdev::lookup(bdev) else { continue };
            if lba >= b.num_blocks() {
                crate::serve::shutdown(&engine);
                return fail(format!("--hold-lock {lba} is past the end of bdev {bdev} ({} blocks)", b.num_blocks()));
            }
            match engine.run_async(0, move || async move { b.lock_lba_range(lba, 1).await }).wait() {
                Ok(l) => held.push(l),
                Err(e) => {
                    crate::serve::shutdown(&engine);
                    return fail(e.to_string());
                }
            }
        }
        out(format_args!("Holding an LBA range lock on block {lba} of {} bdev(s)\n", held.len()));
    }
    out(format_args!("Running I/O for {} seconds...\n", a.time));
    let mut series = Vec::new();
    let (mut results, mut errors, turns) = match a.interleave {
        None => {
            let (r, e, s) = run_jobs(&engine, &bdevs, &spec, Some(a.stats_interval));
            series = s;
            (r, e, None)
        }
        Some(turn) => {
            let (r, e, t) = run_interleaved(&engine, &bdevs, &spec, turn);
            (r, e, Some(t))
        }
    };
    drop(held);
    results.sort_by(|a, b| (a.core, &a.bdev).cmp(&(b.core, &b.bdev)));
    if a.hold_lock.is_some() || a.workload.0.contains(&Workload::CompareAndWrite) {
        for bdev in &bdevs {
            if let Some(s) = ferrite_bdev::lookup(bdev).map(|b| b.lock_stats()) {
                out(format_args!(
                    "Range locks of {bdev}: {} granted ({} woken by a release), {} held, {} waiting at the end\n",
                    s.granted, s.woken, s.held, s.waiting
                ));
            }
        }
    }
    if !results.is_empty() {
        out(format_args!("{}", ferrite_perf::report::format_table(&results)));
    }
    let turns_json = turns.map(|t| {
        out(format_args!("{}", t.summary(&bdevs)));
        t.to_json(&bdevs)
    });
    if let Some(path) = &a.results_json {
        let mut doc = ferrite_perf::report::to_json(&results);
        if let Some(t) = turns_json {
            doc["interleave"] = t;
        }
        if a.interleave.is_none() {
            doc["series"] = crate::perf_series::to_json(&series);
        }
        let doc = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if path == "-" {
            out(format_args!("{doc}\n"));
        } else if let Err(e) = std::fs::write(path, doc + "\n") {
            errors.push(format!("cannot write {path}: {e}"));
        }
    }
    if let Some(path) = &a.plot {
        let mut latency = ferrite_perf::hist::Histogram::new();
        results.iter().for_each(|r| latency.merge(&r.latency));
        let title = format!("{} {} q{}", bdevs.join(","), a.workload.of_core(0).name(), a.queue_depth);
        let total = ferrite_perf::report::to_json(&results).get("total").cloned().unwrap_or_default();
        if let Err(e) = crate::perf_plot::write(path, &title, &series, &latency, &total) {
            errors.push(e);
        }
    }
    for e in &errors {
        eprintln!("ferrite perf: {e}");
    }
    if let Some(s) = server.as_mut() {
        s.stop();
    }
    crate::metrics::stop(&ctx);
    crate::serve::shutdown(&engine);
    let bad = results.iter().any(|r| r.failed > 0 || r.verify_errors > 0);
    if bad || !errors.is_empty() {
        1
    } else {
        0
    }
}

/// Parses -S: seconds, 0.1 to 86400, fractions allowed.
fn parse_interval(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.1..=86400.0).contains(&s) => Ok(s),
        _ => Err(format!("{v:?} is not a number of seconds from 0.1 to 86400")),
    }
}

/// Runs one job per bdev of `bdevs` per core for `spec.duration` and waits for all of them;
/// samples the series every `progress_secs` seconds if given (printing a progress line each time
/// when stdout is a terminal). Returns the results, the errors and the series.
fn run_jobs(
    engine: &ferrite_reactor::Engine,
    bdevs: &[String],
    spec: &JobSpec,
    progress_secs: Option<f64>,
) -> (Vec<JobResult>, Vec<String>, Vec<crate::perf_series::Point>) {
    let abort = &spec.abort;
    let (tx, rx) = mpsc::channel::<(String, usize, Result<JobResult, String>)>();
    let mut progress = Vec::new();
    let n = engine.count() as u32;
    for id in 0..engine.count() {
        for bdev in bdevs {
            let p = Arc::new(Progress::default());
            progress.push(p.clone());
            let place = JobPlacement { bdev: bdev.clone(), core: engine.core_of(id), index: id as u32, of: n };
            let spec = spec.for_core(id);
            let recv = engine.run_async(id, move || ferrite_perf::start(spec, place, p));
            let (tx, name, core) = (tx.clone(), bdev.clone(), engine.core_of(id));
            std::thread::spawn(move || {
                let res = match recv.wait() {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) | Err(e) => Err(e.to_string()),
                };
                let _ = tx.send((name, core, res));
            });
        }
    }
    drop(tx);
    let total_jobs = progress.len();
    let mut results = Vec::new();
    let mut errors = Vec::new();
    let t0 = Instant::now();
    let mut sampler = crate::perf_series::Sampler::new(progress, t0);
    let print = progress_secs.is_some() && std::io::stdout().is_terminal();
    let mut tick = 1;
    let interval = Duration::from_secs_f64(progress_secs.unwrap_or(1.0));
    // Jobs stop on their own timer and abort what is still outstanding DRAIN_GRACE later; if
    // they overrun that (e.g. slow buffer setup), stop them.
    let overrun = t0 + spec.duration + ferrite_perf::job::DRAIN_GRACE;
    let mut stopping_since: Option<Instant> = None;
    while results.len() + errors.len() < total_jobs {
        if Instant::now() >= overrun && !abort.swap(true, Ordering::SeqCst) {
            log::warn!("jobs overran -t {:.3}; stopping them", spec.duration.as_secs_f64());
        }
        if abort.load(Ordering::SeqCst) {
            let since = *stopping_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STUCK_GRACE {
                // I/O that never completes (a module holding it) would keep the run for ever.
                let missing = total_jobs - results.len() - errors.len();
                errors.push(format!(
                    "{missing} job(s) did not stop within {} s of being told to: I/O outstanding that never completed",
                    STUCK_GRACE.as_secs()
                ));
                break;
            }
        }
        let next_tick = t0 + interval * tick;
        let wake = if abort.load(Ordering::SeqCst) { next_tick } else { next_tick.min(overrun) };
        match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok((_, _, Ok(r))) => results.push(r),
            Ok((name, core, Err(e))) => errors.push(format!("job {name} on core {core}: {e}")),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < next_tick => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if progress_secs.is_some() {
                    let (_, (ios, bytes, secs)) = sampler.sample();
                    if print {
                        let line =
                            ferrite_perf::report::progress_line((interval * tick).as_secs_f64(), ios, bytes, secs);
                        out(format_args!("{line}\n"));
                    }
                }
                tick += 1;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // The run's last part, if the last tick left more than half an interval of it out.
    if progress_secs.is_some() && sampler.since_last() > interval.as_secs_f64() / 2.0 {
        sampler.sample();
    }
    (results, errors, sampler.points)
}

/// The IOPS of each turn of an interleaved run: `rounds[r][b]` is bdev `b`'s in round `r`.
struct Turns {
    turn_secs: f64,
    rounds: Vec<Vec<f64>>,
}

impl Turns {
    /// Per-round quotients of bdev `b`'s IOPS over the first bdev's (complete rounds only),
    /// sorted.
    fn quotients(&self, b: usize) -> Vec<f64> {
        let mut q: Vec<f64> = self.rounds.iter().filter(|r| r[0] > 0.0).map(|r| r[b] / r[0]).collect();
        q.sort_by(f64::total_cmp);
        q
    }

    /// A line per bdev after the first: the median, lowest and highest per-round quotient.
    fn summary(&self, bdevs: &[String]) -> String {
        let mut s = format!("Interleaved: {} rounds of {:.3} s turns\n", self.rounds.len(), self.turn_secs);
        for (b, name) in bdevs.iter().enumerate().skip(1) {
            let q = self.quotients(b);
            if q.is_empty() {
                continue;
            }
            s.push_str(&format!(
                " {name} / {}: median {:.4} (lowest {:.4}, highest {:.4})\n",
                bdevs[0],
                median(&q),
                q[0],
                q[q.len() - 1]
            ));
        }
        s
    }

    /// `{"turn_secs", "rounds": [{bdev: iops}], "quotients": {bdev: median per-round quotient}}`.
    fn to_json(&self, bdevs: &[String]) -> serde_json::Value {
        let rounds: Vec<serde_json::Value> = self
            .rounds
            .iter()
            .map(|r| serde_json::Value::Object(bdevs.iter().cloned().zip(r.iter().map(|&v| v.into())).collect()))
            .collect();
        let quotients: serde_json::Map<String, serde_json::Value> = bdevs
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(b, name)| {
                let q = self.quotients(b);
                (!q.is_empty()).then(|| (name.clone(), median(&q).into()))
            })
            .collect();
        serde_json::json!({"turn_secs": self.turn_secs, "rounds": rounds, "quotients": quotients})
    }
}

/// The median of sorted, non-empty `v`.
fn median(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the bdevs one at a time in turns of `turn` seconds until each has had `spec.duration`,
/// the order reversed every other round; returns each (bdev, core)'s results summed over its
/// turns, the errors and every turn's IOPS.
fn run_interleaved(
    engine: &ferrite_reactor::Engine,
    bdevs: &[String],
    spec: &JobSpec,
    turn: f64,
) -> (Vec<JobResult>, Vec<String>, Turns) {
    let total = spec.duration.as_secs_f64();
    let rounds = (total / turn).ceil().max(1.0) as usize;
    // Equal turns that add up to the run time.
    let turn = total / rounds as f64;
    let mut sums: Vec<JobResult> = Vec::new();
    let mut errors = Vec::new();
    let mut turns = Turns { turn_secs: turn, rounds: Vec::new() };
    let mut turn_spec = spec.clone();
    turn_spec.duration = Duration::from_secs_f64(turn);
    'rounds: for r in 0..rounds {
        let mut iops = vec![0.0; bdevs.len()];
        let order: Vec<usize> = if r % 2 == 0 { (0..bdevs.len()).collect() } else { (0..bdevs.len()).rev().collect() };
        for b in order {
            if spec.abort.load(Ordering::SeqCst) {
                break 'rounds;
            }
            let (results, errs, _) = run_jobs(engine, std::slice::from_ref(&bdevs[b]), &turn_spec, None);
            iops[b] = results.iter().map(JobResult::iops).sum();
            for res in results {
                match sums.iter_mut().find(|s| s.bdev == res.bdev && s.core == res.core) {
                    Some(s) => {
                        s.runtime_secs += res.runtime_secs;
                        s.ios += res.ios;
                        s.bytes += res.bytes;
                        s.failed += res.failed;
                        s.verify_errors += res.verify_errors;
                        s.latency.merge(&res.latency);
                    }
                    None => sums.push(res),
                }
            }
            if !errs.is_empty() {
                errors.extend(errs);
                break 'rounds;
            }
        }
        // A round cut short by a signal compares turns of unequal length: left out.
        if spec.abort.load(Ordering::SeqCst) {
            break;
        }
        turns.rounds.push(iops);
    }
    (sums, errors, turns)
}

/// Writes to stdout; once the reader has gone away (`ferrite perf ... | head`), further output is
/// dropped quietly and the run goes on (println! would panic on the closed pipe).
fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    static GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|_| o.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("ferrite perf: cannot write to stdout: {e}");
        }
        GONE.store(true, Ordering::Relaxed);
    }
}
