//! What real initiators never send, over raw sockets (the initiator of tests/iscsi_common on
//! ferrite_iscsi's codec): PDUs that are answered with a Reject (an unknown opcode, a Data-Out
//! for no command, a SNACK at ErrorRecoveryLevel 0), commands outside the CmdSN window
//! (ignored), fatal input that ends only its connection (a data segment over
//! MaxRecvDataSegmentLength, a bad header digest), a connection dropped in the middle of a
//! write, 1,000 connections that never log in (closed at the login deadline), an ABORT TASK
//! of a write waiting for its data, NOP-Out pings, and data digests end to end. In every case
//! the daemon keeps serving another session.

mod common;
mod iscsi_common;

use common::TempDir;
use ferrite_iscsi::negotiate::{DigestPolicy, InitiatorOptions};
use ferrite_iscsi::pdu::{
    DataOut, NopOut, Pdu, ScsiCommand, Snack, SnackType, TaskAttr, TaskMgmtRequest, TmfFunction, BHS_LEN, RESERVED_TAG,
};
use iscsi_common::{closed_within, connect, pattern, Ini, IscsiDaemon};
use serde_json::json;
use std::io::Write;
use std::time::{Duration, Instant};

/// A daemon with one target over a 16 MiB malloc LUN; its full name.
fn setup(dir: &TempDir, cpumask: &str) -> (IscsiDaemon, String) {
    let d = IscsiDaemon::start(dir, cpumask);
    d.malloc("Malloc0", 32768, 512);
    let iqn = d.target("disk1", "Malloc0", json!({}));
    (d, iqn)
}

fn no_immediate() -> InitiatorOptions {
    InitiatorOptions { immediate_data: false, ..InitiatorOptions::default() }
}

/// A good session still writes and reads.
fn still_serves(port: u16, iqn: &str, seed: u64) {
    let mut ini = Ini::login(port, Some(iqn), InitiatorOptions::default()).expect("a good initiator logs in");
    let data = pattern(seed, 64 << 10);
    assert_eq!(ini.write10(100, &data).status, 0);
    let r = ini.read10(100, 128);
    assert_eq!(r.status, 0);
    assert!(r.data == data, "read back differs");
}

#[test]
fn invalid_pdus_are_rejected_and_the_session_goes_on() {
    let dir = TempDir::new("iscsi-reject");
    let (d, iqn) = setup(&dir, "0x1");
    let mut ini = Ini::login(d.port, Some(&iqn), InitiatorOptions::default()).unwrap();
    assert_eq!(ini.tur(), 0);
    // A vendor-specific opcode: Reject, "command not supported", carrying the header.
    let mut bhs = [0u8; BHS_LEN];
    bhs[0] = 0x1c;
    bhs[1] = 0x80;
    bhs[16..20].copy_from_slice(&77u32.to_be_bytes());
    ini.s.write_all(&bhs).unwrap();
    let g = ini.recv();
    let Pdu::Reject(r) = g.pdu else { panic!("expected a Reject, got {:?}", g.pdu) };
    assert_eq!(r.reason, 0x05);
    assert_eq!(g.data, bhs.to_vec(), "the Reject carries the rejected header");
    // A Data-Out for no command (its data is skipped): invalid PDU field.
    let d_out = DataOut {
        final_: true,
        lun: 0,
        itt: 9,
        ttt: 0x1234,
        exp_stat_sn: ini.exp_stat_sn,
        data_sn: 0,
        buffer_offset: 0,
    };
    ini.send(&Pdu::DataOut(d_out), &[0xaa; 512]);
    let Pdu::Reject(r) = ini.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(r.reason, 0x09);
    // A SNACK at ErrorRecoveryLevel 0: protocol error.
    let snack = Snack {
        snack_type: SnackType::Status,
        lun: 0,
        itt: RESERVED_TAG,
        ttt_or_snack_tag: 0,
        exp_stat_sn: ini.exp_stat_sn,
        beg_run: 0,
        run_length: 0,
    };
    ini.send(&Pdu::Snack(snack), &[]);
    let Pdu::Reject(r) = ini.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(r.reason, 0x04);
    // A command above MaxCmdSN is ignored: no answer; the next in-window one is answered.
    let tur = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: 0,
        itt: 4242,
        expected_data_transfer_length: 0,
        cmd_sn: ini.max_cmd_sn.wrapping_add(1),
        exp_stat_sn: ini.exp_stat_sn,
        cdb: [0; 16],
    };
    ini.send(&Pdu::ScsiCommand(tur), &[]);
    assert_eq!(ini.tur(), 0, "the session goes on after an ignored command");
    // A NOP-Out ping comes back with its data.
    let itt = ini.itt();
    let nop =
        NopOut { immediate: true, lun: 0, itt, ttt: RESERVED_TAG, cmd_sn: ini.cmd_sn, exp_stat_sn: ini.exp_stat_sn };
    ini.send(&Pdu::NopOut(nop), b"ping-data");
    let g = ini.recv();
    let Pdu::NopIn(n) = g.pdu else { panic!("expected a NOP-In, got {:?}", g.pdu) };
    assert_eq!((n.itt, n.ttt, g.data.as_slice()), (itt, RESERVED_TAG, &b"ping-data"[..]));
    assert_eq!(ini.tur(), 0);
    still_serves(d.port, &iqn, 1);
    d.d.assert_serving();
}

