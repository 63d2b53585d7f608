//! `ferrite top`: a live view of a running daemon (SPDK's spdk_top), read over its RPC socket
//! each second: reactors, bdevs and targets on tabs.
//!
//! The bdevs tab's p99 comes from the bdevs' latency histograms (`bdev_get_histogram`), from
//! the difference of two reads: the p99 of the interval's I/O, "-" for a bdev without one.
//! Histograms cost the daemon a little per I/O, so top enables them only when asked
//! (`--histograms`, or the `h` key), on the bdevs that have none, and disables those again on
//! `h` or when it quits; histograms enabled by others are read and left alone. Each refresh
//! reads the histograms of the bdevs that had one; every [`RESCAN`] refreshes, those of all.

mod draw;
mod hist;
mod poll;
mod table;

use crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ferrite_rpc::client::RpcClient;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `ferrite top`.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Socket of the daemon.
    #[arg(short = 's', long = "server", default_value = ferrite_rpc::server::DEFAULT_SOCKET)]
    server: PathBuf,
    /// Seconds between refreshes.
    #[arg(short = 'd', long = "delay", default_value_t = 1.0)]
    delay: f64,
    /// Enable the latency histogram of every bdev without one at the start (for the p99
    /// column; `h` toggles), and disable them again at the end.
    #[arg(long)]
    histograms: bool,
}

/// Every this many refreshes, top reads the histograms of all bdevs, not only of those that
/// had one at the last refresh.
const RESCAN: u64 = 10;

/// What the view shows now: the tab, each tab's sort column, the last two samples.
struct View {
    tab: usize,
    sort: [usize; table::TABS.len()],
    prev: Option<poll::Sample>,
    cur: poll::Sample,
    status: String,
    /// The bdevs whose histograms this view enabled (and disables again).
    enabled: Vec<String>,
}

impl View {
    /// `h`: enables the histograms of the bdevs without one, or disables those this view
    /// enabled; sets the status line.
    fn toggle_histograms(&mut self, client: &mut RpcClient, socket: &str) {
        let (enable, names): (bool, Vec<String>) = if self.enabled.is_empty() {
            (true, self.cur.bdevs.iter().filter(|(_, b)| b.hist.is_none()).map(|(n, _)| n.clone()).collect())
        } else {
            (false, std::mem::take(&mut self.enabled))
        };
        let (done, error) = poll::set_histograms(client, &names, enable);
        let verb = if enable { "enabled" } else { "disabled" };
        self.status = match error {
            Some(e) => format!("{socket}: {e}"),
            None => format!("{socket}: histograms {verb} on {} bdev(s)", done.len()),
        };
        if enable {
            self.enabled = done;
        }
        *ENABLED.lock().unwrap_or_else(|e| e.into_inner()) = self.enabled.clone();
    }
}

/// The bdevs whose histograms top enabled, for the signal thread's clean-up.
static ENABLED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// SIGTERM, SIGHUP (the terminal closed) and SIGINT end top as `q` does, from a thread of their
/// own (the terminal library may be stuck reading a terminal that hung up): the histograms top
/// enabled are disabled again over a connection of its own, the terminal restored, and the
/// process ends.
fn watch_signals(server: std::path::PathBuf) {
    crate::signals::block();
    let spawned = std::thread::Builder::new().name("top-signals".into()).spawn(move || {
        let sig = crate::signals::wait();
        let names = ENABLED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !names.is_empty() {
            if let Ok(mut c) = RpcClient::connect(&server, Duration::from_secs(5)) {
                let _ = poll::set_histograms(&mut c, &names, false);
            }
        }
        ratatui::restore();
        eprintln!("ferrite top: {sig}");
        std::process::exit(0);
    });
    if let Err(e) = spawned {
        eprintln!("ferrite top: no signal thread: {e}");
    }
}

