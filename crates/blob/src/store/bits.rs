//! A fixed-length array of bits with lowest-first allocation: the blobstore's in-memory used
//! cluster, used metadata page and used blob id masks (SPDK's `spdk_bit_array` and
//! `spdk_bit_pool`). Bit `i` is stored on disk as bit `i % 8` of byte `i / 8`.

/// An array of `len` bits, with a count of the set ones and the lowest clear one.
#[derive(Clone, PartialEq, Eq)]
pub struct BitArray {
    words: Vec<u64>,
    len: usize,
    ones: usize,
    /// No bit below this is clear (`len` if none is).
    lowest_clear: usize,
}

impl std::fmt::Debug for BitArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BitArray {{ len: {}, ones: {} }}", self.len, self.ones)
    }
}

impl BitArray {
    /// `len` clear bits.
    pub fn new(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(64)], len, ones: 0, lowest_clear: 0 }
    }

    /// Bits from their on-disk form: `len` bits from `bytes` (missing bytes read as zero, bits
    /// beyond `len` are ignored).
    pub fn from_bytes(bytes: &[u8], len: usize) -> Self {
        let mut a = Self::new(len);
        for (i, &b) in bytes.iter().enumerate().take(len.div_ceil(8)) {
            for bit in 0..8 {
                let n = i * 8 + bit;
                if n < len && b & (1 << bit) != 0 {
                    a.set(n);
                }
            }
        }
        a
    }

    /// The on-disk form: `len.div_ceil(8)` bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len.div_ceil(8)];
        for n in self.iter_ones() {
            out[n / 8] |= 1 << (n % 8);
        }
        out
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it holds no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> usize {
        self.ones
    }

    /// Number of clear bits.
    pub fn count_zeros(&self) -> usize {
        self.len - self.ones
    }

    /// Bit `n` (false beyond the end).
    pub fn get(&self, n: usize) -> bool {
        n < self.len && self.words[n / 64] & (1 << (n % 64)) != 0
    }

    /// Sets bit `n`; returns whether it was clear. Panics beyond the end.
    pub fn set(&mut self, n: usize) -> bool {
        assert!(n < self.len, "bit {n} beyond {}", self.len);
        let w = &mut self.words[n / 64];
        let m = 1u64 << (n % 64);
        if *w & m != 0 {
            return false;
        }
        *w |= m;
        self.ones += 1;
        if n == self.lowest_clear {
            self.lowest_clear = self.find_first_clear(n).unwrap_or(self.len);
        }
        true
    }

    /// Clears bit `n`; returns whether it was set. Panics beyond the end.
    pub fn clear(&mut self, n: usize) -> bool {
        assert!(n < self.len, "bit {n} beyond {}", self.len);
        let w = &mut self.words[n / 64];
        let m = 1u64 << (n % 64);
        if *w & m == 0 {
            return false;
        }
        *w &= !m;
        self.ones -= 1;
        self.lowest_clear = self.lowest_clear.min(n);
        true
    }

    /// The first clear bit at or after `from`.
    pub fn find_first_clear(&self, from: usize) -> Option<usize> {
        let mut n = from;
        while n < self.len {
            let w = self.words[n / 64] | ((1u64 << (n % 64)) - 1);
            if w != u64::MAX {
                let found = (n / 64) * 64 + w.trailing_ones() as usize;
                return (found < self.len).then_some(found);
            }
            n = (n / 64 + 1) * 64;
        }
        None
    }

    /// Sets the lowest clear bit and returns it (None if all are set).
    pub fn allocate(&mut self) -> Option<usize> {
        let n = self.lowest_clear;
        if n >= self.len {
            return None;
        }
        self.set(n);
        Some(n)
    }

    /// Changes the length; new bits are clear, bits cut off are dropped.
    pub fn resize(&mut self, len: usize) {
        if len < self.len {
            for n in self.iter_ones().filter(|&n| n >= len).collect::<Vec<_>>() {
                self.clear(n);
            }
        }
        self.words.resize(len.div_ceil(64), 0);
        self.len = len;
        self.lowest_clear = self.find_first_clear(0).unwrap_or(len);
    }

    /// The set bits, lowest first.
    pub fn iter_ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + b)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allocates_lowest_first_and_reuses_freed_bits() {
        let mut a = BitArray::new(130);
        assert_eq!((0..3).map(|_| a.allocate().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
        a.set(3);
        a.set(5);
        assert_eq!(a.allocate(), Some(4));
        assert_eq!(a.allocate(), Some(6));
        assert!(a.clear(1));
        assert!(!a.clear(1));
        assert_eq!(a.allocate(), Some(1));
        for n in 7..130 {
            assert_eq!(a.allocate(), Some(n));
        }
        assert_eq!(a.allocate(), None);
        assert_eq!(a.count_ones(), 130);
        a.clear(129);
        assert_eq!(a.allocate(), Some(129));
    }

    #[test]
    fn on_disk_form_is_lsb_first_per_byte() {
        let mut a = BitArray::new(12);
        a.set(0);
        a.set(9);
        assert_eq!(a.to_bytes(), vec![0x01, 0x02]);
        assert_eq!(BitArray::from_bytes(&[0x01, 0x02], 12), a);
        // Bits beyond the length are ignored.
        assert_eq!(BitArray::from_bytes(&[0x01, 0xf2], 12), a);
    }

    proptest! {
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..4, 0usize..200), 0..300), len in 1usize..200) {
            let mut a = BitArray::new(len);
            let mut model = vec![false; len];
            for (op, n) in ops {
                let n = n % len;
                match op {
                    0 => prop_assert_eq!(a.set(n), !std::mem::replace(&mut model[n], true)),
                    1 => prop_assert_eq!(a.clear(n), std::mem::replace(&mut model[n], false)),
                    2 => {
                        let want = model.iter().position(|b| !b);
                        prop_assert_eq!(a.allocate(), want);
                        if let Some(w) = want { model[w] = true; }
                    }
                    _ => prop_assert_eq!(a.find_first_clear(n), (n..len).find(|&i| !model[i])),
                }
                prop_assert_eq!(a.count_ones(), model.iter().filter(|b| **b).count());
            }
            prop_assert_eq!(a.iter_ones().collect::<Vec<_>>(), (0..len).filter(|&i| model[i]).collect::<Vec<_>>());
            prop_assert_eq!(BitArray::from_bytes(&a.to_bytes(), len), a);
        }
    }
}
