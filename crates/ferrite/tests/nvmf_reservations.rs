//! NVMe reservations on Ferrite's NVMe/TCP target:
//! - two hand-driven hosts (`nvmf_common::Host`, different Host Identifiers) for every status
//!   the reservation commands answer, the access matrix on real I/O (writes read back), the
//!   Reservation Report, the Reservation Notification log page with its asynchronous event,
//!   and features 81h, 82h and 83h;
//! - Persist Through Power Loss through a namespace's `ptpl_file` (SPDK's JSON format): the
//!   reservation comes back when the bdev is created again and added with the file;
//! - SPDK v26.05's NVMe host (two spdk_tgt processes, each a host with its own Host
//!   Identifier, sending raw commands with `bdev_nvme_send_cmd`); prints SKIP without
//!   $SPDK_DIR.

mod common;
mod nvmf_common;

use common::TempDir;
use ferrite_nvmf::spec::fabrics::CNTLID_DYNAMIC;
use ferrite_nvmf::spec::features::fid;
use ferrite_nvmf::spec::identify::cns;
use ferrite_nvmf::spec::identify_ctrl::{oncs, IdentifyController};
use ferrite_nvmf::spec::identify_ns::IdentifyNamespace;
use ferrite_nvmf::spec::log::lid;
use ferrite_nvmf::spec::opcode::{admin as aop, nvm};
use ferrite_nvmf::spec::status::command_specific::FEATURE_ID_NOT_SAVEABLE;
use ferrite_nvmf::spec::status::{generic, sct};
use nvmf_common::*;
use serde_json::{json, Value};
use std::time::Duration;

const NS: u32 = 1;
const BS: u32 = 512;
const KEY_A: u64 = 0xaaaa_0001;
const KEY_B: u64 = 0xbbbb_0002;

/// Reservation types (RTYPE).
const WRITE_EXCLUSIVE: u32 = 1;
const EXCLUSIVE_ACCESS: u32 = 2;
const WRITE_EXCLUSIVE_REG_ONLY: u32 = 3;

/// The I/O Command Set event "Reservation Log Page Available" as AER dword 0.
const RESV_LOG_EVENT: u32 = 0x0080_0006;

fn setup(tag: &str) -> (TempDir, NvmfDaemon) {
    let dir = TempDir::new(tag);
    let mut n = NvmfDaemon::start(&dir, "0x3", json!({}));
    n.malloc("M0", 16384, BS);
    n.subsystem(SUBNQN, true);
    assert_eq!(n.add_ns(SUBNQN, "M0"), NS);
    n.listen(SUBNQN);
    (dir, n)
}

