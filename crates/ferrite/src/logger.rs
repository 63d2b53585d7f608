//! The stderr logger for the `log` facade (level from `--log-level` or FERRITE_LOG; at run
//! time from SPDK's log methods, see `ferrite_rpc::logctl`). A line carries the local
//! wall-clock time as SPDK prints it (`[2026-11-28 23:50:29.490081]`, unless
//! `log_enable_timestamps` turned it off), the level, the thread (`reactor_N`, `main`, ...) and
//! the component (the crate: `bdev`, `iscsi_target`, ...); `--log-format json` writes one JSON
//! object per line instead, for log collectors.

use log::{Level, LevelFilter, Metadata, Record};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Lines are JSON objects (`--log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level() && ferrite_rpc::logctl::printed(m.level(), m.target())
    }
    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let lvl = match r.level() {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("main");
        let component = ferrite_rpc::logctl::component(r.target());
        let time = ferrite_rpc::logctl::timestamps().then(wall_clock);
        let line = if JSON.load(Ordering::Relaxed) {
            let mut o = serde_json::Map::new();
            if let Some(t) = time {
                o.insert("time".into(), t.into());
            }
            o.insert("level".into(), lvl.into());
            o.insert("thread".into(), thread.into());
            o.insert("component".into(), component.into());
            o.insert("message".into(), r.args().to_string().into());
            serde_json::Value::Object(o).to_string()
        } else {
            match time {
                Some(t) => format!("[{t}] {lvl} {thread} {component}: {}", r.args()),
                None => format!("{lvl} {thread} {component}: {}", r.args()),
            }
        };
        // One write per line, so that lines of several threads do not interleave.
        let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
    }
    fn flush(&self) {}
}

/// The local time now as SPDK prints it: `2026-11-28 23:50:29.490081`.
fn wall_clock() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: localtime_r fills the tm it is given from a valid time_t; tm is plain data.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = !unsafe { libc::localtime_r(&secs, &mut tm) }.is_null();
    if !ok {
        return format!("{}.{:06}", now.as_secs(), now.subsec_micros());
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `[time] LEVEL thread component: message`.
    Text,
    /// One JSON object per line: time, level, thread, component, message.
    Json,
}

/// Installs the logger; `level` is one of error, warn, info, debug, trace.
pub fn init(level: &str, format: LogFormat) {
    let level = std::env::var("FERRITE_LOG").unwrap_or_else(|_| level.to_string());
    let filter = level.parse::<LevelFilter>().unwrap_or(LevelFilter::Info);
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    let _ = log::set_logger(&Stderr);
    ferrite_rpc::logctl::init_from_filter(filter);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_wall_clock_reads_as_spdk_prints_it() {
        let t = super::wall_clock();
        // 2026-11-28 23:50:29.490081
        assert_eq!(t.len(), 26, "{t}");
        let b = t.as_bytes();
        assert_eq!((b[4], b[7], b[10], b[13], b[16], b[19]), (b'-', b'-', b' ', b':', b':', b'.'), "{t}");
        assert!(t[..4].parse::<u32>().unwrap() >= 2024, "{t}");
    }
}
