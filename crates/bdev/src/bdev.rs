//! Bdevs: named block devices, their backends (what a module implements), and the registry.

use crate::desc::{BdevDesc, DescEntry};
use crate::io::{BdevIo, IoType, IoTypes};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Errors of the bdev layer's control operations (create, open, claim, delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BdevError {
    /// No bdev has this name or alias.
    NotFound(String),
    /// A bdev (or alias) with this name exists.
    Exists(String),
    /// A parameter is out of range or inconsistent.
    Invalid(String),
    /// Another module holds a claim, or a writer blocks the claim.
    Claimed(String),
    /// The bdev is being deleted.
    Removing(String),
    /// An operating-system error (file missing, permission, ...).
    Os(String),
}

impl std::fmt::Display for BdevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BdevError::NotFound(n) => write!(f, "bdev {n} not found"),
            BdevError::Exists(n) => write!(f, "bdev {n} already exists"),
            BdevError::Invalid(m) | BdevError::Os(m) => f.write_str(m),
            BdevError::Claimed(m) => f.write_str(m),
            BdevError::Removing(n) => write!(f, "bdev {n} is being removed"),
        }
    }
}

impl std::error::Error for BdevError {}

impl BdevError {
    /// The errno SPDK would report for this error (used as the JSON-RPC error code).
    pub fn errno(&self) -> i32 {
        match self {
            BdevError::NotFound(_) => libc::ENODEV,
            BdevError::Exists(_) => libc::EEXIST,
            BdevError::Invalid(_) => libc::EINVAL,
            BdevError::Claimed(_) => libc::EPERM,
            BdevError::Removing(_) => libc::EBUSY,
            BdevError::Os(_) => libc::EIO,
        }
    }
}

/// The per-core half of a backend: receives requests on one core.
pub trait BackendChannel {
    /// Starts `io`. The module completes it later with `io.complete(..)` or
    /// `io.complete_deferred(..)`, exactly once, and never calls `complete` inside `submit`.
    fn submit(&mut self, io: BdevIo);
    /// True if the module serves zero-copy reads (`IoRequest::read_zcopy`) by lending its own
    /// memory; otherwise the bdev layer turns them into plain reads into a pool buffer.
    fn lends_reads(&self) -> bool {
        false
    }
}

/// What a bdev module implements for each bdev it creates.
pub trait BdevBackend: Send + Sync + 'static {
    /// Makes this core's channel. Called on the core that will submit through it.
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError>;
    /// The `driver_specific` object of `bdev_get_bdevs`.
    fn driver_specific(&self) -> Value {
        Value::Object(Default::default())
    }
    /// The `{"method":..,"params":..}` entry that recreates this bdev in a saved config.
    fn config_entry(&self, bdev: &Bdev) -> Option<Value>;
}

/// Properties a module gives when it registers a bdev.
#[derive(Debug, Clone)]
pub struct BdevProps {
    /// Unique name.
    pub name: String,
    /// Other names it can be opened by.
    pub aliases: Vec<String>,
    /// Stable identity; random when not given.
    pub uuid: Option<uuid::Uuid>,
    /// Bytes per block (a power of two, 512 to 64 KiB).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Human-readable kind, e.g. "Malloc disk".
    pub product_name: &'static str,
    /// Module that owns it, e.g. "malloc".
    pub module: &'static str,
    /// I/O types the module serves.
    pub io_types: IoTypes,
}

pub(crate) struct BdevShared {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) aliases: Vec<String>,
    pub(crate) uuid: uuid::Uuid,
    pub(crate) block_size: u32,
    pub(crate) num_blocks: u64,
    pub(crate) product_name: &'static str,
    pub(crate) module: &'static str,
    pub(crate) io_types: IoTypes,
    pub(crate) backend: Arc<dyn BdevBackend>,
    pub(crate) removing: AtomicBool,
    pub(crate) state: Mutex<OpenState>,
}

/// Who has the bdev open, who claims it, and who waits for its removal.
#[derive(Default)]
pub(crate) struct OpenState {
    pub(crate) descs: Vec<DescEntry>,
    pub(crate) claim: Option<(u64, String)>,
    pub(crate) removed_waiters: Vec<ferrite_reactor::oneshot::Sender<()>>,
}

/// A registered block device. Cheap to clone; immutable properties are readable from any core.
#[derive(Clone)]
pub struct Bdev(pub(crate) Arc<BdevShared>);

