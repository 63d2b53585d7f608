//! `ferrite top`: a live view of a running daemon (SPDK's spdk_top), read over its RPC socket
//! each second: reactors, bdevs and targets on tabs.

mod draw;
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
}

/// What the view shows now: the tab, each tab's sort column, the last two samples.
struct View {
    tab: usize,
    sort: [usize; table::TABS.len()],
    prev: Option<poll::Sample>,
    cur: poll::Sample,
    status: String,
}

/// Runs the view until `q` (or Esc, or Ctrl-C); returns the exit code.
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
    let cur = match poll::sample(&mut client) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ferrite top: {e}");
            return 1;
        }
    };
    let status = a.server.display().to_string();
    let mut view = View { tab: 0, sort: [0; table::TABS.len()], prev: None, cur, status: status.clone() };
    let mut term = ratatui::init();
    let delay = Duration::from_secs_f64(a.delay);
    let mut next = Instant::now() + delay;
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
        match poll::sample(&mut client) {
            Ok(s) => {
                view.prev = Some(std::mem::replace(&mut view.cur, s));
                view.status = status.clone();
            }
            Err(e) => view.status = format!("{status}: {e}"),
        }
    })();
    ratatui::restore();
    match res {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferrite top: {e}");
            1
        }
    }
}
