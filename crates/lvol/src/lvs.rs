//! Lvstores and lvols: what SPDK's `lib/lvol` keeps (names and UUIDs in xattrs: an lvstore's on
//! its blobstore's super blob, an lvol's on its blob) and the operations the RPCs run. Every
//! lvstore lives on the first reactor (its blobstore's metadata reactor); the functions here
//! run there.

use crate::xattr::{XATTR_NAME, XATTR_UUID};
use crate::MODULE;
use ferrite_bdev::{Bdev, BdevEvent, ExamineDone};
use ferrite_blob::format::blob::ClearMethod;
use ferrite_blob::store::{Blob, BlobOpts, Blobstore, BsError, Dev, InitClear, StoreOpts};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Blobstore type of an lvstore.
pub const BSTYPE: &str = "LVOLSTORE";
/// Longest lvstore or lvol name, in bytes (SPDK's 64 with the NUL).
pub const NAME_MAX: usize = 63;
/// SPDK's default cluster size for lvstores.
pub const DEFAULT_CLUSTER_SIZE: u32 = 4 << 20;

/// Why an lvol operation failed: an errno (SPDK's) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvolError {
    /// The errno SPDK answers.
    pub errno: i32,
    /// What went wrong.
    pub message: String,
    /// It happened where SPDK's RPC reports a failure from the operation's completion (with
    /// its own JSON-RPC code), not from the checks before it starts.
    pub late: bool,
}

impl LvolError {
    /// An error with `errno` and `message`.
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Self { errno, message: message.into(), late: false }
    }

    /// The same error, marked as found by the operation itself (see [`LvolError::late`]).
    pub fn late(self) -> Self {
        Self { late: true, ..self }
    }
}

impl std::fmt::Display for LvolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<ferrite_blob::store::DevError> for LvolError {
    fn from(e: ferrite_blob::store::DevError) -> Self {
        LvolError::new(libc::EIO, e.to_string())
    }
}

impl From<BsError> for LvolError {
    fn from(e: BsError) -> Self {
        LvolError::new(e.errno(), e.to_string())
    }
}

/// Result of an lvol operation.
pub type LvolResult<T> = Result<T, LvolError>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loaded lvstore.
pub struct Lvstore {
    /// Its name.
    pub name: Mutex<String>,
    /// Its UUID.
    pub uuid: uuid::Uuid,
    /// The blobstore.
    pub bs: Blobstore,
    /// The base bdev's name.
    pub base: String,
    /// The super blob (names the lvstore).
    pub super_blob: Blob,
    /// Its lvols by UUID.
    pub lvols: Mutex<BTreeMap<uuid::Uuid, Arc<Lvol>>>,
    /// Being deleted: no new lvol.
    pub deleting: std::sync::atomic::AtomicBool,
    /// Clones of external snapshots whose bdev is not there (SPDK's degraded lvols): no bdev
    /// until it appears.
    pub degraded: Mutex<Vec<Arc<Lvol>>>,
}

/// An lvol.
pub struct Lvol {
    /// Its name within the lvstore.
    pub name: Mutex<String>,
    /// Its UUID (also its bdev's name).
    pub uuid: uuid::Uuid,
    /// Its blob.
    pub blob: Blob,
    /// The lvstore's UUID.
    pub lvs_uuid: uuid::Uuid,
}

impl Lvol {
    /// The bdev's name: the UUID, as SPDK names lvol bdevs.
    pub fn bdev_name(&self) -> String {
        self.uuid.to_string()
    }
}

/// The lvstores of an engine, and the names of those being created.
#[derive(Default)]
struct Table(Mutex<Vec<Arc<Lvstore>>>, Mutex<Vec<String>>);

fn table() -> Arc<Table> {
    ferrite_reactor::engine_state::<Table>()
}

/// Every lvstore.
pub fn all() -> Vec<Arc<Lvstore>> {
    lock(&table().0).clone()
}

/// The lvstore with this name.
pub fn by_name(name: &str) -> Option<Arc<Lvstore>> {
    all().into_iter().find(|l| *lock(&l.name) == name)
}

/// The lvstore with this UUID.
pub fn by_uuid(uuid: &str) -> Option<Arc<Lvstore>> {
    let u = uuid::Uuid::parse_str(uuid).ok()?;
    all().into_iter().find(|l| l.uuid == u)
}

/// The lvol a bdev name or alias (`lvs/lvol`) or UUID names.
pub fn lvol(name: &str) -> Option<(Arc<Lvstore>, Arc<Lvol>)> {
    find(name, |lvs| lock(&lvs.lvols).values().cloned().collect())
}

/// A degraded lvol (no bdev: its external snapshot is missing) by its UUID or its
/// `lvs_name/lvol_name`, as SPDK's `bdev_lvol_delete` finds one.
pub fn degraded_lvol(name: &str) -> Option<(Arc<Lvstore>, Arc<Lvol>)> {
    find(name, |lvs| lock(&lvs.degraded).clone())
}

/// The lvol among `listed(lvstore)` of some lvstore whose UUID (its bdev's name) or alias
/// (`lvs/lvol`) is `name`.
fn find(name: &str, listed: impl Fn(&Lvstore) -> Vec<Arc<Lvol>>) -> Option<(Arc<Lvstore>, Arc<Lvol>)> {
    for lvs in all() {
        let lvs_name = lock(&lvs.name).clone();
        let hit =
            listed(&lvs).into_iter().find(|l| l.bdev_name() == name || format!("{lvs_name}/{}", lock(&l.name)) == name);
        if let Some(l) = hit {
            return Some((lvs, l));
        }
    }
    None
}

fn check_name(what: &str, name: &str) -> LvolResult<()> {
    if name.is_empty() || name.len() > NAME_MAX || name.contains('\0') {
        return Err(LvolError::new(libc::EINVAL, format!("{what} name {name:?} must be 1 to {NAME_MAX} bytes")));
    }
    // The bdev layer refuses them in bdev names, and an lvol's alias is "lvstore/lvol".
    if name.chars().any(char::is_control) {
        return Err(LvolError::new(libc::EINVAL, format!("{what} name {name:?} contains control characters")));
    }
    Ok(())
}

/// A C string xattr value: the text and its NUL (the lvstore's name, UUIDs).
fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// An lvol name as SPDK stores it at creation: 64 bytes, zero padded.
fn padded_name(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.resize(NAME_MAX + 1, 0);
    v
}