/// A controller (admin queue and one I/O queue) of host `n`: Host Identifier `[n; 16]`.
fn host(port: u16, n: u8) -> Session {
    let hostnqn = format!("nqn.2014-08.org.nvmexpress:uuid:host-{n}");
    let mut admin = Host::initialized(port, HostOpts::default());
    admin.hostid = [n; 16];
    admin.hostnqn = hostnqn.clone();
    admin.connect(SUBNQN, 0, CNTLID_DYNAMIC).ok("admin Connect");
    admin.enable();
    let mut io = Host::initialized(port, HostOpts::default());
    io.hostid = [n; 16];
    io.hostnqn = hostnqn;
    io.connect(SUBNQN, 1, admin.cntlid).ok("I/O Connect");
    io.icd_limit = 4096;
    Session { admin, io: vec![io] }
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

fn resv(q: &mut Host, opc: u8, cdw10: u32, data: &[u8]) -> Completion {
    q.cmd(Host::sqe(opc, NS, |s| s.cdw10 = cdw10), Some(data), 0)
}

fn register(q: &mut Host, rrega: u32, crkey: u64, nrkey: u64) -> Completion {
    resv(q, nvm::RESERVATION_REGISTER, rrega, &keys(crkey, nrkey))
}

fn acquire(q: &mut Host, racqa: u32, rtype: u32, crkey: u64, prkey: u64) -> Completion {
    resv(q, nvm::RESERVATION_ACQUIRE, racqa | rtype << 8, &keys(crkey, prkey))
}

fn release(q: &mut Host, rrela: u32, rtype: u32, crkey: u64) -> Completion {
    resv(q, nvm::RESERVATION_RELEASE, rrela | rtype << 8, &crkey.to_le_bytes())
}

fn report(q: &mut Host, eds: bool, len: u32) -> Completion {
    q.cmd(
        Host::sqe(nvm::RESERVATION_REPORT, NS, |s| {
            s.cdw10 = len / 4 - 1;
            s.cdw11 = u32::from(eds);
        }),
        None,
        len,
    )
}

/// A decoded extended Reservation Status: (generation, rtype, registrants as (cntlid,
/// holder, key, hostid)).
type Registrants = Vec<(u16, bool, u64, [u8; 16])>;
fn decode_report(d: &[u8]) -> (u32, u8, u16, Registrants) {
    let gen = u32::from_le_bytes(d[0..4].try_into().unwrap());
    let regctl = u16::from_le_bytes(d[5..7].try_into().unwrap());
    let n = usize::from(regctl).min(d.len() / 64 - 1);
    let regs = (0..n)
        .map(|i| {
            let e = &d[64 * (i + 1)..64 * (i + 2)];
            (
                u16::from_le_bytes(e[0..2].try_into().unwrap()),
                e[2] & 1 != 0,
                u64::from_le_bytes(e[8..16].try_into().unwrap()),
                e[16..32].try_into().unwrap(),
            )
        })
        .collect();
    (gen, d[4], regctl, regs)
}

fn get_features(a: &mut Host, f: u8, nsid: u32, cdw11: u32, len: u32) -> Completion {
    a.cmd(
        Host::sqe(aop::GET_FEATURES, nsid, |s| {
            s.cdw10 = u32::from(f);
            s.cdw11 = cdw11;
        }),
        None,
        len,
    )
}

fn set_features(a: &mut Host, f: u8, nsid: u32, cdw11: u32) -> Completion {
    a.cmd(
        Host::sqe(aop::SET_FEATURES, nsid, |s| {
            s.cdw10 = u32::from(f);
            s.cdw11 = cdw11;
        }),
        None,
        0,
    )
}

fn conflict(c: &Completion, what: &str) {
    assert_eq!(c.status(), (sct::GENERIC, generic::RESERVATION_CONFLICT), "{what}: {:?}", c.cqe);
    assert!(c.cqe.status.dnr, "{what}: a conflict is not worth a retry");
}

fn invalid(c: &Completion, what: &str) {
    assert_eq!(c.status(), (sct::GENERIC, generic::INVALID_FIELD), "{what}: {:?}", c.cqe);
}

/// The Reservation Notification log's entries as (type, nsid); reading consumes them.
fn notices(a: &mut Host) -> Vec<(u8, u32)> {
    let c = a.get_log_page(lid::RESERVATION_NOTIFICATION, 4096, false).ok("Reservation Notification log");
    c.data
        .chunks(64)
        .take_while(|e| e[8] != 0)
        .map(|e| (e[8], u32::from_le_bytes(e[12..16].try_into().unwrap())))
        .collect()
}

#[test]
fn two_hosts_reserve_conflict_report_and_are_notified() {
    let (_dir, mut n) = setup("nvmfresv");
    let mut a = host(n.port, 1);
    let mut b = host(n.port, 2);

    // Identify: ONCS reservations, every type and IEKEY (no PTPL without a ptpl_file).
    let c = a.admin.identify(cns::CONTROLLER, 0, 0).ok("Identify Controller");
    let id = IdentifyController::decode(c.data[..4096].try_into().unwrap());
    assert_ne!(id.oncs & oncs::RESERVATIONS, 0, "ONCS bit 5");
    let c = a.admin.identify(cns::NAMESPACE, NS, 0).ok("Identify Namespace");
    let id = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(id.rescap, 0xfe, "RESCAP: six types and IEKEY, not PTPL");

    // No reservation: anyone writes.
    let first = pattern(1, 4096);
    b.io[0].write(NS, 0, &first, BS).ok("write before any reservation");

    // Register: a zero key, another key again, PTPL without a ptpl_file, bad data and RREGA.
    invalid(&register(&mut a.io[0], 0, 0, 0), "register key 0");
    register(&mut a.io[0], 0, 0, KEY_A).ok("register A");
    register(&mut a.io[0], 0, 0, KEY_A).ok("register A again, same key");
    conflict(&register(&mut a.io[0], 0, 0, 7), "register A with another key");
    invalid(&register(&mut a.io[0], 3 << 30, 0, KEY_A), "CPTPL 11b without a ptpl_file");
    invalid(&resv(&mut a.io[0], nvm::RESERVATION_REGISTER, 0, &[0; 8]), "8 bytes of keys");
    invalid(&register(&mut a.io[0], 5, 0, KEY_A), "RREGA 101b");
    register(&mut b.io[0], 0, 0, KEY_B).ok("register B");

    // Acquire Write Exclusive: A holds it; B's acquire conflicts; bad RTYPE and IEKEY.
    invalid(&acquire(&mut a.io[0], 0, 7, KEY_A, 0), "RTYPE 7");
    invalid(&acquire(&mut a.io[0], 1 << 3, WRITE_EXCLUSIVE, KEY_A, 0), "IEKEY in Acquire");
    conflict(&acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_B, 0), "acquire with B's key");
    acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_A, 0).ok("A acquires Write Exclusive");
    conflict(&acquire(&mut b.io[0], 0, WRITE_EXCLUSIVE, KEY_B, 0), "B acquires what A holds");

    // B may read, not write (nor write zeroes, deallocate or flush); A writes.
    let c = b.io[0].write(NS, 0, &pattern(2, 4096), BS);
    conflict(&c, "B's write");
    conflict(&b.io[0].write_zeroes(NS, 0, 8), "B's write zeroes");
    conflict(&b.io[0].deallocate(NS, &[(0, 8)]), "B's deallocate");
    conflict(&b.io[0].cmd(Host::sqe(nvm::FLUSH, NS, |_| {}), None, 0), "B's flush");
    assert_eq!(b.io[0].read(NS, 0, 8, BS).ok("B reads").data, first, "B's refused writes changed nothing");
    // A fused Compare and Write writes: both halves refused, the data unchanged.
    let fused = |opc: u8, fuse: u8| {
        let mut raw = Host::rw_sqe(opc, NS, 0, 8);
        raw[1] |= fuse;
        raw
    };
    let q = &mut b.io[0];
    let (c1, c2) = (q.submit(fused(nvm::COMPARE, 1), Some(&first), 0), q.submit(fused(nvm::WRITE, 2), Some(&first), 0));
    conflict(&q.wait(c1), "B's fused compare");
    assert_eq!(q.wait(c2).status(), (sct::GENERIC, generic::ABORTED_FAILED_FUSED), "B's fused write");
    let second = pattern(3, 4096);
    a.io[0].write(NS, 0, &second, BS).ok("the holder writes");
    assert_eq!(b.io[0].read(NS, 0, 8, BS).ok("B reads A's write").data, second);

    // Report: EDS 0 is refused (128-bit host IDs); EDS 1 lists both, A holding.
    let c = report(&mut b.io[0], false, 4096);
    assert_eq!(c.status(), (sct::GENERIC, generic::HOSTID_INCONSISTENT_FORMAT), "report without EDS");
    let c = report(&mut b.io[0], true, 4096).ok("report");
    let (gen, rtype, regctl, regs) = decode_report(&c.data);
    assert_eq!((gen, rtype, regctl), (2, WRITE_EXCLUSIVE as u8, 2), "generation, type, registrants");
    assert_eq!(
        regs,
        vec![(a.admin.cntlid, true, KEY_A, [1; 16]), (b.admin.cntlid, false, KEY_B, [2; 16])],
        "registrants"
    );
    let c = report(&mut b.io[0], true, 64).ok("report of the header only");
    assert_eq!((c.data.len(), decode_report(&c.data).2), (64, 2), "REGCTL counts all, even those cut off");

    // Release: wrong type, wrong key, not the holder (no change), then the holder.
    invalid(&release(&mut a.io[0], 0, EXCLUSIVE_ACCESS, KEY_A), "release of another type");
    conflict(&release(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_B), "release with B's key");
    release(&mut b.io[0], 0, WRITE_EXCLUSIVE, KEY_B).ok("B's release: not the holder, no change");
    conflict(&b.io[0].write(NS, 0, &pattern(4, 4096), BS), "B's write after its own release");
    release(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_A).ok("A releases");
    let third = pattern(5, 4096);
    b.io[0].write(NS, 0, &third, BS).ok("B writes once released");
    assert_eq!(a.io[0].read(NS, 0, 8, BS).ok("A reads B's write").data, third);
    assert!(notices(&mut b.admin).is_empty(), "releasing Write Exclusive tells nobody");

    // A registrants-only reservation released: B is told (AER, then the log page, once).
    let aer = b.admin.submit_aer();
    acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE_REG_ONLY, KEY_A, 0).ok("A acquires WE registrants only");
    b.io[0].write(NS, 8, &third, BS).ok("a registrant writes under registrants-only");
    release(&mut a.io[0], 0, WRITE_EXCLUSIVE_REG_ONLY, KEY_A).ok("A releases");
    let c = b.admin.wait(aer).ok("B's AER");
    assert_eq!(c.cqe.dw0, RESV_LOG_EVENT, "Reservation Log Page Available");
    assert_eq!(notices(&mut b.admin), vec![(2, NS)], "Reservation Released");
    assert!(notices(&mut b.admin).is_empty(), "a log entry is read once");
    assert!(notices(&mut a.admin).is_empty(), "the host that released is not told");

    // Preempt: B takes A's Write Exclusive as Exclusive Access; A is unregistered and told.
    let aer = a.admin.submit_aer();
    acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_A, 0).ok("A acquires again");
    conflict(&acquire(&mut b.io[0], 1, EXCLUSIVE_ACCESS, KEY_B, 0), "preempt with PRKEY 0");
    acquire(&mut b.io[0], 1, EXCLUSIVE_ACCESS, KEY_B, KEY_A).ok("B preempts A");
    assert_eq!(a.admin.wait(aer).ok("A's AER").cqe.dw0, RESV_LOG_EVENT);
    assert_eq!(notices(&mut a.admin), vec![(1, NS)], "Registration Preempted");
    conflict(&a.io[0].read(NS, 0, 8, BS), "A reads under B's Exclusive Access");
    conflict(&a.io[0].write(NS, 0, &first, BS), "A writes under B's Exclusive Access");
    conflict(&release(&mut a.io[0], 0, EXCLUSIVE_ACCESS, KEY_A), "A is no longer registered");
    let (gen, rtype, _, regs) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regs), (EXCLUSIVE_ACCESS as u8, vec![(b.admin.cntlid, true, KEY_B, [2; 16])]));
    assert!(gen > 2);

    // Features: 81h (Connect's host ID; Set refused), 82h (mask), 83h (no ptpl_file).
    let c = get_features(&mut b.admin, fid::HOST_IDENTIFIER, 0, 1, 16).ok("Get Host Identifier");
    assert_eq!(c.data[..16], [2; 16]);
    invalid(&get_features(&mut b.admin, fid::HOST_IDENTIFIER, 0, 0, 16), "Get Host Identifier without EXHID");
    let c = set_features(&mut b.admin, fid::HOST_IDENTIFIER, 0, 1);
    assert_eq!(c.status(), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "Set Host Identifier");
    set_features(&mut a.admin, fid::RESERVATION_NOTIFICATION_MASK, NS, 1 << 1).ok("mask Registration Preempted");
    let c = get_features(&mut a.admin, fid::RESERVATION_NOTIFICATION_MASK, NS, 0, 0).ok("Get mask");
    assert_eq!(c.cqe.dw0, 1 << 1);
    invalid(&get_features(&mut a.admin, fid::RESERVATION_NOTIFICATION_MASK, 0xffff_ffff, 0, 0), "Get mask, all");
    invalid(&get_features(&mut a.admin, fid::RESERVATION_NOTIFICATION_MASK, 9, 0, 0), "Get mask, no such ns");
    let c = get_features(&mut a.admin, fid::RESERVATION_PERSISTENCE, NS, 0, 0).ok("Get PTPL");
    assert_eq!(c.cqe.dw0, 0);
    invalid(&set_features(&mut a.admin, fid::RESERVATION_PERSISTENCE, NS, 1), "Set PTPL without a ptpl_file");

    // A registers again and is preempted again: masked, so no notice.
    register(&mut a.io[0], 0, 0, KEY_A).ok("A registers again");
    acquire(&mut b.io[0], 1, EXCLUSIVE_ACCESS, KEY_B, KEY_A).ok("B preempts A's registration");
    std::thread::sleep(Duration::from_millis(100));
    assert!(notices(&mut a.admin).is_empty(), "the masked notice is not logged");

    // Clear: everything goes; A writes again, and it reads back.
    register(&mut a.io[0], 0, 0, KEY_A).ok("A registers once more");
    conflict(&release(&mut b.io[0], 1, 0, KEY_A), "clear with A's key from B");
    release(&mut b.io[0], 1, 0, KEY_B).ok("B clears");
    assert_eq!(notices(&mut a.admin), vec![], "masked: Registration Preempted");
    let (_, rtype, regctl, _) = decode_report(&report(&mut a.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regctl), (0, 0));
    let last = pattern(6, 4096);
    a.io[0].write(NS, 16, &last, BS).ok("A writes after the clear");
    assert_eq!(b.io[0].read(NS, 16, 8, BS).ok("read back").data, last);
    n.assert_alive();
}

