//! Log-linear latency histogram (HdrHistogram-style) for `ferrite perf`.
//!
//! Values are `u64` (nanoseconds in practice). Values below 128 get one exact bucket each; above that,
//! every power of two `[2^m, 2^(m+1))` is split into 64 equal sub-buckets of width `2^(m-6)`. The bucket
//! holding a value `v >= 128` starts at or above `64 * width`, so reporting a bucket's upper bound for `v`
//! over-estimates it by less than `v / 64` (relative error below 1/64), and never under-estimates it.
//!
//! The buckets are contiguous and cover the whole `u64` range (the last one ends at `u64::MAX`), so no value
//! needs clamping. There are [`BUCKETS`] (3776) counters, about 30 KiB, allocated once in [`Histogram::new`];
//! [`Histogram::record`] is O(1), allocation-free and branch-free apart from the array bounds check.
//! Count, sum (in a `u128`, which cannot overflow for fewer than 2^64 records), min and max are tracked exactly.

use std::fmt;

/// log2 of the number of sub-buckets per power of two.
const SUB_BITS: u32 = 6;

/// Number of sub-buckets per power of two (64).
const SUB: usize = 1 << SUB_BITS;

/// Number of counters: 128 exact buckets for `0..128`, then 64 per power of two for `2^7 ..= 2^63`.
pub const BUCKETS: usize = (64 - SUB_BITS as usize - 1) * SUB + 2 * SUB;

/// Index of the bucket holding `v`.
///
/// With `shift = max(msb(v) - 6, 0)` the index is `shift * 64 + (v >> shift)`: for `v < 128` that is `v`
/// itself, and for `msb(v) = m >= 7` it is `(m - 6) * 64 + [64, 128)`, i.e. `[(m - 5) * 64, (m - 4) * 64)`,
/// so consecutive powers of two get consecutive runs of 64 indices.
#[inline]
fn bucket_index(v: u64) -> usize {
    // `v | 127` has its most significant bit at 6 or above, so this never underflows; it is 0 for v < 128.
    let shift = (63 - SUB_BITS) - (v | (2 * SUB as u64 - 1)).leading_zeros();
    ((shift as usize) << SUB_BITS) + (v >> shift) as usize
}

/// Smallest and largest value (inclusive) that fall into bucket `index`.
#[inline]
fn bucket_bounds(index: usize) -> (u64, u64) {
    let shift = (index >> SUB_BITS).saturating_sub(1) as u32;
    let lower = ((index - ((shift as usize) << SUB_BITS)) as u64) << shift;
    (lower, lower | ((1u64 << shift) - 1))
}

/// 1-based rank of the `p`-th percentile among `count` values: `ceil(p / 100 * count)`, at least 1 and at
/// most `count`. `p` is clamped to `[0, 100]` (NaN counts as 0). Products that land a few ulps above an
/// integer because of binary rounding (e.g. `99.9 / 100 * 1000`) are taken to be that integer.
fn percentile_rank(p: f64, count: u64) -> u64 {
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 100.0) };
    let x = p / 100.0 * count as f64;
    let rank = (x - x * (4.0 * f64::EPSILON)).ceil() as u64;
    rank.clamp(1, count.max(1))
}

/// A log-linear histogram of `u64` values with relative error below 1/64; see the [module docs](self).
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    sum: u128,
    /// `u64::MAX` while empty so that `record` and `merge` need no special case.
    min: u64,
    max: u64,
}