#[test]
fn fatal_input_ends_only_its_connection() {
    let dir = TempDir::new("iscsi-fatal");
    let (d, iqn) = setup(&dir, "0x3");
    // A data segment over the target's MaxRecvDataSegmentLength (64 KiB).
    let mut ini = Ini::login(d.port, Some(&iqn), InitiatorOptions::default()).unwrap();
    let mut bhs = [0u8; BHS_LEN];
    bhs[0] = 0x40; // immediate NOP-Out
    bhs[1] = 0x80;
    bhs[5..8].copy_from_slice(&[0x10, 0x00, 0x00]); // 1 MiB
    bhs[16..20].copy_from_slice(&5u32.to_be_bytes());
    bhs[20..24].copy_from_slice(&RESERVED_TAG.to_be_bytes());
    ini.s.write_all(&bhs).unwrap();
    assert!(closed_within(&mut ini.s, Duration::from_secs(5)), "an oversized data segment does not end the connection");
    // A header digest that does not match, on a session with header digests.
    let opts = InitiatorOptions { header_digest: DigestPolicy::Required, ..InitiatorOptions::default() };
    let mut ini = Ini::login(d.port, Some(&iqn), opts).unwrap();
    assert!(ini.tx.header_digest);
    assert_eq!(ini.tur(), 0);
    let tur = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: 0,
        itt: 99,
        expected_data_transfer_length: 0,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
        cdb: [0; 16],
    };
    let mut wire = ferrite_iscsi::pdu::encode_to_vec(&ini.tx, &Pdu::ScsiCommand(tur), &[], &[]).unwrap();
    wire[BHS_LEN] ^= 0xff;
    ini.s.write_all(&wire).unwrap();
    assert!(closed_within(&mut ini.s, Duration::from_secs(5)), "a bad header digest does not end the connection");
    still_serves(d.port, &iqn, 2);
    d.wait_connections(0, Duration::from_secs(5));
}

#[test]
fn a_connection_dropped_mid_write_leaves_the_target_serving() {
    let dir = TempDir::new("iscsi-drop");
    let (d, iqn) = setup(&dir, "0x3");
    let mut ini = Ini::login(d.port, Some(&iqn), no_immediate()).unwrap();
    let itt = ini.itt();
    let cmd = ini.write_cmd(itt, 0, 128, true); // 64 KiB
    ini.send(&Pdu::ScsiCommand(cmd), &[]);
    let Pdu::R2t(r) = ini.recv().pdu else { panic!("expected an R2T") };
    assert_eq!((r.itt, r.buffer_offset, r.desired_data_transfer_length), (itt, 0, 64 << 10));
    let half =
        DataOut { final_: false, lun: 0, itt, ttt: r.ttt, exp_stat_sn: ini.exp_stat_sn, data_sn: 0, buffer_offset: 0 };
    ini.send(&Pdu::DataOut(half), &[7u8; 8192]);
    // Half a PDU, then gone.
    let wire = ferrite_iscsi::pdu::encode_to_vec(
        &ini.tx,
        &Pdu::DataOut(DataOut { data_sn: 1, buffer_offset: 8192, ..half }),
        &[],
        &[7u8; 8192],
    )
    .unwrap();
    ini.s.write_all(&wire[..4000]).unwrap();
    drop(ini);
    still_serves(d.port, &iqn, 3);
    d.wait_connections(0, Duration::from_secs(5));
    d.d.assert_serving();
}

