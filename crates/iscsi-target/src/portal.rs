//! Portals as `iscsi_create_portal_group` takes them: the wildcards `*` and `[*]` become
//! `0.0.0.0` and `[::]` (SPDK's conversion), hosts and ports fit SPDK's buffers, the port reads
//! as a TCP port the way SPDK reads it (C's `strtol` with base 0: `3260`, `0xcbc`, `06274`),
//! and the host is a numeric address (SPDK's listen resolves numeric hosts only).

use crate::limits::{MAX_PORTAL_ADDR, MAX_PORTAL_PORT};
use crate::model::{Portal, Refused};
use std::net::IpAddr;

/// The TCP port `text` names, read as SPDK reads it (`strtol(port, NULL, 0)`, then 1-65535).
pub fn port_number(text: &str) -> Option<u16> {
    let s = text.trim_start();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (radix, digits) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (16, h)
    } else if s.len() > 1 && s.starts_with('0') {
        (8, &s[1..])
    } else {
        (10, s)
    };
    let mut n: u64 = 0;
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else { break };
        n = n.saturating_mul(u64::from(radix)).saturating_add(u64::from(d));
    }
    if neg || n == 0 || n > 65535 {
        return None;
    }
    Some(n as u16)
}

/// The host as SPDK records it: `*` → `0.0.0.0`, `[*]` → `[::]`, anything else as given.
pub fn normalize_host(host: &str) -> String {
    if host.eq_ignore_ascii_case("[*]") {
        log::warn!("iscsi: please use \"[::]\" as the IPv6 wildcard; \"[*]\" converted");
        "[::]".into()
    } else if host == "*" {
        log::warn!("iscsi: please use \"0.0.0.0\" as the IPv4 wildcard; \"*\" converted");
        "0.0.0.0".into()
    } else {
        host.to_string()
    }
}

/// A portal to create from `host` and `port` as given, checked.
pub fn portal(host: &str, port: &str) -> Result<Portal, Refused> {
    if host.len() > MAX_PORTAL_ADDR || port.len() > MAX_PORTAL_PORT {
        return Err(Refused::invalid(format!("portal ({host}, {port}): host or port too long")));
    }
    let host = normalize_host(host);
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&host);
    if bare.parse::<IpAddr>().is_err() {
        return Err(Refused::invalid(format!("portal ({host}, {port}): the host is not a numeric IP address")));
    }
    if port_number(port).is_none() {
        return Err(Refused::invalid(format!("portal ({host}, {port}): invalid port {port}")));
    }
    Ok(Portal { host, port: port.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_read_like_strtol_base_0() {
        assert_eq!(port_number("3260"), Some(3260));
        assert_eq!(port_number("0x5B2C"), Some(23340));
        assert_eq!(port_number("06274"), Some(3260));
        assert_eq!(port_number("3260abc"), Some(3260), "strtol stops at the first non-digit");
        for bad in ["0", "abc", "", "65536", "99999", "-1", "0x"] {
            assert_eq!(port_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn portals_are_checked_and_wildcards_converted() {
        assert_eq!(portal("*", "3260").unwrap().host, "0.0.0.0");
        assert_eq!(portal("[*]", "3260").unwrap().host, "[::]");
        assert_eq!(portal("[::1]", "3260").unwrap().socket_addr(), Some("[::1]:3260".parse().unwrap()));
        assert_eq!(portal("::1", "3260").unwrap().socket_addr(), Some("[::1]:3260".parse().unwrap()));
        assert!(portal("localhost", "3260").is_err(), "numeric hosts only");
        assert!(portal("127.0.0.1", "abc").is_err());
        assert!(portal("127.0.0.1", &"1".repeat(33)).is_err());
        assert!(portal("0.0.0.0", "3260").unwrap().is_wildcard());
    }
}
