//! The registry: one per engine (`ferrite_reactor::engine_state`), behind a read-write lock.
//! RPCs change it on the RPC reactor; the engine reads it when a connection logs in or asks for
//! discovery, never per I/O. Every change replaces the `Arc` of what it changes, so snapshots
//! handed out stay as they were; `generation` moves on each change.
//!
//! The changes here are SPDK's rules on the configuration itself (tags, maps, LUN ids, names);
//! decoding, bdevs and hooks are the RPC layer's ([`crate::rpc`]).

use crate::chap::ChapParams;
use crate::limits::{MAX_LUN, MAX_PG_MAPS};
use crate::model::{AuthGroup, InitiatorGroup, Lun, PgMap, PortalGroup, Refused, Secret, TargetNode};
use crate::name;
use crate::options::IscsiOptions;
use std::sync::{Arc, RwLock};

/// Everything the iSCSI target is configured with.
#[derive(Default)]
pub(crate) struct State {
    /// `iscsi_set_options`' options and the discovery auth.
    pub options: IscsiOptions,
    /// `iscsi_set_options` was called (SPDK takes it once).
    pub options_set: bool,
    /// Portal groups, in creation order.
    pub portal_groups: Vec<Arc<PortalGroup>>,
    /// Initiator groups, in creation order.
    pub initiator_groups: Vec<Arc<InitiatorGroup>>,
    /// Auth groups, in creation order.
    pub auth_groups: Vec<Arc<AuthGroup>>,
    /// Target nodes, in creation order.
    pub targets: Vec<Arc<TargetNode>>,
    /// Moves on every change.
    pub generation: u64,
    /// The id of the next target node (ids start at 1).
    next_target_id: u64,
}

#[derive(Default)]
struct Shared(RwLock<State>);

/// Runs `f` with the registry read-locked.
pub(crate) fn with_read<R>(f: impl FnOnce(&State) -> R) -> R {
    let s = ferrite_reactor::engine_state::<Shared>();
    let g = s.0.read().unwrap_or_else(|p| p.into_inner());
    f(&g)
}

/// Runs `f` with the registry write-locked; the generation moves.
pub(crate) fn with_write<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let s = ferrite_reactor::engine_state::<Shared>();
    let mut g = s.0.write().unwrap_or_else(|p| p.into_inner());
    g.generation += 1;
    f(&mut g)
}

impl State {
    // ------------------------------------------------------------ auth groups

    /// The auth group `tag`.
    pub fn auth_group(&self, tag: i32) -> Option<&Arc<AuthGroup>> {
        self.auth_groups.iter().find(|g| g.tag == tag)
    }

    fn auth_group_mut(&mut self, tag: i32) -> Result<&mut AuthGroup, Refused> {
        self.auth_groups
            .iter_mut()
            .find(|g| g.tag == tag)
            .map(Arc::make_mut)
            .ok_or_else(|| Refused::new(libc::ENOENT, format!("auth group {tag} not found")))
    }

    /// Creates auth group `tag` with `secrets` (all or nothing).
    pub fn create_auth_group(&mut self, tag: i32, secrets: Vec<Secret>) -> Result<(), Refused> {
        if self.auth_group(tag).is_some() {
            return Err(Refused::new(libc::EEXIST, format!("auth group ({tag}) already exists")));
        }
        let mut g = AuthGroup { tag, secrets: Vec::new() };
        for s in secrets {
            crate::auth::add(&mut g, s)?;
        }
        self.auth_groups.push(Arc::new(g));
        Ok(())
    }

    /// Deletes auth group `tag`.
    pub fn delete_auth_group(&mut self, tag: i32) -> Result<(), Refused> {
        let at = self.auth_groups.iter().position(|g| g.tag == tag);
        let at = at.ok_or_else(|| Refused::new(libc::ENOENT, format!("auth group {tag} not found")))?;
        self.auth_groups.remove(at);
        Ok(())
    }