impl Histogram {
    /// Creates an empty histogram (allocates its counter array once).
    pub fn new() -> Self {
        let counts: Box<[u64; BUCKETS]> =
            vec![0u64; BUCKETS].into_boxed_slice().try_into().expect("vector has exactly BUCKETS elements");
        Histogram { counts, count: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    /// Records one value. O(1) and allocation-free; every `u64`, including `u64::MAX`, is accepted.
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[bucket_index(v)] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Adds all values recorded in `other` to `self`, as if they had been recorded here.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += *theirs;
        }
        self.count += other.count;
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Smallest recorded value (exact), or 0 when empty.
    pub fn min(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    /// Largest recorded value (exact), or 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Arithmetic mean of the recorded values (from the exact sum), or 0.0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The `p`-th percentile, `p` in `[0, 100]` (clamped; NaN counts as 0).
    ///
    /// Returns the upper bound of the bucket holding the `ceil(p / 100 * count)`-th smallest value (the 1st
    /// at least), clamped to [`max`](Self::max): never below the true value and less than 1/64 above it.
    /// Returns 0 when empty.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = percentile_rank(p, self.count);
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_bounds(index).1.min(self.max);
            }
        }
        // Unreachable while the counters sum to `count`; the maximum is the right answer anyway.
        self.max
    }

    /// The non-empty buckets, smallest values first: (lowest value, highest value, count).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &n)| n > 0).map(|(i, &n)| {
            let (lo, hi) = bucket_bounds(i);
            (lo, hi, n)
        })
    }

    /// Forgets all recorded values (keeps the allocation).
    pub fn reset(&mut self) {
        self.counts.fill(0);
        self.count = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Histogram {
    /// A summary (count, min, mean, max and a few percentiles) rather than the 3776 counters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("min", &self.min())
            .field("mean", &self.mean())
            .field("p50", &self.percentile(50.0))
            .field("p99", &self.percentile(99.0))
            .field("max", &self.max())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hist_of(values: &[u64]) -> Histogram {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        h
    }

    #[test]
    fn bucket_count_matches_layout() {
        assert_eq!(BUCKETS, 3776);
        assert_eq!(bucket_index(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_bounds(BUCKETS - 1).1, u64::MAX);
    }

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        let mut next = 0u64;
        for index in 0..BUCKETS {
            let (lower, upper) = bucket_bounds(index);
            assert_eq!(lower, next, "gap or overlap before bucket {index}");
            assert!(upper >= lower);
            assert_eq!(bucket_index(lower), index);
            assert_eq!(bucket_index(upper), index);
            if index < 2 * SUB {
                assert_eq!(lower, upper, "values below 128 are exact");
            } else {
                // width <= lower / 64
                assert!((upper - lower + 1) * 64 <= lower, "bucket {index} too wide");
            }
            next = upper.wrapping_add(1);
        }
        assert_eq!(next, 0, "last bucket ends at u64::MAX");
    }

    #[test]
    fn index_of_known_values() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(63), 63);
        assert_eq!(bucket_index(64), 64);
        assert_eq!(bucket_index(127), 127);
        assert_eq!(bucket_index(128), 128);
        assert_eq!(bucket_index(129), 128);
        assert_eq!(bucket_index(130), 129);
        assert_eq!(bucket_index(255), 191);
        assert_eq!(bucket_index(256), 192);
        assert_eq!(bucket_bounds(128), (128, 129));
        assert_eq!(bucket_bounds(192), (256, 259));
    }

    #[test]
    fn empty_histogram() {
        let h = Histogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.min(), 0);
        assert_eq!(h.max(), 0);
        assert_eq!(h.mean(), 0.0);
        assert_eq!(h.percentile(0.0), 0);
        assert_eq!(h.percentile(50.0), 0);
        assert_eq!(h.percentile(100.0), 0);
        assert_eq!(h, Histogram::default());
    }

    #[test]
    fn small_values_are_exact() {
        let h = hist_of(&(1..=100).collect::<Vec<u64>>());
        assert_eq!(h.count(), 100);
        assert_eq!(h.min(), 1);
        assert_eq!(h.max(), 100);
        assert_eq!(h.mean(), 50.5);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.percentile(1.0), 1);
        assert_eq!(h.percentile(1.5), 2);
        assert_eq!(h.percentile(50.0), 50);
        assert_eq!(h.percentile(99.0), 99);
        assert_eq!(h.percentile(99.9), 100);
        assert_eq!(h.percentile(100.0), 100);
        // Out-of-range p is clamped.
        assert_eq!(h.percentile(-5.0), 1);
        assert_eq!(h.percentile(250.0), 100);
        assert_eq!(h.percentile(f64::NAN), 1);
    }

    #[test]
    fn single_value_percentiles_clamp_to_max() {
        let h = hist_of(&[1000]);
        // 1000 is in bucket [1000, 1007]; the upper bound is clamped to the exact max.
        for p in [0.0, 50.0, 99.9, 100.0] {
            assert_eq!(h.percentile(p), 1000);
        }
        let h = hist_of(&[1000, 5000]);
        assert_eq!(h.percentile(50.0), 1007);
        assert_eq!(h.percentile(100.0), 5000);
    }

    #[test]
    fn rank_handles_binary_rounding() {
        assert_eq!(percentile_rank(99.9, 1000), 999);
        assert_eq!(percentile_rank(99.99, 10_000), 9999);
        assert_eq!(percentile_rank(99.0, 100), 99);
        assert_eq!(percentile_rank(50.0, 3), 2);
        assert_eq!(percentile_rank(0.0, 10), 1);
        assert_eq!(percentile_rank(100.0, 10), 10);
        assert_eq!(percentile_rank(0.1, 1000), 1);
        assert_eq!(percentile_rank(0.11, 1000), 2);
        assert_eq!(percentile_rank(50.0, 0), 1);
    }

    #[test]
    fn u64_max_is_recorded_exactly() {
        let mut h = Histogram::new();
        h.record(u64::MAX);
        h.record(u64::MAX);
        h.record(0);
        assert_eq!(h.count(), 3);
        assert_eq!(h.min(), 0);
        assert_eq!(h.max(), u64::MAX);
        assert_eq!(h.percentile(100.0), u64::MAX);
        assert_eq!(h.percentile(50.0), u64::MAX);
        assert_eq!(h.percentile(10.0), 0);
        assert_eq!(h.mean(), (2.0 * u64::MAX as f64) / 3.0);
    }

    #[test]
    fn reset_empties() {
        let mut h = hist_of(&[5, 500, 50_000]);
        h.reset();
        assert_eq!(h, Histogram::new());
        h.record(7);
        assert_eq!((h.count(), h.min(), h.max(), h.percentile(50.0)), (1, 7, 7, 7));
    }

    #[test]
    fn merge_with_empty_is_identity() {
        let a = hist_of(&[3, 300, 30_000]);
        let mut b = a.clone();
        b.merge(&Histogram::new());
        assert_eq!(a, b);
        let mut e = Histogram::new();
        e.merge(&a);
        assert_eq!(e, a);
        assert_eq!(e.min(), 3);
    }

    fn value() -> impl Strategy<Value = u64> {
        prop_oneof![0..128u64, 0..100_000u64, 0..10_000_000_000u64, any::<u64>()]
    }

    proptest! {
        #[test]
        fn index_and_bounds_agree(v in any::<u64>()) {
            let index = bucket_index(v);
            prop_assert!(index < BUCKETS);
            let (lower, upper) = bucket_bounds(index);
            prop_assert!(lower <= v && v <= upper);
            prop_assert!(upper - v == 0 || (upper - v).saturating_mul(64) < v);
        }

        #[test]
        fn percentile_bounds_true_value(values in proptest::collection::vec(value(), 1..400), p in 0.0..=100.0f64) {
            let h = hist_of(&values);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            for p in [p, 0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0] {
                let truth = sorted[percentile_rank(p, sorted.len() as u64) as usize - 1];
                let est = h.percentile(p);
                prop_assert!(est >= truth, "p{p}: {est} < true {truth}");
                prop_assert!(est <= h.max());
                // Exact below 128, otherwise strictly less than 1/64 above the true value.
                prop_assert!(est == truth || u128::from(est - truth) * 64 < u128::from(truth),
                    "p{p}: {est} too far above true {truth}");
            }
        }

        #[test]
        fn stats_are_exact(values in proptest::collection::vec(value(), 0..400)) {
            let h = hist_of(&values);
            prop_assert_eq!(h.count(), values.len() as u64);
            prop_assert_eq!(h.min(), values.iter().copied().min().unwrap_or(0));
            prop_assert_eq!(h.max(), values.iter().copied().max().unwrap_or(0));
            let sum: u128 = values.iter().map(|&v| u128::from(v)).sum();
            let mean = if values.is_empty() { 0.0 } else { sum as f64 / values.len() as f64 };
            prop_assert_eq!(h.mean(), mean);
        }

        #[test]
        fn merge_equals_concatenation(a in proptest::collection::vec(value(), 0..200),
                                      b in proptest::collection::vec(value(), 0..200)) {
            let mut merged = hist_of(&a);
            merged.merge(&hist_of(&b));
            let concat: Vec<u64> = a.iter().chain(b.iter()).copied().collect();
            let whole = hist_of(&concat);
            prop_assert_eq!(&merged, &whole);
            for p in [0.0, 50.0, 99.0, 99.9, 100.0] {
                prop_assert_eq!(merged.percentile(p), whole.percentile(p));
            }
            prop_assert_eq!(merged.mean(), whole.mean());
        }
    }
}
