//! A bdev's latency histogram as `bdev_get_histogram` returns it (SPDK's format: buckets as
//! little-endian u64s in base64, with granularity, ranges and the tick rate), and the p99 of the
//! I/O counted between two reads of it: `ferrite top`'s p99 column.

use serde_json::Value;

/// One read of a bdev's histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Hist {
    /// Buckets per power-of-two range is `2^granularity`.
    pub granularity: u32,
    /// The first range kept.
    pub min_range: u32,
    /// Ticks per second of the counts.
    pub tsc_rate: u64,
    /// The counts, range by range (cumulative since the histogram was enabled).
    pub buckets: Vec<u64>,
}

impl Hist {
    /// Parses `bdev_get_histogram`'s result; None if it is not one.
    pub fn from_rpc(v: &Value) -> Option<Hist> {
        let bytes = base64_decode(v["histogram"].as_str()?)?;
        if !bytes.len().is_multiple_of(8) {
            return None;
        }
        let buckets = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let granularity = u32::try_from(v["granularity"].as_u64()?).ok().filter(|g| (1..=16).contains(g))?;
        let min_range = u32::try_from(v["min_range"].as_u64()?).ok().filter(|r| *r < 64)?;
        Some(Hist { granularity, min_range, tsc_rate: v["tsc_rate"].as_u64()?.max(1), buckets })
    }

    /// The first tick count past bucket `i` (SPDK's `__spdk_histogram_data_get_bucket_start`).
    fn bucket_end(&self, i: usize) -> u64 {
        let g = self.granularity;
        let range = self.min_range as u64 + (i >> g) as u64;
        let index = (i & ((1usize << g) - 1)) as u64 + 1;
        if range > 0 {
            1u64.checked_shl((range + g as u64 - 1) as u32).unwrap_or(u64::MAX).saturating_add(index << (range - 1))
        } else {
            index
        }
    }

    /// The `pct` percentile, in microseconds, of the I/O counted since `prev` (the whole
    /// histogram without it): the end of the bucket that holds it. None without I/O in between,
    /// or if the histogram was set up anew (other shape, or counts that went down).
    pub fn percentile_since(&self, prev: Option<&Hist>, pct: f64) -> Option<f64> {
        let zero = vec![0; self.buckets.len()];
        let before = match prev {
            Some(p)
                if (p.granularity, p.min_range, p.buckets.len())
                    == (self.granularity, self.min_range, self.buckets.len()) =>
            {
                &p.buckets
            }
            Some(_) => return None,
            None => &zero,
        };
        let mut delta = Vec::with_capacity(self.buckets.len());
        for (now, then) in self.buckets.iter().zip(before) {
            delta.push(now.checked_sub(*then)?);
        }
        let total: u64 = delta.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the percentile's I/O, 1-based: the smallest count with pct% at or below it.
        let rank = ((total as f64 * pct / 100.0).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        let i = delta.iter().position(|&n| {
            seen += n;
            seen >= rank
        })?;
        Some(self.bucket_end(i) as f64 * 1e6 / self.tsc_rate as f64)
    }
}

/// Decodes standard base64 with padding (RFC 4648); None on a bad character or length.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.as_bytes();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (k, chunk) in s.chunks(4).enumerate() {
        let last = k == s.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = n << 6 | val(c)?;
        }
        n <<= 6 * pad as u32;
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn encode(buckets: &[u64]) -> String {
        let bytes: Vec<u8> = buckets.iter().flat_map(|b| b.to_le_bytes()).collect();
        ferrite_bdev::histogram::base64_encode(&bytes)
    }

    #[test]
    fn base64_round_trips_every_padding() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar", &[0xff, 0, 0x80, 7]] {
            assert_eq!(base64_decode(&ferrite_bdev::histogram::base64_encode(data)).as_deref(), Some(data));
        }
        assert_eq!(base64_decode("Zg="), None);
        assert_eq!(base64_decode("Z!=="), None);
        assert_eq!(base64_decode("Zg==Zg=="), None);
    }

    #[test]
    fn p99_of_the_interval_matches_the_daemons_buckets() {
        // The daemon's own histogram (ticks at 1 GHz: a tick is a nanosecond) as the reference.
        let mut h = ferrite_bdev::histogram::Histogram::new(7, 1_000, 120_000_000_000).unwrap();
        let read = |h: &ferrite_bdev::histogram::Histogram| {
            Hist::from_rpc(&json!({"histogram": encode(h.buckets()), "granularity": h.granularity(),
                "min_range": h.min_range(), "max_range": h.max_range(), "tsc_rate": 1_000_000_000u64}))
            .unwrap()
        };
        (0..1000).for_each(|_| h.tally(50_000)); // 50 us, before the first read
        let first = read(&h);
        assert_eq!(first.percentile_since(Some(&first), 99.0), None, "no I/O in between");
        // Then 98 I/Os at 10 us and 2 at 1 ms: p99 of the interval is in the 1 ms bucket, p50
        // in the 10 us one, though the cumulative histogram's p50 is 50 us.
        (0..98).for_each(|_| h.tally(10_000));
        (0..2).for_each(|_| h.tally(1_000_000));
        let second = read(&h);
        let p99 = second.percentile_since(Some(&first), 99.0).unwrap();
        let p50 = second.percentile_since(Some(&first), 50.0).unwrap();
        assert!((1000.0..1010.0).contains(&p99), "{p99}");
        assert!((10.0..10.1).contains(&p50), "{p50}");
        let all = second.percentile_since(None, 50.0).unwrap();
        assert!((50.0..50.5).contains(&all), "{all}");
        // A histogram enabled anew (counts went down) gives no interval value.
        assert_eq!(first.percentile_since(Some(&second), 99.0), None);
    }
}
