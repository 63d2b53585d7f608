//! Every connection and session of the engine, for what spans reactors: logins (TSIHs, the
//! session limit, reinstatement of a session by the same initiator port, joins up to
//! MaxConnections and the session's reactor), the RPCs' view
//! (`iscsi_get_connections`, `iscsi_get_stats`, active connections of a target node), logout
//! requests and LUN events. One table per engine behind a mutex, touched when a connection
//! comes, logs in or goes, never per command.

use super::conn::{self, Conn};
use crate::hooks::{ConnState, ConnectionInfo, LoginPhase, LunEvent, Sessions};
use ferrite_iscsi::login::LoginStatus;
use ferrite_iscsi::pdu::Isid;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A connection as the engine's other reactors see it.
struct ConnEntry {
    info: ConnectionInfo,
    reactor: usize,
    /// The target node's full name (normal sessions, once logged in).
    target: Option<String>,
    pg_tag: u16,
}

/// A session: its initiator port, its target, its reactor and its connections (logged in or
/// logging in to join it).
struct SessEntry {
    isid: Isid,
    initiator: String,
    target: Option<String>,
    conns: Vec<u64>,
    reactor: usize,
    /// The portal group of its leading connection (every connection of a session comes
    /// through one portal group).
    pg_tag: u16,
    /// MaxConnections as negotiated.
    max_conns: u16,
}

#[derive(Default)]
struct Table {
    conns: BTreeMap<u64, ConnEntry>,
    sessions: BTreeMap<u16, SessEntry>,
    last_tsih: u16,
}

#[derive(Default)]
struct Shared(Mutex<Table>);

fn with<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let s = ferrite_reactor::engine_state::<Shared>();
    let mut t = s.0.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut t)
}

/// The short name SPDK shows for a target node (what follows the node base and a colon).
fn short_name(full: &str) -> String {
    let base = crate::options().node_base;
    full.strip_prefix(&base).and_then(|s| s.strip_prefix(':')).unwrap_or(full).to_string()
}

/// How many connections the engine has.
pub(crate) fn count() -> usize {
    with(|t| t.conns.len())
}

/// A connection was accepted.
pub(crate) fn accepted(c: &Conn) {
    let info = ConnectionInfo {
        id: c.id as i32,
        cid: 0,
        tsih: None,
        state: ConnState::Running,
        login_phase: LoginPhase::NotStarted,
        initiator_addr: c.peer_ip.map(|a| a.to_string()).unwrap_or_else(|| c.peer.clone()),
        target_addr: c.local.rsplit_once(':').map_or(c.local.clone(), |(h, _)| h.trim_matches(['[', ']']).to_string()),
        target_node_name: String::new(),
        thread_name: format!("reactor_{}", c.reactor),
    };
    with(|t| t.conns.insert(c.id, ConnEntry { info, reactor: c.reactor, target: None, pg_tag: c.pg_tag }));
}

/// Connection `id` moved on in its login.
pub(crate) fn login_phase(id: u64, phase: LoginPhase, cid: u16) {
    with(|t| {
        if let Some(e) = t.conns.get_mut(&id) {
            e.info.login_phase = phase;
            e.info.cid = i32::from(cid);
        }
    });
}

/// Connection `id` reached the full feature phase in session `tsih` (to `target`, a normal
/// session's node).
pub(crate) fn logged_in(id: u64, tsih: u16, target: Option<&str>) {
    with(|t| {
        if let Some(e) = t.conns.get_mut(&id) {
            e.info.login_phase = LoginPhase::FullFeature;
            e.info.tsih = Some(tsih);
            e.info.target_node_name = target.map(short_name).unwrap_or_default();
            e.target = target.map(str::to_string);
        }
    });
}

/// A connection ended: it leaves the table and its session; a session without connections
/// ends.
pub(crate) fn closed(c: &Conn) {
    with(|t| {
        t.conns.remove(&c.id);
        for s in t.sessions.values_mut() {
            s.conns.retain(|&id| id != c.id);
        }
        t.sessions.retain(|_, s| !s.conns.is_empty());
    });
}

/// The reactor of session `tsih`, if it exists.
pub(crate) fn session_reactor(tsih: u16) -> Option<usize> {
    with(|t| t.sessions.get(&tsih).map(|s| s.reactor))
}