/// Runs the live view until `q`, Esc, Ctrl-C or a stop signal; returns the exit code.
pub fn run(a: TopArgs) -> i32 {
    if !a.delay.is_finite() || !(0.1..=3600.0).contains(&a.delay) {
        eprintln!("ferrite top: --delay {} must be 0.1 to 3600 seconds", a.delay);
        return 2;
    }
    let mut client = match RpcClient::connect(&a.server, Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrite top: {}: {e}", a.server.display());
            return 1;
        }
    };
    let cur = match poll::sample(&mut client, poll::HistReads::All) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ferrite top: {e}");
            return 1;
        }
    };
    let status = a.server.display().to_string();
    let mut view =
        View { tab: 0, sort: [0; table::TABS.len()], prev: None, cur, status: status.clone(), enabled: Vec::new() };
    if a.histograms {
        view.toggle_histograms(&mut client, &status);
    }
    watch_signals(a.server.clone());
    let mut term = ratatui::init();
    let delay = Duration::from_secs_f64(a.delay);
    let mut next = Instant::now() + delay;
    let (mut refreshes, mut rescan_now) = (0u64, false);
    // The error of the last refresh, while the daemon does not answer.
    let mut lost: Option<String> = None;
    let res: std::io::Result<()> = (|| loop {
        let t = table::build(view.tab, view.prev.as_ref(), &view.cur, view.sort[view.tab]);
        let col = view.sort[view.tab] % table::columns(view.tab);
        term.draw(|f| draw::draw(f, &draw::Screen { tab: view.tab, table: &t, sort_col: col, status: &view.status }))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                let ctrl_c = k.modifiers.contains(event::KeyModifiers::CONTROL) && k.code == KeyCode::Char('c');
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    _ if ctrl_c => return Ok(()),
                    KeyCode::Tab => view.tab = (view.tab + 1) % table::TABS.len(),
                    KeyCode::BackTab => view.tab = (view.tab + table::TABS.len() - 1) % table::TABS.len(),
                    KeyCode::Char(c @ '1'..='3') => view.tab = c as usize - '1' as usize,
                    KeyCode::Char('h') => {
                        view.toggle_histograms(&mut client, &status);
                        // Read at once, every bdev's: the next interval starts now.
                        next = Instant::now();
                        rescan_now = true;
                    }
                    KeyCode::Char('s') => {
                        view.sort[view.tab] =
                            (view.sort[view.tab] % table::columns(view.tab) + 1) % table::columns(view.tab)
                    }
                    _ => {}
                }
            }
            continue;
        }
        next = Instant::now() + delay;
        // Every bdev's histogram every RESCAN refreshes (one enabled by another client shows
        // up then) and after `h`; in between only those that had one.
        refreshes += 1;
        let with_hist: Vec<String>;
        let hists = if refreshes % RESCAN == 0 || rescan_now {
            poll::HistReads::All
        } else {
            with_hist = view.cur.bdevs.iter().filter(|(_, b)| b.hist.is_some()).map(|(n, _)| n.clone()).collect();
            poll::HistReads::Only(&with_hist)
        };
        rescan_now = false;
        match poll::sample(&mut client, hists) {
            Ok(s) => {
                lost = None;
                view.prev = Some(std::mem::replace(&mut view.cur, s));
                view.status = match view.enabled.len() {
                    0 => status.clone(),
                    n => format!("{status} | histograms enabled by top on {n} bdev(s)"),
                };
            }
            Err(e) => {
                view.status = format!("{status}: {e}");
                lost = Some(e.to_string());
                // A daemon that comes back (restarted on the same socket) is picked up again.
                if let Ok(c) = RpcClient::connect(&a.server, delay.min(Duration::from_secs(1))) {
                    client = c;
                }
            }
        }
    })();
    ratatui::restore();
    let (_, error) = poll::set_histograms(&mut client, &view.enabled, false);
    if let Some(e) = &error {
        eprintln!("ferrite top: {e}");
    }
    match res {
        // Quit while the daemon could not be read: the exit code says so.
        Ok(()) => match lost {
            Some(e) => {
                eprintln!("ferrite top: the daemon did not answer at the end: {e}");
                1
            }
            None => i32::from(error.is_some()),
        },
        Err(e) => {
            eprintln!("ferrite top: {e}");
            1
        }
    }
}