#[test]
fn abort_task_of_a_write_waiting_for_its_data() {
    let dir = TempDir::new("iscsi-abort");
    let (d, iqn) = setup(&dir, "0x1");
    let mut ini = Ini::login(d.port, Some(&iqn), no_immediate()).unwrap();
    let itt = ini.itt();
    let cmd_sn = ini.cmd_sn;
    let cmd = ini.write_cmd(itt, 0, 16, true);
    ini.send(&Pdu::ScsiCommand(cmd), &[]);
    let Pdu::R2t(r) = ini.recv().pdu else { panic!("expected an R2T") };
    let tmf_itt = ini.itt();
    let tmf = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::AbortTask as u8,
        lun: 0,
        itt: tmf_itt,
        referenced_task_tag: itt,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
        ref_cmd_sn: cmd_sn,
        exp_data_sn: 0,
    };
    ini.send(&Pdu::TaskMgmtRequest(tmf), &[]);
    let Pdu::TaskMgmtResponse(t) = ini.recv().pdu else { panic!("expected a task management response") };
    assert_eq!((t.itt, t.response), (tmf_itt, 0), "ABORT TASK: function complete");
    // Its data comes now anyway: rejected as for no command; nothing else is answered for it.
    let d_out =
        DataOut { final_: true, lun: 0, itt, ttt: r.ttt, exp_stat_sn: ini.exp_stat_sn, data_sn: 0, buffer_offset: 0 };
    ini.send(&Pdu::DataOut(d_out), &[1u8; 8192]);
    let Pdu::Reject(j) = ini.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(j.reason, 0x09);
    assert_eq!(ini.tur(), 0);
    // An ABORT TASK of a task that has ended: task does not exist.
    let tmf = TaskMgmtRequest { itt: ini.itt(), cmd_sn: ini.cmd_sn, exp_stat_sn: ini.exp_stat_sn, ..tmf };
    ini.send(&Pdu::TaskMgmtRequest(tmf), &[]);
    let Pdu::TaskMgmtResponse(t) = ini.recv().pdu else { panic!("expected a task management response") };
    assert_eq!(t.response, 1);
    let reset = TaskMgmtRequest {
        function: TmfFunction::LogicalUnitReset as u8,
        itt: ini.itt(),
        referenced_task_tag: RESERVED_TAG,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
        ..tmf
    };
    ini.send(&Pdu::TaskMgmtRequest(reset), &[]);
    let Pdu::TaskMgmtResponse(t) = ini.recv().pdu else { panic!("expected a task management response") };
    assert_eq!(t.response, 0);
    // The reset's unit attention, then ready.
    assert_eq!(ini.tur(), 2);
    assert_eq!(ini.tur(), 0);
}

