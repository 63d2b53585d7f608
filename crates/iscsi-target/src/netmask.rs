//! Initiator addresses against an initiator group's netmasks, as SPDK matches them
//! (`iscsi_netmask_allow_addr`): `ANY` (any case) matches everything; `[v6addr]` or
//! `[v6addr]/bits` (1-128) an IPv6 prefix; anything else `v4addr` or `v4addr/bits` (1-32) an
//! IPv4 prefix. A netmask that does not parse matches nothing (SPDK keeps such masks, and so
//! does Ferrite). An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) is matched as
//! the IPv4 address it is (SPDK would match its text against IPv6 masks only).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Prefix length after `/` as SPDK reads it (`strtol`: leading digits, else 0).
fn prefix_bits(s: &str) -> i64 {
    let s = s.trim_start();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let n: i64 = digits.bytes().take_while(u8::is_ascii_digit).take(18).fold(0, |a, d| a * 10 + i64::from(d - b'0'));
    if neg {
        -n
    } else {
        n
    }
}

/// True if the first `bits` bits of `a` and `b` agree.
fn same_prefix(a: &[u8], b: &[u8], bits: usize) -> bool {
    let whole = bits / 8;
    if a[..whole] != b[..whole] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || {
        let m = 0xffu8 << (8 - rest);
        a[whole] & m == b[whole] & m
    }
}

fn v6_allows(mask: &str, addr: Ipv6Addr) -> bool {
    let Some(inner) = mask.strip_prefix('[') else { return false };
    let Some((host, rest)) = inner.split_once(']') else { return false };
    let bits = match rest.strip_prefix('/') {
        Some(b) => prefix_bits(b),
        None => 128,
    };
    if !(1..=128).contains(&bits) {
        return false;
    }
    let Ok(m) = host.parse::<Ipv6Addr>() else { return false };
    same_prefix(&m.octets(), &addr.octets(), bits as usize)
}

fn v4_allows(mask: &str, addr: Ipv4Addr) -> bool {
    let (host, bits) = match mask.split_once('/') {
        Some((h, b)) => (h, prefix_bits(b)),
        None => (mask, 32),
    };
    if !(1..=32).contains(&bits) {
        return false;
    }
    let Ok(m) = host.parse::<Ipv4Addr>() else { return false };
    same_prefix(&m.octets(), &addr.octets(), bits as usize)
}

/// True if netmask `mask` admits `addr`.
pub fn allows(mask: &str, addr: IpAddr) -> bool {
    if mask.eq_ignore_ascii_case("ANY") {
        return true;
    }
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    };
    match (mask.starts_with('['), addr) {
        (true, IpAddr::V6(a)) => v6_allows(mask, a),
        (false, IpAddr::V4(a)) => v4_allows(mask, a),
        _ => false,
    }
}

/// True if `mask` could ever match an address (for a warning when a group gets one that
/// cannot; SPDK accepts any text).
pub fn meaningful(mask: &str) -> bool {
    if mask.eq_ignore_ascii_case("ANY") {
        return true;
    }
    let probe_v6 = |m: &str| {
        let inner = m.strip_prefix('[').and_then(|i| i.split_once(']'));
        inner.is_some_and(|(h, rest)| {
            h.parse::<Ipv6Addr>().is_ok()
                && (rest.is_empty() || rest.strip_prefix('/').is_some_and(|b| (1..=128).contains(&prefix_bits(b))))
        })
    };
    let probe_v4 = |m: &str| match m.split_once('/') {
        Some((h, b)) => h.parse::<Ipv4Addr>().is_ok() && (1..=32).contains(&prefix_bits(b)),
        None => m.parse::<Ipv4Addr>().is_ok(),
    };
    if mask.starts_with('[') {
        probe_v6(mask)
    } else {
        probe_v4(mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn masks_match_as_spdk_matches_them() {
        assert!(allows("ANY", ip("10.1.2.3")) && allows("any", ip("::1")));
        assert!(allows("10.0.0.0/8", ip("10.200.1.1")));
        assert!(!allows("10.0.0.0/8", ip("11.0.0.1")));
        assert!(allows("192.168.1.7", ip("192.168.1.7")) && !allows("192.168.1.7", ip("192.168.1.8")));
        assert!(allows("192.168.1.0/25", ip("192.168.1.127")) && !allows("192.168.1.0/25", ip("192.168.1.128")));
        assert!(!allows("10.0.0.0/0", ip("10.0.0.1")), "0 bits is refused, as in SPDK");
        assert!(!allows("10.0.0.0/33", ip("10.0.0.1")));
        assert!(!allows("10.0.0.0/x", ip("10.0.0.1")));
        assert!(allows("[fe80::]/64", ip("fe80::1:2")) && !allows("[fe80::]/64", ip("fe81::1")));
        assert!(allows("[::1]", ip("::1")) && !allows("[::1]", ip("::2")));
        assert!(
            allows("[2001:db8::]/33", ip("2001:db8:7fff::1")) && !allows("[2001:db8::]/33", ip("2001:db8:8000::1"))
        );
        assert!(!allows("::1", ip("::1")), "IPv6 masks need brackets");
        assert!(!allows("10.0.0.1", ip("::1")) && !allows("[::1]", ip("10.0.0.1")));
        assert!(!allows("garbage", ip("10.0.0.1")));
        assert!(allows("10.0.0.0/8", ip("::ffff:10.9.9.9")), "an IPv4 client on an IPv6 socket");
    }

    #[test]
    fn meaningless_masks_are_recognised() {
        for m in ["ANY", "10.0.0.0/8", "1.2.3.4", "[fe80::]/64", "[::1]"] {
            assert!(meaningful(m), "{m}");
        }
        for m in ["garbage", "10.0.0.0/0", "[fe80::", "::1", "1.2.3.4/40", "[::1]/0"] {
            assert!(!meaningful(m), "{m}");
        }
    }
}
