//! Reservations: SPC-4 persistent reservations (PERSISTENT RESERVE IN and OUT) on the bdev's
//! shared registry (`ferrite_bdev::reservation`, whose six types and rules are SCSI's), SPC-2
//! RESERVE and RELEASE, and which commands each lets through (SPC-4 tables 63 and 64, SBC-3
//! table 13).
//!
//! A registrant is an initiator port (name and ISID): a registration holds through every target
//! port (REPORT CAPABILITIES says ATP_C 0, and READ FULL STATUS reports ALL_TG_PT). RESERVE and
//! RELEASE conflict while any registration exists (CRH). With an `aptpl_file`, APTPL keeps the
//! registry across restarts (`ferrite_bdev::reservation::persist`).

use crate::cdb::Command;
use crate::lun::{Lun, NexusKey};
use crate::sense::{asc, Fault, SENSE_HARDWARE_ERROR, SENSE_ILLEGAL_REQUEST};
use crate::session::Inner;
use ferrite_bdev::reservation::{Notice, ResvError};
use ferrite_bdev::{Access, Initiator, InitiatorId, ResvType};
use std::rc::Rc;

/// What a command does as far as reservations go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Allowed whatever is held.
    Always,
    /// Reads the medium (or shows its state).
    Read,
    /// Changes the medium (or the logical unit).
    Write,
}

fn class(cmd: &Command) -> Class {
    match cmd {
        Command::Inquiry { .. }
        | Command::ReportLuns { .. }
        | Command::RequestSense { .. }
        | Command::ReportOpcodes { .. }
        | Command::ReportTmfs { .. }
        | Command::ReportTargetPortGroups { .. }
        | Command::PrIn { .. }
        | Command::PrOut { .. }
        | Command::ReadCapacity10
        | Command::ReadCapacity16 { .. }
        | Command::TestUnitReady
        | Command::Reserve { .. }
        | Command::Release { .. } => Class::Always,
        Command::StartStopUnit { power_condition: 0, start: true, .. } => Class::Always,
        Command::Read(_)
        | Command::Verify { .. }
        | Command::PreFetch { .. }
        | Command::GetLbaStatus { .. }
        | Command::ModeSense { .. } => Class::Read,
        _ => Class::Write,
    }
}

/// Commands an SPC-2 reservation of another nexus lets through.
fn spc2_allowed(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Inquiry { .. }
            | Command::ReportLuns { .. }
            | Command::RequestSense { .. }
            | Command::Release { .. }
            | Command::PrIn { .. }
            | Command::ReportOpcodes { .. }
            | Command::ReportTmfs { .. }
            | Command::ReportTargetPortGroups { .. }
    )
}

/// RESERVATION CONFLICT if a reservation keeps nexus `me` (initiator `who`) from `cmd`. One
/// relaxed load of the logical unit and one of the registry while nothing is held.
#[inline]
pub(crate) fn conflict(lun: &Lun, me: NexusKey, who: InitiatorId, cmd: &Command) -> Result<(), Fault> {
    if lun.spc2_held() && !spc2_allowed(cmd) && lun.spc2_holder().is_some_and(|h| h != me) {
        return Err(Fault::reservation_conflict());
    }
    let access = match class(cmd) {
        Class::Always => return Ok(()),
        Class::Read => Access::Read,
        Class::Write => Access::Write,
    };
    lun.bdev().reservations().check_id(who, access).map_err(|_| Fault::reservation_conflict())
}

/// RESERVE(6/10): the logical unit for this nexus (again, if it holds it).
pub(crate) fn reserve_spc2(s: &Inner, lun: &Lun) -> Result<(), Fault> {
    if !lun.bdev().reservations().report().registrants.is_empty() || !lun.spc2_reserve(s.nexus_key()) {
        return Err(Fault::reservation_conflict());
    }
    Ok(())
}

/// RELEASE(6/10): releases this nexus's reservation; GOOD without one.
pub(crate) fn release_spc2(s: &Inner, lun: &Lun) -> Result<(), Fault> {
    if !lun.bdev().reservations().report().registrants.is_empty() {
        return Err(Fault::reservation_conflict());
    }
    lun.spc2_release(s.nexus_key());
    Ok(())
}