#[test]
fn data_digests_end_to_end() {
    let dir = TempDir::new("iscsi-digest");
    let d = IscsiDaemon::start(&dir, "0x3");
    d.malloc("Malloc0", 32768, 512);
    let iqn = d.target("disk1", "Malloc0", json!({"header_digest": true, "data_digest": true}));
    // The node requires digests: an initiator that will not use them cannot log in.
    let off =
        InitiatorOptions { header_digest: DigestPolicy::Off, data_digest: DigestPolicy::Off, ..Default::default() };
    assert!(Ini::login(d.port, Some(&iqn), off).is_err());
    let opts = InitiatorOptions {
        header_digest: DigestPolicy::Allowed,
        data_digest: DigestPolicy::Allowed,
        max_recv_data_segment_length: 8192,
        ..Default::default()
    };
    let mut ini = Ini::login(d.port, Some(&iqn), opts).unwrap();
    assert!(ini.tx.header_digest && ini.tx.data_digest && ini.rx.data_digest);
    let data = pattern(11, 256 << 10);
    assert_eq!(ini.write10(8, &data).status, 0);
    let r = ini.read10(8, 512);
    assert_eq!(r.status, 0);
    assert!(r.data == data, "read back differs");
    // A Data-Out whose data digest is wrong: Reject (data digest error), and the write ends
    // with CHECK CONDITION (ABORTED COMMAND) once its data is in.
    // (Another ISID: the same one would reinstate, and so close, the first session.)
    let mut ini2 = Ini::login_with(d.port, Some(&iqn), |c| {
        c.options = InitiatorOptions { immediate_data: false, ..opts };
        c.isid = ferrite_iscsi::pdu::Isid([0x80, 0, 0, 2, 0, 0]);
    })
    .unwrap();
    let itt = ini2.itt();
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    cdb[8] = 1;
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: 0,
        itt,
        expected_data_transfer_length: 512,
        cmd_sn: ini2.cmd_sn,
        exp_stat_sn: ini2.exp_stat_sn,
        cdb,
    };
    ini2.send(&Pdu::ScsiCommand(cmd), &[]);
    let Pdu::R2t(r) = ini2.recv().pdu else { panic!("expected an R2T") };
    let d_out =
        DataOut { final_: true, lun: 0, itt, ttt: r.ttt, exp_stat_sn: ini2.exp_stat_sn, data_sn: 0, buffer_offset: 0 };
    let mut wire = ferrite_iscsi::pdu::encode_to_vec(&ini2.tx, &Pdu::DataOut(d_out), &[], &[3u8; 512]).unwrap();
    let last = wire.len() - 1;
    wire[last] ^= 0xff;
    ini2.s.write_all(&wire).unwrap();
    let Pdu::Reject(j) = ini2.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(j.reason, 0x02);
    let g = ini2.recv();
    let Pdu::ScsiResponse(resp) = g.pdu else { panic!("expected a SCSI Response, got {:?}", g.pdu) };
    assert_eq!((resp.itt, resp.status), (itt, 2));
    assert_eq!(g.data[2 + 2] & 0x0f, 0x0b, "ABORTED COMMAND");
    assert_eq!(ini.tur(), 0);
    // The same initiator port logging in again reinstates its session: the old one closes.
    let mut again = Ini::login(d.port, Some(&iqn), opts).unwrap();
    assert!(closed_within(&mut ini.s, Duration::from_secs(5)), "the reinstated session's connection stays");
    assert_eq!(again.tur(), 0);
}

