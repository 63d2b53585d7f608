//! Results of `ferrite perf` jobs and their presentation, modelled on SPDK bdevperf.
//!
//! * [`progress_line`]: the once-a-second progress line.
//! * [`format_table`]: bdevperf's final table, with extra p50/p99/p99.9 latency columns and a `Total` row.
//! * [`to_json`]: the machine-readable form, shaped like bdevperf's `--json` perf results.
//!
//! Rates over a zero (or negative, or non-finite) duration are reported as 0, and latencies of jobs that
//! recorded nothing are 0, so no output ever contains NaN or infinity. Latencies are recorded in nanoseconds
//! and reported in microseconds.

use crate::hist::Histogram;
use serde_json::{json, Value};

/// Bytes per MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Minimum width of the device-name column of job rows (bdevperf's `%-20s`); longer names widen it.
const MIN_NAME_WIDTH: usize = 20;

/// Minimum width of each value column (bdevperf's `%10.2f`); values that do not fit widen their column.
const MIN_COLUMN_WIDTH: usize = 10;

/// Column titles of the table, after the `Device Information` label.
const COLUMNS: [&str; 10] = ["runtime(s)", "IOPS", "MiB/s", "Fail/s", "Average", "min", "p50", "p99", "p99.9", "max"];

/// The final result of one job (one bdev on one core).
#[derive(Clone, Debug)]
pub struct JobResult {
    /// Name of the bdev the job ran against.
    pub bdev: String,
    /// Core (reactor) the job ran on; shown as the core mask `1 << core`.
    pub core: usize,
    /// Workload name, e.g. `randread` or `verify`.
    pub workload: String,
    /// Number of I/Os kept in flight.
    pub queue_depth: u32,
    /// Size of each I/O in bytes.
    pub io_size: u32,
    /// Measured run time in seconds.
    pub runtime_secs: f64,
    /// Completed I/Os.
    pub ios: u64,
    /// Bytes transferred by the completed I/Os.
    pub bytes: u64,
    /// Failed I/Os.
    pub failed: u64,
    /// Data mismatches found by a verify workload.
    pub verify_errors: u64,
    /// Per-I/O latencies in nanoseconds.
    pub latency: Histogram,
}

impl JobResult {
    /// Completed I/Os per second over the run time (0 for a zero run time).
    pub fn iops(&self) -> f64 {
        per_sec(self.ios as f64, self.runtime_secs)
    }

    /// Throughput in MiB per second over the run time (0 for a zero run time).
    pub fn mib_per_sec(&self) -> f64 {
        per_sec(self.bytes as f64 / MIB, self.runtime_secs)
    }

    /// Failed I/Os per second over the run time (0 for a zero run time).
    fn failed_per_sec(&self) -> f64 {
        per_sec(self.failed as f64, self.runtime_secs)
    }
}

/// `amount / secs`, or 0 when `secs` is not a positive finite number.
fn per_sec(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 && secs.is_finite() {
        amount / secs
    } else {
        0.0
    }
}

/// `x` if finite, else 0 (JSON has no NaN or infinity).
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Nanoseconds to microseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The hexadecimal core mask `0x…` of `1 << core`, for any core number.
fn core_mask(core: usize) -> String {
    format!("0x{}{}", 1u8 << (core % 4), "0".repeat(core / 4))
}

/// Rates and latencies (in microseconds) of one row of the report.
struct Stats {
    iops: f64,
    mibps: f64,
    failed_per_sec: f64,
    avg_us: f64,
    min_us: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
}

impl Stats {
    /// Latency figures of `hist` with the given average; rates are filled in by the caller.
    fn with_latency(hist: &Histogram, avg_ns: f64, iops: f64, mibps: f64, failed_per_sec: f64) -> Self {
        Stats {
            iops: finite(iops),
            mibps: finite(mibps),
            failed_per_sec: finite(failed_per_sec),
            avg_us: finite(avg_ns / 1000.0),
            min_us: us(hist.min()),
            p50_us: us(hist.percentile(50.0)),
            p99_us: us(hist.percentile(99.0)),
            p999_us: us(hist.percentile(99.9)),
            max_us: us(hist.max()),
        }
    }

