//! Fencing, as Mayastor's nexus does it (`resv_key`, `preempt_key`): on opening a child whose
//! bdev passes NVMe I/O commands through (an `nvmf://` child, through Ferrite's NVMe/TCP host),
//! the nexus registers its key on the namespace and takes a reservation (Write Exclusive - All
//! Registrants by default, Mayastor's), preempting `preempt_key` (the key of the nexus it
//! replaces) if given. The preempted nexus is no longer a registrant: its writes to that child
//! fail with Reservation Conflict, and it faults the child for that reason, so a nexus that
//! comes back after a partition cannot write behind the new one's back.
//!
//! The commands go through the child's descriptor as `IoType::NvmeIo` passthrough, on the
//! calling core's channel (`ferrite_nvme::spec::resv` builds them).

use ferrite_bdev::{BdevDesc, BdevError, IoAux, IoRequest, IoStatus, IoType, NvmeCmd};
use ferrite_nvme::spec::resv::{self, racqa, rrega, rrela, ReportData, ResvCommand};

/// What a nexus asks of its children's reservations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fencing {
    /// Its reservation key (0: no fencing).
    pub resv_key: u64,
    /// The key to preempt (0: none).
    pub preempt_key: u64,
    /// The reservation type (NVMe RTYPE).
    pub resv_type: u8,
}

/// Bytes read by a Report (the header and 63 registrants).
const REPORT_LEN: usize = 4096;

fn conflict(s: IoStatus) -> bool {
    matches!(s, IoStatus::Nvme { sct: 0, sc: 0x83, .. })
}

/// Sends `c` through `desc`; the data the controller returned (Report), or the status.
async fn send(desc: &BdevDesc, c: ResvCommand) -> Result<Vec<u8>, IoStatus> {
    let ch = desc.channel().map_err(|e| IoStatus::Failed(e.errno()))?;
    let raw = c.sqe.to_bytes();
    let mut dw = [0u32; 16];
    for (i, d) in dw.iter_mut().enumerate() {
        *d = u32::from_le_bytes(raw[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    }
    let mut req = IoRequest::new(IoType::NvmeIo, 0, 0);
    req.aux = IoAux::Nvme(Box::new(NvmeCmd(dw)));
    let len = if c.read_len > 0 { c.read_len } else { c.data.len() };
    if len > 0 {
        let mut b = ferrite_reactor::alloc_buf(len);
        b.set_len(len);
        b.fill(0);
        b[..c.data.len()].copy_from_slice(&c.data);
        req.bufs.push(b);
    }
    let done = ch.submit_wait(req).await;
    if !done.status.is_ok() {
        return Err(done.status);
    }
    Ok(if c.read_len > 0 { done.req.bufs.iter().flat_map(|b| b.iter().copied()).collect() } else { Vec::new() })
}

fn failed(uri: &str, what: &str, s: IoStatus) -> BdevError {
    let errno = if conflict(s) { libc::EACCES } else { s.errno() };
    BdevError::Errno(errno, format!("child {uri}: reservation {what}: {s}"))
}

/// True if the child's bdev can carry reservation commands.
pub(crate) fn applies(desc: &BdevDesc, f: &Fencing) -> bool {
    f.resv_key != 0 && desc.bdev().supports(IoType::NvmeIo)
}

/// Registers `f.resv_key` on the child and takes the reservation, preempting `f.preempt_key`;
/// then checks with a Report that a registrant with this key holds a reservation of the type.
pub(crate) async fn acquire(uri: &str, desc: &BdevDesc, f: &Fencing) -> Result<(), BdevError> {
    if !applies(desc, f) {
        return Ok(());
    }
    let (key, t) = (f.resv_key, f.resv_type);
    // Replace with Ignore Existing Key registers whether or not this host was registered.
    send(desc, resv::register(1, rrega::REPLACE, true, resv::cptpl::NO_CHANGE, 0, key))
        .await
        .map_err(|s| failed(uri, "register", s))?;
    if f.preempt_key != 0 && f.preempt_key != key {
        match send(desc, resv::acquire(1, racqa::PREEMPT, false, t, key, f.preempt_key)).await {
            Ok(_) => log::info!("nexus child {uri}: preempted key {:#x}", f.preempt_key),
            // Nobody with that key any more: a plain acquire follows.
            Err(s) if conflict(s) => log::info!("nexus child {uri}: no registrant with key {:#x}", f.preempt_key),
            Err(s) => return Err(failed(uri, "preempt", s)),
        }
    }
    match send(desc, resv::acquire(1, racqa::ACQUIRE, false, t, key, 0)).await {
        Ok(_) => {}
        Err(s) if conflict(s) => {
            // Held by this nexus before a restart (the same key, another host identifier):
            // preempting its own key takes it over.
            let r = report(desc).await.map_err(|s| failed(uri, "report", s))?;
            let mine = r.registrants.iter().filter(|g| g.rkey == key).count();
            if mine < 2 || !r.registrants.iter().any(|g| g.holder && g.rkey == key) {
                return Err(failed(uri, "acquire", s));
            }
            send(desc, resv::acquire(1, racqa::PREEMPT, false, t, key, key))
                .await
                .map_err(|s| failed(uri, "preempt of its own key", s))?;
            send(desc, resv::acquire(1, racqa::ACQUIRE, false, t, key, 0))
                .await
                .map_err(|s| failed(uri, "acquire", s))?;
        }
        Err(s) => return Err(failed(uri, "acquire", s)),
    }
    // Earlier registrations of this key (this nexus before a restart, as another host) go.
    if let Ok(r) = report(desc).await {
        if r.registrants.iter().filter(|g| g.rkey == key).count() > 1 {
            let _ = send(desc, resv::acquire(1, racqa::PREEMPT, false, t, key, key)).await;
        }
    }
    let r = report(desc).await.map_err(|s| failed(uri, "report", s))?;
    if r.rtype != t || !r.registrants.iter().any(|g| g.rkey == key && g.holder) {
        return Err(BdevError::Errno(
            libc::EACCES,
            format!(
                "child {uri}: reservation not held with key {key:#x} after acquire (type {}, registrants {:?})",
                r.rtype,
                r.registrants.iter().map(|g| (g.rkey, g.holder)).collect::<Vec<_>>()
            ),
        ));
    }
    log::info!("nexus child {uri}: reservation type {t} held with key {key:#x} ({} registrants)", r.registrants.len());
    Ok(())
}

/// The child's reservation status.
pub(crate) async fn report(desc: &BdevDesc) -> Result<ReportData, IoStatus> {
    let b = send(desc, resv::report(1, REPORT_LEN)).await?;
    ReportData::decode(&b).ok_or(IoStatus::Failed(libc::EIO))
}

/// Leaves the child's registrants (a holder leaving releases the reservation), when the nexus
/// lets go of the child. Best effort: a child that is gone needs nothing.
pub(crate) async fn leave(uri: &str, desc: &BdevDesc, f: &Fencing) {
    if !applies(desc, f) {
        return;
    }
    if let Err(s) = send(desc, resv::release(1, rrela::RELEASE, false, f.resv_type, f.resv_key)).await {
        log::info!("nexus child {uri}: reservation release: {s}");
    }
    if let Err(s) = send(desc, resv::register(1, rrega::UNREGISTER, false, 0, f.resv_key, 0)).await {
        log::info!("nexus child {uri}: unregister: {s}");
    }
}
