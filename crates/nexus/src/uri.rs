//! Child URIs, as Mayastor names a nexus's children: `bdev:///name` (an existing bdev),
//! `malloc:///name?size_mb=N&blk_size=B` and `uring:///path?blk_size=B` (made by the nexus),
//! `nvmf://host:port/nqn` (a remote namespace, attached through Ferrite's NVMe/TCP host).
//! Parsing is pure: what the URI names is looked up or made in `child`.

use std::fmt;

/// What a child URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildUri {
    /// An existing bdev, by name.
    Bdev {
        /// Its name.
        name: String,
    },
    /// A malloc bdev the nexus makes (or takes, if it exists unclaimed with this geometry).
    Malloc {
        /// Its name.
        name: String,
        /// Size in MiB.
        size_mb: u64,
        /// Block size in bytes.
        blk_size: u32,
    },
    /// A uring bdev over a file or block device, named by its path.
    Uring {
        /// The file or device.
        path: String,
        /// Block size in bytes (0: the device's).
        blk_size: u32,
    },
    /// Namespace 1 of a remote NVMe/TCP subsystem.
    Nvmf {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
        /// The subsystem's NQN.
        nqn: String,
    },
}

/// Why a URI is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriError(pub String);

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(uri: &str, why: &str) -> Result<T, UriError> {
    Err(UriError(format!("invalid child URI {uri:?}: {why}")))
}

/// Undoes %XX escapes.
fn unescape(uri: &str, s: &str) -> Result<String, UriError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(v) => out.push(v),
                None => return err(uri, "bad % escape"),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).or_else(|_| err(uri, "not UTF-8"))
}

/// The query's `key=value` pairs; unknown keys are refused.
fn query(uri: &str, q: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, UriError> {
    let mut v = Vec::new();
    for kv in q.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let Some((k, val)) = kv.split_once('=') else { return err(uri, &format!("parameter {kv:?} has no value")) };
        if !known.contains(&k) {
            return err(uri, &format!("unknown parameter {k:?}"));
        }
        if v.iter().any(|(x, _)| x == k) {
            return err(uri, &format!("parameter {k:?} given twice"));
        }
        v.push((k.to_string(), unescape(uri, val)?));
    }
    Ok(v)
}

fn num<T: std::str::FromStr>(uri: &str, q: &[(String, String)], key: &str) -> Result<Option<T>, UriError> {
    match q.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v.parse().map(Some).or_else(|_| err(uri, &format!("{key}={v} is not a number"))),
    }
}

fn block_size(uri: &str, bs: Option<u32>, default: u32) -> Result<u32, UriError> {
    let bs = bs.unwrap_or(default);
    if bs != 0 && (!bs.is_power_of_two() || !(512..=65536).contains(&bs)) {
        return err(uri, &format!("blk_size {bs} is not a power of two from 512 to 65536"));
    }
    Ok(bs)
}

impl ChildUri {
    /// Parses a child URI.
    pub fn parse(uri: &str) -> Result<ChildUri, UriError> {
        let Some((scheme, rest)) = uri.split_once("://") else { return err(uri, "no scheme") };
        let (rest, q) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        match scheme {
            "bdev" | "malloc" | "uring" => {
                let Some(path) = rest.strip_prefix('/') else {
                    return err(uri, &format!("{scheme}:/// takes no host"));
                };
                let path = unescape(uri, path)?;
                if path.is_empty() {
                    return err(uri, "no name");
                }
                match scheme {
                    "bdev" => {
                        query(uri, q, &["uuid"])?;
                        Ok(ChildUri::Bdev { name: path })
                    }
                    "malloc" => {
                        let q = query(uri, q, &["size_mb", "blk_size", "uuid"])?;
                        let size_mb = num::<u64>(uri, &q, "size_mb")?.unwrap_or(0);
                        if size_mb == 0 {
                            return err(uri, "malloc needs size_mb > 0");
                        }
                        let blk_size = block_size(uri, num(uri, &q, "blk_size")?, 512)?;
                        Ok(ChildUri::Malloc { name: path, size_mb, blk_size })
                    }
                    _ => {
                        let q = query(uri, q, &["blk_size", "uuid"])?;
                        let blk_size = block_size(uri, num(uri, &q, "blk_size")?, 0)?;
                        Ok(ChildUri::Uring { path: format!("/{path}"), blk_size })
                    }
                }
            }
            "nvmf" => {
                query(uri, q, &["uuid"])?;
                let Some((hostport, nqn)) = rest.split_once('/') else { return err(uri, "no NQN") };
                let Some((host, port)) = hostport.rsplit_once(':') else { return err(uri, "no port") };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let Ok(port) = port.parse::<u16>() else { return err(uri, "bad port") };
                if host.is_empty() || port == 0 {
                    return err(uri, "no host or port");
                }
                let nqn = unescape(uri, nqn)?;
                if nqn.is_empty() || nqn.contains('/') {
                    return err(uri, "bad NQN");
                }
                Ok(ChildUri::Nvmf { host: host.to_string(), port, nqn })
            }
            other => err(uri, &format!("unknown scheme {other:?}")),
        }
    }

    /// True for a bdev of this node (reads may prefer it: `local_first`).
    pub fn is_local(&self) -> bool {
        matches!(self, ChildUri::Bdev { .. })
    }

    /// True if the nexus makes the bdev (and destroys it when the child goes).
    pub fn is_made(&self) -> bool {
        !matches!(self, ChildUri::Bdev { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_parses() {
        assert_eq!(ChildUri::parse("bdev:///lvs0%2Fvol").unwrap(), ChildUri::Bdev { name: "lvs0/vol".into() });
        assert_eq!(
            ChildUri::parse("malloc:///m0?size_mb=64&blk_size=4096").unwrap(),
            ChildUri::Malloc { name: "m0".into(), size_mb: 64, blk_size: 4096 }
        );
        assert_eq!(
            ChildUri::parse("malloc:///m0?size_mb=8").unwrap(),
            ChildUri::Malloc { name: "m0".into(), size_mb: 8, blk_size: 512 }
        );
        assert_eq!(
            ChildUri::parse("uring:///tmp/a.img?blk_size=512").unwrap(),
            ChildUri::Uring { path: "/tmp/a.img".into(), blk_size: 512 }
        );
        assert_eq!(
            ChildUri::parse("nvmf://127.0.0.1:4420/nqn.2019-05.io.openebs:r1").unwrap(),
            ChildUri::Nvmf { host: "127.0.0.1".into(), port: 4420, nqn: "nqn.2019-05.io.openebs:r1".into() }
        );
        assert!(ChildUri::parse("bdev:///x").unwrap().is_local());
        assert!(!ChildUri::parse("malloc:///x?size_mb=1").unwrap().is_local());
    }

    #[test]
    fn bad_uris_are_refused() {
        for bad in [
            "",
            "m0",
            "http://x/y",
            "bdev://host/x",
            "bdev:///",
            "malloc:///m0",
            "malloc:///m0?size_mb=0",
            "malloc:///m0?size_mb=x",
            "malloc:///m0?size_mb=1&blk_size=1000",
            "malloc:///m0?size_mb=1&frob=1",
            "malloc:///m0?size_mb=1&size_mb=2",
            "malloc:///m0?size_mb",
            "uring:///a?blk_size=100",
            "nvmf://127.0.0.1/nqn",
            "nvmf://127.0.0.1:0/nqn",
            "nvmf://127.0.0.1:99999/nqn",
            "nvmf://127.0.0.1:4420/",
            "nvmf://:4420/nqn",
            "bdev:///%zz",
        ] {
            assert!(ChildUri::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