fn text_xattr(b: &Blob, name: &str) -> Option<String> {
    let v = b.xattr(name)?;
    let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
    String::from_utf8(v[..end].to_vec()).ok()
}

/// Opens `bdev_name` for the lvstore (writable, claimed); its removal takes the lvstore down.
fn open_base(bdev_name: &str) -> LvolResult<Dev> {
    let name = bdev_name.to_string();
    let desc = Bdev::open_ext(bdev_name, true, move |ev| {
        if ev == BdevEvent::Remove {
            let name = name.clone();
            ferrite_reactor::engine().send(0, move || {
                ferrite_reactor::spawn_local(async move { base_removed(&name).await }).detach();
            });
        }
    })
    .map_err(|e| {
        let errno = match e {
            ferrite_bdev::BdevError::NotFound(_) => libc::ENODEV,
            // EPERM, as SPDK's claim of a claimed bdev answers.
            ferrite_bdev::BdevError::Claimed(_) => libc::EPERM,
            _ => libc::EBUSY,
        };
        LvolError::new(errno, format!("cannot open bdev {bdev_name}: {e}"))
    })?;
    // EPERM, as SPDK's claim answers.
    desc.claim(MODULE).map_err(|e| LvolError::new(libc::EPERM, format!("bdev {bdev_name} is claimed: {e}")))?;
    Ok(Dev::new(desc))
}

/// What `bdev_lvol_create_lvstore` takes.
#[derive(Debug, Clone)]
pub struct LvsOpts {
    /// Base bdev.
    pub bdev_name: String,
    /// Lvstore name.
    pub lvs_name: String,
    /// Cluster size in bytes (None: 4 MiB).
    pub cluster_sz: Option<u32>,
    /// What happens to the data clusters.
    pub clear: InitClear,
    /// Metadata pages per 100 clusters (None: 100).
    pub md_pages_per_cluster_ratio: Option<u32>,
}

/// Creates an lvstore on a bdev (`bdev_lvol_create_lvstore`).
pub async fn create(o: &LvsOpts) -> LvolResult<Arc<Lvstore>> {
    check_name("lvstore", &o.lvs_name)?;
    // The name is taken now (checked and reserved at once), not when the blobstore is made.
    {
        let t = table();
        let mut creating = lock(&t.1);
        if by_name(&o.lvs_name).is_some() || creating.contains(&o.lvs_name) {
            return Err(LvolError::new(libc::EEXIST, format!("lvstore {} exists", o.lvs_name)));
        }
        creating.push(o.lvs_name.clone());
    }
    let res = create_reserved(o).await;
    lock(&table().1).retain(|n| *n != o.lvs_name);
    res
}

async fn create_reserved(o: &LvsOpts) -> LvolResult<Arc<Lvstore>> {
    let dev = open_base(&o.bdev_name)?;
    let cluster = o.cluster_sz.unwrap_or(DEFAULT_CLUSTER_SIZE);
    let bs_blocks = dev.block_size();
    if cluster < bs_blocks || !cluster.is_multiple_of(bs_blocks) {
        return Err(LvolError::new(
            libc::EINVAL,
            format!("cluster size {cluster} is not a multiple of the block size {bs_blocks}"),
        ));
    }
    let total = dev.num_blocks() / (cluster / bs_blocks) as u64;
    let ratio = o.md_pages_per_cluster_ratio.unwrap_or(100);
    if ratio == 0 || ratio > 1000 {
        return Err(LvolError::new(libc::EINVAL, format!("num_md_pages_per_cluster_ratio {ratio} is not 1 to 1000")));
    }
    let md_pages = ferrite_blob::store::layout::lvs_md_pages(total, ratio).max(1);
    let opts = StoreOpts {
        cluster_size: cluster,
        num_md_pages: Some(
            u32::try_from(md_pages).map_err(|_| LvolError::new(libc::EINVAL, "too many metadata pages"))?,
        ),
        bstype: BSTYPE.into(),
        clear: o.clear,
    };
    let bs = Blobstore::init(dev, &opts).await.map_err(|e| LvolError::from(e).late())?;
    let uuid = uuid::Uuid::new_v4();
    let super_id = bs
        .create_blob(&BlobOpts {
            xattrs: vec![(XATTR_NAME.into(), cstr(&o.lvs_name)), (XATTR_UUID.into(), cstr(&uuid.to_string()))],
            ..Default::default()
        })
        .await?;
    bs.set_super_blob(super_id).await?;
    let super_blob = bs.open_blob(super_id).await?;
    let lvs = Arc::new(Lvstore {
        name: Mutex::new(o.lvs_name.clone()),
        uuid,
        bs,
        base: o.bdev_name.clone(),
        super_blob,
        lvols: Mutex::new(BTreeMap::new()),
        deleting: std::sync::atomic::AtomicBool::new(false),
        degraded: Mutex::new(Vec::new()),
    });
    lock(&table().0).push(lvs.clone());
    log::info!("lvstore {} ({uuid}) created on {}", o.lvs_name, o.bdev_name);
    Ok(lvs)
}

// How long examine waits for the read of a bdev's first page: the bound every module's examine
// shares.
use ferrite_bdev::module::EXAMINE_READ_TIMEOUT;

/// Looks for an lvstore on a newly registered bdev and, if there is one, loads it and
/// registers its lvols (examine). Ends the examine when done.
pub fn examine(bdev: Bdev, done: ExamineDone) {
    let name = bdev.name().to_string();
    let engine = ferrite_reactor::engine();
    ferrite_reactor::spawn_local(async move {
        let rx = engine.run_async(0, move || async move {
            attach_degraded(&name);
            match probe(&name).await {
                // Not an lvstore (or one loaded already): nothing to say.
                Err(e) if e.errno == libc::EILSEQ => {}
                Err(e) => log::warn!("lvol examine of {name}: {}", e.message),
                // Its super block says lvstore: whatever keeps it from loading is worth a line.
                Ok(()) => {
                    if let Err(e) = load_probed(&name).await {
                        log::warn!("lvol examine of {name}: no lvstore loads from it: {}", e.message);
                    }
                }
            }
        });
        let _ = rx.await;
        done.finish();
    })
    .detach();
}

/// Loads the lvstore on `bdev_name`, if it holds one (EILSEQ if it does not).
pub async fn load(bdev_name: &str) -> LvolResult<Arc<Lvstore>> {
    probe(bdev_name).await?;
    load_probed(bdev_name).await
}