    fn of_job(job: &JobResult) -> Self {
        Stats::with_latency(&job.latency, job.latency.mean(), job.iops(), job.mib_per_sec(), job.failed_per_sec())
    }

    /// The `Total` row: rates summed over jobs, average weighted by each job's I/O count, min/max and
    /// percentiles from the merged histogram.
    fn total(jobs: &[JobResult]) -> Self {
        let mut merged = Histogram::new();
        let mut weighted_ns = 0.0;
        let mut weight = 0u64;
        for job in jobs {
            merged.merge(&job.latency);
            weighted_ns += job.latency.mean() * job.ios as f64;
            weight += job.ios;
        }
        let avg_ns = if weight == 0 { 0.0 } else { weighted_ns / weight as f64 };
        Stats::with_latency(
            &merged,
            avg_ns,
            jobs.iter().map(JobResult::iops).sum(),
            jobs.iter().map(JobResult::mib_per_sec).sum(),
            jobs.iter().map(JobResult::failed_per_sec).sum(),
        )
    }

    /// The nine value cells after the runtime column, formatted with 2 decimals.
    fn cells(&self) -> [String; 9] {
        [
            self.iops,
            self.mibps,
            self.failed_per_sec,
            self.avg_us,
            self.min_us,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
        ]
        .map(|x| format!("{x:.2}"))
    }

    /// The latency fields shared by per-job and total JSON objects.
    fn latency_json(&self) -> [(&'static str, Value); 6] {
        [
            ("avg_latency_us", json!(self.avg_us)),
            ("min_latency_us", json!(self.min_us)),
            ("p50_latency_us", json!(self.p50_us)),
            ("p99_latency_us", json!(self.p99_us)),
            ("p999_latency_us", json!(self.p999_us)),
            ("max_latency_us", json!(self.max_us)),
        ]
    }
}

/// The once-a-second progress line, e.g. `[  3s]  4163000.00 IOPS,  16261.72 MiB/s`, where `ios` and
/// `bytes` were done during the last `interval_secs` seconds (rates are 0 for a zero interval).
pub fn progress_line(elapsed_secs: f64, ios: u64, bytes: u64, interval_secs: f64) -> String {
    let iops = per_sec(ios as f64, interval_secs);
    let mibps = per_sec(bytes as f64 / MIB, interval_secs);
    format!("[{elapsed_secs:>3}s]{iops:>12.2} IOPS,{mibps:>10.2} MiB/s")
}

/// The final results table, following SPDK bdevperf's layout with extra percentile columns.
///
/// ```text
///                                                                                                  Latency(us)
///  Device Information          : runtime(s)       IOPS      MiB/s     Fail/s    Average        min        p50 ...
///  Job: Malloc0 (Core Mask 0x1)
///          randread, depth: 128, IO size: 4096
///          Malloc0             :       5.00  250000.00     976.56       0.00     511.20       3.10     500.00 ...
///  ==========================================================================================================...
///  Total                       :             250000.00     976.56       0.00     511.20       3.10     500.00 ...
/// ```
///
/// Latencies are in microseconds. Columns are at least 10 characters wide (the name column at least 20)
/// and widen to fit the longest entry, so the header, every job's values row and the `Total` row always
/// have the same length. A `Verify errors on <bdev> core <n>: <count>` line follows for every job with
/// verify errors.
pub fn format_table(jobs: &[JobResult]) -> String {
    let name_width = jobs.iter().map(|j| j.bdev.chars().count()).max().unwrap_or(0).max(MIN_NAME_WIDTH);
    // Job values rows are indented by 9 (bdevperf's "\t "), header and Total rows by 1.
    let label_width = name_width + 8;

    let job_rows: Vec<[String; 10]> = jobs
        .iter()
        .map(|job| {
            let values = Stats::of_job(job).cells();
            std::array::from_fn(
                |i| if i == 0 { format!("{:.2}", finite(job.runtime_secs)) } else { values[i - 1].clone() },
            )
        })
        .collect();
    let total_values = Stats::total(jobs).cells();
    let total_row: [String; 10] =
        std::array::from_fn(|i| if i == 0 { String::new() } else { total_values[i - 1].clone() });

    let mut widths = COLUMNS.map(str::len);
    for row in job_rows.iter().chain(std::iter::once(&total_row)) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len()).max(MIN_COLUMN_WIDTH);
        }
    }
    let columns = |cells: &[String]| -> String {
        cells.iter().zip(widths).map(|(cell, width)| format!(" {cell:>width$}")).collect()
    };

    let header = format!(" {:<label_width$}:{}", "Device Information", columns(&COLUMNS.map(String::from)));
    let line_width = header.len();

    let mut out = String::new();
    out.push_str(&format!("{:>line_width$}\n", "Latency(us)"));
    out.push_str(&header);
    out.push('\n');
    for (job, row) in jobs.iter().zip(&job_rows) {
        out.push_str(&format!(" Job: {} (Core Mask {})\n", job.bdev, core_mask(job.core)));
        out.push_str(&format!("{:9}{}, depth: {}, IO size: {}\n", "", job.workload, job.queue_depth, job.io_size));
        out.push_str(&format!("{:9}{:<name_width$}:{}\n", "", job.bdev, columns(row)));
    }
    out.push_str(&format!(" {}\n", "=".repeat(line_width - 1)));
    out.push_str(&format!(" {:<label_width$}:{}\n", "Total", columns(&total_row)));
    for job in jobs.iter().filter(|j| j.verify_errors > 0) {
        out.push_str(&format!("Verify errors on {} core {}: {}\n", job.bdev, job.core, job.verify_errors));
    }
    out
}