/// Preempt and Abort as SPDK v26.05: the acquire completes only once the preempted host's
/// command in flight on the namespace (a write held 5 s in a delay bdev) has completed, and
/// that command is not cancelled: it succeeds and its data is there.
#[test]
fn preempt_and_abort_waits_for_the_preempted_hosts_commands() {
    const HELD: Duration = Duration::from_secs(5);
    let dir = TempDir::new("nvmfresvabort");
    let mut n = NvmfDaemon::start(&dir, "0x3", json!({}));
    n.malloc("MD", 16384, BS);
    let held_us = HELD.as_micros() as u64;
    n.d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "MD", "name": "D0", "avg_read_latency": 10, "p99_read_latency": 10,
            "avg_write_latency": held_us, "p99_write_latency": held_us})),
    );
    n.subsystem(SUBNQN, true);
    assert_eq!(n.add_ns(SUBNQN, "D0"), NS);
    n.listen(SUBNQN);
    let mut a = host(n.port, 1);
    let mut b = host(n.port, 2);
    register(&mut a.io[0], 0, 0, KEY_A).ok("register A");
    register(&mut b.io[0], 0, 0, KEY_B).ok("register B");
    acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_A, 0).ok("A acquires Write Exclusive");

    // A's write is held in the delay bdev while B preempts A and aborts.
    let data = pattern(1, 4096);
    let w = a.io[0].submit(Host::rw_sqe(nvm::WRITE, NS, 0, 8), Some(&data), 0);
    std::thread::sleep(Duration::from_secs(1));
    let start = std::time::Instant::now();
    let preempt_abort = resv(&mut b.io[0], nvm::RESERVATION_ACQUIRE, 2 | WRITE_EXCLUSIVE << 8, &keys(KEY_B, KEY_A));
    let waited = start.elapsed();
    preempt_abort.ok("B's Preempt and Abort");
    assert!(waited >= Duration::from_secs(2), "the acquire waited for A's held write ({waited:?} of {HELD:?})");
    a.io[0].wait(w).ok("A's write was waited for, not cancelled");
    assert_eq!(b.io[0].read(NS, 0, 8, BS).ok("read back").data, data, "A's write landed");

    // A is preempted: its next write is refused at once; B holds the reservation.
    conflict(&a.io[0].write(NS, 0, &pattern(2, 4096), BS), "A's write after the preemption");
    let (_, rtype, _, regs) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regs), (WRITE_EXCLUSIVE as u8, vec![(b.admin.cntlid, true, KEY_B, [2; 16])]));
    // Nothing of A's in flight: a Preempt and Abort of A's new registration answers at once.
    register(&mut a.io[0], 0, 0, KEY_A).ok("A registers again");
    acquire(&mut b.io[0], 2, WRITE_EXCLUSIVE, KEY_B, KEY_A).ok("B preempts and aborts A again");
    n.assert_alive();
}