/// Whether connection `conn` (CID `cid`) may join session `tsih` of initiator port (`initiator`, `isid`)
/// to `target` (asked at its first Login Request, before it has authenticated: nothing
/// changes). Fails with "session does not exist" (no such session of that initiator port and
/// target, through this portal group, on this reactor) or "too many connections".
pub(crate) fn may_join(
    conn: &Conn,
    tsih: u16,
    initiator: &str,
    isid: Isid,
    target: Option<&str>,
    cid: u16,
) -> Result<(), LoginStatus> {
    with(|t| {
        let s = t.sessions.get(&tsih).ok_or(LoginStatus::SESSION_DOES_NOT_EXIST)?;
        let same_target = match (&s.target, target) {
            (Some(a), Some(b)) => crate::name::same(a, b),
            (None, None) => true,
            _ => false,
        };
        if s.isid != isid
            || !s.initiator.eq_ignore_ascii_case(initiator)
            || !same_target
            || s.reactor != conn.reactor
            || s.pg_tag != conn.pg_tag
        {
            return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
        }
        if s.conns.len() >= usize::from(s.max_conns) && !s.conns.contains(&conn.id) {
            // A connection with a CID in use may still replace it once authenticated.
            let in_use = s.conns.iter().filter_map(|id| t.conns.get(id)).any(|e| e.info.cid == i32::from(cid));
            if !in_use {
                return Err(LoginStatus::TOO_MANY_CONNECTIONS);
            }
        }
        Ok(())
    })
}

/// Connection `conn` (CID `cid`), authenticated, enters session `tsih` at the end of its
/// login: it counts among the session's connections from now on, and a connection of the
/// session with the same CID is replaced (closed: connection reinstatement, RFC 7143 section
/// 6.3.4). Fails with "session does not exist" (the session ended meanwhile) or "too many
/// connections" (MaxConnections).
pub(crate) fn join_session(conn: &Conn, tsih: u16, cid: u16) -> Result<(), LoginStatus> {
    let replaced = with(|t| {
        let s = t.sessions.get(&tsih).ok_or(LoginStatus::SESSION_DOES_NOT_EXIST)?;
        if s.reactor != conn.reactor || s.pg_tag != conn.pg_tag {
            return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
        }
        let replaced: Vec<u64> = s
            .conns
            .iter()
            .copied()
            .filter(|id| *id != conn.id && t.conns.get(id).is_some_and(|e| e.info.cid == i32::from(cid)))
            .collect();
        let others = s.conns.iter().filter(|id| **id != conn.id && !replaced.contains(id)).count();
        if others >= usize::from(s.max_conns) {
            return Err(LoginStatus::TOO_MANY_CONNECTIONS);
        }
        let s = t.sessions.get_mut(&tsih).expect("looked up above");
        s.conns.retain(|id| !replaced.contains(id));
        if !s.conns.contains(&conn.id) {
            s.conns.push(conn.id);
        }
        Ok(replaced)
    })?;
    for id in replaced {
        log::info!("iscsi session {tsih:#x}: connection {} replaces connection {id} (CID {cid})", conn.id);
        conn::with_local(id, |o| {
            o.quiet_end.set(true);
            o.close();
        });
    }
    Ok(())
}