/// Machine-readable results, shaped like bdevperf's `--json` perf results:
/// `{"results": [{"job", "core_mask", "workload", "queue_depth", "io_size", "runtime", "iops", "mibps",
/// "io_failed", "verify_errors", "avg_latency_us", "min_latency_us", "p50_latency_us", "p99_latency_us",
/// "p999_latency_us", "max_latency_us"}, ...], "total": {"iops", "mibps", "io_failed", <latencies>}}`.
///
/// `io_failed` and `verify_errors` are counts; `iops`, `mibps` and latencies (microseconds) are numbers
/// computed as for [`format_table`], including the `total` object.
pub fn to_json(jobs: &[JobResult]) -> Value {
    let results: Vec<Value> = jobs
        .iter()
        .map(|job| {
            let stats = Stats::of_job(job);
            let mut obj = json!({
                "job": job.bdev,
                "core_mask": core_mask(job.core),
                "workload": job.workload,
                "queue_depth": job.queue_depth,
                "io_size": job.io_size,
                "runtime": finite(job.runtime_secs),
                "iops": stats.iops,
                "mibps": stats.mibps,
                "io_failed": job.failed,
                "verify_errors": job.verify_errors,
            });
            extend(&mut obj, stats.latency_json());
            obj
        })
        .collect();

    let total = Stats::total(jobs);
    let mut total_obj = json!({
        "iops": total.iops,
        "mibps": total.mibps,
        "io_failed": jobs.iter().map(|j| j.failed).sum::<u64>(),
    });
    extend(&mut total_obj, total.latency_json());
    json!({ "results": results, "total": total_obj })
}