/// Where Ferrite and SPDK v26.05 differ in small things, Ferrite's answers: an Acquire of
/// type 0 (reserved) is Invalid Field (SPDK makes the host a holder of no type); Set Features
/// 82h and 83h with Save are Feature Identifier Not Saveable (as SPDK answers every saved
/// Set Features); under an all-registrants type the report marks every registrant a holder
/// (NVMe's definition; SPDK marks only the first).
#[test]
fn type_zero_saved_features_and_all_registrants_holders() {
    let (_dir, mut n) = setup("nvmfresvsmall");
    let mut a = host(n.port, 1);
    let mut b = host(n.port, 2);
    register(&mut a.io[0], 0, 0, KEY_A).ok("register A");
    register(&mut b.io[0], 0, 0, KEY_B).ok("register B");
    invalid(&acquire(&mut a.io[0], 0, 0, KEY_A, 0), "Acquire of RTYPE 0");
    let (_, rtype, _, regs) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regs.iter().any(|r| r.1)), (0, false), "no reservation, no holder");

    for f in [fid::RESERVATION_NOTIFICATION_MASK, fid::RESERVATION_PERSISTENCE] {
        let c = a.admin.cmd(
            Host::sqe(aop::SET_FEATURES, NS, |s| {
                s.cdw10 = u32::from(f) | 1 << 31;
                s.cdw11 = 0;
            }),
            None,
            0,
        );
        assert_eq!(c.status(), (sct::COMMAND_SPECIFIC, FEATURE_ID_NOT_SAVEABLE), "Set Features {f:#x} with Save");
    }

    acquire(&mut a.io[0], 0, 5, KEY_A, 0).ok("A acquires Write Exclusive - All Registrants");
    let (_, rtype, _, regs) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!(rtype, 5);
    assert_eq!(regs.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(), vec![(true, KEY_A), (true, KEY_B)]);
    let data = pattern(7, 4096);
    b.io[0].write(NS, 0, &data, BS).ok("a registrant writes: it holds the reservation too");
    assert_eq!(a.io[0].read(NS, 0, 8, BS).ok("read back").data, data);
    n.assert_alive();
}

