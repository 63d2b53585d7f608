//! The controllers attached under one name (SPDK's `nvme_bdev_ctrlr`) and their namespace
//! bdevs: the first attach makes the name; a second one with the same name adds an alternate
//! path to its controller (failover) or another controller of the subsystem (multipath), after
//! checking that it reaches the same subsystem and namespaces, with SPDK's errors otherwise.
//! Detach removes one path or everything.

use crate::bdev::NsShared;
use crate::ctrlr::{self, AttachOpts, HostCtrlr, Mode, NsInfo};
use crate::trid::{PathFilter, Trid};
use ferrite_rpc::{errno_error, RpcError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The controllers and bdevs of one name.
pub struct Group {
    /// The name (bdevs are `<name>n<nsid>`).
    pub name: String,
    /// The first attach's mode: multipath groups hold several controllers, the others one
    /// controller with alternate paths.
    pub mode: Mode,
    /// The generation of its paths (shared with its controllers and bdevs).
    pub gen: Arc<AtomicU64>,
    /// Its controllers in attach order.
    pub ctrlrs: Mutex<Vec<Arc<HostCtrlr>>>,
    /// Its bdevs in NSID order of creation.
    pub bdevs: Mutex<Vec<Arc<NsShared>>>,
}

/// Names by name (one table per engine).
#[derive(Default)]
struct Groups(Mutex<BTreeMap<String, Arc<Group>>>);

fn groups() -> Arc<Groups> {
    ferrite_reactor::engine_state::<Groups>()
}

/// The group of a name.
pub fn get(name: &str) -> Option<Arc<Group>> {
    groups().0.lock().unwrap().get(name).cloned()
}

/// Every group.
pub fn all() -> Vec<Arc<Group>> {
    groups().0.lock().unwrap().values().cloned().collect()
}

fn einval(msg: impl Into<String>) -> RpcError {
    errno_error(libc::EINVAL, msg)
}

fn strerror(e: i32) -> RpcError {
    errno_error(
        e,
        std::io::Error::from_raw_os_error(e).to_string().split(" (os error").next().unwrap_or("").to_string(),
    )
}

impl Group {
    fn multipath(&self) -> bool {
        self.mode == Mode::Multipath
    }

    /// The attach calls that make the group again, in order (save_config).
    pub fn config_entries(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for c in self.ctrlrs.lock().unwrap().iter() {
            let trids = c.trids.lock().unwrap().clone();
            for (i, t) in trids.iter().enumerate() {
                let mode = if i > 0 { Mode::Failover } else { self.mode };
                out.push(json!({"method": "bdev_nvme_attach_controller", "params": attach_params(&c.opts, t, mode)}));
            }
        }
        out
    }

    /// `bdev_nvme_get_controllers`' entry for the group (SPDK's format).
    pub fn info_json(&self) -> Value {
        let ctrlrs: Vec<Value> = self
            .ctrlrs
            .lock()
            .unwrap()
            .iter()
            .map(|c| {
                let state = if c.detached.load(Ordering::Relaxed) {
                    "deleting"
                } else if c.failed.load(Ordering::Relaxed) {
                    "failed"
                } else if c.resetting.load(Ordering::Relaxed) {
                    "resetting"
                } else {
                    "enabled"
                };
                let trids = c.trids.lock().unwrap().clone();
                let mut v = json!({"state": state, "trid": trids[0].json(),
                    "cntlid": c.cntlid.load(Ordering::Relaxed),
                    "host": {"nqn": c.opts.hostnqn, "addr": "", "svcid": "", "no_shn_notification": false}});
                if trids.len() > 1 {
                    v["alternate_trids"] = Value::Array(trids[1..].iter().map(Trid::json).collect());
                }
                v
            })
            .collect();
        json!({"name": self.name, "ctrlrs": ctrlrs})
    }
}

/// The attach parameters save_config writes for path `t` of a controller.
fn attach_params(o: &AttachOpts, t: &Trid, mode: Mode) -> Value {
    let mut v = json!({"name": o.name, "trtype": "TCP", "adrfam": t.adrfam, "traddr": t.traddr, "trsvcid": t.trsvcid,
        "subnqn": t.subnqn, "hostnqn": o.hostnqn, "hdgst": o.hdgst, "ddgst": o.ddgst,
        "ctrlr_loss_timeout_sec": o.ctrlr_loss_timeout_sec, "reconnect_delay_sec": o.reconnect_delay_sec,
        "fast_io_fail_timeout_sec": o.fast_io_fail_timeout_sec, "multipath": mode.name()});
    // Only when set: SPDK v26.05 does not know the parameter and would refuse the config.
    if o.disable_sq_flow_control {
        v["disable_sq_flow_control"] = json!(true);
    }
    v
}

/// `bdev_nvme_attach_controller`: a new name, or a path added to one (SPDK's checks and
/// errors). Answers the names of the bdevs the attach reaches.
pub async fn attach(opts: AttachOpts) -> Result<Vec<String>, RpcError> {
    let existing = get(&opts.name);
    // A path already attached (under any name) is refused (SPDK's nvme_ctrlr_get: -EEXIST).
    let used = |t: &Trid| {
        all().iter().any(|g| {
            g.ctrlrs.lock().unwrap().iter().any(|c| {
                c.trids.lock().unwrap().iter().any(|x| x.same_path(t) && x.subnqn == t.subnqn)
                    && c.opts.hostnqn == opts.hostnqn
            })
        })
    };
    let Some(g) = existing else {
        if used(&opts.trid) {
            return Err(strerror(libc::EEXIST));
        }
        return attach_new(opts).await;
    };
    let first = g.ctrlrs.lock().unwrap().first().cloned().ok_or_else(|| strerror(libc::ENODEV))?;
    if opts.mode == Mode::Disable {
        return Err(errno_error(
            libc::EALREADY,
            format!("A controller named {} already exists and multipath is disabled", opts.name),
        ));
    }
    if first.active_trid().same_path(&opts.trid) {
        return Err(errno_error(
            libc::EALREADY,
            format!("A controller named {} already exists with the specified network path", opts.name),
        ));
    }
    if first.opts.trid.subnqn != opts.trid.subnqn {
        return Err(einval(format!(
            "A controller named {} already exists, but uses a different subnqn ({})",
            opts.name, first.opts.trid.subnqn
        )));
    }
    if first.opts.hostnqn != opts.hostnqn {
        return Err(einval(format!(
            "A controller named {} already exists, but uses a different hostnqn ({})",
            opts.name, first.opts.hostnqn
        )));
    }
    if used(&opts.trid) {
        return Err(strerror(libc::EEXIST));
    }
    // Every controller of a name is set up the same way (failover or multipath).
    if g.multipath() != (opts.mode == Mode::Multipath) {
        return Err(strerror(libc::EINVAL));
    }
    if g.multipath() {
        add_controller(&g, opts).await
    } else {
        add_alternate(&first, opts.trid).await?;
        // SPDK answers no bdev for an alternate path.
        Ok(Vec::new())
    }
}

async fn attach_new(opts: AttachOpts) -> Result<Vec<String>, RpcError> {
    let name = opts.name.clone();
    let mode = opts.mode;
    let gen = Arc::new(AtomicU64::new(1));
    let (c, ns) =
        ctrlr::attach(opts, gen.clone()).await.map_err(|e| errno_error(libc::EIO, format!("Unable to attach: {e}")))?;
    let g = Arc::new(Group {
        name: name.clone(),
        mode,
        gen,
        ctrlrs: Mutex::new(vec![c.clone()]),
        bdevs: Mutex::new(Vec::new()),
    });
    let taken = {
        let table = groups();
        let mut t = table.0.lock().unwrap();
        let taken = t.contains_key(&name);
        if !taken {
            t.insert(name.clone(), g.clone());
        }
        taken
    };
    if taken {
        ctrlr::detach(&c).await;
        return Err(errno_error(libc::EALREADY, format!("A controller named {name} already exists")));
    }
    let mut names = Vec::new();
    for n in &ns {
        match crate::bdev::register_namespace(&g, &c, n) {
            Ok(b) => {
                names.push(b.name.clone());
                g.bdevs.lock().unwrap().push(b);
            }
            Err(e) => {
                detach(&name, &PathFilter::default()).await.ok();
                return Err(errno_error(e.errno(), e.to_string()));
            }
        }
    }
    log::info!("nvme controller {name} attached: bdevs {names:?}");
    Ok(names)
}

/// Failover: checks that `trid` reaches the same subsystem and namespaces as `c`, then keeps
/// it as an alternate path (SPDK's bdev_nvme_add_secondary_trid).
async fn add_alternate(c: &Arc<HostCtrlr>, trid: Trid) -> Result<(), RpcError> {
    if c.trids.lock().unwrap().contains(&trid) {
        return Err(strerror(libc::EALREADY));
    }
    let (_, ns) = ctrlr::probe(c, &trid).await.map_err(|e| errno_error(libc::EIO, format!("Unable to attach: {e}")))?;
    let have = c.namespaces.lock().unwrap().clone();
    for n in &have {
        if !ns.iter().any(|x| x.nsid == n.nsid && x.same_namespace(n)) {
            log::warn!(
                "nvme controller {}: path {}:{} does not reach namespace {} as the active path does",
                c.opts.name,
                trid.traddr,
                trid.trsvcid,
                n.nsid
            );
            return Err(strerror(libc::EINVAL));
        }
    }
    log::info!("nvme controller {}: alternate path {}:{} added", c.opts.name, trid.traddr, trid.trsvcid);
    c.trids.lock().unwrap().push(trid);
    Ok(())
}

/// Multipath: another controller of the subsystem; namespaces it shares with the name's bdevs
/// become their second path, new ones new bdevs.
async fn add_controller(g: &Arc<Group>, opts: AttachOpts) -> Result<Vec<String>, RpcError> {
    let (c, ns) = ctrlr::attach(opts, g.gen.clone())
        .await
        .map_err(|e| errno_error(libc::EIO, format!("Unable to attach: {e}")))?;
    let refuse = |why: String| {
        log::warn!("nvme controller {}: {why}", g.name);
        strerror(libc::EINVAL)
    };
    let check = || -> Result<(), RpcError> {
        let cmic = c.info.lock().unwrap().cmic;
        if cmic & ferrite_nvme::spec::identify_ctrl::cmic::MULTI_CTRL == 0 {
            return Err(refuse(format!("Ctrlr{} does not support multipath", c.cntlid.load(Ordering::Relaxed))));
        }
        let cntlid = c.cntlid.load(Ordering::Relaxed);
        if g.ctrlrs.lock().unwrap().iter().any(|x| x.cntlid.load(Ordering::Relaxed) == cntlid) {
            return Err(refuse(format!("cntlid {cntlid} are duplicated")));
        }
        Ok(())
    };
    if let Err(e) = check() {
        ctrlr::detach(&c).await;
        return Err(e);
    }
    g.ctrlrs.lock().unwrap().push(c.clone());
    let mut names = Vec::new();
    for n in &ns {
        let existing = g.bdevs.lock().unwrap().iter().find(|b| b.nsid == n.nsid).cloned();
        match existing {
            // As SPDK: a namespace that differs from the bdev of its NSID is left out (logged),
            // the controller's other namespaces still attach.
            Some(b) if !b.info.same_namespace(n) || b.info.block_size != n.block_size => {
                log::error!("nvme controller {}: namespace {}: Namespaces are not identical; left out", g.name, n.nsid);
            }
            Some(b) => {
                b.ctrlrs.lock().unwrap().push(c.clone());
                names.push(b.name.clone());
            }
            None => match crate::bdev::register_namespace(g, &c, n) {
                Ok(b) => {
                    names.push(b.name.clone());
                    g.bdevs.lock().unwrap().push(b);
                }
                Err(e) => log::warn!("nvme controller {}: namespace {}: {e}", g.name, n.nsid),
            },
        }
    }
    c.paths_changed();
    log::info!("nvme controller {}: controller {} added: bdevs {names:?}", g.name, c.cntlid.load(Ordering::Relaxed));
    Ok(names)
}

/// Controller `c` now reports namespaces `ns` (a namespace attribute notice, a reconnection):
/// new NSIDs get a bdev (or, if another controller of the name has that namespace's bdev, a
/// path in it), namespaces it no longer reports lose its path (a bdev left without a path is
/// unregistered), and a namespace whose size changed resizes its bdev. As in SPDK, an NSID
/// still active keeps its bdev (its identifiers are not compared again). Runs on the first
/// reactor.
pub fn namespaces_changed(c: &Arc<HostCtrlr>, ns: &[NsInfo]) {
    let Some(g) = get(&c.opts.name) else { return };
    if !g.ctrlrs.lock().unwrap().iter().any(|x| Arc::ptr_eq(x, c)) {
        return;
    }
    let mut unreg = Vec::new();
    let mut resized = Vec::new();
    let mut added = Vec::new();
    {
        let mut bdevs = g.bdevs.lock().unwrap();
        for b in bdevs.iter() {
            let same = ns.iter().find(|n| n.nsid == b.nsid);
            let mut l = b.ctrlrs.lock().unwrap();
            let has = l.iter().any(|x| Arc::ptr_eq(x, c));
            match same {
                None if has => {
                    l.retain(|x| !Arc::ptr_eq(x, c));
                    if l.is_empty() {
                        unreg.push(b.name.clone());
                    }
                }
                None => {}
                // Another controller's namespace of this NSID that differs stays left out.
                Some(n) if !has && (!b.info.same_namespace(n) || b.info.block_size != n.block_size) => {}
                Some(n) => {
                    if !has {
                        l.push(c.clone());
                    }
                    resized.push((b.name.clone(), n.num_blocks, n.write_protected));
                }
            }
        }
        bdevs.retain(|b| !unreg.contains(&b.name));
        for n in ns {
            if bdevs.iter().any(|b| b.nsid == n.nsid) {
                continue;
            }
            match crate::bdev::register_namespace(&g, c, n) {
                Ok(b) => {
                    added.push(b.name.clone());
                    bdevs.push(b);
                }
                Err(e) => log::warn!("nvme controller {}: namespace {}: {e}", g.name, n.nsid),
            }
        }
        g.gen.fetch_add(1, Ordering::AcqRel);
    }
    for (name, blocks, write_protected) in resized {
        let Some(b) = ferrite_bdev::lookup(&name) else { continue };
        if b.num_blocks() != blocks {
            match b.notify_resize(blocks) {
                Ok(()) => log::info!("nvme controller {}: {name} resized to {blocks} blocks", g.name),
                Err(e) => log::warn!("nvme controller {}: {name}: {e}", g.name),
            }
        }
        // A namespace made write-protected (an lvol set read-only on the target) takes no more
        // writes through its bdev either; protection is never lifted on a live bdev.
        if write_protected {
            b.stop_serving(crate::bdev::WRITE_PROTECTED_TYPES);
        }
    }
    if !added.is_empty() {
        log::info!("nvme controller {}: namespaces added: bdevs {added:?}", g.name);
    }
    for name in unreg {
        log::info!("nvme controller {}: namespace of {name} removed: unregistering it", g.name);
        // Its requests in flight finish or fail on their own; nothing waits for them here.
        let _ = ferrite_bdev::unregister(&name, Some("nvme"));
    }
}

/// Resets the controllers of `name` (those with controller ID `cntlid`, or all if 0), one
/// after the other (`bdev_nvme_reset_controller`). Runs on the first reactor.
pub async fn reset(name: &str, cntlid: u16) -> Result<(), RpcError> {
    let g = get(name).ok_or_else(|| strerror(libc::ENODEV))?;
    let ctrlrs: Vec<Arc<HostCtrlr>> = g
        .ctrlrs
        .lock()
        .unwrap()
        .iter()
        .filter(|c| cntlid == 0 || c.cntlid.load(Ordering::Acquire) == cntlid)
        .cloned()
        .collect();
    if ctrlrs.is_empty() {
        return Err(strerror(libc::ENODEV));
    }
    for c in ctrlrs {
        c.reset().await.map_err(strerror)?;
    }
    Ok(())
}

/// `bdev_nvme_detach_controller`: with an empty filter everything of the name, otherwise the
/// paths it matches (an alternate is dropped; the active path fails over to the next; a
/// controller's last path takes the controller, and a bdev left without controllers goes).
pub async fn detach(name: &str, filter: &PathFilter) -> Result<(), RpcError> {
    let g = get(name).ok_or_else(|| strerror(libc::ENODEV))?;
    let ctrlrs = g.ctrlrs.lock().unwrap().clone();
    let mut gone: Vec<Arc<HostCtrlr>> = Vec::new();
    let mut matched = false;
    for c in &ctrlrs {
        if filter.is_empty() {
            gone.push(c.clone());
            continue;
        }
        let trids = c.trids.lock().unwrap().clone();
        for t in trids.iter().skip(1) {
            if filter.matches(t) {
                c.remove_alternate(t);
                matched = true;
            }
        }
        if filter.matches(&trids[0]) {
            matched = true;
            if c.trids.lock().unwrap().len() > 1 {
                c.fail_over();
            } else {
                gone.push(c.clone());
            }
        }
    }
    if !filter.is_empty() && !matched {
        return Err(strerror(libc::ENXIO));
    }
    drop_controllers(&g, &gone).await;
    Ok(())
}

/// Controller `c` was given up on (`ctrlr_loss_timeout_sec` passed): as SPDK does, it is
/// deleted; bdevs it alone served are unregistered, and the name goes with its last controller.
pub async fn remove_lost(c: &Arc<HostCtrlr>) {
    let Some(g) = get(&c.opts.name) else { return };
    if !g.ctrlrs.lock().unwrap().iter().any(|x| Arc::ptr_eq(x, c)) {
        return;
    }
    log::warn!("nvme controller {}: deleting the lost controller", g.name);
    drop_controllers(&g, std::slice::from_ref(c)).await;
}

/// Takes controllers `gone` out of group `g`: they leave its bdevs first, bdevs left with none
/// are unregistered, the group goes once it has no controller, then they are detached (once
/// those bdevs are gone, or after [`DETACH_GRACE`], which fails the I/O still in flight).
async fn drop_controllers(g: &Arc<Group>, gone: &[Arc<HostCtrlr>]) {
    let name = g.name.as_str();
    // Controllers that go leave the bdevs first; bdevs left with none are unregistered.
    let mut unreg = Vec::new();
    {
        g.ctrlrs.lock().unwrap().retain(|c| !gone.iter().any(|x| Arc::ptr_eq(x, c)));
        let mut bdevs = g.bdevs.lock().unwrap();
        for b in bdevs.iter() {
            let mut l = b.ctrlrs.lock().unwrap();
            l.retain(|c| !gone.iter().any(|x| Arc::ptr_eq(x, c)));
            if l.is_empty() {
                unreg.push(b.name.clone());
            }
        }
        g.gen.fetch_add(1, Ordering::AcqRel);
        let keep_order: Vec<Arc<NsShared>> = bdevs.iter().filter(|b| !unreg.contains(&b.name)).cloned().collect();
        let removed: Vec<Arc<NsShared>> = bdevs.iter().filter(|b| unreg.contains(&b.name)).cloned().collect();
        *bdevs = keep_order;
        drop(bdevs);
        // Removed bdevs keep their controllers until they are gone (in-flight I/O).
        drop(removed);
    }
    if g.ctrlrs.lock().unwrap().is_empty() {
        groups().0.lock().unwrap().remove(name);
    }
    let mut waits = Vec::new();
    for n in &unreg {
        if let Ok(rx) = ferrite_bdev::unregister(n, Some("nvme")) {
            waits.push(rx);
        }
    }
    // I/O in flight gets DETACH_GRACE to complete; what the controllers have not answered by
    // then fails when their connections close (a command a controller never answers would
    // otherwise hold its bdev's users, and so the detach, for ever).
    let deadline = std::time::Instant::now() + DETACH_GRACE;
    let mut left = Vec::new();
    for mut w in waits {
        if crate::qpair::with_deadline(&mut w, deadline).await.is_none() {
            left.push(w);
        }
    }
    if !left.is_empty() {
        log::warn!(
            "nvme controller {name}: I/O still outstanding {} s after the detach began; closing the connections",
            DETACH_GRACE.as_secs()
        );
    }
    for c in gone {
        ctrlr::detach(c).await;
    }
    for w in left {
        let _ = w.await;
    }
}

/// How long a detach lets I/O in flight complete before it closes the controllers' connections.
const DETACH_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets the multipath policy of a bdev of this module (`bdev_nvme_set_multipath_policy`).
pub fn set_policy(bdev: &str, active_active: bool) -> Result<(), RpcError> {
    for g in all() {
        if let Some(b) = g.bdevs.lock().unwrap().iter().find(|b| b.name == bdev) {
            b.active_active.store(active_active, Ordering::Release);
            g.gen.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
    }
    Err(strerror(libc::ENODEV))
}

/// Detaches everything (daemon shutdown; on the first reactor, after bdevs are gone).
pub async fn shutdown() {
    let all: Vec<Arc<Group>> = std::mem::take(&mut *groups().0.lock().unwrap()).into_values().collect();
    for g in all {
        let ctrlrs = g.ctrlrs.lock().unwrap().clone();
        for c in ctrlrs {
            ctrlr::detach(&c).await;
        }
    }
}