/// The registry's type for SCSI type code `t` (SPC-4 table 169).
pub fn resv_type(t: u8) -> Option<ResvType> {
    Some(match t {
        1 => ResvType::WriteExclusive,
        3 => ResvType::ExclusiveAccess,
        5 => ResvType::WriteExclusiveRegOnly,
        6 => ResvType::ExclusiveAccessRegOnly,
        7 => ResvType::WriteExclusiveAllRegs,
        8 => ResvType::ExclusiveAccessAllRegs,
        _ => return None,
    })
}

/// The SCSI type code of `t`.
pub fn scsi_type(t: ResvType) -> u8 {
    match t {
        ResvType::WriteExclusive => 1,
        ResvType::ExclusiveAccess => 3,
        ResvType::WriteExclusiveRegOnly => 5,
        ResvType::ExclusiveAccessRegOnly => 6,
        ResvType::WriteExclusiveAllRegs => 7,
        ResvType::ExclusiveAccessAllRegs => 8,
    }
}

/// An iSCSI TransportID of an initiator port (SPC-4 7.6.4.6, format 01b: name, ",i,0x" and
/// the ISID), padded to a multiple of four; None for an NVMe host.
pub fn transport_id(who: &Initiator) -> Option<Vec<u8>> {
    let Initiator::Scsi { name, isid } = who else { return None };
    let mut s = format!("{name},i,0x");
    for b in isid {
        s.push_str(&format!("{b:02x}"));
    }
    let mut v = vec![0x40 | 0x05, 0, 0, 0];
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    while !v.len().is_multiple_of(4) || v.len() < 24 {
        v.push(0);
    }
    let n = (v.len() - 4) as u16;
    v[2..4].copy_from_slice(&n.to_be_bytes());
    Some(v)
}

/// The initiator port an iSCSI TransportID of format 01b names.
pub fn parse_transport_id(t: &[u8]) -> Option<Initiator> {
    if t.len() < 4 || t[0] != 0x45 {
        return None;
    }
    let n = usize::from(u16::from_be_bytes([t[2], t[3]]));
    let body = t.get(4..4 + n)?;
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let s = std::str::from_utf8(&body[..end]).ok()?;
    let (name, isid) = s.rsplit_once(",i,0x")?;
    if isid.len() != 12 || name.is_empty() {
        return None;
    }
    let mut out = [0u8; 6];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(isid.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Initiator::Scsi { name: name.to_string(), isid: out })
}

/// PERSISTENT RESERVE IN (service actions 0-3; the decoder refuses the rest).
pub(crate) fn pr_in(_s: &Inner, lun: &Lun, sa: u8) -> Result<Vec<u8>, Fault> {
    let rep = lun.bdev().reservations().report();
    let mut d = rep.generation.to_be_bytes().to_vec();
    match sa {
        0 => {
            d.extend_from_slice(&((rep.registrants.len() * 8) as u32).to_be_bytes());
            for r in &rep.registrants {
                d.extend_from_slice(&r.key.to_be_bytes());
            }
        }
        1 => match rep.rtype {
            Some(t) => {
                d.extend_from_slice(&16u32.to_be_bytes());
                let key = if t.all_registrants() { 0 } else { rep.holder_key };
                d.extend_from_slice(&key.to_be_bytes());
                d.extend_from_slice(&[0, 0, 0, 0, 0, scsi_type(t), 0, 0]);
            }
            None => d.extend_from_slice(&0u32.to_be_bytes()),
        },
        2 => {
            // REPORT CAPABILITIES: CRH, PTPL_C with an aptpl_file; TMV with every type.
            let ptpl_c = u8::from(lun.aptpl_file.is_some());
            d = vec![0, 8, 0x10 | ptpl_c, 0x80 | u8::from(rep.aptpl), 0xea, 0x01, 0, 0];
        }
        _ => {
            let mut body = Vec::new();
            for r in &rep.registrants {
                let Some(tid) = transport_id(&r.who) else { continue };
                body.extend_from_slice(&r.key.to_be_bytes());
                body.extend_from_slice(&[0; 4]);
                body.push(0x02 | u8::from(r.holder));
                body.push(match (r.holder, rep.rtype) {
                    (true, Some(t)) => scsi_type(t),
                    _ => 0,
                });
                body.extend_from_slice(&[0; 6]);
                body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                body.extend_from_slice(&tid);
            }
            d.extend_from_slice(&(body.len() as u32).to_be_bytes());
            d.extend_from_slice(&body);
        }
    }
    Ok(d)
}

