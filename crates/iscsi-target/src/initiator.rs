//! Changes to an initiator group's lists, with SPDK's rules (lib/iscsi/init_grp.c): at most 256
//! names of at most 223 bytes and 256 netmasks of at most 64, no duplicates, removals only of
//! what is there, `ALL` rewritten as `ANY` (SPDK rewrites the first `ALL` anywhere in the
//! text), and a call that fails part-way changes nothing.

use crate::limits::{MAX_INITIATORS, MAX_INITIATOR_NAME, MAX_NETMASKS, MAX_NETMASK_LEN};
use crate::model::{InitiatorGroup, Refused};
use crate::netmask;

/// SPDK's rewrite of the first `ALL` in an entry to `ANY`.
fn any_for_all(s: &str) -> String {
    if s.contains("ALL") {
        log::warn!("iscsi: please use \"ANY\" instead of \"ALL\" ({s:?} converted)");
    }
    s.replacen("ALL", "ANY", 1)
}

fn add_to(list: &mut Vec<String>, items: &[String], max: usize, max_len: usize, what: &str) -> Result<(), Refused> {
    for item in items {
        if list.len() >= max {
            return Err(Refused::new(libc::EPERM, format!("more than {max} {what}s")));
        }
        if item.len() > max_len {
            return Err(Refused::invalid(format!("{what} {item:?} is longer than {max_len} bytes")));
        }
        let item = any_for_all(item);
        if list.contains(&item) {
            return Err(Refused::new(libc::EEXIST, format!("{what} {item} is already in the group")));
        }
        list.push(item);
    }
    Ok(())
}

fn remove_from(list: &mut Vec<String>, items: &[String], what: &str) -> Result<(), Refused> {
    for item in items {
        let at = list
            .iter()
            .position(|x| x == item)
            .ok_or_else(|| Refused::new(libc::ENOENT, format!("{what} {item} is not in the group")))?;
        list.remove(at);
    }
    Ok(())
}

/// `group` with `initiators` and `netmasks` added (all or none).
pub fn added(group: &InitiatorGroup, initiators: &[String], netmasks: &[String]) -> Result<InitiatorGroup, Refused> {
    let mut g = group.clone();
    add_to(&mut g.initiators, initiators, MAX_INITIATORS, MAX_INITIATOR_NAME, "initiator")?;
    add_to(&mut g.netmasks, netmasks, MAX_NETMASKS, MAX_NETMASK_LEN, "netmask")?;
    for m in netmasks.iter().filter(|m| !netmask::meaningful(m)) {
        log::warn!("iscsi: initiator group {}: netmask {m:?} matches no address", g.tag);
    }
    Ok(g)
}

/// `group` with `initiators` and `netmasks` removed (all or none).
pub fn removed(group: &InitiatorGroup, initiators: &[String], netmasks: &[String]) -> Result<InitiatorGroup, Refused> {
    let mut g = group.clone();
    remove_from(&mut g.initiators, initiators, "initiator")?;
    remove_from(&mut g.netmasks, netmasks, "netmask")?;
    Ok(g)
}

/// A new group (both lists must be non-empty: SPDK's `iscsi_create_initiator_group`).
pub fn new_group(tag: i32, initiators: &[String], netmasks: &[String]) -> Result<InitiatorGroup, Refused> {
    if initiators.is_empty() || netmasks.is_empty() {
        return Err(Refused::invalid("an initiator group needs at least one initiator and one netmask"));
    }
    added(&InitiatorGroup { tag, initiators: vec![], netmasks: vec![] }, initiators, netmasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn lists_change_all_or_nothing_with_spdks_rules() {
        let g = new_group(1, &v(&["ALL"]), &v(&["ANY"])).unwrap();
        assert_eq!(g.initiators, ["ANY"], "ALL becomes ANY");
        assert!(new_group(2, &v(&[]), &v(&["ANY"])).is_err());
        assert!(new_group(2, &v(&["a", "a"]), &v(&["ANY"])).is_err());
        assert!(new_group(2, &v(&["a"]), &v(&["ANY", "ANY"])).is_err());
        assert!(new_group(2, &v(&[&"a".repeat(224)]), &v(&["ANY"])).is_err());
        assert!(new_group(2, &v(&["a"]), &v(&[&"1".repeat(65)])).is_err());
        assert!(new_group(2, &v(&[&"a".repeat(223)]), &v(&[&"1".repeat(64)])).is_ok());
        // A failing add or remove changes nothing.
        assert_eq!(added(&g, &v(&["iqn.c", "ANY"]), &[]).unwrap_err().errno, libc::EEXIST);
        assert_eq!(added(&g, &v(&["iqn.d"]), &v(&["ANY"])).unwrap_err().errno, libc::EEXIST);
        let g2 = added(&g, &v(&["iqn.b"]), &[]).unwrap();
        assert_eq!(g2.initiators, ["ANY", "iqn.b"]);
        assert_eq!(removed(&g2, &v(&["iqn.zz"]), &[]).unwrap_err().errno, libc::ENOENT);
        assert!(removed(&g2, &v(&["iqn.b"]), &v(&["1.1.1.1"])).is_err());
        let g3 = removed(&g2, &[], &v(&["ANY"])).unwrap();
        assert!(g3.netmasks.is_empty(), "SPDK lets the last netmask go");
        let many: Vec<String> = (0..257).map(|i| format!("iqn.{i}")).collect();
        assert_eq!(added(&g, &many, &[]).unwrap_err().errno, libc::EPERM);
    }

    #[test]
    fn names_decide_in_order_and_bang_denies() {
        let g = new_group(1, &v(&["!iqn.bad", "iqn.good", "ANY"]), &v(&["ANY"])).unwrap();
        assert_eq!(g.name_verdict("IQN.BAD"), Some(false));
        assert_eq!(g.name_verdict("iqn.good"), Some(true));
        assert_eq!(g.name_verdict("iqn.other"), Some(true));
        let deny_all = new_group(2, &v(&["iqn.good", "!ANY"]), &v(&["ANY"])).unwrap();
        assert_eq!(deny_all.name_verdict("iqn.good"), Some(true));
        assert_eq!(deny_all.name_verdict("iqn.other"), Some(false));
        let none = new_group(3, &v(&["iqn.x"]), &v(&["ANY"])).unwrap();
        assert_eq!(none.name_verdict("iqn.y"), None);
    }
}
