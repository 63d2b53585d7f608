//! The persistent health store: which children of a nexus are current, so that after a crash the
//! nexus is reassembled only from children known to be current (Mayastor's "nexus info" in
//! etcd). A record per nexus, keyed by its UUID: `{"name", "clean_shutdown", "children":
//! [{"uri", "healthy"}]}`.
//!
//! Two stores: a local JSON file (one document of every record, rewritten atomically: temp
//! file, fsync, rename, fsync of the directory) and etcd (its v3 HTTP/JSON gateway, `etcd`).
//! Both block: the nexus calls them on `spawn_blocking`'s threads, off the reactors.

use crate::etcd::Etcd;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where the nexus falls back to keeping records when neither `nexus_create` nor
/// `nexus_set_options` named a store.
pub const DEFAULT_FILE: &str = "/var/tmp/ferrite/nexus-store.json";

/// A child as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRecord {
    /// Its URI.
    pub uri: String,
    /// Holds every acknowledged write (may be read from, may be a rebuild's source).
    pub healthy: bool,
}

/// A nexus as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NexusRecord {
    /// The nexus's name.
    pub name: String,
    /// Set when the nexus was destroyed cleanly.
    #[serde(default)]
    pub clean_shutdown: bool,
    /// Its children.
    pub children: Vec<ChildRecord>,
}

impl NexusRecord {
    /// True if the record says `uri` is current.
    pub fn healthy(&self, uri: &str) -> Option<bool> {
        self.children.iter().find(|c| c.uri == uri).map(|c| c.healthy)
    }
}

/// A store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// A JSON file of every record.
    File(PathBuf),
    /// etcd, at `host:port`.
    Etcd(String),
    /// A map in this process's memory, by name (`memory://name`): for simulations, where a
    /// nexus is destroyed and made again in one process and the store must outlive it.
    Memory(String),
}

/// The records of the memory stores, by store name then key.
static MEMORY: Mutex<Option<std::collections::HashMap<String, serde_json::Map<String, Value>>>> = Mutex::new(None);

/// The key of a nexus's record.
pub fn key(uuid: &uuid::Uuid) -> String {
    format!("/ferrite/nexus/{uuid}")
}

/// Serialises read-modify-writes of store files within the process.
static FILE_LOCK: Mutex<()> = Mutex::new(());

impl Store {
    /// Parses a store's name: `etcd://host:port`, `file:///path` or a plain path.
    pub fn parse(s: &str) -> Result<Store, String> {
        if let Some(name) = s.strip_prefix("memory://") {
            return Ok(Store::Memory(name.to_string()));
        }
        if let Some(ep) = s.strip_prefix("etcd://") {
            let ep = ep.trim_end_matches('/');
            if ep.is_empty() || !ep.contains(':') {
                return Err(format!("store {s:?}: etcd://host:port"));
            }
            return Ok(Store::Etcd(ep.to_string()));
        }
        let path = s.strip_prefix("file://").unwrap_or(s);
        if path.is_empty() || !path.starts_with('/') {
            return Err(format!("store {s:?}: an absolute path, file:///path or etcd://host:port"));
        }
        Ok(Store::File(PathBuf::from(path)))
    }

    /// The name it parses from.
    pub fn name(&self) -> String {
        match self {
            Store::File(p) => p.display().to_string(),
            Store::Etcd(ep) => format!("etcd://{ep}"),
            Store::Memory(n) => format!("memory://{n}"),
        }
    }

    /// The record at `key`, if any (blocks).
    pub fn get(&self, key: &str) -> Result<Option<NexusRecord>, String> {
        let v = match self {
            Store::File(p) => {
                let _g = FILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                read_doc(p)?.get(key).cloned()
            }
            Store::Etcd(ep) => match (Etcd { endpoint: ep.clone() }).get(key)? {
                None => None,
                Some(b) => Some(serde_json::from_slice(&b).map_err(|e| format!("etcd record {key}: {e}"))?),
            },
            Store::Memory(n) => {
                let m = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
                m.as_ref().and_then(|m| m.get(n)).and_then(|d| d.get(key)).cloned()
            }
        };
        v.map(|v| serde_json::from_value(v).map_err(|e| format!("record {key}: {e}"))).transpose()
    }