#[test]
fn connections_that_never_log_in_are_closed_at_the_deadline() {
    let dir = TempDir::new("iscsi-silent");
    let (d, iqn) = setup(&dir, "0x3");
    let limit = raise_nofile();
    let n = 1000.min(limit.saturating_sub(100) as usize);
    let t0 = Instant::now();
    let mut silent: Vec<_> = (0..n).map(|_| connect(d.port)).collect();
    // Others still log in and do I/O meanwhile.
    still_serves(d.port, &iqn, 4);
    let deadline = Instant::now() + Duration::from_secs(8);
    while d.connections().len() < n {
        assert!(Instant::now() < deadline, "the target lists {} of {n} connections", d.connections().len());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The login deadline is 10 s; the watchdog looks once a second.
    for s in silent.iter_mut().step_by(97) {
        let left = Duration::from_secs(14).saturating_sub(t0.elapsed());
        assert!(closed_within(s, left.max(Duration::from_millis(100))), "a silent connection outlived the deadline");
    }
    d.wait_connections(0, Duration::from_secs(5));
    println!("{n} silent connections closed {:.1} s after they came", t0.elapsed().as_secs_f64());
    still_serves(d.port, &iqn, 5);
    d.d.assert_serving();
}

/// Raises this process's soft limit of open files to the hard limit and returns it.
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

#[test]
fn data_in_and_r2t_sequences_follow_the_negotiated_bursts() {
    let dir = TempDir::new("iscsi-bursts");
    let (d, iqn) = setup(&dir, "0x1");
    let opts = InitiatorOptions {
        max_burst_length: 65536,
        first_burst_length: 8192,
        max_recv_data_segment_length: 16384,
        ..InitiatorOptions::default()
    };
    let mut ini = Ini::login(d.port, Some(&iqn), opts).unwrap();
    assert_eq!(ini.negotiated.session.max_burst_length, 65536);
    // A 256 KiB write: 8 KiB immediate, then one R2T at a time (MaxOutstandingR2T=1) of at
    // most MaxBurstLength, R2TSN counting up.
    let data = pattern(21, 256 << 10);
    let itt = ini.itt();
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    cdb[7..9].copy_from_slice(&512u16.to_be_bytes());
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: 0,
        itt,
        expected_data_transfer_length: 256 << 10,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
        cdb,
    };
    ini.cmd_sn += 1;
    ini.send(&Pdu::ScsiCommand(cmd), &data[..8192]);
    let mut r2ts = Vec::new();
    loop {
        let g = ini.recv();
        match g.pdu {
            Pdu::R2t(r) => {
                assert_eq!(r.r2t_sn as usize, r2ts.len(), "R2TSN");
                assert!(r.desired_data_transfer_length <= 65536);
                r2ts.push((r.buffer_offset, r.desired_data_transfer_length));
                let end = r.buffer_offset + r.desired_data_transfer_length;
                send_sequence(&mut ini, itt, r.ttt, &data, r.buffer_offset as usize, end as usize, 16384);
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!((r.itt, r.status), (itt, 0));
                assert_eq!(r.exp_data_sn as usize, r2ts.len(), "ExpDataSN counts the R2Ts");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut expect = 8192u32;
    for (off, len) in &r2ts {
        assert_eq!(*off, expect, "R2Ts continue where the data is");
        expect += len;
    }
    assert_eq!(expect, 256 << 10);
    // A 256 KiB read: Data-In of at most 16 KiB, F at each 64 KiB, DataSN from 0, the status
    // in the last one.
    let itt = ini.itt();
    cdb[0] = 0x28;
    let cmd =
        ScsiCommand { read: true, write: false, itt, cmd_sn: ini.cmd_sn, exp_stat_sn: ini.exp_stat_sn, cdb, ..cmd };
    ini.cmd_sn += 1;
    ini.send(&Pdu::ScsiCommand(cmd), &[]);
    let mut got = Vec::new();
    let mut sn = 0;
    loop {
        let g = ini.recv();
        let Pdu::DataIn(din) = g.pdu else { panic!("expected Data-In, got {:?}", g.pdu) };
        assert_eq!((din.itt, din.data_sn, din.buffer_offset as usize), (itt, sn, got.len()));
        assert!(g.data.len() <= 16384);
        got.extend_from_slice(&g.data);
        let burst_end = got.len() % 65536 == 0;
        assert_eq!(din.final_, burst_end, "F at each MaxBurstLength (at {})", got.len());
        sn += 1;
        if din.status_present {
            assert_eq!(got.len(), 256 << 10);
            assert_eq!((din.status, din.residual_count), (0, 0));
            break;
        }
    }
    assert!(got == data, "read back differs");
}

/// One Data-Out sequence of `data[from..to]` in PDUs of `pdu` bytes, with `ttt` (an R2T's, or
/// RESERVED_TAG: unsolicited).
fn send_sequence(ini: &mut Ini, itt: u32, ttt: u32, data: &[u8], from: usize, to: usize, pdu: usize) {
    let (mut off, mut sn) = (from, 0);
    while off < to {
        let n = (to - off).min(pdu);
        let d_out = DataOut {
            final_: off + n == to,
            lun: 0,
            itt,
            ttt,
            exp_stat_sn: ini.exp_stat_sn,
            data_sn: sn,
            buffer_offset: off as u32,
        };
        ini.send(&Pdu::DataOut(d_out), &data[off..off + n]);
        off += n;
        sn += 1;
    }
}

#[test]
fn unsolicited_data_out_under_initial_r2t_no() {
    let dir = TempDir::new("iscsi-unsol");
    let d = IscsiDaemon::start_with_options(&dir, "0x1", Some(json!({"first_burst_length": 32768})));
    d.malloc("Malloc0", 32768, 512);
    let iqn = d.target("disk1", "Malloc0", json!({}));
    let mut ini = Ini::login(d.port, Some(&iqn), InitiatorOptions::default()).unwrap();
    let p = &ini.negotiated.session;
    assert!(!p.initial_r2t, "the target takes InitialR2T=No when the initiator asks");
    assert_eq!(p.first_burst_length, 32768);
    // A 128 KiB write: 8 KiB immediate (F 0), 24 KiB unsolicited in 8 KiB Data-Outs, then the
    // rest through R2Ts that start after the first burst.
    let data = pattern(31, 128 << 10);
    let itt = ini.itt();
    let cmd = ini.write_cmd(itt, 0, 256, false);
    ini.send(&Pdu::ScsiCommand(cmd), &data[..8192]);
    send_sequence(&mut ini, itt, RESERVED_TAG, &data, 8192, 32768, 8192);
    let mut expect = 32768u32;
    loop {
        let g = ini.recv();
        match g.pdu {
            Pdu::R2t(r) => {
                assert_eq!(r.buffer_offset, expect, "R2Ts continue after the first burst");
                let end = r.buffer_offset + r.desired_data_transfer_length;
                send_sequence(&mut ini, itt, r.ttt, &data, r.buffer_offset as usize, end as usize, 8192);
                expect = end;
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!((r.itt, r.status), (itt, 0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(expect, 128 << 10);
    let r = ini.read10(0, 256);
    assert!(r.status == 0 && r.data == data, "read back differs");
    // No immediate data at all: a 16 KiB write whose whole first burst is unsolicited.
    let small = pattern(32, 16 << 10);
    let itt = ini.itt();
    let cmd = ini.write_cmd(itt, 0, 32, false);
    ini.send(&Pdu::ScsiCommand(cmd), &[]);
    send_sequence(&mut ini, itt, RESERVED_TAG, &small, 0, small.len(), 4096);
    let Pdu::ScsiResponse(r) = ini.recv().pdu else { panic!("expected the write's response") };
    assert_eq!((r.itt, r.status), (itt, 0));
    let r = ini.read10(0, 32);
    assert!(r.status == 0 && r.data == small, "read back differs");
    // Unsolicited Data-Out for no command: Reject (invalid PDU field), the session goes on.
    send_sequence(&mut ini, 0x5555, RESERVED_TAG, &small, 0, 512, 512);
    let Pdu::Reject(j) = ini.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(j.reason, 0x09);
    // F 0 after a whole first burst of immediate data: no unsolicited data may follow.
    let itt = ini.itt();
    let cmd = ini.write_cmd(itt, 0, 16, false);
    ini.send(&Pdu::ScsiCommand(cmd), &data[..8192]);
    let Pdu::Reject(j) = ini.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(j.reason, 0x04, "protocol error");
    assert_eq!(ini.tur(), 0);
    // Under InitialR2T=Yes (the initiator's choice), F 0 on a write is a protocol error.
    let opts = InitiatorOptions { initial_r2t: true, ..InitiatorOptions::default() };
    let mut strict = Ini::login(d.port, Some(&iqn), opts).unwrap();
    assert!(strict.negotiated.session.initial_r2t);
    let itt = strict.itt();
    let cmd = strict.write_cmd(itt, 0, 16, false);
    strict.send(&Pdu::ScsiCommand(cmd), &data[..4096]);
    let Pdu::Reject(j) = strict.recv().pdu else { panic!("expected a Reject") };
    assert_eq!(j.reason, 0x04, "protocol error");
    assert_eq!(strict.tur(), 0);
    still_serves(d.port, &iqn, 3);
    d.d.assert_serving();
}
