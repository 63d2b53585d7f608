//! Latency histograms in SPDK's format (`include/spdk/histogram_data.h`), kept per (bdev, core)
//! while enabled and merged on request; the `bdev_enable_histogram` and `bdev_get_histogram`
//! methods.
//!
//! The buckets are SPDK's: each power-of-two range of tick counts is split into
//! `2^granularity` buckets (ranges 0 and 1 one value per bucket, each later range twice as wide
//! as the one before), and only the ranges from `min_range` to `max_range` are kept. The result
//! of `bdev_get_histogram` is the bucket array as little-endian u64s in base64, with
//! `granularity`, `min_range`, `max_range` and `tsc_rate`, which SPDK's `scripts/histogram.py`
//! decodes.
//!
//! Cost: while disabled, one branch per completion (`Option::is_some` on the core's counters).
//! While enabled, one `lzcnt`, a shift and an increment of a core-local bucket per completion.

use crate::bdev::{lookup, Bdev};
use crate::io::IoType;
use crate::rpc::not_found;
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Mutex;

/// SPDK's default granularity (`SPDK_HISTOGRAM_GRANULARITY_DEFAULT`): 128 buckets per range.
pub const DEFAULT_GRANULARITY: u32 = 7;
/// Largest granularity accepted (2^16 buckets per range, 512 KiB per range and core).
pub const MAX_GRANULARITY: u32 = 16;
/// SPDK's RPC default for the smallest latency tracked (`SPDK_BDEV_HISTOGRAM_DEFAULT_MIN_VALUE_NS`).
pub const DEFAULT_MIN_NSEC: u64 = 1_000;
/// SPDK's RPC default for the largest latency tracked (`SPDK_BDEV_HISTOGRAM_DEFAULT_MAX_VALUE_NS`).
pub const DEFAULT_MAX_NSEC: u64 = 120_000_000_000;

/// An SPDK histogram: counts of data points (tick counts) in logarithmic buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    granularity: u32,
    min_range: u32,
    max_range: u32,
    buckets: Box<[u64]>,
}

#[inline]
fn range_of(granularity: u32, v: u64) -> u32 {
    let clz = v.leading_zeros();
    (64 - granularity).saturating_sub(clz)
}

impl Histogram {
    /// A histogram tracking values from `min_val` (inclusive) to `max_val` (exclusive), as
    /// SPDK's `spdk_histogram_data_alloc_sized_ext`; None if the range is empty or the
    /// granularity is not 1 to [`MAX_GRANULARITY`].
    pub fn new(granularity: u32, min_val: u64, max_val: u64) -> Option<Self> {
        if min_val >= max_val || !(1..=MAX_GRANULARITY).contains(&granularity) {
            return None;
        }
        let min_range = range_of(granularity, min_val);
        let max_range = range_of(granularity, max_val - 1);
        let n = ((max_range - min_range + 1) as usize) << granularity;
        Some(Self { granularity, min_range, max_range, buckets: vec![0; n].into_boxed_slice() })
    }

    /// Counts one data point (SPDK's `spdk_histogram_data_tally`): values below the first
    /// range land in its first bucket, values above the last in its last bucket.
    #[inline]
    pub fn tally(&mut self, v: u64) {
        let g = self.granularity;
        let range = range_of(g, v);
        let (range, index) = if range < self.min_range {
            (self.min_range, 0)
        } else if range > self.max_range {
            (self.max_range, (1u64 << g) - 1)
        } else {
            let shift = range.saturating_sub(1);
            (range, (v >> shift) & ((1u64 << g) - 1))
        };
        let i = (((range - self.min_range) as usize) << g) + index as usize;
        self.buckets[i] += 1;
    }

    /// True if both have the same granularity and ranges (so they can merge).
    pub fn same_shape(&self, o: &Histogram) -> bool {
        (self.granularity, self.min_range, self.max_range) == (o.granularity, o.min_range, o.max_range)
    }

    /// Adds another histogram's counts; false (and nothing added) if their shapes differ.
    pub fn merge(&mut self, o: &Histogram) -> bool {
        if !self.same_shape(o) {
            return false;
        }
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
        true
    }

