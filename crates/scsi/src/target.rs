//! A SCSI target device: its name, its target ports (with their groups, for VPD 83h and REPORT
//! TARGET PORT GROUPS) and its logical units by number. Sessions ([`crate::Session`]) are made
//! from it; they notice LUNs added or removed through a generation counter (one relaxed load per
//! command).

use crate::inquiry::PortInfo;
use crate::lun::Lun;
use crate::sense::asc;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Why a target change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// The LUN number is taken.
    LunExists(u64),
    /// The LUN number cannot be addressed (single-level addressing: below 16,384).
    LunInvalid(u64),
    /// No target port has this relative identifier.
    NoSuchPort(u16),
    /// The port's relative identifier is zero or taken.
    PortInvalid(u16),
}

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetError::LunExists(n) => write!(f, "LUN {n} exists"),
            TargetError::LunInvalid(n) => write!(f, "LUN {n} cannot be addressed (0-16383)"),
            TargetError::NoSuchPort(p) => write!(f, "no target port {p}"),
            TargetError::PortInvalid(p) => write!(f, "target port {p} is zero or taken"),
        }
    }
}

impl std::error::Error for TargetError {}

#[derive(Default)]
pub(crate) struct TargetState {
    pub(crate) luns: BTreeMap<u64, Arc<Lun>>,
    pub(crate) ports: Vec<PortInfo>,
}

/// A target device.
pub struct Target {
    name: String,
    pub(crate) state: Mutex<TargetState>,
    generation: AtomicU64,
}

/// Highest LUN number (single level, peripheral or flat addressing).
pub const MAX_LUN: u64 = 16383;

impl Target {
    /// A target named `name` (its SCSI name string in VPD 83h; iSCSI: the IQN), without ports
    /// or logical units.
    pub fn new(name: &str) -> Arc<Target> {
        Arc::new(Target { name: name.into(), state: Mutex::new(TargetState::default()), generation: AtomicU64::new(0) })
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, TargetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a target port.
    pub fn add_port(&self, port: PortInfo) -> Result<(), TargetError> {
        let mut s = self.locked();
        if port.rel_id == 0 || s.ports.iter().any(|p| p.rel_id == port.rel_id) {
            return Err(TargetError::PortInvalid(port.rel_id));
        }
        s.ports.push(port);
        Ok(())
    }

    /// The target port `rel_id`.
    pub fn port(&self, rel_id: u16) -> Option<PortInfo> {
        self.locked().ports.iter().find(|p| p.rel_id == rel_id).cloned()
    }

    /// The target ports.
    pub fn ports(&self) -> Vec<PortInfo> {
        self.locked().ports.clone()
    }

    /// Adds logical unit `lun` as number `id`. Every nexus of the other logical units gets
    /// REPORTED LUNS DATA HAS CHANGED.
    pub fn add_lun(&self, id: u64, lun: Arc<Lun>) -> Result<(), TargetError> {
        if id > MAX_LUN {
            return Err(TargetError::LunInvalid(id));
        }
        let mut s = self.locked();
        if s.luns.contains_key(&id) {
            return Err(TargetError::LunExists(id));
        }
        for l in s.luns.values() {
            l.establish_all(asc::REPORTED_LUNS_DATA_CHANGED, None);
        }
        s.luns.insert(id, lun);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes logical unit `id` (sessions drop it at their next command; commands already
    /// running end as they do). The other logical units' nexuses get REPORTED LUNS DATA HAS
    /// CHANGED.
    pub fn remove_lun(&self, id: u64) -> Option<Arc<Lun>> {
        let mut s = self.locked();
        let lun = s.luns.remove(&id)?;
        for l in s.luns.values() {
            l.establish_all(asc::REPORTED_LUNS_DATA_CHANGED, None);
        }
        self.generation.fetch_add(1, Ordering::Release);
        Some(lun)
    }

    /// Logical unit `id`.
    pub fn lun(&self, id: u64) -> Option<Arc<Lun>> {
        self.locked().luns.get(&id).cloned()
    }

    /// The LUN numbers, lowest first.
    pub fn lun_ids(&self) -> Vec<u64> {
        self.locked().luns.keys().copied().collect()
    }

    /// Moves on every change of the LUN set.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// A LUN number as REPORT LUNS shows it (SAM-5 4.7: peripheral device addressing below 256,
/// flat space addressing above).
pub fn lun_to_bytes(id: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if id < 256 {
        b[1] = id as u8;
    } else {
        b[0] = 0x40 | ((id >> 8) as u8 & 0x3f);
        b[1] = id as u8;
    }
    b
}

/// The LUN number of an 8-byte LUN field (peripheral or flat space addressing, single level);
/// None for other methods and levels.
pub fn lun_from_bytes(b: &[u8; 8]) -> Option<u64> {
    if b[2..].iter().any(|&x| x != 0) {
        return None;
    }
    match b[0] >> 6 {
        0 if b[0] == 0 => Some(u64::from(b[1])),
        1 => Some(u64::from(b[0] & 0x3f) << 8 | u64::from(b[1])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_fields_round_trip() {
        for id in [0, 1, 255, 256, 4000, MAX_LUN] {
            assert_eq!(lun_from_bytes(&lun_to_bytes(id)), Some(id));
        }
        assert_eq!(lun_to_bytes(5), [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lun_from_bytes(&[0x80, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