    /// Adds a secret to auth group `tag`.
    pub fn add_secret(&mut self, tag: i32, s: Secret) -> Result<(), Refused> {
        crate::auth::add(self.auth_group_mut(tag)?, s)
    }

    /// Removes `user`'s secret from auth group `tag`.
    pub fn remove_secret(&mut self, tag: i32, user: &str) -> Result<(), Refused> {
        crate::auth::remove(self.auth_group_mut(tag)?, user)
    }

    // ------------------------------------------------------------ portal groups

    /// The portal group `tag`.
    pub fn portal_group(&self, tag: i32) -> Option<&Arc<PortalGroup>> {
        self.portal_groups.iter().find(|g| g.tag == tag)
    }

    /// Checks that `pg` may be added: its tag is a TPGT and free, and none of its portals is in
    /// use (by another group or twice in it).
    pub fn check_new_portal_group(&self, pg: &PortalGroup) -> Result<(), Refused> {
        if !(0..=65535).contains(&pg.tag) {
            return Err(Refused::invalid(format!("portal group tag {} is not a 16-bit portal group tag", pg.tag)));
        }
        if self.portal_group(pg.tag).is_some() {
            return Err(Refused::new(libc::EEXIST, format!("portal group {} exists", pg.tag)));
        }
        let mut seen: Vec<&crate::model::Portal> = self.portal_groups.iter().flat_map(|g| g.portals.iter()).collect();
        for p in &pg.portals {
            if seen.contains(&p) {
                return Err(Refused::new(libc::EEXIST, format!("portal ({}, {}) already exists", p.host, p.port)));
            }
            seen.push(p);
        }
        Ok(())
    }

    /// Adds a checked portal group.
    pub fn insert_portal_group(&mut self, pg: PortalGroup) -> Result<(), Refused> {
        self.check_new_portal_group(&pg)?;
        self.portal_groups.push(Arc::new(pg));
        Ok(())
    }

    /// Removes portal group `tag` and every target node's map of it (SPDK's
    /// `iscsi_tgt_node_delete_map`).
    pub fn remove_portal_group(&mut self, tag: i32) -> Option<Arc<PortalGroup>> {
        let at = self.portal_groups.iter().position(|g| g.tag == tag)?;
        for t in &mut self.targets {
            if t.pg_map(tag).is_some() {
                Arc::make_mut(t).pg_maps.retain(|m| m.pg_tag != tag);
            }
        }
        Some(self.portal_groups.remove(at))
    }

    /// Changes portal group `tag` with `f`; false if there is none.
    pub fn change_portal_group(&mut self, tag: i32, f: impl FnOnce(&mut PortalGroup)) -> bool {
        match self.portal_groups.iter_mut().find(|g| g.tag == tag) {
            Some(g) => {
                f(Arc::make_mut(g));
                true
            }
            None => false,
        }
    }

    // ------------------------------------------------------------ initiator groups

    /// The initiator group `tag`.
    pub fn initiator_group(&self, tag: i32) -> Option<&Arc<InitiatorGroup>> {
        self.initiator_groups.iter().find(|g| g.tag == tag)
    }

    /// Adds an initiator group (its tag must be free).
    pub fn insert_initiator_group(&mut self, g: InitiatorGroup) -> Result<(), Refused> {
        if self.initiator_group(g.tag).is_some() {
            return Err(Refused::new(libc::EEXIST, format!("initiator group {} exists", g.tag)));
        }
        self.initiator_groups.push(Arc::new(g));
        Ok(())
    }

    /// Replaces initiator group `tag` by what `f` makes of it.
    pub fn change_initiator_group(
        &mut self,
        tag: i32,
        f: impl FnOnce(&InitiatorGroup) -> Result<InitiatorGroup, Refused>,
    ) -> Result<(), Refused> {
        let g = self
            .initiator_groups
            .iter_mut()
            .find(|g| g.tag == tag)
            .ok_or_else(|| Refused::new(libc::ENOENT, format!("initiator group ({tag}) is not found")))?;
        let new = f(g)?;
        debug_assert_eq!(new.tag, tag);
        *g = Arc::new(new);
        Ok(())
    }