    /// Buckets per power-of-two range is `2^granularity`.
    pub fn granularity(&self) -> u32 {
        self.granularity
    }
    /// The first range kept.
    pub fn min_range(&self) -> u32 {
        self.min_range
    }
    /// The last range kept.
    pub fn max_range(&self) -> u32 {
        self.max_range
    }
    /// The counts, range by range (`2^granularity` per range).
    pub fn buckets(&self) -> &[u64] {
        &self.buckets
    }
    /// Number of data points counted.
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The first value past bucket `index` of `range` (SPDK's
    /// `__spdk_histogram_data_get_bucket_start`, which names the end of the bucket).
    pub fn bucket_end(&self, range: u32, index: u64) -> u64 {
        let index = index + 1;
        if range > 0 {
            (1u64 << (range + self.granularity - 1)) + (index << (range - 1))
        } else {
            index
        }
    }

    /// Each bucket's end (the first value past it, in ticks) with its count, in increasing
    /// order (what a Prometheus histogram's cumulative buckets are made from).
    pub fn bucket_ends(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let g = self.granularity;
        self.buckets.iter().enumerate().map(move |(i, &n)| {
            let range = self.min_range + (i >> g) as u32;
            (self.bucket_end(range, (i & ((1usize << g) - 1)) as u64), n)
        })
    }

    /// The buckets as SPDK sends them: little-endian u64s, base64.
    pub fn to_base64(&self) -> String {
        let bytes: Vec<u8> = self.buckets.iter().flat_map(|b| b.to_le_bytes()).collect();
        base64_encode(&bytes)
    }
}

/// Standard base64 with padding (RFC 4648), as SPDK's `spdk_base64_encode`.
pub fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A core's histogram of one bdev, with the I/O type it counts (None: every type).
pub(crate) struct CoreHistogram {
    pub(crate) opc: Option<IoType>,
    pub(crate) h: Histogram,
}

impl CoreHistogram {
    #[inline]
    pub(crate) fn record(&mut self, t: IoType, ticks: u64) {
        if self.opc.is_none_or(|o| o == t) {
            self.h.tally(ticks);
        }
    }
}

/// How a bdev's histograms are set up while enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistConfig {
    pub(crate) opc: Option<IoType>,
    pub(crate) granularity: u32,
    /// In ticks.
    pub(crate) min_val: u64,
    /// In ticks.
    pub(crate) max_val: u64,
}

impl HistConfig {
    pub(crate) fn empty(&self) -> Histogram {
        Histogram::new(self.granularity, self.min_val, self.max_val).expect("checked when enabled")
    }
}

/// The bdev-wide histogram setting (None: disabled). Read when a core's counters are made and
/// by the control plane; never on the I/O path.
#[derive(Default)]
pub(crate) struct HistShared(Mutex<Option<HistConfig>>);

