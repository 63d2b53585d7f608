//! A minimal stderr logger for the `log` facade (level from `--log-level` or FERRITE_LOG; at run
//! time from SPDK's log methods, see `ferrite_rpc::logctl`).

use log::{Level, LevelFilter, Metadata, Record};

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level() && ferrite_rpc::logctl::printed(m.level(), m.target())
    }
    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let lvl = match r.level() {
                Level::Error => "ERROR",
                Level::Warn => "WARN",
                Level::Info => "INFO",
                Level::Debug => "DEBUG",
                Level::Trace => "TRACE",
            };
            let thread = std::thread::current();
            eprintln!(
                "[{}.{:06}] {lvl} {}: {}",
                t.as_secs(),
                t.subsec_micros(),
                thread.name().unwrap_or("main"),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

/// Installs the logger; `level` is one of error, warn, info, debug, trace.
pub fn init(level: &str) {
    let level = std::env::var("FERRITE_LOG").unwrap_or_else(|_| level.to_string());
    let filter = level.parse::<LevelFilter>().unwrap_or(LevelFilter::Info);
    let _ = log::set_logger(&Stderr);
    ferrite_rpc::logctl::init_from_filter(filter);
}