impl Bdev {
    /// Unique name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// Aliases.
    pub fn aliases(&self) -> &[String] {
        &self.0.aliases
    }
    /// UUID.
    pub fn uuid(&self) -> uuid::Uuid {
        self.0.uuid
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.0.block_size
    }
    /// Number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.0.num_blocks
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.0.num_blocks * self.0.block_size as u64
    }
    /// Product name.
    pub fn product_name(&self) -> &'static str {
        self.0.product_name
    }
    /// Owning module.
    pub fn module(&self) -> &'static str {
        self.0.module
    }
    /// True if the bdev serves `t`.
    pub fn supports(&self, t: IoType) -> bool {
        self.0.io_types.contains(t)
    }
    /// Internal identity (unique for the life of the process).
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// The module that holds the claim, if any.
    pub fn claimed_by(&self) -> Option<String> {
        self.0.state.lock().unwrap().claim.as_ref().map(|(_, m)| m.clone())
    }
    /// The backend (for `driver_specific` and config).
    pub fn backend(&self) -> &Arc<dyn BdevBackend> {
        &self.0.backend
    }
    /// True once deletion started.
    pub fn is_removing(&self) -> bool {
        self.0.removing.load(Ordering::Relaxed)
    }
    /// Number of open descriptors.
    pub fn open_count(&self) -> usize {
        self.0.state.lock().unwrap().descs.len()
    }

    /// Opens the bdev by name or alias. `on_remove` runs on the opening core when the bdev starts
    /// being deleted; the opener must then stop submitting, let in-flight I/O finish, and drop the
    /// descriptor.
    pub fn open(name: &str, write: bool, on_remove: impl Fn() + Send + Sync + 'static) -> Result<BdevDesc, BdevError> {
        let bdev = lookup(name).ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        BdevDesc::open(bdev, write, Arc::new(on_remove))
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

struct Registry {
    by_name: BTreeMap<String, Bdev>,
    aliases: BTreeMap<String, String>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { by_name: BTreeMap::new(), aliases: BTreeMap::new() });

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checks the properties shared by every module's create call.
pub fn check_geometry(block_size: u32, num_blocks: u64) -> Result<(), BdevError> {
    if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(BdevError::Invalid(format!("block_size {block_size} must be a power of two from 512 to 65536")));
    }
    if num_blocks == 0 {
        return Err(BdevError::Invalid("num_blocks must be greater than 0".into()));
    }
    if num_blocks.checked_mul(block_size as u64).is_none() {
        return Err(BdevError::Invalid(format!("size of {num_blocks} blocks of {block_size} bytes overflows")));
    }
    Ok(())
}

/// Registers a bdev made by a module.
pub fn register(props: BdevProps, backend: Arc<dyn BdevBackend>) -> Result<Bdev, BdevError> {
    check_geometry(props.block_size, props.num_blocks)?;
    if props.name.is_empty() {
        return Err(BdevError::Invalid("bdev name must not be empty".into()));
    }
    let mut reg = registry();
    for n in std::iter::once(&props.name).chain(props.aliases.iter()) {
        if reg.by_name.contains_key(n) || reg.aliases.contains_key(n) {
            return Err(BdevError::Exists(n.clone()));
        }
    }
    let uuid = props.uuid.unwrap_or_else(uuid::Uuid::new_v4);
    if reg.by_name.values().any(|b| b.uuid() == uuid) {
        return Err(BdevError::Exists(format!("with uuid {uuid}")));
    }
    let bdev = Bdev(Arc::new(BdevShared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        name: props.name.clone(),
        aliases: props.aliases.clone(),
        uuid,
        block_size: props.block_size,
        num_blocks: props.num_blocks,
        product_name: props.product_name,
        module: props.module,
        io_types: props.io_types,
        backend,
        removing: AtomicBool::new(false),
        state: Mutex::new(OpenState::default()),
    }));
    for a in &props.aliases {
        reg.aliases.insert(a.clone(), props.name.clone());
    }
    reg.by_name.insert(props.name.clone(), bdev.clone());
    log::info!("registered bdev {} ({}, {} x {} B)", props.name, props.module, props.num_blocks, props.block_size);
    Ok(bdev)
}

/// Finds a bdev by name, alias or UUID string.
pub fn lookup(name: &str) -> Option<Bdev> {
    let reg = registry();
    if let Some(b) = reg.by_name.get(name) {
        return Some(b.clone());
    }
    if let Some(n) = reg.aliases.get(name) {
        return reg.by_name.get(n).cloned();
    }
    reg.by_name.values().find(|b| b.uuid().to_string() == name).cloned()
}

/// Every registered bdev, by name.
pub fn list() -> Vec<Bdev> {
    registry().by_name.values().cloned().collect()
}

/// Starts deleting a bdev: it leaves the registry (its name is free again at once), new I/O on it
/// fails with `Removed`, and every opener is told. The returned receiver fires once every
/// descriptor is closed, which is when the module's resources can go.
pub fn unregister(name: &str, module: Option<&str>) -> Result<ferrite_reactor::oneshot::Receiver<()>, BdevError> {
    let bdev = {
        let mut reg = registry();
        let bdev = reg.by_name.get(name).cloned().ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        if let Some(m) = module {
            if bdev.module() != m {
                return Err(BdevError::NotFound(format!("{name} (it is a {} bdev, not {m})", bdev.module())));
            }
        }
        reg.by_name.remove(name);
        for a in &bdev.0.aliases {
            reg.aliases.remove(a);
        }
        bdev
    };
    bdev.0.removing.store(true, Ordering::SeqCst);
    let (tx, rx) = ferrite_reactor::oneshot::channel();
    let notify = {
        let mut st = bdev.0.state.lock().unwrap();
        if st.descs.is_empty() {
            tx.send(());
        } else {
            st.removed_waiters.push(tx);
        }
        st.descs.iter().map(|d| (d.core.clone(), d.on_remove.clone())).collect::<Vec<_>>()
    };
    log::info!("unregistering bdev {name}: {} opener(s) notified", notify.len());
    for (core, cb) in notify {
        match core {
            Some((c, engine)) => engine.send(c, move || cb()),
            None => cb(),
        }
    }
    Ok(rx)
}