/// Whether `bdev_name` holds an lvstore to load: unclaimed, and its first page a super block
/// of an lvstore (EILSEQ if not).
async fn probe(bdev_name: &str) -> LvolResult<()> {
    let b = ferrite_bdev::lookup(bdev_name).ok_or_else(|| LvolError::new(libc::ENODEV, "no such bdev"))?;
    if b.claimed_by().is_some() || all().iter().any(|l| l.base == bdev_name) {
        return Err(LvolError::new(libc::EILSEQ, "claimed"));
    }
    // A look at the super block first, through a read-only descriptor (no claim).
    {
        let desc = Bdev::open_ext(bdev_name, false, |_| {}).map_err(|e| LvolError::new(libc::ENODEV, e.to_string()))?;
        // The first 4 KiB, in whole blocks (blocks need not divide 4 KiB: 1536 bytes).
        let bs = b.block_size() as u64;
        let len = 4096u64.div_ceil(bs) * bs;
        if b.num_blocks() * bs < len {
            return Err(LvolError::new(libc::EILSEQ, "too small"));
        }
        let ch = desc.channel().map_err(|e| LvolError::new(libc::EIO, e.to_string()))?;
        let req = ferrite_bdev::IoRequest::read(0, len / bs, ferrite_reactor::alloc_buf(len as usize));
        let Some(c) = ch.submit_wait_within(req, EXAMINE_READ_TIMEOUT).await else {
            return Err(LvolError::new(libc::ETIMEDOUT, "the read of the first page timed out"));
        };
        if !c.status.is_ok() {
            return Err(LvolError::new(libc::EIO, format!("read of the super block: {}", c.status)));
        }
        let head: Vec<u8> = c.req.bufs.iter().flat_map(|x| x.iter().copied()).take(4096).collect();
        match ferrite_blob::format::SuperBlock::decode(&head) {
            Ok(sb) if sb.bstype_str() == BSTYPE => Ok(()),
            _ => Err(LvolError::new(libc::EILSEQ, "no lvstore")),
        }
    }
}

/// Loads the lvstore on `bdev_name`, whose super block [`probe`] found: the blobstore, then
/// the lvstore from its super blob (SPDK's `lvs_open_super`), then its lvols.
async fn load_probed(bdev_name: &str) -> LvolResult<Arc<Lvstore>> {
    let dev = open_base(bdev_name)?;
    let bs = Blobstore::load(dev, Some(BSTYPE)).await?;
    let super_id =
        bs.super_blob().ok_or_else(|| LvolError::new(libc::EILSEQ, "the super block names no super blob"))?;
    let super_blob = bs.open_blob(super_id).await.map_err(|e| match e {
        BsError::NotFound(_) => {
            LvolError::new(libc::ENOENT, format!("super blob {super_id:#x} is not a blob of this store"))
        }
        e => LvolError::new(e.errno(), format!("super blob {super_id:#x} does not open: {e}")),
    })?;
    let name =
        text_xattr(&super_blob, XATTR_NAME).ok_or_else(|| LvolError::new(libc::EILSEQ, "lvstore without a name"))?;
    let uuid = text_xattr(&super_blob, XATTR_UUID)
        .and_then(|u| uuid::Uuid::parse_str(&u).ok())
        .ok_or_else(|| LvolError::new(libc::EILSEQ, "lvstore without a uuid"))?;
    if by_name(&name).is_some() || all().iter().any(|l| l.uuid == uuid) {
        return Err(LvolError::new(libc::EEXIST, format!("an lvstore named {name} or with uuid {uuid} is loaded")));
    }
    let lvs = Arc::new(Lvstore {
        name: Mutex::new(name.clone()),
        uuid,
        bs: bs.clone(),
        base: bdev_name.to_string(),
        super_blob,
        lvols: Mutex::new(BTreeMap::new()),
        deleting: std::sync::atomic::AtomicBool::new(false),
        degraded: Mutex::new(Vec::new()),
    });
    lock(&table().0).push(lvs.clone());
    for id in bs.blob_ids().into_iter().filter(|&id| id != super_id) {
        let blob = match bs.open_blob(id).await {
            Ok(b) => b,
            Err(e) => {
                log::warn!("lvstore {name}: blob {id:#x} does not open: {e}");
                continue;
            }
        };
        let (Some(lname), Some(luuid)) =
            (text_xattr(&blob, XATTR_NAME), text_xattr(&blob, XATTR_UUID).and_then(|u| uuid::Uuid::parse_str(&u).ok()))
        else {
            log::warn!("lvstore {name}: blob {id:#x} has no lvol name or uuid; left out");
            continue;
        };
        let lvol = Arc::new(Lvol { name: Mutex::new(lname.clone()), uuid: luuid, blob, lvs_uuid: uuid });
        if let Some(id) = lvol.blob.root_external() {
            let found = esnap_bdev(&id).and_then(|b| open_esnap(&lvs, &b).ok());
            if found.is_none() {
                log::warn!(
                    "lvstore {name}: lvol {lname} is degraded: its external snapshot {} is not there",
                    esnap_text(&id)
                );
                lock(&lvs.degraded).push(lvol);
                continue;
            }
        }
        if let Err(e) = crate::bdev::register(&lvs, &lvol) {
            log::warn!("lvstore {name}: lvol {lname}: {e}");
            continue;
        }
        lock(&lvs.lvols).insert(luuid, lvol);
    }
    log::info!("lvstore {name} ({uuid}) loaded from {bdev_name}: {} lvols", lock(&lvs.lvols).len());
    Ok(lvs)
}