/// A leading login of connection `conn` reached the full feature phase: a new session of
/// (`initiator`, `isid`) to `target` (None: discovery). An existing session of the same
/// initiator port to the same target is reinstated: its connection is closed (RFC 7143
/// section 6.3.5). Fails with "out of resources" at `max_sessions`.
pub(crate) fn create_session(
    conn: &Conn,
    initiator: &str,
    isid: Isid,
    target: Option<&str>,
    max_sessions: u32,
    max_conns: u16,
) -> Result<u16, LoginStatus> {
    let engine = ferrite_reactor::engine();
    let (tsih, old) = with(|t| {
        let same = |s: &SessEntry| {
            s.isid == isid
                && s.initiator.eq_ignore_ascii_case(initiator)
                && match (&s.target, target) {
                    (Some(a), Some(b)) => crate::name::same(a, b),
                    (None, None) => true,
                    _ => false,
                }
        };
        let old: Vec<(u16, Vec<u64>, usize)> =
            t.sessions.iter().filter(|(_, s)| same(s)).map(|(k, s)| (*k, s.conns.clone(), s.reactor)).collect();
        for (k, _, _) in &old {
            t.sessions.remove(k);
        }
        if t.sessions.len() >= max_sessions as usize {
            return Err(LoginStatus::OUT_OF_RESOURCES);
        }
        let mut tsih = t.last_tsih;
        loop {
            tsih = tsih.wrapping_add(1).max(1);
            if !t.sessions.contains_key(&tsih) {
                break;
            }
        }
        t.last_tsih = tsih;
        t.sessions.insert(
            tsih,
            SessEntry {
                isid,
                initiator: initiator.to_string(),
                target: target.map(str::to_string),
                conns: vec![conn.id],
                reactor: conn.reactor,
                pg_tag: conn.pg_tag,
                max_conns,
            },
        );
        Ok((tsih, old))
    })?;
    for (old_tsih, ids, reactor) in old {
        log::info!(
            "iscsi: session {old_tsih:#x} of {initiator} (ISID {:#014x}) reinstated as {tsih:#x}; its connections {ids:?} close",
            isid.to_u64()
        );
        engine.send(reactor, move || {
            for id in ids {
                conn::with_local(id, |c| {
                    c.quiet_end.set(true);
                    c.close();
                });
            }
        });
    }
    Ok(tsih)
}

/// Closes every connection to target node `target` but `except` (a target cold reset).
pub(crate) fn close_target(target: &str, except: u64) {
    let engine = ferrite_reactor::engine();
    let picked: Vec<(u64, usize)> = with(|t| {
        t.conns
            .iter()
            .filter(|(id, e)| **id != except && e.target.as_deref().is_some_and(|n| crate::name::same(n, target)))
            .map(|(id, e)| (*id, e.reactor))
            .collect()
    });
    for (id, reactor) in picked {
        engine.send(reactor, move || conn::close_local(id));
    }
}

/// Session `tsih` did not start after all (its connection's setup failed).
pub(crate) fn drop_session(tsih: u16) {
    with(|t| t.sessions.remove(&tsih));
}

/// The engine's view of its sessions for the management plane.
pub(crate) struct EngineSessions;

impl Sessions for EngineSessions {
    fn connections(&self) -> Vec<ConnectionInfo> {
        with(|t| t.conns.values().map(|e| e.info.clone()).collect())
    }

    fn request_logout(&self, target: &str, pg_tag: Option<i32>) {
        let engine = ferrite_reactor::engine();
        let picked: Vec<(u64, usize)> = with(|t| {
            t.conns
                .iter()
                .filter(|(_, e)| e.target.as_deref().is_some_and(|n| crate::name::same(n, target)))
                .filter(|(_, e)| pg_tag.is_none_or(|p| p == i32::from(e.pg_tag)))
                .map(|(id, e)| (*id, e.reactor))
                .collect()
        });
        for (id, reactor) in picked {
            engine.send(reactor, move || conn::with_local(id, |c| super::logout::request(c)));
        }
    }

    fn active_connections(&self, target: &str) -> usize {
        with(|t| t.conns.values().filter(|e| e.target.as_deref().is_some_and(|n| crate::name::same(n, target))).count())
    }

    fn lun_event(&self, target: &str, lun_id: u32, event: LunEvent) {
        if event != LunEvent::Removed {
            // A resize: the SCSI logical unit establishes CAPACITY DATA HAS CHANGED itself.
            return;
        }
        super::scsi::remove_lun(target, lun_id);
        // Each reactor's sessions of the target let the logical unit go now (its channel
        // with it), not at their next command.
        let name = target.to_string();
        let engine = ferrite_reactor::engine();
        for r in 0..engine.count() {
            let name = name.clone();
            engine.send(r, move || {
                for c in conn::all_local() {
                    let ours =
                        c.session().and_then(|s| s.target.as_ref()).is_some_and(|t| crate::name::same(&t.name, &name));
                    if let (true, Some(n)) = (ours, c.nexus()) {
                        n.refresh();
                    }
                }
            });
        }
    }
}
