//! Who may reach a target node, and what discovery shows them.
//!
//! Login (SPDK's `iscsi_tgt_node_access`): the node must be mapped to the portal group the
//! connection came through; that map's initiator groups are asked in order, and the first
//! whose names decide on the initiator ([`InitiatorGroup::name_verdict`]) settles it: a `!`
//! entry denies at once, an admitting one admits if one of that group's netmasks admits the
//! address (else the next group is asked); no group deciding denies.
//!
//! Discovery (SendTargets): a node is listed if the initiator could log in to it through one of
//! its portal groups, and with it the portals of those of its portal groups that admit it and
//! are not private. SPDK lists every node whose initiator groups admit the name anywhere,
//! without looking at the address, with all its public portals; Ferrite does not tell an
//! initiator of targets or portals its address may not use.

use crate::model::{Portal, TargetNode};
use crate::state::State;
use std::net::IpAddr;

/// True if `initiator` at `addr` may log in to `node` through portal group `pg_tag`.
pub(crate) fn allowed(s: &State, node: &TargetNode, initiator: &str, addr: IpAddr, pg_tag: i32) -> bool {
    let Some(map) = node.pg_map(pg_tag) else { return false };
    for tag in &map.ig_tags {
        let Some(ig) = s.initiator_group(*tag) else { continue };
        match ig.name_verdict(initiator) {
            Some(false) => return false,
            Some(true) if ig.allows_addr(addr) => return true,
            _ => {}
        }
    }
    false
}

/// True if SendTargets from `initiator` at `addr` lists `node`.
pub(crate) fn visible(s: &State, node: &TargetNode, initiator: &str, addr: IpAddr) -> bool {
    node.pg_maps.iter().any(|m| allowed(s, node, initiator, addr, m.pg_tag))
}

/// A portal as SendTargets gives it: `TargetAddress=host:port,tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetAddress {
    /// The portal (a wildcard host is the engine's to replace by the address the initiator
    /// connected to, as SPDK does).
    pub portal: Portal,
    /// The portal group's tag.
    pub tag: i32,
}

/// One target node in a SendTargets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// `TargetName=`.
    pub name: String,
    /// Its `TargetAddress=` entries, in portal group map order then portal order.
    pub addresses: Vec<TargetAddress>,
}