#[test]
fn masked_oncs_reservs_hides_reservations() {
    let dir = TempDir::new("nvmfresvmask");
    let mut n = NvmfDaemon::start(&dir, "0x1", json!({"masked_oncs": ["reservs"]}));
    n.malloc("M0", 2048, BS);
    n.subsystem(SUBNQN, true);
    assert_eq!(n.add_ns(SUBNQN, "M0"), NS);
    n.listen(SUBNQN);
    let mut a = host(n.port, 1);
    let c = a.admin.identify(cns::CONTROLLER, 0, 0).ok("Identify Controller");
    let id = IdentifyController::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(id.oncs & oncs::RESERVATIONS, 0, "ONCS hides reservations");
    let c = register(&mut a.io[0], 0, 0, KEY_A);
    assert_eq!(c.status(), (sct::GENERIC, generic::INVALID_OPCODE), "Register when masked");
    a.io[0].write(NS, 0, &pattern(1, 512), BS).ok("I/O goes on");
    n.assert_alive();
}

#[test]
fn ptpl_file_brings_the_reservation_back() {
    let dir = TempDir::new("nvmfptpl");
    let mut n = NvmfDaemon::start(&dir, "0x1", json!({}));
    let uuid = "5d6e0f2a-1b3c-4d5e-8f70-112233445566";
    let malloc = json!({"name": "P0", "num_blocks": 2048, "block_size": BS, "uuid": uuid});
    n.d.call("bdev_malloc_create", Some(malloc.clone()));
    n.subsystem(SUBNQN, true);
    let file = dir.join("ns1.ptpl");
    let ns = json!({"nqn": SUBNQN, "namespace": {"bdev_name": "P0", "ptpl_file": file.to_str().unwrap()}});
    assert_eq!(n.d.call("nvmf_subsystem_add_ns", Some(ns.clone())), json!(NS));
    n.listen(SUBNQN);

    let mut a = host(n.port, 1);
    let mut b = host(n.port, 2);
    let c = a.admin.identify(cns::NAMESPACE, NS, 0).ok("Identify Namespace");
    let id = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(id.rescap, 0xff, "RESCAP with PTPL");
    register(&mut a.io[0], 3 << 30, 0, KEY_A).ok("register A with CPTPL 11b");
    register(&mut b.io[0], 0, 0, KEY_B).ok("register B");
    acquire(&mut a.io[0], 0, WRITE_EXCLUSIVE, KEY_A, 0).ok("A acquires");
    let c = get_features(&mut a.admin, fid::RESERVATION_PERSISTENCE, NS, 0, 0).ok("Get PTPL");
    assert_eq!(c.cqe.dw0, 1);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        saved,
        json!({"ptpl": true, "rtype": 1, "crkey": KEY_A, "bdev_uuid": uuid,
            "holder_uuid": "01010101-0101-0101-0101-010101010101",
            "registrants": [{"rkey": KEY_A, "host_uuid": "01010101-0101-0101-0101-010101010101"},
                {"rkey": KEY_B, "host_uuid": "02020202-0202-0202-0202-020202020202"}]}),
        "SPDK's format"
    );
    let cfg = n.d.call("save_config", None).to_string();
    assert!(cfg.contains("ns1.ptpl"), "save_config keeps ptpl_file");
    drop((a, b));

    // The bdev goes (and its registry with it) and comes back: the file restores it.
    n.d.call("bdev_malloc_delete", Some(json!({"name": "P0"})));
    std::thread::sleep(Duration::from_millis(200));
    n.d.call("bdev_malloc_create", Some(malloc));
    assert_eq!(n.d.call("nvmf_subsystem_add_ns", Some(ns)), json!(NS));
    let mut b = host(n.port, 2);
    let (_, rtype, regctl, regs) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regctl), (WRITE_EXCLUSIVE as u8, 2), "restored");
    assert_eq!(regs.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(), vec![(true, KEY_A), (false, KEY_B)]);
    conflict(&b.io[0].write(NS, 0, &pattern(1, 512), BS), "B's write under the restored reservation");
    b.io[0].read(NS, 0, 1, BS).ok("B reads");

    // A file for another bdev is refused.
    let other = dir.join("other.ptpl");
    std::fs::write(&other, saved.to_string().replace(uuid, "00000000-0000-0000-0000-000000000001")).unwrap();
    n.malloc("P1", 2048, BS);
    let e = n.d.call_err(
        "nvmf_subsystem_add_ns",
        Some(json!({"nqn": SUBNQN, "namespace": {"bdev_name": "P1", "ptpl_file": other.to_str().unwrap()}})),
    );
    assert!(e.message.contains("other.ptpl"), "{e:?}");
    // The registry is the bdev's: a file does not replace what hosts hold through another
    // namespace of the same bdev.
    let sub2 = "nqn.2016-06.io.ferrite:resv2";
    n.subsystem(sub2, true);
    let copy = dir.join("copy.ptpl");
    std::fs::write(&copy, saved.to_string()).unwrap();
    let e = n.d.call_err(
        "nvmf_subsystem_add_ns",
        Some(json!({"nqn": sub2, "namespace": {"bdev_name": "P0", "ptpl_file": copy.to_str().unwrap()}})),
    );
    assert!(e.message.contains("already has 2 registrant"), "{e:?}");
    let (_, rtype, regctl, _) = decode_report(&report(&mut b.io[0], true, 4096).ok("report").data);
    assert_eq!((rtype, regctl), (WRITE_EXCLUSIVE as u8, 2), "the live reservation stands");
    // A file that lists a host twice is refused.
    let uuid2 = "5d6e0f2a-1b3c-4d5e-8f70-112233445567";
    n.d.call("bdev_malloc_create", Some(json!({"name": "P2", "num_blocks": 2048, "block_size": BS, "uuid": uuid2})));
    let twice = dir.join("twice.ptpl");
    let host = "03030303-0303-0303-0303-030303030303";
    let doc = json!({"ptpl": true, "rtype": 0, "crkey": 0, "bdev_uuid": uuid2, "holder_uuid": "",
        "registrants": [{"rkey": 1, "host_uuid": host}, {"rkey": 2, "host_uuid": host}]});
    std::fs::write(&twice, doc.to_string()).unwrap();
    let e = n.d.call_err(
        "nvmf_subsystem_add_ns",
        Some(json!({"nqn": SUBNQN, "namespace": {"bdev_name": "P2", "ptpl_file": twice.to_str().unwrap()}})),
    );
    assert!(e.message.contains("listed twice"), "{e:?}");
    for bad in ["", "/nonexistent-ferrite-dir/x.ptpl"] {
        let e = n.d.call_err(
            "nvmf_subsystem_add_ns",
            Some(json!({"nqn": SUBNQN, "namespace": {"bdev_name": "P2", "ptpl_file": bad}})),
        );
        assert!(e.message.contains("ptpl_file"), "{bad:?}: {e:?}");
    }
    // A ptpl_file that can no longer be written: the command fails with Internal Device Error
    // (the host must not believe in a persistence that is not there).
    let gone = dir.join("gone");
    std::fs::create_dir(&gone).unwrap();
    let p2 = json!({"nqn": SUBNQN, "namespace": {"bdev_name": "P2", "nsid": 7,
        "ptpl_file": gone.join("p2.ptpl").to_str().unwrap()}});
    assert_eq!(n.d.call("nvmf_subsystem_add_ns", Some(p2)), json!(7));
    std::fs::remove_dir_all(&gone).unwrap();
    let c = b.io[0].cmd(Host::sqe(nvm::RESERVATION_REGISTER, 7, |s| s.cdw10 = 0), Some(&keys(0, 9)), 0);
    assert_eq!(c.status(), (sct::GENERIC, generic::INTERNAL_DEVICE_ERROR), "{:?}", c.cqe);
    // PTPL off: the file is emptied, as SPDK leaves it.
    set_features(&mut b.admin, fid::RESERVATION_PERSISTENCE, NS, 0).ok("Set PTPL off");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
    n.assert_alive();
}

