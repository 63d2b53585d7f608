//! SendTargets (RFC 7143 section 13.3 and appendix C): the target records a Text Response
//! carries.
//!
//! Each record is `TargetName=<name>` followed by one `TargetAddress=<address>:<port>,<tag>`
//! per portal (IPv6 addresses in brackets). What is asked:
//!
//! - `SendTargets=All`: every target the initiator may access; only in a discovery session
//!   (a normal session gets `SendTargets=Reject`);
//! - `SendTargets=<name>`: that target, if the initiator may access it (else nothing);
//! - `SendTargets=` (empty): in a normal session, the session's target; in a discovery
//!   session, all of them (as SPDK answers).
//!
//! The caller passes only the targets this initiator may access (its access lists are the
//! target tables' business).

use std::fmt;

use crate::keys::{self, TextWriter};
use crate::negotiate::SessionType;

/// A portal: where a target listens, and the portal group it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portal {
    /// An IPv4 or IPv6 address, or a DNS name.
    pub host: String,
    /// The TCP port.
    pub port: u16,
    /// The Target Portal Group Tag.
    pub group_tag: u16,
}

impl fmt::Display for Portal {
    /// The TargetAddress value: `host:port,tag`, `[v6]:port,tag`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') && !self.host.starts_with('[') {
            write!(f, "[{}]:{},{}", self.host, self.port, self.group_tag)
        } else {
            write!(f, "{}:{},{}", self.host, self.port, self.group_tag)
        }
    }
}

/// A target and its portals, as SendTargets reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRecord {
    /// The target's name.
    pub name: String,
    /// Its portals.
    pub portals: Vec<Portal>,
}

/// What a SendTargets value asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// All targets.
    All,
    /// The named target.
    One(&'a str),
    /// Nothing: the request is refused (`SendTargets=Reject`).
    Refused,
}

/// What `value` asks for in a session of `session_type` whose target is `session_target`.
pub fn scope<'a>(value: &'a str, session_type: SessionType, session_target: Option<&'a str>) -> Scope<'a> {
    match (value, session_type) {
        ("All", SessionType::Discovery) | ("", SessionType::Discovery) => Scope::All,
        ("All", SessionType::Normal) => Scope::Refused,
        ("", SessionType::Normal) => session_target.map_or(Scope::Refused, Scope::One),
        (name, _) => Scope::One(name),
    }
}

/// Writes the answer to `SendTargets=<value>` into `out`.
pub fn send_targets(
    value: &str,
    session_type: SessionType,
    session_target: Option<&str>,
    targets: &[TargetRecord],
    out: &mut TextWriter,
) {
    let wanted = scope(value, session_type, session_target);
    if wanted == Scope::Refused {
        out.push("SendTargets", keys::REJECT);
        return;
    }
    for t in targets {
        if let Scope::One(name) = wanted {
            if t.name != name {
                continue;
            }
        }
        out.push("TargetName", &t.name);
        for p in &t.portals {
            out.push("TargetAddress", &p.to_string());
        }
    }
}

/// Reads SendTargets records (an initiator's view of a Text Response): each TargetName and
/// the TargetAddress values after it.
pub fn parse_records(pairs: &[keys::KeyValue]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for kv in pairs {
        match kv.key.as_str() {
            "TargetName" => out.push((kv.value.clone(), Vec::new())),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.1.push(kv.value.clone());
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::parse_text;

    fn targets() -> Vec<TargetRecord> {
        vec![
            TargetRecord {
                name: "iqn.2016-06.io.spdk:disk1".into(),
                portals: vec![
                    Portal { host: "10.0.0.1".into(), port: 3260, group_tag: 1 },
                    Portal { host: "fe80::1".into(), port: 3260, group_tag: 2 },
                ],
            },
            TargetRecord {
                name: "iqn.2016-06.io.spdk:disk2".into(),
                portals: vec![Portal { host: "10.0.0.1".into(), port: 3261, group_tag: 1 }],
            },
        ]
    }

    fn run(value: &str, t: SessionType, current: Option<&str>) -> Vec<u8> {
        let mut out = TextWriter::new();
        send_targets(value, t, current, &targets(), &mut out);
        out.into_bytes()
    }

    #[test]
    fn all_in_discovery() {
        let text = run("All", SessionType::Discovery, None);
        assert_eq!(
            text,
            b"TargetName=iqn.2016-06.io.spdk:disk1\0TargetAddress=10.0.0.1:3260,1\0\
              TargetAddress=[fe80::1]:3260,2\0TargetName=iqn.2016-06.io.spdk:disk2\0\
              TargetAddress=10.0.0.1:3261,1\0"
                .to_vec()
        );
        assert_eq!(run("", SessionType::Discovery, None), text);
        let recs = parse_records(&parse_text(&text).unwrap());
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].1, vec!["10.0.0.1:3260,1", "[fe80::1]:3260,2"]);
    }

    #[test]
    fn one_and_normal_sessions() {
        assert_eq!(
            run("iqn.2016-06.io.spdk:disk2", SessionType::Discovery, None),
            b"TargetName=iqn.2016-06.io.spdk:disk2\0TargetAddress=10.0.0.1:3261,1\0".to_vec()
        );
        assert_eq!(run("iqn.none", SessionType::Discovery, None), b"".to_vec());
        assert_eq!(
            run("All", SessionType::Normal, Some("iqn.2016-06.io.spdk:disk2")),
            b"SendTargets=Reject\0".to_vec()
        );
        assert_eq!(
            run("", SessionType::Normal, Some("iqn.2016-06.io.spdk:disk2")),
            b"TargetName=iqn.2016-06.io.spdk:disk2\0TargetAddress=10.0.0.1:3261,1\0".to_vec()
        );
        let p = Portal { host: "[::1]".into(), port: 3260, group_tag: 1 };
        assert_eq!(p.to_string(), "[::1]:3260,1");
    }
}