/// Creates an lvol of `size` bytes (rounded up to clusters) in `lvs` (`bdev_lvol_create`).
pub async fn create_lvol(
    lvs: &Arc<Lvstore>,
    name: &str,
    size: u64,
    thin: bool,
    clear: Option<ClearMethod>,
) -> LvolResult<Arc<Lvol>> {
    check_name("lvol", name)?;
    let gone = || LvolError::new(libc::ENODEV, format!("lvstore {} is being deleted", lock(&lvs.name)));
    if lvs.deleting.load(std::sync::atomic::Ordering::Acquire) {
        return Err(gone());
    }
    if lock(&lvs.lvols).values().any(|l| *lock(&l.name) == name) {
        return Err(LvolError::new(libc::EEXIST, format!("lvol {name} exists in lvstore {}", lock(&lvs.name))));
    }
    let cluster = lvs.bs.geometry().cluster_size as u64;
    let clusters = size.div_ceil(cluster);
    if clusters == 0 {
        // SPDK makes a bdev of 0 blocks; no target can serve one (see docs/ARCHITECTURE.md).
        return Err(LvolError::new(libc::EINVAL, "an lvol of 0 bytes has no block to serve: give a size"));
    }
    if !thin && clusters > lvs.bs.free_clusters() {
        return Err(LvolError::new(
            libc::ENOSPC,
            format!("{clusters} clusters wanted, {} free", lvs.bs.free_clusters()),
        ));
    }
    let uuid = uuid::Uuid::new_v4();
    let id = lvs
        .bs
        .create_blob(&BlobOpts {
            num_clusters: clusters,
            thin,
            xattrs: vec![(XATTR_NAME.into(), padded_name(name)), (XATTR_UUID.into(), cstr(&uuid.to_string()))],
            clear_method: clear,
            ..Default::default()
        })
        .await?;
    let blob = open_new(lvs, id).await?;
    if lvs.deleting.load(std::sync::atomic::Ordering::Acquire) {
        // The lvstore started going while this one waited.
        drop(blob);
        let _ = lvs.bs.delete_blob(id).await;
        return Err(gone());
    }
    // Another create of this name may have won meanwhile: `adopt` checks.
    let lvol = adopt(lvs, name, uuid, blob).await?;
    log::info!(
        "lvol {}/{name} ({uuid}) created: {clusters} clusters{}",
        lock(&lvs.name),
        if thin { ", thin" } else { "" }
    );
    Ok(lvol)
}

/// Deletes an lvol: its bdev goes (openers are told), then its blob.
pub async fn delete_lvol(lvs: &Arc<Lvstore>, lvol: Arc<Lvol>) -> LvolResult<()> {
    let id = lvol.blob.id();
    // Held from here: no clone, snapshot or parent change of it (or of its one clone) starts
    // while its bdev goes, so the delete cannot be refused after the bdev is gone.
    let hold = lvs
        .bs
        .reserve_delete(id)
        .map_err(|e| LvolError::new(e.errno(), format!("lvol {} cannot be deleted now: {e}", lock(&lvol.name))))?;
    let degraded = {
        let mut d = lock(&lvs.degraded);
        let at = d.iter().position(|l| Arc::ptr_eq(l, &lvol));
        at.map(|i| d.remove(i)).is_some()
    };
    if !degraded {
        let gone = ferrite_bdev::unregister(&lvol.bdev_name(), Some(MODULE))
            .map_err(|e| LvolError::new(libc::ENODEV, e.to_string()))?;
        let _ = gone.await;
        lock(&lvs.lvols).remove(&lvol.uuid);
    }
    let name = lock(&lvol.name).clone();
    // The blob closes once its last handle is gone: the bdev's (dropped with its last
    // channel) and this one.
    drop_arc_wait(&lvol).await;
    let lvol = match Arc::try_unwrap(lvol) {
        Ok(l) => l,
        Err(l) => {
            restore(lvs, l.clone(), degraded);
            return Err(LvolError::new(libc::EBUSY, format!("lvol {name} is still in use")));
        }
    };
    let Lvol { name: lname, uuid, blob, lvs_uuid } = lvol;
    drop(blob);
    if let Err(e) = lvs.bs.delete_held(hold).await {
        // Still there (the delete failed before it changed anything, or the next load
        // finishes it): its bdev comes back.
        log::warn!("lvol {}/{name}: delete failed: {e}", lock(&lvs.name));
        if let Ok(blob) = lvs.bs.open_blob(id).await {
            restore(lvs, Arc::new(Lvol { name: lname, uuid, blob, lvs_uuid }), degraded);
        }
        return Err(e.into());
    }
    log::info!("lvol {}/{name} deleted", lock(&lvs.name));
    Ok(())
}

/// Puts back an lvol whose delete failed: its bdev registered again, or, degraded, in the
/// list of lvols waiting for their external snapshot.
fn restore(lvs: &Arc<Lvstore>, lvol: Arc<Lvol>, degraded: bool) {
    if degraded {
        return lock(&lvs.degraded).push(lvol);
    }
    match crate::bdev::register(lvs, &lvol) {
        Ok(_) => {
            lock(&lvs.lvols).insert(lvol.uuid, lvol);
        }
        Err(e) => log::warn!("lvol {}: its bdev does not come back: {e}", lock(&lvol.name)),
    }
}