    /// Removes initiator group `tag` and every map of it; a portal group left without
    /// initiator groups leaves its target node (SPDK's `iscsi_tgt_node_delete_ig_maps`).
    pub fn remove_initiator_group(&mut self, tag: i32) -> Option<Arc<InitiatorGroup>> {
        let at = self.initiator_groups.iter().position(|g| g.tag == tag)?;
        for t in &mut self.targets {
            if t.pg_maps.iter().any(|m| m.ig_tags.contains(&tag)) {
                let t = Arc::make_mut(t);
                for m in &mut t.pg_maps {
                    m.ig_tags.retain(|&i| i != tag);
                }
                t.pg_maps.retain(|m| !m.ig_tags.is_empty());
            }
        }
        Some(self.initiator_groups.remove(at))
    }

    // ------------------------------------------------------------ target nodes

    /// The target node named `name` (full name, any case).
    pub fn target(&self, name: &str) -> Option<&Arc<TargetNode>> {
        self.targets.iter().find(|t| name::same(&t.name, name))
    }

    /// The target node with id `id`.
    pub fn target_by_id(&self, id: u64) -> Option<&Arc<TargetNode>> {
        self.targets.iter().find(|t| t.id == id)
    }

    /// A fresh target node id.
    pub fn new_target_id(&mut self) -> u64 {
        self.next_target_id += 1;
        self.next_target_id
    }

    /// `node` with the (pg, ig) pairs `maps` added, all or none (SPDK's
    /// `iscsi_target_node_add_pg_ig_maps`): both groups exist, at most 4 portal groups, a pair
    /// not mapped already.
    pub fn with_maps_added(&self, node: &TargetNode, maps: &[(i32, i32)]) -> Result<TargetNode, Refused> {
        let mut n = node.clone();
        for &(pg, ig) in maps {
            if self.portal_group(pg).is_none() {
                return Err(Refused::new(libc::ENOENT, format!("{}: PortalGroup{pg} not found", n.name)));
            }
            if self.initiator_group(ig).is_none() {
                return Err(Refused::new(libc::ENOENT, format!("{}: InitiatorGroup{ig} not found", n.name)));
            }
            let map = match n.pg_maps.iter().position(|m| m.pg_tag == pg) {
                Some(i) => &mut n.pg_maps[i],
                None if n.pg_maps.len() >= MAX_PG_MAPS => {
                    return Err(Refused::invalid(format!("{}: more than {MAX_PG_MAPS} portal groups", n.name)))
                }
                None => {
                    n.pg_maps.push(PgMap { pg_tag: pg, ig_tags: Vec::new(), redirect: None });
                    n.pg_maps.last_mut().expect("just pushed")
                }
            };
            if map.ig_tags.contains(&ig) {
                return Err(Refused::new(libc::EEXIST, format!("{}: map {pg}:{ig} exists", n.name)));
            }
            map.ig_tags.push(ig);
        }
        Ok(n)
    }

    /// `node` with the pairs `maps` removed, all or none (both groups exist and the pair is
    /// mapped); a portal group left without initiator groups is unmapped.
    pub fn with_maps_removed(&self, node: &TargetNode, maps: &[(i32, i32)]) -> Result<TargetNode, Refused> {
        let mut n = node.clone();
        for &(pg, ig) in maps {
            if self.portal_group(pg).is_none() || self.initiator_group(ig).is_none() {
                return Err(Refused::new(libc::ENOENT, format!("{}: group of map {pg}:{ig} not found", n.name)));
            }
            let at = n.pg_maps.iter().position(|m| m.pg_tag == pg);
            let at =
                at.ok_or_else(|| Refused::new(libc::ENOENT, format!("{}: PortalGroup{pg} is not mapped", n.name)))?;
            let m = &mut n.pg_maps[at];
            let i = m.ig_tags.iter().position(|&t| t == ig);
            let i =
                i.ok_or_else(|| Refused::new(libc::ENOENT, format!("{}: InitiatorGroup{ig} is not mapped", n.name)))?;
            m.ig_tags.remove(i);
            if m.ig_tags.is_empty() {
                n.pg_maps.remove(at);
            }
        }
        Ok(n)
    }

