//! The configuration as SPDK's `iscsi_get_*` methods and `save_config` write it (the same
//! objects: SPDK's config entries are its info objects), and the "iscsi" subsystem's entries in
//! SPDK's order: options, portal groups, initiator groups, target nodes, auth groups.

use crate::hooks::ConnectionInfo;
use crate::model::{AuthGroup, InitiatorGroup, PortalGroup, TargetNode};
use crate::state::with_read;
use serde_json::{json, Map, Value};

/// A portal group (`tag`, `portals`, `private`; `wait` is not kept, as in SPDK).
pub fn portal_group(pg: &PortalGroup) -> Value {
    json!({"tag": pg.tag,
        "portals": pg.portals.iter().map(|p| json!({"host": p.host, "port": p.port})).collect::<Vec<_>>(),
        "private": pg.private})
}

/// An initiator group.
pub fn initiator_group(ig: &InitiatorGroup) -> Value {
    json!({"tag": ig.tag, "initiators": ig.initiators, "netmasks": ig.netmasks})
}

/// An auth group, secrets included (SPDK shows them).
pub fn auth_group(g: &AuthGroup) -> Value {
    let secrets: Vec<Value> = g
        .secrets
        .iter()
        .map(|s| {
            let mut v = json!({"user": s.user, "secret": s.secret});
            if let (Some(mu), Some(ms)) = (&s.muser, &s.msecret) {
                v["muser"] = json!(mu);
                v["msecret"] = json!(ms);
            }
            v
        })
        .collect();
    json!({"tag": g.tag, "secrets": secrets})
}

/// A target node (redirects are neither shown nor saved, as in SPDK).
pub fn target_node(t: &TargetNode) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(t.name));
    if let Some(a) = &t.alias {
        m.insert("alias_name".into(), json!(a));
    }
    let maps: Vec<Value> = t
        .pg_maps
        .iter()
        .flat_map(|pm| pm.ig_tags.iter().map(move |ig| json!({"pg_tag": pm.pg_tag, "ig_tag": ig})))
        .collect();
    m.insert("pg_ig_maps".into(), Value::Array(maps));
    let luns: Vec<Value> = t.luns.iter().map(|l| json!({"bdev_name": l.bdev_name, "lun_id": l.id})).collect();
    m.insert("luns".into(), Value::Array(luns));
    m.insert("queue_depth".into(), json!(t.queue_depth));
    if let Value::Object(chap) = t.chap.to_json() {
        m.extend(chap);
    }
    m.insert("header_digest".into(), json!(t.header_digest));
    m.insert("data_digest".into(), json!(t.data_digest));
    Value::Object(m)
}

/// A connection, as `iscsi_get_connections` lists it.
pub fn connection(c: &ConnectionInfo) -> Value {
    json!({"id": c.id, "cid": c.cid, "tsih": c.tsih.unwrap_or(u16::MAX), "state": c.state.name(),
        "login_phase": c.login_phase.name(), "initiator_addr": c.initiator_addr, "target_addr": c.target_addr,
        "target_node_name": c.target_node_name, "thread_name": c.thread_name})
}

/// The "iscsi" subsystem's config entries.
pub fn config() -> Vec<Value> {
    with_read(|s| {
        let mut v = vec![json!({"method": "iscsi_set_options", "params": s.options.to_json()})];
        let entry = |method: &str, params: Value| json!({"method": method, "params": params});
        v.extend(s.portal_groups.iter().map(|pg| entry("iscsi_create_portal_group", portal_group(pg))));
        v.extend(s.initiator_groups.iter().map(|ig| entry("iscsi_create_initiator_group", initiator_group(ig))));
        // SPDK leaves `alias_name` out of a node without alias, and then cannot load the entry
        // (its decoder requires the member): Ferrite writes it empty, which both load.
        v.extend(s.targets.iter().map(|t| {
            let mut p = target_node(t);
            p.as_object_mut().expect("an object").entry("alias_name").or_insert(json!(""));
            entry("iscsi_create_target_node", p)
        }));
        v.extend(s.auth_groups.iter().map(|g| entry("iscsi_create_auth_group", auth_group(g))));
        v
    })
}