/// Adds `fields` to the JSON object `obj`.
fn extend<const N: usize>(obj: &mut Value, fields: [(&'static str, Value); N]) {
    if let Value::Object(map) = obj {
        for (key, value) in fields {
            map.insert(key.to_owned(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose histogram holds each of `latencies_ns` `reps` times; `ios` = number of recorded values.
    fn job(bdev: &str, core: usize, runtime_secs: f64, latencies_ns: &[u64], reps: u64) -> JobResult {
        let mut latency = Histogram::new();
        for &ns in latencies_ns {
            for _ in 0..reps {
                latency.record(ns);
            }
        }
        let ios = latency.count();
        JobResult {
            bdev: bdev.to_owned(),
            core,
            workload: "randread".to_owned(),
            queue_depth: 128,
            io_size: 4096,
            runtime_secs,
            ios,
            bytes: ios * 4096,
            failed: 0,
            verify_errors: 0,
            latency,
        }
    }

    /// Two jobs with latencies that are bucket upper bounds, so percentiles are exact:
    /// Malloc0: 1000 I/Os in 2 s, 250 each of 999/1999/3999/7999 ns (mean 3749 ns).
    /// Malloc1: 500 I/Os in 0.5 s, 250 each of 15999/31999 ns (mean 23999 ns), 5 failed, 3 verify errors.
    fn two_jobs() -> Vec<JobResult> {
        let a = job("Malloc0", 0, 2.0, &[999, 1999, 3999, 7999], 250);
        let mut b = job("Malloc1", 1, 0.5, &[15999, 31999], 250);
        b.failed = 5;
        b.verify_errors = 3;
        vec![a, b]
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn job_rates() {
        let jobs = two_jobs();
        assert!(close(jobs[0].iops(), 500.0));
        assert!(close(jobs[1].iops(), 1000.0));
        assert!(close(jobs[0].mib_per_sec(), 1000.0 * 4096.0 / MIB / 2.0));
        assert!(close(jobs[1].mib_per_sec(), 3.90625));
        assert!(close(jobs[1].failed_per_sec(), 10.0));
    }

    #[test]
    fn totals_from_two_jobs() {
        let jobs = two_jobs();
        let t = Stats::total(&jobs);
        assert!(close(t.iops, 1500.0));
        assert!(close(t.mibps, 1.953125 + 3.90625));
        assert!(close(t.failed_per_sec, 10.0));
        // (1000 * 3749 + 500 * 23999) / 1500 = 10499 ns, not the plain mean of means (13874 ns).
        assert!(close(t.avg_us, 10.499), "{}", t.avg_us);
        assert!(close(t.min_us, 0.999));
        assert!(close(t.max_us, 31.999));
        // Merged: 1500 values, 250 per latency; rank 750 is the last 3999, ranks 1485 and 1499 are 31999.
        assert!(close(t.p50_us, 3.999));
        assert!(close(t.p99_us, 31.999));
        assert!(close(t.p999_us, 31.999));
        // The per-job p50s differ from the merged one.
        assert!(close(Stats::of_job(&jobs[0]).p50_us, 1.999));
        assert!(close(Stats::of_job(&jobs[1]).p50_us, 15.999));
    }

    #[test]
    fn weighted_average_uses_io_counts() {
        let mut jobs = two_jobs();
        // Claim Malloc1 did 10x more I/Os than it sampled: its mean now weighs 5000 vs 1000.
        jobs[1].ios = 5000;
        let t = Stats::total(&jobs);
        let expected_ns = (1000.0 * 3749.0 + 5000.0 * 23999.0) / 6000.0;
        assert!(close(t.avg_us, expected_ns / 1000.0));
    }

    #[test]
    fn json_keys_and_values() {
        let v = to_json(&two_jobs());
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        let r0 = results[0].as_object().unwrap();
        let mut keys: Vec<&str> = r0.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected = vec![
            "job",
            "core_mask",
            "workload",
            "queue_depth",
            "io_size",
            "runtime",
            "iops",
            "mibps",
            "io_failed",
            "verify_errors",
            "avg_latency_us",
            "min_latency_us",
            "p50_latency_us",
            "p99_latency_us",
            "p999_latency_us",
            "max_latency_us",
        ];
        expected.sort_unstable();
        assert_eq!(keys, expected);

        assert_eq!(r0["job"], "Malloc0");
        assert_eq!(r0["core_mask"], "0x1");
        assert_eq!(r0["workload"], "randread");
        assert_eq!(r0["queue_depth"], 128);
        assert_eq!(r0["io_size"], 4096);
        assert_eq!(r0["runtime"], 2.0);
        assert_eq!(r0["iops"], 500.0);
        assert_eq!(r0["io_failed"], 0);
        assert_eq!(r0["verify_errors"], 0);
        assert!(close(r0["avg_latency_us"].as_f64().unwrap(), 3.749));
        assert!(close(r0["min_latency_us"].as_f64().unwrap(), 0.999));
        assert!(close(r0["p50_latency_us"].as_f64().unwrap(), 1.999));
        assert!(close(r0["max_latency_us"].as_f64().unwrap(), 7.999));

        let r1 = &results[1];
        assert_eq!(r1["job"], "Malloc1");
        assert_eq!(r1["core_mask"], "0x2");
        assert_eq!(r1["runtime"], 0.5);
        assert_eq!(r1["iops"], 1000.0);
        assert_eq!(r1["mibps"], 3.90625);
        assert_eq!(r1["io_failed"], 5);
        assert_eq!(r1["verify_errors"], 3);

        let total = v["total"].as_object().unwrap();
        let mut keys: Vec<&str> = total.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "avg_latency_us",
                "io_failed",
                "iops",
                "max_latency_us",
                "mibps",
                "min_latency_us",
                "p50_latency_us",
                "p999_latency_us",
                "p99_latency_us",
            ]
        );
        assert!(close(total["iops"].as_f64().unwrap(), 1500.0));
        assert!(close(total["mibps"].as_f64().unwrap(), 5.859375));
        assert_eq!(total["io_failed"], 5);
        assert!(close(total["avg_latency_us"].as_f64().unwrap(), 10.499));
        assert!(close(total["min_latency_us"].as_f64().unwrap(), 0.999));
        assert!(close(total["p50_latency_us"].as_f64().unwrap(), 3.999));
        assert!(close(total["p99_latency_us"].as_f64().unwrap(), 31.999));
        assert!(close(total["p999_latency_us"].as_f64().unwrap(), 31.999));
        assert!(close(total["max_latency_us"].as_f64().unwrap(), 31.999));
    }

    /// Header, job values rows (of bdevs named `Malloc*`) and Total row.
    fn value_rows(table: &str) -> Vec<&str> {
        table
            .lines()
            .filter(|l| {
                l.starts_with(" Device Information") || l.starts_with(" Total") || l.starts_with("         Malloc")
            })
            .collect()
    }

    #[test]
    fn table_layout() {
        let table = format_table(&two_jobs());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[1],
            " Device Information          : runtime(s)       IOPS      MiB/s     Fail/s    Average        min        p50        p99      p99.9        max"
        );
        assert!(lines[0].ends_with("Latency(us)"));
        assert_eq!(lines[0].len(), lines[1].len());
        assert_eq!(lines[2], " Job: Malloc0 (Core Mask 0x1)");
        assert_eq!(lines[3], "         randread, depth: 128, IO size: 4096");
        assert_eq!(
            lines[4],
            "         Malloc0             :       2.00     500.00       1.95       0.00       3.75       1.00       2.00       8.00       8.00       8.00"
        );
        assert_eq!(lines[5], " Job: Malloc1 (Core Mask 0x2)");
        assert!(lines[7].starts_with("         Malloc1             :       0.50    1000.00       3.91      10.00"));
        assert!(lines[8].starts_with(" ====") && lines[8].trim_start().chars().all(|c| c == '='));
        assert_eq!(lines[8].len(), lines[1].len());
        assert_eq!(
            lines[9],
            " Total                       :               1500.00       5.86      10.00      10.50       1.00       4.00      32.00      32.00      32.00"
        );
        assert_eq!(lines[10], "Verify errors on Malloc1 core 1: 3");
        assert_eq!(lines.len(), 11);

        let rows = value_rows(&table);
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.len() == rows[0].len()), "{table}");
        // The colons after the labels line up too.
        assert!(rows.iter().all(|r| r.find(':') == rows[0].find(':')), "{table}");
    }

    #[test]
    fn table_widens_for_long_names_and_large_values() {
        let mut jobs = two_jobs();
        jobs[0].bdev = "MallocWithAVeryLongBdevName0".to_owned();
        jobs[0].ios = 123_456_789_000;
        jobs[0].bytes = jobs[0].ios * 4096;
        jobs[1].latency.record(9_999_999_999_999);
        let table = format_table(&jobs);
        let rows = value_rows(&table);
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.len() == rows[0].len()), "{table}");
        assert!(rows.iter().all(|r| r.find(':') == rows[0].find(':')), "{table}");
        assert!(table.contains("MallocWithAVeryLongBdevName0"));
        assert!(table.contains(" Job: Malloc1 (Core Mask 0x2)"));
        let width = rows[0].len();
        assert!(table.lines().next().unwrap().len() == width);
    }

    #[test]
    fn zero_io_and_zero_runtime_report_zero() {
        let empty = job("Null0", 3, 0.0, &[], 0);
        assert_eq!(empty.iops(), 0.0);
        assert_eq!(empty.mib_per_sec(), 0.0);
        let mut weird = job("Null1", 4, f64::NAN, &[], 0);
        weird.ios = 10;
        weird.bytes = 40960;
        weird.failed = 1;
        assert_eq!(weird.iops(), 0.0);
        let negative = JobResult { runtime_secs: -1.0, ..weird.clone() };
        assert_eq!(negative.iops(), 0.0);

        for jobs in [vec![], vec![empty.clone()], vec![empty, weird, negative]] {
            let table = format_table(&jobs);
            assert!(!table.contains("NaN") && !table.contains("inf"), "{table}");
            assert!(table.contains(" Total "));
            let v = to_json(&jobs);
            let total = v["total"].as_object().unwrap();
            for key in ["iops", "mibps", "avg_latency_us", "min_latency_us", "p50_latency_us", "max_latency_us"] {
                assert_eq!(total[key], 0.0, "{key}");
            }
            for r in v["results"].as_array().unwrap() {
                for (key, value) in r.as_object().unwrap() {
                    assert!(!value.is_null(), "{key} is null");
                }
                assert_eq!(r["iops"], 0.0);
                assert_eq!(r["runtime"].as_f64().unwrap().max(0.0), 0.0);
            }
        }
        let v = to_json(&[job("Null0", 3, 0.0, &[], 0)]);
        assert_eq!(v["results"][0]["core_mask"], "0x8");
        assert_eq!(v["results"][0]["avg_latency_us"], 0.0);
    }

    #[test]
    fn core_masks() {
        assert_eq!(core_mask(0), "0x1");
        assert_eq!(core_mask(1), "0x2");
        assert_eq!(core_mask(3), "0x8");
        assert_eq!(core_mask(4), "0x10");
        assert_eq!(core_mask(9), "0x200");
        assert_eq!(core_mask(63), format!("0x{:x}", 1u64 << 63));
        assert_eq!(core_mask(64), "0x10000000000000000");
    }

    #[test]
    fn progress_lines() {
        assert_eq!(progress_line(3.0, 4_163_000, 4_163_000 * 4096, 1.0), "[  3s]  4163000.00 IOPS,  16261.72 MiB/s");
        assert_eq!(progress_line(12.0, 500, 500 * 512, 0.5), "[ 12s]     1000.00 IOPS,      0.49 MiB/s");
        assert_eq!(progress_line(1.0, 100, 100, 0.0), "[  1s]        0.00 IOPS,      0.00 MiB/s");
        assert_eq!(progress_line(2.5, 100, 100, 0.5), "[2.5s]      200.00 IOPS,      0.00 MiB/s");
    }
}