    /// Adds a target node (its name must be free, any case).
    pub fn insert_target(&mut self, node: TargetNode) -> Result<(), Refused> {
        if self.target(&node.name).is_some() {
            return Err(Refused::new(libc::EEXIST, format!("target {} exists", node.name)));
        }
        debug_assert!(node.pg_maps.iter().all(|m| !m.ig_tags.is_empty()));
        debug_assert!(node.luns.windows(2).all(|w| w[0].id < w[1].id));
        self.targets.push(Arc::new(node));
        Ok(())
    }

    /// Replaces target node `name` by what `f` makes of it.
    pub fn change_target(
        &mut self,
        name: &str,
        f: impl FnOnce(&Self, &TargetNode) -> Result<TargetNode, Refused>,
    ) -> Result<(), Refused> {
        let at = self.targets.iter().position(|t| name::same(&t.name, name));
        let at = at.ok_or_else(|| Refused::new(libc::ENOENT, format!("target {name} is not found")))?;
        let new = f(self, &self.targets[at])?;
        debug_assert_eq!(new.id, self.targets[at].id);
        self.targets[at] = Arc::new(new);
        Ok(())
    }

    /// Removes target node `name`.
    pub fn remove_target(&mut self, name: &str) -> Option<Arc<TargetNode>> {
        let at = self.targets.iter().position(|t| name::same(&t.name, name))?;
        Some(self.targets.remove(at))
    }

    /// Removes from target node `id` the LUNs `gone` picks; returns the node's name and them.
    pub fn remove_luns(&mut self, id: u64, gone: impl Fn(&Lun) -> bool) -> Option<(String, Vec<Arc<Lun>>)> {
        let t = self.targets.iter_mut().find(|t| t.id == id)?;
        if !t.luns.iter().any(|l| gone(l)) {
            return None;
        }
        let t = Arc::make_mut(t);
        let (out, keep): (Vec<_>, Vec<_>) = t.luns.drain(..).partition(|l| gone(l));
        t.luns = keep;
        Some((t.name.clone(), out))
    }
}

/// The LUN id a LUN asks for: `-1` picks the lowest free one; others must be 0-255 and free.
pub(crate) fn lun_id(node: &TargetNode, asked: i32) -> Result<u32, Refused> {
    match asked {
        -1 => node.free_lun_id().ok_or_else(|| Refused::new(libc::ENOSPC, "Free LUN ID is not found")),
        id if id < -1 => Err(Refused::invalid(format!("LUN ID ({id}) is negative"))),
        id if id as u32 >= MAX_LUN => Err(Refused::invalid(format!("LUN ID {id} is more than the maximum"))),
        id if node.lun(id as u32).is_some() => Err(Refused::new(libc::EEXIST, "LUN ID is duplicated")),
        id => Ok(id as u32),
    }
}

