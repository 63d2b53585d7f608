//! A registry's persistent copy (Persist Through Power Loss, SCSI's APTPL), in the JSON document
//! SPDK's NVMe-oF target writes (`nvmf_ns_reservation_store_json`: `ptpl`, `rtype`, `crkey`,
//! `bdev_uuid`, `holder_uuid`, `registrants` of `rkey` and `host_uuid`), with SCSI initiator
//! ports beside NVMe hosts: a SCSI registrant is `{"rkey", "initiator", "isid"}` and a SCSI
//! holder `holder_initiator` and `holder_isid` (the ISID in 12 hex digits). A file of NVMe hosts
//! only is exactly SPDK's. Written beside and renamed, so a crash leaves the old or the new copy;
//! an empty file while APTPL is off, as SPDK leaves it.

use super::{Initiator, ResvType};
use crate::Bdev;
use serde_json::{json, Map, Value};
use std::path::Path;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Fields naming `who`: `host_uuid`, or `initiator` and `isid` (with `prefix` for the holder).
fn name_fields(who: &Initiator, prefix: &str, m: &mut Map<String, Value>) {
    match who {
        Initiator::Nvme { hostid, .. } => {
            m.insert(format!("{prefix}uuid"), json!(uuid::Uuid::from_bytes(*hostid).hyphenated().to_string()));
        }
        Initiator::Scsi { name, isid } => {
            m.insert(format!("{prefix}initiator"), json!(name));
            m.insert(format!("{prefix}isid"), json!(hex(isid)));
        }
    }
}

/// The document for `bdev`'s registry, or None while APTPL is off.
pub fn to_json(bdev: &Bdev) -> Option<Value> {
    let rep = bdev.reservations().report();
    if !rep.aptpl {
        return None;
    }
    let all = rep.rtype.is_some_and(ResvType::all_registrants);
    let mut doc = Map::new();
    doc.insert("ptpl".into(), json!(true));
    doc.insert("rtype".into(), json!(rep.rtype.map_or(0, ResvType::code)));
    doc.insert("crkey".into(), json!(rep.holder_key));
    doc.insert("bdev_uuid".into(), json!(bdev.uuid().hyphenated().to_string()));
    match rep.registrants.iter().find(|r| r.holder && !all) {
        Some(h) => name_fields(&h.who, "holder_", &mut doc),
        None => {
            doc.insert("holder_uuid".into(), json!(""));
        }
    }
    let regs: Vec<Value> = rep
        .registrants
        .iter()
        .map(|r| {
            let mut m = Map::new();
            m.insert("rkey".into(), json!(r.key));
            match &r.who {
                Initiator::Nvme { .. } => name_fields(&r.who, "host_", &mut m),
                Initiator::Scsi { .. } => name_fields(&r.who, "", &mut m),
            }
            Value::Object(m)
        })
        .collect();
    doc.insert("registrants".into(), Value::Array(regs));
    Some(Value::Object(doc))
}