/// Waits (briefly) until only the caller holds the lvol: the bdev's backend drops its handle
/// once its last channel is gone.
async fn drop_arc_wait(lvol: &Arc<Lvol>) {
    for _ in 0..500 {
        if Arc::strong_count(lvol) <= 1 {
            return;
        }
        ferrite_reactor::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Resizes an lvol to `size` bytes (rounded up to clusters) and tells its bdev's openers.
pub async fn resize_lvol(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>, size: u64) -> LvolResult<()> {
    let g = lvs.bs.geometry();
    let clusters = size.div_ceil(g.cluster_size as u64);
    // Everything that can refuse is checked before the blob changes.
    if clusters == 0 {
        return Err(LvolError::new(libc::EINVAL, "an lvol cannot be resized to 0 bytes"));
    }
    if lvol.blob.is_read_only() {
        // EPERM, as SPDK's blob resize answers.
        return Err(LvolError::new(
            libc::EPERM,
            format!("lvol {} is read-only: it cannot be resized", lock(&lvol.name)),
        ));
    }
    let old = lvol.blob.num_clusters();
    if clusters > old && !lvol.blob.is_thin() && clusters - old > lvs.bs.free_clusters() {
        return Err(LvolError::new(
            libc::ENOSPC,
            format!("{} more clusters wanted, {} free", clusters - old, lvs.bs.free_clusters()),
        ));
    }
    let b = ferrite_bdev::lookup(&lvol.bdev_name())
        .ok_or_else(|| LvolError::new(libc::ENODEV, "the lvol's bdev is gone"))?;
    let blocks = clusters * (g.cluster_size / g.io_unit_size) as u64;
    if clusters < old && b.open_count() > 0 {
        return Err(LvolError::new(libc::EBUSY, format!("lvol {} is open; it cannot shrink", lvol.bdev_name())));
    }
    lvol.blob.resize(clusters).await?;
    b.notify_resize(blocks).map_err(|e| LvolError::new(libc::EINVAL, e.to_string()))?;
    Ok(())
}

/// Deletes an lvstore with its lvols (`bdev_lvol_delete_lvstore`): the lvol bdevs go, the
/// blobstore is unloaded and its super block zeroed, and the base bdev is released.
pub async fn delete(lvs: &Arc<Lvstore>) -> LvolResult<()> {
    if lvs.deleting.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return Err(LvolError::new(libc::EBUSY, format!("lvstore {} is being deleted", lock(&lvs.name))));
    }
    // All or nothing: with an operation under way on any lvol (an inflate, a snapshot) the
    // delete is refused before it deletes anything, and none can start once it goes on.
    if let Err(e) = lvs.bs.close_to_ops() {
        lvs.deleting.store(false, std::sync::atomic::Ordering::Release);
        return Err(LvolError::new(e.errno(), format!("lvstore {} cannot be deleted now: {e}", lock(&lvs.name))));
    }
    // Clones before their snapshots (a snapshot with no clone left goes without a merge).
    loop {
        let lvols: Vec<Arc<Lvol>> = lock(&lvs.lvols).values().cloned().collect();
        if lvols.is_empty() {
            break;
        }
        // (Only the lvols deleted now are held here: a delete waits for the last other holder.)
        let (leaves, rest): (Vec<Arc<Lvol>>, Vec<Arc<Lvol>>) =
            lvols.into_iter().partition(|l| lvs.bs.clones_of(l.blob.id()).is_empty());
        let next = if leaves.is_empty() { rest } else { leaves };
        for l in next {
            if let Err(e) = delete_lvol(lvs, l).await {
                lvs.bs.reopen_to_ops();
                lvs.deleting.store(false, std::sync::atomic::Ordering::Release);
                return Err(e);
            }
        }
    }
    lock(&table().0).retain(|x| !Arc::ptr_eq(x, lvs));
    let dev = lvs.bs.dev().clone();
    // The super blob stays open in `lvs`: unload after the table lets go is not possible while
    // it is open, so the store is destroyed in place: its super block is zeroed and flushed.
    dev.write_zeroes(0, 4096u64.max(dev.block_size() as u64)).await?;
    dev.flush().await?;
    log::info!("lvstore {} ({}) deleted", lock(&lvs.name), lvs.uuid);
    Ok(())
}

/// The base bdev of an lvstore is going: its lvol bdevs go with it (their data stays on the
/// base; the lvstore comes back when the base does).
async fn base_removed(base: &str) {
    let Some(lvs) = all().into_iter().find(|l| l.base == base) else { return };
    log::warn!("lvstore {}: base bdev {base} removed; its lvols go", lock(&lvs.name));
    lock(&table().0).retain(|x| !Arc::ptr_eq(x, &lvs));
    let lvols: Vec<Arc<Lvol>> = std::mem::take(&mut *lock(&lvs.lvols)).into_values().collect();
    for l in lvols {
        if let Ok(rx) = ferrite_bdev::unregister(&l.bdev_name(), Some(MODULE)) {
            let _ = rx.await;
        }
    }
}

/// Unloads every lvstore cleanly (daemon shutdown): its lvol bdevs go first (waiting for
/// their openers), then the blobstore is unloaded (masks written, marked clean), while the base
/// bdev is still there.
pub async fn shutdown() {
    let mut left: Vec<Arc<Lvstore>> = std::mem::take(&mut *lock(&table().0));
    while !left.is_empty() {
        // A store whose lvols nobody has open goes first. The targets are closed by now, so
        // an opener is something stacked on the lvol: another lvstore (directly, or through
        // a passthru or other virtual bdevs), or a clone of it as external snapshot in
        // another store. Those go before the store under them, or its lvols' bdevs wait for
        // them (the shutdown waited forever). Failing that, a store that hosts no other one.
        let next = left
            .iter()
            .position(|a| !lvols_open(a))
            .or_else(|| left.iter().position(|a| !left.iter().any(|b| !Arc::ptr_eq(a, b) && hosts(a, b))))
            .unwrap_or(0);
        let lvs = left.remove(next);
        let lvols: Vec<Arc<Lvol>> = std::mem::take(&mut *lock(&lvs.lvols)).into_values().collect();
        // Bounded all the same: an opener that never lets go leaves this store dirty (the
        // next load recovers it), not the daemon hanging.
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        for l in &lvols {
            if let Ok(rx) = ferrite_bdev::unregister(&l.bdev_name(), Some(MODULE)) {
                let gone = async { rx.await.is_ok() };
                let timeout = async {
                    ferrite_reactor::sleep(deadline.saturating_duration_since(std::time::Instant::now())).await;
                    false
                };
                if !ferrite_reactor::net::race(gone, timeout).await {
                    log::warn!("lvol {}: its bdev is still open at shutdown", lock(&l.name));
                }
            }
        }
        for l in &lvols {
            drop_arc_wait(l).await;
        }
        drop(lvols);
        // Degraded lvols have no bdev, but their blobs are open: closed here, or the unload
        // finds them busy and leaves the store to be recovered at the next load.
        drop(std::mem::take(&mut *lock(&lvs.degraded)));
        let name = lock(&lvs.name).clone();
        let Ok(lvs) = Arc::try_unwrap(lvs) else {
            log::warn!("lvstore {name}: still in use at shutdown; not unloaded (the next load recovers it)");
            continue;
        };
        let Lvstore { bs, super_blob, .. } = lvs;
        drop(super_blob);
        match bs.unload().await {
            Ok(()) => log::info!("lvstore {name} unloaded"),
            Err(e) => log::warn!("lvstore {name}: unload: {e} (the next load recovers it)"),
        }
    }
}

/// How long the shutdown waits for one lvstore's lvol bdevs to close.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// True if anything has one of `lvs`'s lvol bdevs open.
fn lvols_open(lvs: &Lvstore) -> bool {
    lock(&lvs.lvols).values().any(|l| ferrite_bdev::lookup(&l.bdev_name()).is_some_and(|b| b.open_count() > 0))
}

/// True if lvstore `inner`'s base bdev is one of `outer`'s lvols.
fn hosts(outer: &Lvstore, inner: &Lvstore) -> bool {
    let Some(base) = ferrite_bdev::lookup(&inner.base) else { return false };
    lock(&outer.lvols).values().any(|l| l.bdev_name() == base.name())
}

/// An lvol's place among snapshots and clones: its parent's name and its clones' names.
#[derive(Debug, Default)]
pub struct Family {
    /// The parent snapshot's lvol name (a clone has one).
    pub parent: Option<String>,
    /// The names of the lvols that have it as parent (a snapshot has some).
    pub clones: Vec<String>,
}

/// The family of `lvol` in its lvstore.
pub fn family(lvol: &Lvol) -> Family {
    let Some(lvs) = all().into_iter().find(|l| l.uuid == lvol.lvs_uuid) else { return Family::default() };
    let by_id: BTreeMap<u64, String> =
        lock(&lvs.lvols).values().map(|l| (l.blob.id(), lock(&l.name).clone())).collect();
    let id = lvol.blob.id();
    Family {
        parent: lvs.bs.parent_of(id).and_then(|p| by_id.get(&p).cloned()),
        clones: lvs.bs.clones_of(id).iter().filter_map(|c| by_id.get(c).cloned()).collect(),
    }
}

fn name_taken(lvs: &Lvstore, name: &str) -> LvolResult<()> {
    // Degraded lvols keep their names: they come back under them.
    let named = |l: &Arc<Lvol>| *lock(&l.name) == name;
    if lock(&lvs.lvols).values().any(named) || lock(&lvs.degraded).iter().any(named) {
        return Err(LvolError::new(libc::EEXIST, format!("lvol {name} exists in lvstore {}", lock(&lvs.name))));
    }
    Ok(())
}

/// Opens blob `id`, just made; nothing refers to it yet, so it goes again if that fails.
async fn open_new(lvs: &Lvstore, id: u64) -> LvolResult<Blob> {
    match lvs.bs.open_blob(id).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let _ = lvs.bs.delete_blob(id).await;
            Err(e.into())
        }
    }
}

