//! What the NBD server exports and who is connected: control-plane tables shared by every
//! reactor (read during handshakes, never on the I/O path).

use std::collections::BTreeMap;

/// An export: a bdev offered under a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// Name clients ask for.
    pub name: String,
    /// The bdev behind it.
    pub bdev: String,
    /// Identity of that bdev ([`ferrite_bdev::Bdev::id`]): the export serves this bdev only, not
    /// a later one that takes the same name, and goes when it is deleted.
    pub bdev_id: u64,
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

/// One engine's exports and connections (see `ferrite_reactor::context`).
pub(crate) struct Tables {
    pub(crate) exports: BTreeMap<String, Export>,
    pub(crate) conns: BTreeMap<u64, ConnInfo>,
    pub(crate) next_conn: u64,
}

impl Default for Tables {
    fn default() -> Self {
        Self { exports: BTreeMap::new(), conns: BTreeMap::new(), next_conn: 1 }
    }
}

pub(crate) fn tables() -> ferrite_reactor::StateGuard<Tables> {
    ferrite_reactor::lock_state::<Tables>()
}

/// True while the bdev the export was made for is registered (a bdev deleted and made again
/// under the same name is another bdev).
fn bdev_present(e: &Export) -> bool {
    ferrite_bdev::lookup(&e.bdev).is_some_and(|b| b.id() == e.bdev_id)
}

/// Drops exports whose bdev was deleted (their connections were closed by the bdev's removal).
fn prune(t: &mut Tables) {
    t.exports.retain(|name, e| {
        let keep = bdev_present(e);
        if !keep {
            log::info!("nbd export {name} removed: its bdev {} was deleted", e.bdev);
        }
        keep
    });
}

/// Adds an export; fails if the name is taken.
pub fn add(e: Export) -> Result<(), String> {
    let mut t = tables();
    prune(&mut t);
    if t.exports.contains_key(&e.name) {
        return Err(format!("export {} already exists", e.name));
    }
    t.exports.insert(e.name.clone(), e);
    Ok(())
}

/// Removes an export (connections using it are closed by the caller).
pub fn remove(name: &str) -> Option<Export> {
    let mut t = tables();
    prune(&mut t);
    t.exports.remove(name)
}

/// Removes every export (the last NBD server stopped); returns their names.
pub fn remove_all() -> Vec<String> {
    let mut t = tables();
    std::mem::take(&mut t.exports).into_keys().collect()
}

/// Finds an export by name (not one whose bdev was deleted).
pub fn get(name: &str) -> Option<Export> {
    let mut t = tables();
    prune(&mut t);
    t.exports.get(name).cloned()
}

/// Every export, by name (not those whose bdev was deleted).
pub fn list() -> Vec<Export> {
    let mut t = tables();
    prune(&mut t);
    t.exports.values().cloned().collect()
}

/// Every connection.
pub fn connections() -> Vec<ConnInfo> {
    tables().conns.values().cloned().collect()
}
