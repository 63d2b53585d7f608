//! iSCSI names as SPDK's target checks them (lib/iscsi/tgt_node.c): a target node's name is
//! prefixed with the node base unless it is already an `iqn.`, `eui.` or `naa.` name, must be at
//! most 223 bytes and have none of the characters `check_iscsi_name` refuses, and an `iqn.` name
//! must start `iqn.YYYY-MM.`. Names compare without regard to ASCII case, as SPDK finds them.

use crate::limits::MAX_TARGET_NAME;

/// True if `name` already has an iSCSI name type (`iqn.`, `eui.`, `naa.`, any case).
fn has_type(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 4 && ["iqn.", "eui.", "naa."].iter().any(|p| b[..4].eq_ignore_ascii_case(p.as_bytes()))
}

/// The full name of a target node created as `name` under `node_base` (SPDK:
/// `"<node_base>:<name>"` unless `name` already has a type).
pub fn full_name(node_base: &str, name: &str) -> String {
    if has_type(name) {
        name.to_string()
    } else {
        format!("{node_base}:{name}")
    }
}

/// Why `name` is not a valid iSCSI name, if it is not (SPDK's `check_iscsi_name`).
pub fn check(name: &str) -> Result<(), String> {
    if name.len() > MAX_TARGET_NAME {
        return Err(format!("{} bytes, at most {MAX_TARGET_NAME}", name.len()));
    }
    for &c in name.as_bytes() {
        let bad = matches!(c, 0x01..=0x2c | 0x2f | 0x3b..=0x40 | 0x5b..=0x60 | 0x7b..=0x7f) || c.is_ascii_whitespace();
        if bad {
            return Err(format!("character {:?} is not allowed", c as char));
        }
    }
    let b = name.as_bytes();
    if b.len() >= 4 && b[..4].eq_ignore_ascii_case(b"iqn.") {
        let d = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
        let ok = (4..8).all(d) && b.get(8) == Some(&b'-') && d(9) && d(10) && b.get(11) == Some(&b'.');
        if !ok {
            return Err("an iqn name must start \"iqn.YYYY-MM.\"".into());
        }
    }
    Ok(())
}

/// True if two iSCSI names are the same (SPDK compares them ignoring ASCII case).
pub fn same(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_checked_as_spdk_does() {
        let base = "iqn.2016-06.io.spdk";
        assert_eq!(full_name(base, "disk1"), "iqn.2016-06.io.spdk:disk1");
        for typed in ["iqn.2020-01.com.x:d", "eui.0123", "NAA.0123", "IQN.2020-01.x"] {
            assert_eq!(full_name(base, typed), typed);
        }
        for good in ["iqn.2016-06.io.spdk:Upper", "eui.0123", "naa.x", "iqn.2020-01.com.x:d6"] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in [
            "iqn.2016-06.io.spdk:bad name",
            "iqn.2016-06.io.spdk:bad_name",
            "iqn.20a0-01.com.x:d7",
            "iqn.2016-6.x",
            "a/b",
            "a@b",
            "a{b",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        // 223 bytes pass, 224 do not (the node base counts).
        assert!(check(&full_name(base, &"a".repeat(203))).is_ok());
        assert!(check(&full_name(base, &"a".repeat(204))).is_err());
        assert!(same("iqn.2016-06.io.spdk:DISK1", "IQN.2016-06.io.spdk:disk1"));
    }
}