fn resv_fault(e: ResvError) -> Fault {
    match e {
        ResvError::Conflict => Fault::reservation_conflict(),
        ResvError::Full => Fault::check(SENSE_ILLEGAL_REQUEST, asc::INSUFFICIENT_REGISTRATION_RESOURCES),
        ResvError::Invalid(_) => Fault::invalid_param(8, None),
    }
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Tells the nexuses of this logical unit what the registry's notices say, as SCSI codes.
fn notify(lun: &Lun, notices: &[(Initiator, Notice)], clear: bool) {
    for (who, n) in notices {
        let code = match n {
            _ if clear => asc::RESERVATIONS_PREEMPTED,
            Notice::RegistrationPreempted => asc::REGISTRATIONS_PREEMPTED,
            Notice::ReservationReleased => asc::RESERVATIONS_RELEASED,
            Notice::ReservationPreempted => asc::RESERVATIONS_PREEMPTED,
        };
        lun.establish_for(who, code);
    }
}

/// PERSISTENT RESERVE OUT with its parameter list `data` (`len` bytes).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pr_out(
    s: &Rc<Inner>,
    lun: &Lun,
    lun_id: u64,
    sa: u8,
    scope: u8,
    rtype: u8,
    len: u32,
    data: &[u8],
) -> Result<(), Fault> {
    let reg = lun.bdev().reservations();
    let before = reg.report();
    let r = if sa == 7 {
        register_and_move(s, lun, len, data)
    } else {
        basic(s, lun, lun_id, sa, scope, rtype, len, data).await
    };
    r?;
    if let Some(f) = &lun.aptpl_file {
        if before.aptpl || reg.report().aptpl {
            if let Err(e) = ferrite_bdev::reservation::persist::save(lun.bdev(), f) {
                log::error!("scsi: bdev {}: cannot write {}: {e}", lun.bdev().name(), f.display());
                return Err(Fault::check(SENSE_HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE));
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn basic(
    s: &Rc<Inner>,
    lun: &Lun,
    lun_id: u64,
    sa: u8,
    scope: u8,
    rtype: u8,
    len: u32,
    data: &[u8],
) -> Result<(), Fault> {
    if len < 24 || data.len() < 24 {
        return Err(Fault::param_list_length());
    }
    let flags = data[20];
    if flags & 0x08 != 0 {
        return Err(Fault::invalid_param(20, Some(3)));
    }
    if len != 24 {
        return Err(Fault::param_list_length());
    }
    if flags & 0x04 != 0 {
        return Err(Fault::invalid_param(20, Some(2)));
    }
    let (key, sa_key, aptpl) = (be64(&data[0..]), be64(&data[8..]), flags & 1 != 0);
    let reg = lun.bdev().reservations();
    let who = &s.who;
    let before = reg.report();
    let mine = before.registrants.iter().find(|r| r.who == *who).map(|r| r.key);
    let registered_with_key = || if mine == Some(key) { Ok(()) } else { Err(Fault::reservation_conflict()) };
    let typed = || {
        if scope != 0 {
            return Err(Fault::invalid_cdb(2, Some(7)));
        }
        resv_type(rtype).ok_or(Fault::invalid_cdb(2, Some(3)))
    };
    match sa {
        0 | 6 => {
            if aptpl && lun.aptpl_file.is_none() {
                return Err(Fault::invalid_param(20, Some(0)));
            }
            let ignore = sa == 6;
            match mine {
                None if !ignore && key != 0 => return Err(Fault::reservation_conflict()),
                None if sa_key == 0 => {}
                None => reg.register(who, sa_key).map_err(resv_fault)?,
                Some(k) if !ignore && k != key => return Err(Fault::reservation_conflict()),
                Some(k) if sa_key == 0 => notify(lun, &reg.unregister(who, k, ignore).map_err(resv_fault)?, false),
                Some(k) => reg.replace(who, k, sa_key, ignore).map_err(resv_fault)?,
            }
            reg.set_aptpl(aptpl);
        }
        1 => {
            let t = typed()?;
            registered_with_key()?;
            reg.acquire(who, key, t).map_err(resv_fault)?;
        }
        2 => {
            typed()?;
            registered_with_key()?;
            let holder = before.registrants.iter().any(|r| r.who == *who && r.holder);
            match before.rtype {
                Some(t) if holder => {
                    if scsi_type(t) != rtype {
                        return Err(Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_RELEASE_OF_PR));
                    }
                    notify(lun, &reg.release(who, key, t.code()).map_err(resv_fault)?, false);
                }
                // No reservation, or not its holder: GOOD, nothing changes.
                _ => {}
            }
        }
        3 => {
            registered_with_key()?;
            notify(lun, &reg.clear(who, key).map_err(resv_fault)?, true);
        }
        4 | 5 => {
            let t = typed()?;
            registered_with_key()?;
            let all = before.rtype.is_some_and(ResvType::all_registrants);
            if sa_key == 0 && !all {
                return Err(Fault::invalid_param(8, None));
            }
            let everyone = all && sa_key == 0;
            if !everyone && !before.registrants.iter().any(|r| r.key == sa_key) {
                return Err(Fault::reservation_conflict());
            }
            let mut notices = reg.preempt(who, key, sa_key, t).map_err(resv_fault)?;
            // Those still registered hear RESERVATIONS RELEASED only if the type changed.
            if before.rtype == Some(t) {
                notices.retain(|(_, n)| *n != Notice::ReservationReleased);
            }
            notify(lun, &notices, false);
            if sa == 5 {
                let gone: Vec<Initiator> = notices
                    .iter()
                    .filter(|(_, n)| *n == Notice::RegistrationPreempted)
                    .map(|(w, _)| w.clone())
                    .collect();
                crate::session::abort_elsewhere(lun, lun_id, s.id, |w| gone.contains(w)).await;
            }
        }
        _ => unreachable!("the decoder accepts service actions 0-7"),
    }
    Ok(())
}

/// REGISTER AND MOVE: the parameter list names the destination by relative target port and
/// iSCSI TransportID.
fn register_and_move(s: &Inner, lun: &Lun, len: u32, data: &[u8]) -> Result<(), Fault> {
    if len < 24 || data.len() < 24 {
        return Err(Fault::param_list_length());
    }
    let (key, sa_key) = (be64(&data[0..]), be64(&data[8..]));
    let (unreg, aptpl) = (data[17] & 2 != 0, data[17] & 1 != 0);
    let port = u16::from_be_bytes([data[18], data[19]]);
    let tid_len = u32::from_be_bytes(data[20..24].try_into().expect("4 bytes")) as usize;
    if data.len() < 24 + tid_len || len as usize != 24 + tid_len {
        return Err(Fault::param_list_length());
    }
    if aptpl && lun.aptpl_file.is_none() {
        return Err(Fault::invalid_param(17, Some(0)));
    }
    let reg = lun.bdev().reservations();
    let rep = reg.report();
    if !rep.registrants.iter().any(|r| r.who == s.who && r.key == key) {
        return Err(Fault::reservation_conflict());
    }
    if s.target.port(port).is_none() {
        return Err(Fault::invalid_param(18, None));
    }
    let to = parse_transport_id(&data[24..]).ok_or(Fault::invalid_param(24, None))?;
    reg.register_and_move(&s.who, key, &to, sa_key, unreg).map_err(|e| match e {
        ResvError::Invalid(m) if m.contains("holder") => Fault::invalid_param(24, None),
        e => resv_fault(e),
    })?;
    reg.set_aptpl(aptpl);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_ids_round_trip() {
        let who = Initiator::Scsi { name: "iqn.2026-01.org.example:host".into(), isid: [0x80, 0, 0, 0x3d, 0, 1] };
        let t = transport_id(&who).unwrap();
        assert_eq!(t.len() % 4, 0);
        assert_eq!(t[0], 0x45);
        assert_eq!(parse_transport_id(&t), Some(who));
        assert_eq!(parse_transport_id(&[0x05, 0, 0, 4, b'a', 0, 0, 0]), None, "format 00b has no ISID");
    }

    #[test]
    fn type_codes() {
        for t in [1, 3, 5, 6, 7, 8] {
            assert_eq!(scsi_type(resv_type(t).unwrap()), t);
        }
        assert_eq!(resv_type(2), None);
    }
}