/// Registers the bdev of a new lvol over `blob` and adds it to the lvstore; the blob is
/// deleted if that fails.
async fn adopt(lvs: &Arc<Lvstore>, name: &str, uuid: uuid::Uuid, blob: Blob) -> LvolResult<Arc<Lvol>> {
    let id = blob.id();
    if let Err(e) = name_taken(lvs, name) {
        drop(blob);
        let _ = lvs.bs.delete_blob(id).await;
        return Err(e);
    }
    let lvol = Arc::new(Lvol { name: Mutex::new(name.to_string()), uuid, blob, lvs_uuid: lvs.uuid });
    if let Err(e) = crate::bdev::register(lvs, &lvol) {
        drop(lvol);
        let _ = lvs.bs.delete_blob(id).await;
        return Err(LvolError::new(e.errno(), e.to_string()));
    }
    lock(&lvs.lvols).insert(uuid, lvol.clone());
    Ok(lvol)
}

/// Snapshots `lvol` as `name` (`bdev_lvol_snapshot`): writes to the lvol wait while its
/// clusters move to the snapshot (reads go on); the lvol becomes the snapshot's clone.
pub async fn snapshot_lvol(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>, name: &str) -> LvolResult<Arc<Lvol>> {
    check_name("snapshot", name)?;
    name_taken(lvs, name)?;
    if lvol.blob.is_read_only() {
        return Err(LvolError::new(libc::EINVAL, format!("lvol {} is read-only: no snapshot of it", lock(&lvol.name))));
    }
    let bdev = ferrite_bdev::lookup(&lvol.bdev_name())
        .ok_or_else(|| LvolError::new(libc::ENODEV, "the lvol's bdev is gone"))?;
    let uuid = uuid::Uuid::new_v4();
    let xattrs = vec![(XATTR_NAME.into(), padded_name(name)), (XATTR_UUID.into(), cstr(&uuid.to_string()))];
    let sid = lvs.bs.prepare_snapshot(&lvol.blob, xattrs).await?;
    let started = std::time::Instant::now();
    let held = bdev.lock_lba_range(0, u64::MAX).await;
    let r = lvs.bs.commit_snapshot(&lvol.blob, sid).await;
    drop(held);
    let snap = r?;
    // Done once the lvol names it; if this write fails the next load finishes the snapshot.
    let _ = lvs.bs.finish_snapshot(&snap).await;
    log::info!(
        "lvol {}/{}: snapshot {name} ({uuid}) taken; writes waited {} us",
        lock(&lvs.name),
        lock(&lvol.name),
        started.elapsed().as_micros()
    );
    adopt(lvs, name, uuid, snap).await
}

/// Clones snapshot (read-only lvol) `snap` as `name` (`bdev_lvol_clone`).
pub async fn clone_lvol(lvs: &Arc<Lvstore>, snap: &Arc<Lvol>, name: &str) -> LvolResult<Arc<Lvol>> {
    check_name("clone", name)?;
    name_taken(lvs, name)?;
    if !snap.blob.is_read_only() {
        return Err(LvolError::new(
            libc::EINVAL,
            format!("lvol {} is not read-only: it cannot be cloned", lock(&snap.name)),
        ));
    }
    let uuid = uuid::Uuid::new_v4();
    let xattrs = vec![(XATTR_NAME.into(), padded_name(name)), (XATTR_UUID.into(), cstr(&uuid.to_string()))];
    let id = lvs.bs.create_clone(&snap.blob, xattrs).await?;
    let blob = open_new(lvs, id).await?;
    let lvol = adopt(lvs, name, uuid, blob).await?;
    log::info!("lvol {}/{name} ({uuid}) cloned from {}", lock(&lvs.name), lock(&snap.name));
    Ok(lvol)
}

/// Allocates every cluster of `lvol` and drops its parent (`bdev_lvol_inflate`), or, with
/// `all` false, only what its parent holds and takes the grandparent (`bdev_lvol_decouple_parent`).
pub async fn separate_lvol(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>, all: bool) -> LvolResult<()> {
    if lvol.blob.is_read_only() {
        let what = if all { "inflated" } else { "decoupled" };
        return Err(LvolError::new(
            libc::EPERM,
            format!("lvol {} is read-only: it cannot be {what}", lock(&lvol.name)),
        ));
    }
    if !all && lvol.blob.parent_id().is_none() && lvol.blob.external_id().is_none() {
        return Err(LvolError::new(libc::EINVAL, format!("lvol {} has no parent", lock(&lvol.name))));
    }
    if all {
        lvs.bs.inflate(&lvol.blob).await?;
    } else {
        lvs.bs.decouple_parent(&lvol.blob).await?;
    }
    log::info!("lvol {}/{} {}", lock(&lvs.name), lock(&lvol.name), if all { "inflated" } else { "decoupled" });
    Ok(())
}