impl HistShared {
    pub(crate) fn get(&self) -> Option<HistConfig> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes this core's histogram of `bdev` match the bdev's setting (run on every core).
fn apply_local(bdev: &Bdev) {
    let cfg = bdev.0.histogram.get();
    crate::channel::with_local_stats(bdev, |s| s.set_histogram(cfg));
}

/// Enables (with `cfg`) or disables (None) the histograms of `bdev` on every core of `engine`;
/// counts start from zero. Resolves once every core has applied it.
pub async fn enable(engine: &ferrite_reactor::Engine, bdev: &Bdev, cfg: Option<(Option<IoType>, u32, u64, u64)>) {
    let cfg = cfg.map(|(opc, granularity, min_val, max_val)| HistConfig { opc, granularity, min_val, max_val });
    *bdev.0.histogram.0.lock().unwrap_or_else(|p| p.into_inner()) = cfg;
    let b = bdev.clone();
    let _ = engine.on_all(move |_| apply_local(&b)).await;
}

/// The merged histogram of `bdev` over every core (None if histograms are disabled).
pub async fn merged(engine: &ferrite_reactor::Engine, bdev: &Bdev) -> Option<Histogram> {
    let cfg = bdev.0.histogram.get()?;
    let id = bdev.id();
    let parts =
        engine.on_all(move |_| crate::channel::local_stats(id).and_then(|s| s.histogram())).await.unwrap_or_default();
    let mut total = cfg.empty();
    for p in parts.iter().flatten() {
        total.merge(p);
    }
    Some(total)
}

fn nsec_to_ticks(ns: u64) -> u64 {
    if ns == u64::MAX {
        return u64::MAX;
    }
    (ns as u128 * ferrite_reactor::tsc::ticks_per_sec() as u128 / 1_000_000_000).min(u64::MAX as u128) as u64
}

/// The I/O type SPDK calls `name` (`spdk_bdev_get_io_type`).
pub fn io_type_by_name(name: &str) -> Option<IoType> {
    IoType::ALL.into_iter().find(|t| t.name() == name)
}

/// The saved-config entry that enables the histogram of `b`, if enabled (SPDK writes
/// `name`, `enable` and `opc`).
pub(crate) fn config_entry(b: &Bdev) -> Option<Value> {
    let cfg = b.0.histogram.get()?;
    let mut params = json!({"name": b.name(), "enable": true});
    if let Some(t) = cfg.opc {
        params["opc"] = json!(t.name());
    }
    Some(json!({"method": "bdev_enable_histogram", "params": params}))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EnableParams {
    /// The bdev.
    name: String,
    /// On or off.
    enable: bool,
    /// Only this I/O type (`read`, `write`, ...): all if not given.
    opc: Option<String>,
    /// SPDK's bucket granularity (only its default).
    granularity: Option<u32>,
    /// SPDK's lowest tracked latency (only its default).
    min_nsec: Option<u64>,
    /// SPDK's highest tracked latency (only its default).
    max_nsec: Option<u64>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetParams {
    /// The bdev.
    name: String,
}

/// Registers `bdev_enable_histogram` and `bdev_get_histogram`.
pub(crate) fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_enable_histogram",
        "Turns the latency histogram of a bdev on or off (optionally for one I/O type).",
        |ctx, p: EnableParams| async move {
            let b = lookup(&p.name).ok_or_else(|| not_found(&p.name))?;
            let opc = match p.opc.as_deref() {
                None => None,
                Some(n) => Some(
                    io_type_by_name(n).ok_or_else(|| errno_error(libc::EINVAL, format!("Invalid Io type {n:?}")))?,
                ),
            };
            let granularity = p.granularity.unwrap_or(DEFAULT_GRANULARITY);
            if !(1..=MAX_GRANULARITY).contains(&granularity) {
                return Err(errno_error(
                    libc::EINVAL,
                    format!("granularity {granularity} must be 1 to {MAX_GRANULARITY}"),
                ));
            }
            let (min_ns, max_ns) = (p.min_nsec.unwrap_or(DEFAULT_MIN_NSEC), p.max_nsec.unwrap_or(DEFAULT_MAX_NSEC));
            let (min_val, max_val) = (nsec_to_ticks(min_ns), nsec_to_ticks(max_ns));
            if min_val >= max_val {
                return Err(errno_error(libc::EINVAL, format!("min_nsec {min_ns} must be below max_nsec {max_ns}")));
            }
            let cfg = p.enable.then_some((opc, granularity, min_val, max_val));
            enable(&ctx.engine, &b, cfg).await;
            log::info!("bdev {}: histogram {}", b.name().escape_debug(), if p.enable { "enabled" } else { "disabled" });
            Ok(json!(true))
        },
    );
    reg.typed(
        "bdev_get_histogram",
        "A bdev's latency histogram, merged over the cores, in SPDK's encoding.",
        |ctx, p: GetParams| async move {
            let b = lookup(&p.name).ok_or_else(|| not_found(&p.name))?;
            let h = merged(&ctx.engine, &b)
                .await
                .ok_or_else(|| RpcError::internal(format!("histogram is not enabled on bdev {}", p.name)))?;
            Ok(json!({"histogram": h.to_base64(), "granularity": h.granularity(), "min_range": h.min_range(),
            "max_range": h.max_range(), "tsc_rate": ferrite_reactor::tsc::ticks_per_sec()}))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_spdk() {
        // Unbounded: 58 ranges of 128 buckets; 0..=255 one value per bucket.
        let mut h = Histogram::new(7, 0, u64::MAX).unwrap();
        assert_eq!((h.min_range(), h.max_range(), h.buckets().len()), (0, 57, 58 * 128));
        h.tally(0);
        h.tally(127);
        h.tally(200);
        h.tally(300); // range 2, 2 values per bucket: index (300 >> 1) & 127 = 22
        h.tally(u64::MAX);
        let b = h.buckets();
        assert_eq!((b[0], b[127], b[128 + 72], b[2 * 128 + 22], b[57 * 128 + 127]), (1, 1, 1, 1, 1));
        assert_eq!(h.bucket_end(2, 22), 256 + 23 * 2, "bucket 22 of range 2 holds 300 and 301");
        // Bounded: values outside clamp to the first and last bucket.
        let mut h = Histogram::new(7, 1000, 100_000).unwrap();
        assert_eq!((h.min_range(), h.max_range()), (3, 10));
        h.tally(5);
        h.tally(1 << 40);
        assert_eq!((h.buckets()[0], *h.buckets().last().unwrap()), (1, 1));
        assert!(Histogram::new(7, 5, 5).is_none() && Histogram::new(0, 0, 9).is_none());
    }

    #[test]
    fn bucket_ends_rise_and_hold_every_value_below_its_end() {
        let mut h = Histogram::new(3, 0, 1 << 20).unwrap();
        for v in [0u64, 5, 9, 300, 301, 70_000] {
            h.tally(v);
        }
        let ends: Vec<(u64, u64)> = h.bucket_ends().collect();
        assert!(ends.windows(2).all(|w| w[0].0 < w[1].0), "ends rise");
        assert_eq!(ends.iter().map(|e| e.1).sum::<u64>(), 6);
        // Each value counts in the first bucket whose end is past it.
        for v in [0u64, 5, 9, 300, 70_000] {
            let (end, n) = *ends.iter().find(|e| e.0 > v).unwrap();
            assert!(n > 0, "value {v}: bucket ending at {end} is empty");
        }
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64_encode(i.as_bytes()), o);
        }
    }
}
