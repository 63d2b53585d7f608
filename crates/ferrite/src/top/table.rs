//! The tabs' tables as text: a header and sorted rows of cells, ready to draw.

use super::poll::{self, Sample};

/// The tabs, in order (keys 1, 2, 3).
pub const TABS: [&str; 3] = ["Reactors", "Bdevs", "Targets"];

/// One tab's table: column names, and rows of cells (already sorted).
pub struct TextTable {
    /// Column names.
    pub header: Vec<&'static str>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

/// A row with the values it sorts by: a name (ascending) or a number (descending).
enum Key {
    Text(String),
    Num(f64),
}

/// Sorts `rows` by their `col`-th key: names A to Z, numbers largest first.
fn sorted(mut rows: Vec<(Vec<Key>, Vec<String>)>, col: usize) -> Vec<Vec<String>> {
    rows.sort_by(|(a, _), (b, _)| match (&a[col], &b[col]) {
        (Key::Text(x), Key::Text(y)) => x.cmp(y),
        (Key::Num(x), Key::Num(y)) => y.total_cmp(x),
        _ => std::cmp::Ordering::Equal,
    });
    rows.into_iter().map(|(_, cells)| cells).collect()
}

/// Number of columns of tab `tab` (what the sort key cycles through).
pub fn columns(tab: usize) -> usize {
    match tab {
        0 => 5,
        1 => 6,
        _ => 3,
    }
}

/// Tab `tab`'s table between `prev` and `cur`, sorted by column `col`.
pub fn build(tab: usize, prev: Option<&Sample>, cur: &Sample, col: usize) -> TextTable {
    use Key::{Num, Text};
    let col = col % columns(tab);
    match tab {
        0 => {
            let rows = poll::reactor_rows(prev, cur)
                .into_iter()
                .map(|r| {
                    let keys = vec![
                        Num(-(r.core as f64)),
                        Num(r.busy_pct),
                        Num(r.idle_pct),
                        Num(r.turns_per_sec),
                        Text(r.state.to_string()),
                    ];
                    let cells = vec![
                        format!("reactor_{}", r.core),
                        format!("{:.1}", r.busy_pct),
                        format!("{:.1}", r.idle_pct),
                        format!("{:.0}", r.turns_per_sec),
                        r.state.to_string(),
                    ];
                    (keys, cells)
                })
                .collect();
            TextTable { header: vec!["Reactor", "Busy %", "Idle %", "Loops/s", "State"], rows: sorted(rows, col) }
        }
        1 => {
            let rows = poll::bdev_rows(prev, cur)
                .into_iter()
                .map(|r| {
                    let qd = r.queue_depth.map_or(-1.0, |q| q as f64);
                    let p99 = r.p99_us.unwrap_or(-1.0);
                    let keys = vec![
                        Text(r.name.clone()),
                        Num(r.iops),
                        Num(r.mib_per_sec),
                        Num(r.mean_lat_us),
                        Num(p99),
                        Num(qd),
                    ];
                    let cells = vec![
                        r.name,
                        format!("{:.0}", r.iops),
                        format!("{:.2}", r.mib_per_sec),
                        format!("{:.1}", r.mean_lat_us),
                        r.p99_us.map_or("-".to_string(), |p| format!("{p:.1}")),
                        r.queue_depth.map_or("-".to_string(), |q| q.to_string()),
                    ];
                    (keys, cells)
                })
                .collect();
            TextTable {
                header: vec!["Bdev", "IOPS", "MiB/s", "Mean lat (us)", "p99 lat (us)", "Queue depth"],
                rows: sorted(rows, col),
            }
        }
        _ => {
            let rows = poll::target_rows(cur)
                .into_iter()
                .map(|r| {
                    let keys = vec![Text(r.target.clone()), Text(r.reactor.clone()), Num(r.connections as f64)];
                    (keys, vec![r.target, r.reactor, r.connections.to_string()])
                })
                .collect();
            TextTable { header: vec!["Target", "Reactor", "Connections"], rows: sorted(rows, col) }
        }
    }
}
