//! Parsing of core masks: SPDK's hexadecimal form (`0x3`, `-m 3`) and core lists (`0-1`, `[0,2-3]`).

use std::fmt;

/// A parse failure, naming the text that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuMaskError(pub String);

impl fmt::Display for CpuMaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid core mask: {}", self.0)
    }
}

impl std::error::Error for CpuMaskError {}

/// Highest core number accepted (matches SPDK's limit of 1024 cores).
pub const MAX_CORE: usize = 1023;

/// Parses a core mask into a sorted, de-duplicated list of core numbers.
///
/// Accepted forms: `0x3` or `3` (hexadecimal bit mask, like SPDK's `-m`), and core lists such as
/// `0-1`, `0,2`, `[0,2-3]`. A bare number without `0x` is a hexadecimal mask, as in SPDK; a list
/// is recognised by a `-`, `,` or bracket.
pub fn parse_cpumask(text: &str) -> Result<Vec<usize>, CpuMaskError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(CpuMaskError("empty".into()));
    }
    let is_list = t.starts_with('[') || t.contains(',') || t.contains('-');
    let cores = if is_list {
        parse_list(t.trim_start_matches('[').trim_end_matches(']'), text)?
    } else {
        parse_hex(t.trim_start_matches("0x").trim_start_matches("0X"), text)?
    };
    if cores.is_empty() {
        return Err(CpuMaskError(format!("{text:?} selects no core")));
    }
    Ok(cores)
}

fn parse_hex(hex: &str, orig: &str) -> Result<Vec<usize>, CpuMaskError> {
    if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(CpuMaskError(format!("{orig:?} is not a hexadecimal mask")));
    }
    let mut cores = Vec::new();
    for (pos, c) in hex.chars().rev().enumerate() {
        let nibble = c.to_digit(16).expect("checked hex digit");
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                let core = pos * 4 + bit;
                if core > MAX_CORE {
                    return Err(CpuMaskError(format!("{orig:?} names core {core} > {MAX_CORE}")));
                }
                cores.push(core);
            }
        }
    }
    Ok(cores)
}

fn parse_list(list: &str, orig: &str) -> Result<Vec<usize>, CpuMaskError> {
    let num = |s: &str| -> Result<usize, CpuMaskError> {
        let n: usize = s.trim().parse().map_err(|_| CpuMaskError(format!("{orig:?}: {s:?} is not a core number")))?;
        if n > MAX_CORE {
            return Err(CpuMaskError(format!("{orig:?} names core {n} > {MAX_CORE}")));
        }
        Ok(n)
    };
    let mut cores = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(CpuMaskError(format!("{orig:?}: range {a}-{b} is reversed")));
                }
                cores.extend(a..=b);
            }
            None => cores.push(num(part)?),
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Ok(cores)
}

/// Formats cores as SPDK's hexadecimal mask (`0x3`).
pub fn format_cpumask(cores: &[usize]) -> String {
    let max = cores.iter().copied().max().unwrap_or(0);
    let mut nibbles = vec![0u8; max / 4 + 1];
    for &c in cores {
        nibbles[c / 4] |= 1 << (c % 4);
    }
    let hex: String = nibbles.iter().rev().map(|n| format!("{n:x}")).collect();
    let hex = hex.trim_start_matches('0');
    format!("0x{}", if hex.is_empty() { "0" } else { hex })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hex_and_list_forms() {
        assert_eq!(parse_cpumask("0x3").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpumask("3").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpumask("0x10").unwrap(), vec![4]);
        assert_eq!(parse_cpumask("0-1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpumask("[0,2-3]").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cpumask("1,1,0").unwrap(), vec![0, 1]);
    }

    #[test]
    fn bad_masks_are_rejected() {
        for bad in ["", "0x", "0x0", "zz", "1-0", "0-x", "[5000]", "0x1g"] {
            assert!(parse_cpumask(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(set in proptest::collection::btree_set(0usize..64, 1..10)) {
            let cores: Vec<usize> = set.into_iter().collect();
            prop_assert_eq!(parse_cpumask(&format_cpumask(&cores)).unwrap(), cores);
        }
    }
}