    /// Writes `rec` at `key` (blocks); durable when it returns Ok.
    pub fn put(&self, key: &str, rec: &NexusRecord) -> Result<(), String> {
        let v = serde_json::to_value(rec).expect("a record serialises");
        match self {
            Store::File(p) => {
                let _g = FILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                let mut doc = read_doc(p)?;
                doc.insert(key.to_string(), v);
                write_atomically(p, &serde_json::to_vec_pretty(&Value::Object(doc)).expect("JSON"))
            }
            Store::Etcd(ep) => (Etcd { endpoint: ep.clone() }).put(key, v.to_string().as_bytes()),
            Store::Memory(n) => {
                let mut m = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
                m.get_or_insert_with(Default::default).entry(n.clone()).or_default().insert(key.to_string(), v);
                Ok(())
            }
        }
    }
}

/// The file's records (none if there is no file yet).
fn read_doc(p: &Path) -> Result<serde_json::Map<String, Value>, String> {
    match std::fs::read(p) {
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(format!("store {}: not a JSON object", p.display())),
            Err(e) => Err(format!("store {}: {e}", p.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(format!("store {}: {e}", p.display())),
    }
}

/// Replaces `p` with `data`: a temp file beside it, fsync, rename, fsync of the directory.
fn write_atomically(p: &Path, data: &[u8]) -> Result<(), String> {
    let err = |e: std::io::Error| format!("store {}: {e}", p.display());
    let dir = p.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(".{}.tmp", p.file_name().and_then(|n| n.to_str()).unwrap_or("store")));
    {
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(data).map_err(err)?;
        f.sync_all().map_err(err)?;
    }
    std::fs::rename(&tmp, p).map_err(err)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, healthy: &[bool]) -> NexusRecord {
        NexusRecord {
            name: name.into(),
            clean_shutdown: false,
            children: healthy
                .iter()
                .enumerate()
                .map(|(i, &h)| ChildRecord { uri: format!("bdev:///c{i}"), healthy: h })
                .collect(),
        }
    }

    #[test]
    fn a_file_store_round_trips_records_side_by_side() {
        let dir = std::env::temp_dir().join(format!("ferrite-nexus-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/store.json");
        let s = Store::parse(path.to_str().unwrap()).unwrap();
        assert_eq!(s.get("/a").unwrap(), None, "no file yet");
        s.put("/a", &rec("A", &[true, false])).unwrap();
        s.put("/b", &rec("B", &[true])).unwrap();
        s.put("/a", &rec("A", &[true, true])).unwrap();
        assert_eq!(s.get("/a").unwrap(), Some(rec("A", &[true, true])));
        assert_eq!(s.get("/b").unwrap().unwrap().healthy("bdev:///c0"), Some(true));
        assert_eq!(s.get("/b").unwrap().unwrap().healthy("bdev:///zz"), None);
        assert!(!dir.join("sub/.store.json.tmp").exists(), "the temp file was renamed");
        std::fs::write(&path, b"[1]").unwrap();
        assert!(s.get("/a").is_err(), "a damaged store is an error, not an empty one");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn store_names_parse() {
        assert_eq!(Store::parse("etcd://127.0.0.1:2379").unwrap(), Store::Etcd("127.0.0.1:2379".into()));
        assert_eq!(Store::parse("file:///x/y.json").unwrap(), Store::File("/x/y.json".into()));
        assert_eq!(Store::parse("/x/y.json").unwrap().name(), "/x/y.json");
        for bad in ["", "relative.json", "etcd://", "etcd://host"] {
            assert!(Store::parse(bad).is_err(), "{bad}");
        }
    }
}