/// Marks `lvol` read-only (`bdev_lvol_set_read_only`): its writes fail from now on.
/// Refused while an lvstore lives on it, directly or through bdevs stacked over it: that
/// lvstore could no longer write its metadata.
pub async fn set_read_only(lvol: &Arc<Lvol>) -> LvolResult<()> {
    let bdev = ferrite_bdev::lookup(&lvol.bdev_name());
    // The lvstore may stand on it directly or on a passthru (delay, error) over it.
    let holds_store =
        |b: &Bdev| b.claims().iter().any(|(m, k)| m == MODULE && *k != ferrite_bdev::ClaimType::ReadManyWriteNone);
    let stack = |b: &Bdev| std::iter::once(b.clone()).chain(ferrite_bdev::stacked_over(b)).any(|b| holds_store(&b));
    if bdev.as_ref().is_some_and(stack) {
        return Err(LvolError::new(
            libc::EBUSY,
            format!("lvol {} holds an lvstore, which writes its metadata there", lock(&lvol.name)),
        ));
    }
    lvol.blob.set_read_only()?;
    lvol.blob.sync_md().await?;
    // Its bdev says so from now on (bdev_get_bdevs, NBD's flags, NVMe's NSATTR), as a
    // snapshot's does from its start.
    if let Some(b) = bdev {
        b.stop_serving(crate::bdev::WRITE_IO_TYPES);
    }
    Ok(())
}

/// Renames `lvol` (`bdev_lvol_rename`): its xattr and its bdev's alias.
pub async fn rename_lvol(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>, new: &str) -> LvolResult<()> {
    check_name("lvol", new)?;
    let old = lock(&lvol.name).clone();
    if old == new {
        return Ok(());
    }
    name_taken(lvs, new)?;
    let lvs_name = lock(&lvs.name).clone();
    let b = ferrite_bdev::lookup(&lvol.bdev_name())
        .ok_or_else(|| LvolError::new(libc::ENODEV, "the lvol's bdev is gone"))?;
    if ferrite_bdev::lookup(&format!("{lvs_name}/{new}")).is_some() {
        return Err(LvolError::new(libc::EEXIST, format!("a bdev is named {lvs_name}/{new}")));
    }
    lvol.blob.set_xattr(XATTR_NAME, &cstr(new))?;
    if let Err(e) = lvol.blob.sync_md().await {
        let _ = lvol.blob.set_xattr(XATTR_NAME, &cstr(&old));
        return Err(e.into());
    }
    *lock(&lvol.name) = new.to_string();
    b.rename_alias(&format!("{lvs_name}/{old}"), &format!("{lvs_name}/{new}"))
        .map_err(|e| LvolError::new(e.errno(), e.to_string()))?;
    log::info!("lvol {lvs_name}/{old} renamed {new}");
    Ok(())
}

/// Renames an lvstore (`bdev_lvol_rename_lvstore`): its super blob's xattr and every lvol's
/// alias.
pub async fn rename_lvstore(lvs: &Arc<Lvstore>, new: &str) -> LvolResult<()> {
    check_name("lvstore", new)?;
    let old = lock(&lvs.name).clone();
    if old == new {
        return Ok(());
    }
    if by_name(new).is_some() || lock(&table().1).iter().any(|n| n == new) {
        return Err(LvolError::new(libc::EEXIST, format!("lvstore {new} exists")));
    }
    // Every new alias must be free (names may hold '/': "a/b" + "c" and "a" + "b/c" meet).
    let lvols: Vec<Arc<Lvol>> = lock(&lvs.lvols).values().cloned().collect();
    // Degraded lvols too: their bdevs come back under the new aliases.
    let degraded: Vec<Arc<Lvol>> = lock(&lvs.degraded).clone();
    for l in lvols.iter().chain(&degraded) {
        let alias = format!("{new}/{}", lock(&l.name));
        if let Some(b) = ferrite_bdev::lookup(&alias) {
            if b.name() != l.bdev_name() {
                return Err(LvolError::new(libc::EEXIST, format!("bdev {} is named {alias} already", b.name())));
            }
        }
    }
    lvs.super_blob.set_xattr(XATTR_NAME, &cstr(new))?;
    if let Err(e) = lvs.super_blob.sync_md().await {
        let _ = lvs.super_blob.set_xattr(XATTR_NAME, &cstr(&old));
        return Err(e.into());
    }
    *lock(&lvs.name) = new.to_string();
    for l in lvols {
        let n = lock(&l.name).clone();
        if let Some(b) = ferrite_bdev::lookup(&l.bdev_name()) {
            if let Err(e) = b.rename_alias(&format!("{old}/{n}"), &format!("{new}/{n}")) {
                log::warn!("lvstore {old} renamed {new}: alias of lvol {n}: {e}");
            }
        }
    }
    log::info!("lvstore {old} renamed {new}");
    Ok(())
}

/// Grows an lvstore to its base bdev's size now (`bdev_lvol_grow_lvstore`, after the base grew).
pub async fn grow(lvs: &Arc<Lvstore>) -> LvolResult<()> {
    let before = lvs.bs.total_clusters();
    let after = lvs.bs.grow().await?;
    if after != before {
        log::info!("lvstore {}: grown from {before} to {after} clusters", lock(&lvs.name));
    }
    Ok(())
}

/// An external snapshot id as text (the bdev UUID SPDK stores, without its NUL).
pub fn esnap_text(id: &[u8]) -> String {
    let end = id.iter().position(|&c| c == 0).unwrap_or(id.len());
    String::from_utf8_lossy(&id[..end]).into_owned()
}

/// The bdev an external snapshot id names (by UUID).
fn esnap_bdev(id: &[u8]) -> Option<Bdev> {
    ferrite_bdev::lookup(&esnap_text(id))
}