/// SendTargets from `initiator` at `addr`: every node it may reach (`which` `None` for
/// `SendTargets=All`), or the one named (any case).
pub(crate) fn send_targets(s: &State, initiator: &str, addr: IpAddr, which: Option<&str>) -> Vec<DiscoveryEntry> {
    s.targets
        .iter()
        .filter(|t| which.is_none_or(|w| crate::name::same(w, &t.name)))
        .filter(|t| visible(s, t, initiator, addr))
        .map(|t| DiscoveryEntry {
            name: t.name.clone(),
            addresses: t
                .pg_maps
                .iter()
                .filter(|m| allowed(s, t, initiator, addr, m.pg_tag))
                .filter_map(|m| s.portal_group(m.pg_tag))
                .filter(|pg| !pg.private)
                .flat_map(|pg| pg.portals.iter().map(|p| TargetAddress { portal: p.clone(), tag: pg.tag }))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chap::ChapParams;
    use crate::model::{InitiatorGroup, PortalGroup};
    use crate::state::tests::node;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state() -> State {
        let mut s = State::default();
        for (tag, private) in [(1, false), (2, false), (3, true)] {
            let portals = vec![crate::portal::portal("10.0.0.1", &format!("{}", 3260 + tag)).unwrap()];
            s.insert_portal_group(PortalGroup { tag, portals, private, chap: ChapParams::default(), started: true })
                .unwrap();
        }
        let ig = |tag, names: &[&str], masks: &[&str]| InitiatorGroup {
            tag,
            initiators: names.iter().map(|s| s.to_string()).collect(),
            netmasks: masks.iter().map(|s| s.to_string()).collect(),
        };
        s.insert_initiator_group(ig(1, &["ANY"], &["ANY"])).unwrap();
        s.insert_initiator_group(ig(2, &["iqn.host1", "!iqn.evil"], &["192.168.0.0/16"])).unwrap();
        s.insert_initiator_group(ig(3, &["!ANY"], &["ANY"])).unwrap();
        s.insert_initiator_group(ig(4, &["iqn.evil", "iqn.host2"], &["[fd00::]/8", "10.1.0.0/16"])).unwrap();
        s
    }

    #[test]
    fn logins_follow_spdks_rules() {
        let s = state();
        let open = node(1, "iqn.t:open", &[(1, &[1])]);
        assert!(allowed(&s, &open, "iqn.anyone", ip("1.2.3.4"), 1));
        assert!(!allowed(&s, &open, "iqn.anyone", ip("1.2.3.4"), 2), "not mapped to portal group 2");
        let n = node(2, "iqn.t:n", &[(2, &[2, 4])]);
        assert!(allowed(&s, &n, "iqn.host1", ip("192.168.7.7"), 2));
        assert!(allowed(&s, &n, "IQN.HOST1", ip("192.168.7.7"), 2), "names in any case");
        assert!(!allowed(&s, &n, "iqn.host1", ip("10.1.2.3"), 2), "group 2 admits the name, not the address");
        assert!(!allowed(&s, &n, "iqn.evil", ip("10.1.2.3"), 2), "denied by group 2 before group 4 admits it");
        assert!(allowed(&s, &n, "iqn.host2", ip("10.1.2.3"), 2), "group 2 says nothing, group 4 admits");
        assert!(allowed(&s, &n, "iqn.host2", ip("fd12::1"), 2));
        assert!(!allowed(&s, &n, "iqn.host2", ip("fe80::1"), 2));
        assert!(!allowed(&s, &n, "iqn.stranger", ip("192.168.1.1"), 2), "no group decides");
        let closed = node(3, "iqn.t:closed", &[(1, &[3, 1])]);
        assert!(!allowed(&s, &closed, "iqn.anyone", ip("1.2.3.4"), 1), "!ANY denies before ANY admits");
    }

    #[test]
    fn discovery_lists_what_the_initiator_may_reach_and_hides_private_groups() {
        let mut s = state();
        s.insert_target(node(1, "iqn.t:open", &[(1, &[1]), (3, &[1])])).unwrap();
        s.insert_target(node(2, "iqn.t:hosts", &[(1, &[2]), (2, &[4])])).unwrap();
        s.insert_target(node(3, "iqn.t:private", &[(3, &[1])])).unwrap();
        s.insert_target(node(4, "iqn.t:closed", &[(1, &[3])])).unwrap();
        let names = |e: &[DiscoveryEntry]| e.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        let all = send_targets(&s, "iqn.host1", ip("192.168.1.1"), None);
        assert_eq!(names(&all), ["iqn.t:open", "iqn.t:hosts", "iqn.t:private"]);
        assert_eq!(all[0].addresses.len(), 1, "portal group 3 is private");
        assert_eq!(all[0].addresses[0].tag, 1);
        assert_eq!(all[1].addresses.iter().map(|a| a.tag).collect::<Vec<_>>(), [1], "group 4 does not admit host1");
        assert!(all[2].addresses.is_empty(), "a node reached only privately is named without addresses");
        let h2 = send_targets(&s, "iqn.host2", ip("10.1.0.9"), None);
        assert_eq!(names(&h2), ["iqn.t:open", "iqn.t:hosts", "iqn.t:private"]);
        assert_eq!(h2[1].addresses[0].tag, 2);
        let far = send_targets(&s, "iqn.host1", ip("172.16.0.1"), None);
        assert_eq!(names(&far), ["iqn.t:open", "iqn.t:private"], "host1's address is not admitted for hosts");
        let one = send_targets(&s, "iqn.host1", ip("192.168.1.1"), Some("IQN.T:HOSTS"));
        assert_eq!(names(&one), ["iqn.t:hosts"]);
        assert!(send_targets(&s, "iqn.x", ip("1.1.1.1"), Some("iqn.t:closed")).is_empty());
    }
}