/// Writes `bdev`'s registry to `path` (an empty file while APTPL is off).
pub fn save(bdev: &Bdev, path: &Path) -> std::io::Result<()> {
    let text = to_json(bdev).map(|v| v.to_string()).unwrap_or_default();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn initiator(v: &Value, prefix: &str, file: &str) -> Result<Option<Initiator>, String> {
    let get = |k: &str| v.get(format!("{prefix}{k}")).and_then(Value::as_str).filter(|s| !s.is_empty());
    let uuid_key = if prefix.is_empty() { "host_uuid".to_string() } else { format!("{prefix}uuid") };
    if let Some(u) = v.get(&uuid_key).and_then(Value::as_str).filter(|s| !s.is_empty()) {
        let id = uuid::Uuid::parse_str(u).map_err(|e| format!("{file}: {u}: {e}"))?;
        return Ok(Some(Initiator::Nvme { hostid: *id.as_bytes(), hostnqn: String::new() }));
    }
    match (get("initiator"), get("isid")) {
        (Some(name), Some(isid)) => {
            let isid = unhex::<6>(isid).ok_or_else(|| format!("{file}: ISID {isid} is not 12 hex digits"))?;
            Ok(Some(Initiator::Scsi { name: name.to_string(), isid }))
        }
        (None, None) => Ok(None),
        _ => Err(format!("{file}: an initiator needs both its name and its ISID")),
    }
}

/// Restores `bdev`'s registry from `path`: nothing if the file is missing, empty or has PTPL
/// off; an error if it is malformed, names another bdev, lists an initiator twice, or the
/// registry already has registrants (a file must not replace reservations held now).
pub fn load(bdev: &Bdev, path: &Path) -> Result<(), String> {
    let file = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {file}: {e}")),
    };
    if text.trim().is_empty() {
        return Ok(());
    }
    let d: Value = serde_json::from_str(&text).map_err(|e| format!("{file} is not valid: {e}"))?;
    if !d.get("ptpl").and_then(Value::as_bool).unwrap_or(false) {
        return Ok(());
    }
    let bdev_uuid = d.get("bdev_uuid").and_then(Value::as_str).unwrap_or_default();
    let u = uuid::Uuid::parse_str(bdev_uuid).map_err(|e| format!("{file}: bdev_uuid {bdev_uuid}: {e}"))?;
    if u != bdev.uuid() {
        return Err(format!("{file} is for bdev {bdev_uuid}, not {}", bdev.uuid()));
    }
    if !bdev.reservations().report().registrants.is_empty() {
        return Err(format!("{file}: bdev {} already has registrants", bdev.name()));
    }
    let mut regs: Vec<(Initiator, u64)> = Vec::new();
    for r in d.get("registrants").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let key = r.get("rkey").and_then(Value::as_u64).ok_or_else(|| format!("{file}: a registrant has no rkey"))?;
        let who = initiator(r, "", &file)?.ok_or_else(|| format!("{file}: a registrant names nobody"))?;
        if regs.iter().any(|(w, _)| *w == who) {
            return Err(format!("{file}: {who} is listed twice"));
        }
        regs.push((who, key));
    }
    let rtype = match d.get("rtype").and_then(Value::as_u64).unwrap_or(0) {
        0 => None,
        t => Some(ResvType::from_code(t as u8).ok_or_else(|| format!("{file}: rtype {t}"))?),
    };
    let holder = initiator(&d, "holder_", &file)?;
    bdev.reservations().restore(regs, rtype, holder.as_ref(), true).map_err(|e| format!("{file}: {e}"))?;
    log::info!("bdev {}: reservations restored from {file}", bdev.name());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isids_round_trip_as_hex() {
        assert_eq!(hex(&[0x80, 0, 0x02, 0x3d, 0, 1]), "8000023d0001");
        assert_eq!(unhex::<6>("8000023d0001"), Some([0x80, 0, 0x02, 0x3d, 0, 1]));
        assert_eq!(unhex::<6>("80"), None);
        assert_eq!(unhex::<6>("zz00023d0001"), None);
    }

    #[test]
    fn initiators_are_read_from_either_form() {
        let v = json!({"rkey": 1, "initiator": "iqn.a", "isid": "000000000001"});
        assert_eq!(
            initiator(&v, "", "f").unwrap(),
            Some(Initiator::Scsi { name: "iqn.a".into(), isid: [0, 0, 0, 0, 0, 1] })
        );
        let v = json!({"holder_uuid": "00000000-0000-0000-0000-000000000007"});
        let mut id = [0u8; 16];
        id[15] = 7;
        assert_eq!(
            initiator(&v, "holder_", "f").unwrap(),
            Some(Initiator::Nvme { hostid: id, hostnqn: String::new() })
        );
        assert!(initiator(&json!({"initiator": "x"}), "", "f").is_err());
        assert_eq!(initiator(&json!({"holder_uuid": ""}), "holder_", "f").unwrap(), None);
    }
}