/// The device of external snapshot bdev `b` for `lvs`: opened read-only and claimed
/// read-many-write-none (nobody writes it while clones read it), registered with the blobstore
/// under its UUID; the same one if it is already.
fn open_esnap(lvs: &Lvstore, b: &Bdev) -> LvolResult<Dev> {
    let id = cstr(&b.uuid().to_string());
    if let Some(d) = lvs.bs.external_source(&id) {
        return Ok(d);
    }
    let io_unit = lvs.bs.geometry().io_unit_size;
    if !io_unit.is_multiple_of(b.block_size()) {
        return Err(LvolError::new(
            libc::EINVAL,
            format!("bdev {}: blocks of {} B do not divide the lvstore's {io_unit} B", b.name(), b.block_size()),
        ));
    }
    let name = b.name().to_string();
    let eid = id.clone();
    let desc = Bdev::open_ext(b.name(), false, move |ev| {
        if ev == BdevEvent::Remove {
            log::warn!("external snapshot bdev {name} is going: the lvols over it become degraded");
            let eid = eid.clone();
            ferrite_reactor::engine().send(0, move || {
                ferrite_reactor::spawn_local(async move { esnap_removed(&eid).await }).detach();
            });
        }
    })
    .map_err(|e| LvolError::new(libc::ENODEV, format!("cannot open bdev {}: {e}", b.name())))?;
    desc.claim_as(MODULE, ferrite_bdev::ClaimType::ReadManyWriteNone, 0)
        .map_err(|e| LvolError::new(libc::EPERM, format!("bdev {} cannot be an external snapshot: {e}", b.name())))?;
    let dev = Dev::new(desc);
    lvs.bs.set_external_source(id, dev.clone());
    Ok(dev)
}

/// A bdev appeared: degraded lvols whose external snapshot it is get their bdevs.
fn attach_degraded(name: &str) {
    let Some(b) = ferrite_bdev::lookup(name) else { return };
    let uuid = b.uuid().to_string();
    for lvs in all() {
        let due: Vec<Arc<Lvol>> = {
            let mut d = lock(&lvs.degraded);
            let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut *d)
                .into_iter()
                .partition(|l| l.blob.root_external().is_some_and(|id| esnap_text(&id) == uuid));
            *d = keep;
            due
        };
        for l in due {
            let res = open_esnap(&lvs, &b)
                .and_then(|_| crate::bdev::register(&lvs, &l).map_err(|e| LvolError::new(e.errno(), e.to_string())));
            match res {
                Ok(_) => {
                    log::info!("lvstore {}: lvol {} is whole again ({name} is there)", lock(&lvs.name), lock(&l.name));
                    lock(&lvs.lvols).insert(l.uuid, l);
                }
                Err(e) => {
                    log::warn!("lvstore {}: lvol {} stays degraded: {e}", lock(&lvs.name), lock(&l.name));
                    lock(&lvs.degraded).push(l);
                }
            }
        }
    }
}

/// Makes `name`, a thin clone of bdev `bdev_name` (an external snapshot: any bdev nobody
/// writes), in `lvs` (`bdev_lvol_clone_bdev`). Its size is the bdev's, rounded up to clusters.
pub async fn clone_bdev(lvs: &Arc<Lvstore>, bdev_name: &str, name: &str) -> LvolResult<Arc<Lvol>> {
    check_name("clone", name)?;
    name_taken(lvs, name)?;
    let b =
        ferrite_bdev::lookup(bdev_name).ok_or_else(|| LvolError::new(libc::ENODEV, format!("no bdev {bdev_name}")))?;
    if lvs.base == b.name() || lock(&lvs.lvols).values().any(|l| l.bdev_name() == b.name()) {
        return Err(LvolError::new(
            libc::EINVAL,
            format!(
                "bdev {bdev_name} is lvstore {}'s base or one of its lvols (clone a snapshot with bdev_lvol_clone)",
                lock(&lvs.name)
            ),
        ));
    }
    open_esnap(lvs, &b)?;
    let size = b.num_blocks() * b.block_size() as u64;
    let clusters = size.div_ceil(lvs.bs.geometry().cluster_size as u64);
    let uuid = uuid::Uuid::new_v4();
    let id = lvs
        .bs
        .create_blob(&BlobOpts {
            num_clusters: clusters,
            thin: true,
            xattrs: vec![(XATTR_NAME.into(), padded_name(name)), (XATTR_UUID.into(), cstr(&uuid.to_string()))],
            external_parent: Some(cstr(&b.uuid().to_string())),
            ..Default::default()
        })
        .await?;
    let blob = open_new(lvs, id).await?;
    let lvol = adopt(lvs, name, uuid, blob).await?;
    log::info!("lvol {}/{name} ({uuid}) cloned from bdev {bdev_name}", lock(&lvs.name));
    Ok(lvol)
}

/// The name of the bdev an lvol's external snapshot is, if it is an esnap clone.
pub fn external_snapshot_name(lvol: &Lvol) -> Option<String> {
    let id = lvol.blob.external_id()?;
    Some(esnap_bdev(&id).map(|b| b.name().to_string()).unwrap_or_else(|| esnap_text(&id)))
}

/// Makes snapshot `parent` the parent of thin lvol `lvol` (`bdev_lvol_set_parent`).
pub async fn set_parent(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>, parent: &Arc<Lvol>) -> LvolResult<()> {
    lvs.bs.set_parent(&lvol.blob, &parent.blob).await?;
    log::info!("lvol {}/{}: parent is now {}", lock(&lvs.name), lock(&lvol.name), lock(&parent.name));
    Ok(())
}

/// An external snapshot's bdev is going: the lvols that read it lose their bdevs and wait,
/// degraded, for it to come back (SPDK's behaviour); its descriptor is closed so that its
/// removal can finish.
async fn esnap_removed(id: &[u8]) {
    for lvs in all() {
        let Some(gone) = lvs.bs.external_source(id) else { continue };
        let hit: Vec<Arc<Lvol>> =
            lock(&lvs.lvols).values().filter(|l| l.blob.root_external().is_some_and(|r| r == id)).cloned().collect();
        for l in hit {
            lock(&lvs.lvols).remove(&l.uuid);
            if let Ok(rx) = ferrite_bdev::unregister(&l.bdev_name(), Some(MODULE)) {
                let _ = rx.await;
            }
            log::warn!("lvstore {}: lvol {} is degraded", lock(&lvs.name), lock(&l.name));
            lock(&lvs.degraded).push(l);
        }
        // The bdev may have come back while the lvol bdevs went: its new device, registered by
        // the attach, stays; only the one that went is forgotten.
        if lvs.bs.external_source(id).is_some_and(|d| d.same(&gone)) {
            lvs.bs.remove_external_source(id);
        }
    }
    // Lvols that went degraded after such a return attach now.
    let text = esnap_text(id);
    if let Some(b) = ferrite_bdev::lookup(&text).filter(|b| b.uuid().to_string() == text) {
        attach_degraded(b.name());
    }
}