/// The CHAP settings from a call's four optional members (absent ones are false and 0, as
/// SPDK's decoders leave them), checked.
pub(crate) fn chap(
    disable: Option<bool>,
    require: Option<bool>,
    mutual: Option<bool>,
    group: Option<i32>,
) -> Result<ChapParams, String> {
    let c = ChapParams {
        disable: disable.unwrap_or(false),
        require: require.unwrap_or(false),
        mutual: mutual.unwrap_or(false),
        group: group.unwrap_or(0),
    };
    c.check().map(|_| c)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A target node without LUNs.
    pub fn node(id: u64, name: &str, maps: &[(i32, &[i32])]) -> TargetNode {
        TargetNode {
            id,
            name: name.into(),
            alias: None,
            pg_maps: maps.iter().map(|(p, igs)| PgMap { pg_tag: *p, ig_tags: igs.to_vec(), redirect: None }).collect(),
            luns: vec![],
            queue_depth: 64,
            chap: ChapParams::default(),
            header_digest: false,
            data_digest: false,
        }
    }

    /// A state with portal groups 1-5 and initiator groups 1 and 2 (ANY/ANY).
    pub fn groups() -> State {
        let mut s = State::default();
        for tag in 1..=5 {
            let portals = vec![crate::portal::portal("127.0.0.1", &format!("{}", 3260 + tag)).unwrap()];
            s.insert_portal_group(PortalGroup {
                tag,
                portals,
                private: false,
                chap: ChapParams::default(),
                started: true,
            })
            .unwrap();
        }
        for tag in 1..=2 {
            s.insert_initiator_group(InitiatorGroup {
                tag,
                initiators: vec!["ANY".into()],
                netmasks: vec!["ANY".into()],
            })
            .unwrap();
        }
        s
    }

    #[test]
    fn maps_follow_spdks_rules() {
        let s = groups();
        let n = node(1, "iqn.x:a", &[]);
        let n = s.with_maps_added(&n, &[(1, 1), (1, 2), (2, 1)]).unwrap();
        assert_eq!(n.pg_maps.len(), 2);
        assert_eq!(s.with_maps_added(&n, &[(1, 1)]).unwrap_err().errno, libc::EEXIST);
        assert_eq!(s.with_maps_added(&n, &[(9, 1)]).unwrap_err().errno, libc::ENOENT);
        assert_eq!(s.with_maps_added(&n, &[(1, 9)]).unwrap_err().errno, libc::ENOENT);
        let four = s.with_maps_added(&n, &[(3, 1), (4, 1)]).unwrap();
        assert!(s.with_maps_added(&four, &[(5, 1)]).is_err(), "at most 4 portal groups");
        // A failing call changes nothing; removing the last ig of a pg unmaps it.
        assert!(s.with_maps_removed(&n, &[(2, 1), (2, 2)]).is_err());
        let r = s.with_maps_removed(&n, &[(2, 1)]).unwrap();
        assert_eq!(r.pg_maps.len(), 1);
        assert!(s.with_maps_removed(&r, &[(2, 1)]).is_err());
    }

    #[test]
    fn deleting_a_group_unmaps_it_from_every_node() {
        let mut s = groups();
        let n = s.with_maps_added(&node(1, "iqn.x:a", &[]), &[(1, 1), (1, 2), (2, 2)]).unwrap();
        s.insert_target(n).unwrap();
        let before = s.target("IQN.X:A").unwrap().clone();
        s.remove_initiator_group(2).unwrap();
        let t = s.target("iqn.x:a").unwrap();
        assert_eq!(t.pg_maps, vec![PgMap { pg_tag: 1, ig_tags: vec![1], redirect: None }]);
        assert_eq!(before.pg_maps.len(), 2, "snapshots taken before stay as they were");
        s.remove_portal_group(1).unwrap();
        assert!(s.target("iqn.x:a").unwrap().pg_maps.is_empty());
        assert!(s.insert_target(node(2, "IQN.x:A", &[])).is_err(), "names are unique in any case");
    }

    #[test]
    fn portal_groups_need_free_tags_and_portals() {
        let mut s = groups();
        let pg = |tag, port: &str| PortalGroup {
            tag,
            portals: vec![crate::portal::portal("127.0.0.1", port).unwrap()],
            private: false,
            chap: ChapParams::default(),
            started: true,
        };
        assert_eq!(s.insert_portal_group(pg(1, "9999")).unwrap_err().errno, libc::EEXIST);
        assert_eq!(s.insert_portal_group(pg(9, "3261")).unwrap_err().errno, libc::EEXIST, "portal in use");
        assert!(s.insert_portal_group(pg(-5, "9999")).is_err());
        assert!(s.insert_portal_group(pg(65536, "9999")).is_err());
        s.insert_portal_group(pg(0, "9999")).unwrap();
    }
}
