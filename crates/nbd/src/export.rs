//! What the NBD server exports and who is connected: control-plane tables shared by every
//! reactor (read during handshakes, never on the I/O path).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// An export: a bdev offered under a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// Name clients ask for.
    pub name: String,
    /// The bdev behind it.
    pub bdev: String,
    /// Refuse writes.
    pub read_only: bool,
    /// Free text shown by NBD_OPT_LIST and NBD_INFO_DESCRIPTION.
    pub description: String,
}

/// A connected client, as `nbd_server_get_connections` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Connection id (unique in the process).
    pub id: u64,
    /// Export in use, once the handshake chose one.
    pub export: Option<String>,
    /// Reactor that owns the connection.
    pub reactor: usize,
    /// Peer address.
    pub peer: String,
    /// Listener it came through.
    pub listen: String,
}

#[derive(Default)]
pub(crate) struct Tables {
    pub(crate) exports: BTreeMap<String, Export>,
    pub(crate) conns: BTreeMap<u64, ConnInfo>,
    pub(crate) next_conn: u64,
}

static TABLES: Mutex<Tables> = Mutex::new(Tables { exports: BTreeMap::new(), conns: BTreeMap::new(), next_conn: 1 });

pub(crate) fn tables() -> MutexGuard<'static, Tables> {
    TABLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds an export; fails if the name is taken.
pub fn add(e: Export) -> Result<(), String> {
    let mut t = tables();
    if t.exports.contains_key(&e.name) {
        return Err(format!("export {} already exists", e.name));
    }
    t.exports.insert(e.name.clone(), e);
    Ok(())
}

/// Removes an export (connections using it are closed by the caller).
pub fn remove(name: &str) -> Option<Export> {
    tables().exports.remove(name)
}

/// Finds an export by name.
pub fn get(name: &str) -> Option<Export> {
    tables().exports.get(name).cloned()
}

/// Every export, by name.
pub fn list() -> Vec<Export> {
    tables().exports.values().cloned().collect()
}

/// Every connection.
pub fn connections() -> Vec<ConnInfo> {
    tables().conns.values().cloned().collect()
}