// ---- SPDK's NVMe host ----------------------------------------------------------------------

/// An spdk_tgt: one NVMe host (SPDK draws a random Host Identifier per process), with rpc.py
/// to talk to it; killed on drop.
struct SpdkHost {
    spdk: std::path::PathBuf,
    sock: std::path::PathBuf,
    child: std::process::Child,
}

impl SpdkHost {
    fn start(spdk: &std::path::Path, dir: &TempDir, name: &str) -> SpdkHost {
        let sock = dir.join(&format!("{name}.sock"));
        let log = std::fs::File::create(dir.join(&format!("{name}.log"))).unwrap();
        let child = std::process::Command::new(spdk.join("build/bin/spdk_tgt"))
            .args(["-m", "0x2", "--no-huge", "-s", "1024", "--disable-cpumask-locks", "-r", sock.to_str().unwrap()])
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spdk_tgt starts");
        let t = SpdkHost { spdk: spdk.to_path_buf(), sock, child };
        for _ in 0..300 {
            if t.sock.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(t.sock.exists(), "spdk_tgt {name} did not start");
        std::thread::sleep(Duration::from_millis(300));
        t
    }

    /// Runs rpc.py with `args`, expects success, returns its JSON output (or null).
    fn rpc(&self, args: &[&str]) -> Value {
        let out = std::process::Command::new("python3")
            .arg(self.spdk.join("scripts/rpc.py"))
            .args(["-s", self.sock.to_str().unwrap(), "-t", "60"])
            .args(args)
            .env("PYTHONPATH", self.spdk.join("python"))
            .output()
            .expect("rpc.py runs");
        assert!(
            out.status.success(),
            "rpc.py {args:?}: {}{}\nspdk_tgt's log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.sock.with_extension("log")).unwrap_or_default()
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Sends `sqe` on controller `ctrl`'s I/O queue (`bdev_nvme_send_cmd`) with `data` to the
    /// target or `read_len` bytes back; returns ((SCT, SC), DNR, data).
    fn send(&self, ctrl: &str, sqe: [u8; 64], data: Option<&[u8]>, read_len: u32) -> ((u8, u8), bool, Vec<u8>) {
        let cmd = b64encode(&sqe);
        let mut args = vec!["bdev_nvme_send_cmd", "-n", ctrl, "-t", "io", "-c", &cmd];
        let (enc, len) = (data.map(b64encode), read_len.to_string());
        match &enc {
            Some(d) => args.extend(["-r", "h2c", "-d", d]),
            None => args.extend(["-r", "c2h", "-D", &len]),
        }
        let v = self.rpc(&args);
        let cpl = b64decode(v["cpl"].as_str().unwrap_or_else(|| panic!("no cpl in {v}")));
        let st = u16::from_le_bytes([cpl[14], cpl[15]]);
        let data = v["data"].as_str().map(b64decode).unwrap_or_default();
        ((((st >> 9) & 7) as u8, (st >> 1) as u8), st >> 15 != 0, data)
    }
}

impl Drop for SpdkHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 with SPDK's URL-safe alphabet and padding.
fn b64encode(b: &[u8]) -> String {
    let mut s = String::new();
    for c in b.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn b64decode(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for ch in s.bytes().filter(|&c| c != b'=') {
        let v = match ch {
            b'+' => 62,
            b'/' => 63,
            _ => B64.iter().position(|&x| x == ch).unwrap_or_else(|| panic!("not base64: {ch}")) as u32,
        };
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn sqe(opc: u8, cdw10: u32, cdw11: u32, cdw12: u32) -> [u8; 64] {
    Host::sqe(opc, NS, |s| {
        s.cdw10 = cdw10;
        s.cdw11 = cdw11;
        s.cdw12 = cdw12;
    })
}

#[test]
fn spdk_hosts_fence_each_other() {
    let Some(spdk) = common::spdk_or_skip("spdk_hosts_fence_each_other") else { return };
    let (dir, n) = setup("nvmfresvspdk");
    let (a, b) = (SpdkHost::start(&spdk, &dir, "hosta"), SpdkHost::start(&spdk, &dir, "hostb"));
    let port = n.port.to_string();
    for (h, name, nqn) in
        [(&a, "HA", "nqn.2014-08.org.nvmexpress:host-a"), (&b, "HB", "nqn.2014-08.org.nvmexpress:host-b")]
    {
        let attach = ["bdev_nvme_attach_controller", "-b", name, "-t", "tcp", "-a", "127.0.0.1", "-f", "ipv4"];
        h.rpc(&[&attach[..], &["-s", &port, "-n", SUBNQN, "-q", nqn]].concat());
    }
    let ok = ((sct::GENERIC, generic::SUCCESS), false);
    let write = |h: &SpdkHost, c: &str, lba: u32, data: &[u8]| {
        let (st, dnr, _) = h.send(c, sqe(nvm::WRITE, lba, 0, 7), Some(data), 0);
        (st, dnr)
    };
    let read = |h: &SpdkHost, c: &str, lba: u32| {
        let (st, _, d) = h.send(c, sqe(nvm::READ, lba, 0, 7), None, 4096);
        assert_eq!(st, ok.0, "read");
        d
    };
    let resv = |h: &SpdkHost, c: &str, opc: u8, cdw10: u32, data: &[u8]| {
        let (st, dnr, _) = h.send(c, sqe(opc, cdw10, 0, 0), Some(data), 0);
        (st, dnr)
    };

    // Both register; A takes Write Exclusive.
    assert_eq!(resv(&a, "HA", nvm::RESERVATION_REGISTER, 0, &keys(0, KEY_A)), ok, "A registers");
    assert_eq!(resv(&b, "HB", nvm::RESERVATION_REGISTER, 0, &keys(0, KEY_B)), ok, "B registers");
    assert_eq!(resv(&a, "HA", nvm::RESERVATION_ACQUIRE, WRITE_EXCLUSIVE << 8, &keys(KEY_A, 0)), ok, "A acquires");
    let conflict = ((sct::GENERIC, generic::RESERVATION_CONFLICT), true);
    let b_acquires = resv(&b, "HB", nvm::RESERVATION_ACQUIRE, WRITE_EXCLUSIVE << 8, &keys(KEY_B, 0));
    assert_eq!(b_acquires, conflict, "B acquires what A holds");

    // A writes; B's write is refused; B reads A's data.
    let da = pattern(11, 4096);
    assert_eq!(write(&a, "HA", 0, &da), ok, "the holder writes");
    assert_eq!(write(&b, "HB", 0, &pattern(12, 4096)), conflict, "B's write");
    assert_eq!(read(&b, "HB", 0), da, "B reads A's data; its write changed nothing");
    assert_eq!(read(&a, "HA", 0), da);

    // The report (extended) lists both hosts, A holding.
    let (st, _, d) = b.send("HB", sqe(nvm::RESERVATION_REPORT, 4096 / 4 - 1, 1, 0), None, 4096);
    assert_eq!(st, ok.0, "report");
    let (_, rtype, regctl, regs) = decode_report(&d);
    assert_eq!((rtype, regctl), (WRITE_EXCLUSIVE as u8, 2));
    let holders: Vec<(bool, u64)> = regs.iter().map(|r| (r.1, r.2)).collect();
    assert_eq!(holders, vec![(true, KEY_A), (false, KEY_B)]);
    assert_ne!(regs[0].3, regs[1].3, "two Host Identifiers");
    assert!(regs.iter().all(|r| r.0 != 0xffff && r.3 != [0; 16]), "live controllers with host IDs: {regs:?}");

    // A releases: B writes, A reads it back.
    let released = resv(&a, "HA", nvm::RESERVATION_RELEASE, WRITE_EXCLUSIVE << 8, &KEY_A.to_le_bytes());
    assert_eq!(released, ok, "A releases");
    let db = pattern(13, 4096);
    assert_eq!(write(&b, "HB", 0, &db), ok, "B writes once released");
    assert_eq!(read(&a, "HA", 0), db);
    assert_eq!(read(&b, "HB", 0), db);
    drop((a, b));
    let mut n = n;
    n.assert_alive();
}
