//! PDU codec tests: byte vectors from RFC 3720/7143 and from what libiscsi sends, every
//! check's error, the decoder's stages.

use super::*;
use crate::digest;

fn target_rx() -> PduParams {
    PduParams { header_digest: false, data_digest: false, max_data_segment: 262_144 }
}

/// libiscsi's first Login Request without CHAP (lib/login.c `iscsi_login_async` with no user
/// set: CSG=LoginOperationalNegotiation, NSG=FullFeature, T=1, immediate; keys in the order
/// its `iscsi_login_add_*` calls append them; defaults from lib/init.c `iscsi_create_context`;
/// ISID from `iscsi_set_isid_random(rnd=0x123456, qualifier=0)`; CmdSN and ITT as
/// `rand()` gave them, here 0x1000 and 0x2000; ExpStatSN = statsn + 1 as lib/socket.c sets
/// it when the PDU goes out).
fn libiscsi_login_text() -> Vec<u8> {
    let keys = [
        "InitiatorName=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
        "TargetName=iqn.2016-06.io.spdk:disk1",
        "SessionType=Normal",
        "HeaderDigest=None,CRC32C",
        "DataDigest=None",
        "InitialR2T=No",
        "ImmediateData=Yes",
        "MaxBurstLength=262144",
        "FirstBurstLength=262144",
        "DefaultTime2Wait=2",
        "DefaultTime2Retain=0",
        "MaxOutstandingR2T=1",
        "ErrorRecoveryLevel=0",
        "IFMarker=No",
        "OFMarker=No",
        "MaxConnections=1",
        "MaxRecvDataSegmentLength=262144",
        "DataPDUInOrder=Yes",
        "DataSequenceInOrder=Yes",
    ];
    let mut t = Vec::new();
    for k in keys {
        t.extend_from_slice(k.as_bytes());
        t.push(0);
    }
    t
}

fn libiscsi_login_bytes() -> Vec<u8> {
    let text = libiscsi_login_text();
    let mut b = vec![0u8; 48];
    b[0] = 0x43; // ISCSI_PDU_LOGIN_REQUEST | ISCSI_PDU_IMMEDIATE
    b[1] = 0x80 | 0x04 | 0x03; // TRANSIT | CSG_OPNEG | NSG_FF
    let len = text.len() as u32;
    b[4..8].copy_from_slice(&len.to_be_bytes()); // scsi_set_uint32(&hdr[4], size)
    b[8..14].copy_from_slice(&[0x80, 0x12, 0x34, 0x56, 0x00, 0x00]);
    b[16..20].copy_from_slice(&0x2000u32.to_be_bytes());
    b[24..28].copy_from_slice(&0x1000u32.to_be_bytes());
    b[28..32].copy_from_slice(&1u32.to_be_bytes());
    b.extend_from_slice(&text);
    while !b.len().is_multiple_of(4) {
        b.push(0);
    }
    b
}

#[test]
fn libiscsi_login_request_decodes() {
    let wire = libiscsi_login_bytes();
    let d = decode_whole(Role::Target, &PduParams::LOGIN, &wire).unwrap().unwrap();
    assert_eq!(d.len, wire.len());
    let Pdu::LoginRequest(r) = d.header.pdu else { panic!("{:?}", d.header.pdu) };
    assert!(r.transit && !r.continue_);
    assert_eq!((r.csg, r.nsg), (1, 3));
    assert_eq!(Stage::from_bits(r.csg), Some(Stage::Operational));
    assert_eq!((r.version_max, r.version_min), (0, 0));
    assert_eq!(r.isid, Isid([0x80, 0x12, 0x34, 0x56, 0, 0]));
    assert_eq!(r.isid.kind(), 2);
    assert_eq!(r.isid.to_u64(), 0x8012_3456_0000);
    assert_eq!((r.tsih, r.itt, r.cid, r.cmd_sn, r.exp_stat_sn), (0, 0x2000, 0, 0x1000, 1));
    assert_eq!(d.data, libiscsi_login_text().as_slice());
    assert_eq!(d.data_digest, DigestCheck::Absent);
    // And the same bytes come out of the encoder.
    let again = encode_to_vec(&PduParams::LOGIN, &d.header.pdu, &[], d.data).unwrap();
    assert_eq!(again, wire);
}

#[test]
fn rfc3720_read10_vector() {
    // RFC 3720 appendix B.4: "An iSCSI - SCSI Read (10) Command PDU" and its CRC32C.
    let mut b = [0u8; 48];
    b[0] = 0x01;
    b[1] = 0xc0;
    b[16] = 0x14;
    b[22] = 0x04;
    b[27] = 0x14;
    b[31] = 0x18;
    b[32] = 0x28;
    b[40] = 0x02;
    let mut wire = b.to_vec();
    wire.extend_from_slice(&[0x56, 0x3a, 0x96, 0xd9]);
    let params = PduParams { header_digest: true, ..target_rx() };
    let d = decode_whole(Role::Target, &params, &wire).unwrap().unwrap();
    let Pdu::ScsiCommand(c) = d.header.pdu else { panic!() };
    assert!(!c.immediate && c.final_ && c.read && !c.write);
    assert_eq!(c.attr, TaskAttr::Untagged);
    assert_eq!((c.itt, c.expected_data_transfer_length, c.cmd_sn, c.exp_stat_sn), (0x1400_0000, 1024, 0x14, 0x18));
    // READ(10) of LBA 0, 2 blocks: bytes 40 and 41 of the PDU are the CDB's 8th and 9th.
    assert_eq!(c.cdb[..10], [0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0]);
    assert_eq!(encode_to_vec(&params, &d.header.pdu, &[], &[]).unwrap(), wire);
    // One bit off in the header: a fatal header digest error.
    wire[20] ^= 1;
    let e = decode_whole(Role::Target, &params, &wire).unwrap().unwrap_err();
    assert!(matches!(e, PduError::HeaderDigest { received: 0xd996_3a56, .. }) && e.is_fatal());
    assert_eq!(e.reject_reason(), None);
}

#[test]
fn libiscsi_write16_with_immediate_data() {
    // lib/iscsi-command.c `iscsi_scsi_command_async` for a 4 KiB WRITE(16) to LUN 1 with
    // ImmediateData=Yes and FirstBurstLength ≥ 4096: flags F|W|ATTR_SIMPLE, the LUN through
    // `scsi_set_uint16(&hdr[8], lun)`, EDTL 4096, the data appended as immediate data.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[13] = 8;
    let data = vec![0x5au8; 4096];
    let mut b = vec![0u8; 48];
    b[0] = 0x01;
    b[1] = 0x80 | 0x20 | 0x01;
    b[4..8].copy_from_slice(&4096u32.to_be_bytes());
    b[8..10].copy_from_slice(&1u16.to_be_bytes());
    b[16..20].copy_from_slice(&7u32.to_be_bytes());
    b[20..24].copy_from_slice(&4096u32.to_be_bytes());
    b[24..28].copy_from_slice(&0x1001u32.to_be_bytes());
    b[28..32].copy_from_slice(&0x42u32.to_be_bytes());
    b[32..48].copy_from_slice(&cdb);
    b.extend_from_slice(&data);
    let d = decode_whole(Role::Target, &target_rx(), &b).unwrap().unwrap();
    let Pdu::ScsiCommand(c) = d.header.pdu else { panic!() };
    assert_eq!(c.lun, 1 << 48);
    assert!(c.write && c.final_ && !c.read && c.attr == TaskAttr::Simple);
    assert_eq!(d.header.ahs.cdb(&c.cdb, d.ahs).len(), 16);
    assert_eq!(d.data.len(), 4096);
    assert_eq!(encode_to_vec(&target_rx(), &d.header.pdu, &[], &data).unwrap(), b);
}

#[test]
fn data_digest_covers_padding() {
    let pdu = Pdu::NopOut(NopOut { immediate: true, lun: 0, itt: 5, ttt: RESERVED_TAG, cmd_sn: 1, exp_stat_sn: 2 });
    let params = PduParams { header_digest: true, data_digest: true, max_data_segment: 8192 };
    let wire = encode_to_vec(&params, &pdu, &[], b"ping!").unwrap();
    // 48 + 4 header digest + 5 data + 3 padding + 4 data digest.
    assert_eq!(wire.len(), 64);
    assert_eq!(&wire[57..60], &[0, 0, 0]);
    assert_eq!(digest::from_wire([wire[60], wire[61], wire[62], wire[63]]), digest::crc32c(b"ping!\0\0\0"));
    let d = decode_whole(Role::Target, &params, &wire).unwrap().unwrap();
    assert_eq!((d.data, d.data_digest), (&b"ping!"[..], DigestCheck::Ok));
    let mut bad = wire.clone();
    bad[58] = 1; // a padding byte: covered by the digest
    let d = decode_whole(Role::Target, &params, &bad).unwrap().unwrap();
    assert!(matches!(d.data_digest, DigestCheck::Mismatch { .. }));
}

fn bhs_of(op: u8, flags: u8) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[0] = op;
    b[1] = flags;
    b
}

fn check(role: Role, b: &[u8; 48], ahs: &[u8]) -> Result<Header, PduError> {
    check_header(role, &target_rx(), b, ahs, None)
}

#[test]
fn opcode_checks() {
    for op in 0u8..64 {
        let mut b = bhs_of(op, 0x80);
        b[0] |= 0x40; // immediate, for NOP-Out's reserved ITT rule
        if op == 0x31 {
            b[47] = 1; // R2T needs a length
        }
        let known = Opcode::from_u8(op);
        for role in [Role::Initiator, Role::Target] {
            let r = check(role, &b, &[]);
            match known {
                None => assert_eq!(r.unwrap_err(), PduError::UnknownOpcode { opcode: op }),
                Some(o) if o.sender() == role => {
                    let e = r.unwrap_err();
                    assert_eq!(e, PduError::WrongDirection { opcode: o });
                    assert_eq!(e.reject_reason(), Some(RejectReason::ProtocolError));
                }
                Some(o) => assert_eq!(r.map(|h| h.pdu.opcode()), Ok(o), "{o}"),
            }
        }
    }
    assert_eq!(PduError::UnknownOpcode { opcode: 0x1c }.reject_reason(), Some(RejectReason::CommandNotSupported));
}

#[test]
fn field_checks() {
    let t = Role::Target;
    let inv = |op: Opcode, offset: u16, value: u32| Err(PduError::InvalidField { opcode: op, offset, value });
    // SCSI Command: reserved ATTR, W=0 and F=0, no direction with a length.
    assert_eq!(check(t, &bhs_of(0x01, 0x85), &[]).map(|_| ()), inv(Opcode::ScsiCommand, 1, 0x85));
    assert_eq!(check(t, &bhs_of(0x01, 0x41), &[]).map(|_| ()), inv(Opcode::ScsiCommand, 1, 0x41));
    let mut b = bhs_of(0x01, 0x80);
    b[23] = 1;
    assert_eq!(check(t, &b, &[]).map(|_| ()), inv(Opcode::ScsiCommand, 1, 0x80));
    // NOP-Out with the reserved ITT must be immediate.
    let mut b = bhs_of(0x00, 0x80);
    b[16..20].fill(0xff);
    assert_eq!(check(t, &b, &[]).map(|_| ()), inv(Opcode::NopOut, 0, 0));
    b[0] = 0x40;
    assert!(check(t, &b, &[]).is_ok());
    // Text Request with F and C.
    assert_eq!(check(t, &bhs_of(0x04, 0xc0), &[]).map(|_| ()), inv(Opcode::TextRequest, 1, 0xc0));
    // Reserved logout reason and SNACK type.
    assert_eq!(check(t, &bhs_of(0x06, 0x83), &[]).map(|_| ()), inv(Opcode::LogoutRequest, 1, 0x83));
    assert_eq!(check(t, &bhs_of(0x10, 0x84), &[]).map(|_| ()), inv(Opcode::Snack, 1, 0x84));
    // Task management and logout carry neither AHS nor data.
    let mut b = bhs_of(0x02, 0x81);
    b[7] = 4;
    assert_eq!(check(t, &b, &[]).map(|_| ()), inv(Opcode::TaskMgmtRequest, 5, 4));
    let mut b = bhs_of(0x06, 0x80);
    b[4] = 2;
    let ahs = [0, 5, 2, 0, 0, 0, 0, 1];
    assert_eq!(check(t, &b, &ahs).map(|_| ()), inv(Opcode::LogoutRequest, 4, 2));
    // Initiator side: R2T with reserved TTT or no length, Data-In with S but not F, SCSI
    // Response with O and U.
    let i = Role::Initiator;
    let mut b = bhs_of(0x31, 0x80);
    b[20..24].fill(0xff);
    b[47] = 1;
    assert_eq!(check(i, &b, &[]).map(|_| ()), inv(Opcode::R2t, 20, RESERVED_TAG));
    assert_eq!(check(i, &bhs_of(0x31, 0x80), &[]).map(|_| ()), inv(Opcode::R2t, 44, 0));
    assert_eq!(check(i, &bhs_of(0x25, 0x01), &[]).map(|_| ()), inv(Opcode::DataIn, 1, 0x01));
    assert_eq!(check(i, &bhs_of(0x21, 0x86), &[]).map(|_| ()), inv(Opcode::ScsiResponse, 1, 0x86));
    assert_eq!(check(i, &bhs_of(0x24, 0xc0), &[]).map(|_| ()), inv(Opcode::TextResponse, 1, 0xc0));
    // Login CSG/NSG stay raw: the login answers them.
    let h = check(t, &bhs_of(0x43, 0x8a), &[]).unwrap();
    let Pdu::LoginRequest(r) = h.pdu else { panic!() };
    assert_eq!((r.csg, r.nsg, Stage::from_bits(r.csg), Stage::from_bits(r.nsg)), (2, 2, None, None));
    // Reserved bytes are ignored.
    let mut b = bhs_of(0x05, 0x80);
    b[2] = 0xff;
    b[24..28].fill(0xff);
    b[44..48].fill(0xff);
    assert!(check(t, &b, &[]).is_ok());
}

#[test]
fn ahs_checks() {
    let t = Role::Target;
    let mut b = bhs_of(0x01, 0xe1); // F R W, bidirectional
    b[23] = 8;
    // Bidirectional without its read length AHS.
    assert_eq!(check(t, &b, &[]).unwrap_err(), PduError::InvalidAhs { opcode: Opcode::ScsiCommand, at: 0 });
    // With it, and an extended CDB of 32 bytes (16 more: AHSLength 17, 20 bytes, no pad).
    let mut ahs = vec![0, 5, 2, 0, 0, 0, 0x10, 0];
    let ext: Vec<u8> = (16u8..32).collect();
    ahs.extend_from_slice(&[0, 17, 1, 0]);
    ahs.extend_from_slice(&ext);
    b[4] = (ahs.len() / 4) as u8;
    let h = check(t, &b, &ahs).unwrap();
    assert_eq!(h.ahs.bidi_read_length, Some(0x1000));
    let Pdu::ScsiCommand(c) = h.pdu else { panic!() };
    let mut head = [0u8; 16];
    head.copy_from_slice(&(0u8..16).collect::<Vec<_>>());
    let mut c2 = c;
    c2.cdb = head;
    let cdb = h.ahs.cdb(&c2.cdb, &ahs);
    assert_eq!(cdb.len(), 32);
    let mut all = [0u8; 40];
    assert_eq!(cdb.copy_to(&mut all), 32);
    assert_eq!(all[..32], (0u8..32).collect::<Vec<_>>()[..]);
    assert_eq!((cdb.get(31), cdb.get(32)), (Some(31), None));
    // The encoder writes the same AHS.
    let enc =
        encode_to_vec(&target_rx(), &Pdu::ScsiCommand(c), &[Ahs::BidiReadLength(0x1000), Ahs::ExtendedCdb(&ext)], &[])
            .unwrap();
    assert_eq!(&enc[48..], &ahs[..]);
    let bad = |ahs: &[u8], at| {
        let mut b = b;
        b[4] = (ahs.len() / 4) as u8;
        assert_eq!(check(t, &b, ahs).unwrap_err(), PduError::InvalidAhs { opcode: Opcode::ScsiCommand, at }, "{ahs:?}");
    };
    bad(&[0, 5, 2, 0, 0, 0, 0, 1, 0, 5, 2, 0, 0, 0, 0, 1], 8); // twice
    bad(&[0, 4, 2, 0, 0, 0, 0, 1], 0); // wrong length
    bad(&[0, 5, 3, 0, 0, 0, 0, 1], 0); // reserved type
    bad(&[0, 5, 2, 0, 0, 0, 0, 1, 0, 9, 1, 0], 8); // runs past TotalAHSLength
    bad(&[0, 5, 2, 0, 0, 0, 0, 1, 0, 1, 1, 0], 8); // an empty extended CDB
    bad(&[0, 5, 0, 0, 0, 0, 0, 1], 0); // type 0
}

#[test]
fn data_limit_is_fatal() {
    let mut b = bhs_of(0x05, 0x80);
    b[5..8].copy_from_slice(&[0, 0x20, 0x01]); // 8193
    let e = check_header(Role::Target, &PduParams::LOGIN, &b, &[], None).unwrap_err();
    assert_eq!(e, PduError::DataSegmentTooLong { opcode: 5, len: 8193, limit: 8192 });
    assert!(e.is_fatal());
    assert_eq!(frame_status(&b, &PduParams::LOGIN), Err(e));
    let mut dec = Decoder::new(Role::Target);
    assert_eq!(dec.feed(&b), Err(e));
    assert_eq!(dec.want(), Want::Closed);
    assert_eq!(dec.feed(&[0]), Err(e));
    assert_eq!(dec.failure(), Some(e));
}

#[test]
fn frame_status_counts() {
    let params = PduParams { header_digest: true, data_digest: true, max_data_segment: 8192 };
    let pdu = Pdu::TextRequest(TextRequest {
        immediate: true,
        final_: true,
        continue_: false,
        lun: 0,
        itt: 1,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 1,
    });
    let wire = encode_to_vec(&params, &pdu, &[], b"SendTargets=All\0").unwrap();
    assert_eq!(wire.len(), 48 + 4 + 16 + 4);
    assert_eq!(frame_status(&[], &params), Ok(FrameStatus::Need(48)));
    assert_eq!(frame_status(&wire[..10], &params), Ok(FrameStatus::Need(38)));
    assert_eq!(frame_status(&wire[..48], &params), Ok(FrameStatus::Need(24)));
    assert_eq!(frame_status(&wire, &params), Ok(FrameStatus::Complete { len: 72 }));
    assert!(decode_whole(Role::Target, &params, &wire[..71]).is_none());
    assert_eq!(pdu_len(wire.first_chunk::<48>().unwrap(), &params), 72);
    assert_eq!(padding(0) + padding(4) + padding(1) + padding(2) + padding(3), 3 + 2 + 1);
}

#[test]
fn decoder_invalid_pdu_is_skipped() {
    // An unknown opcode with 5 data bytes, then a valid NOP-Out: the first is reported and
    // skipped with its data, padding and digest; the second decodes.
    let params = PduParams { header_digest: false, data_digest: true, max_data_segment: 8192 };
    let mut bad = bhs_of(0x1c, 0x80).to_vec();
    bad[7] = 5;
    bad.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0, 0, 9, 9, 9, 9]);
    let nop = Pdu::NopOut(NopOut { immediate: true, lun: 0, itt: 1, ttt: RESERVED_TAG, cmd_sn: 0, exp_stat_sn: 0 });
    let good = encode_to_vec(&params, &nop, &[], &[]).unwrap();
    let mut stream = bad.clone();
    stream.extend_from_slice(&good);
    let mut dec = Decoder::with_params(Role::Target, params);
    let fed = dec.feed(&stream).unwrap();
    assert_eq!(fed.consumed, 48);
    let Some(Event::Invalid(inv)) = fed.event else { panic!("{fed:?}") };
    assert_eq!(inv.error, PduError::UnknownOpcode { opcode: 0x1c });
    assert_eq!(inv.bhs[..], bad[..48]);
    assert_eq!(dec.want(), Want::Bytes(12));
    let fed2 = dec.feed(&stream[48..]).unwrap();
    assert_eq!(fed2.consumed, 12 + 48);
    let Some(Event::Header(h)) = fed2.event else { panic!("{fed2:?}") };
    assert_eq!(h.pdu, nop);
}

#[test]
fn decoder_data_digest_error_is_not_fatal() {
    let params = PduParams { header_digest: true, data_digest: true, max_data_segment: 8192 };
    let out =
        Pdu::DataOut(DataOut { final_: true, lun: 0, itt: 3, ttt: 9, exp_stat_sn: 1, data_sn: 0, buffer_offset: 0 });
    let mut a = encode_to_vec(&params, &out, &[], &[7u8; 10]).unwrap();
    let b = encode_to_vec(&params, &out, &[], &[8u8; 12]).unwrap();
    let n = a.len();
    a[n - 1] ^= 0xff; // the first PDU's data digest
    a.extend_from_slice(&b);
    let mut dec = Decoder::with_params(Role::Target, params);
    let mut events = Vec::new();
    let mut buf = &a[..];
    while !buf.is_empty() {
        let fed = match dec.want() {
            Want::Data(_) => dec.data(buf),
            _ => dec.feed(buf).unwrap(),
        };
        buf = &buf[fed.consumed..];
        events.extend(fed.event);
    }
    assert_eq!(events.len(), 4);
    assert!(matches!(events[1], Event::DataDigestError { .. }));
    assert_eq!(events[3], Event::DataEnd);
}

#[test]
fn decoder_exposes_ahs() {
    let cmd = Pdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: 0,
        itt: 1,
        expected_data_transfer_length: 512,
        cmd_sn: 1,
        exp_stat_sn: 1,
        cdb: [0x7f; 16],
    });
    let ext = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let wire = encode_to_vec(&target_rx(), &cmd, &[Ahs::ExtendedCdb(&ext)], &[]).unwrap();
    let mut dec = Decoder::with_params(Role::Target, target_rx());
    assert_eq!(dec.ahs(), &[] as &[u8]);
    let fed = dec.feed(&wire).unwrap();
    let Some(Event::Header(h)) = fed.event else { panic!() };
    let Pdu::ScsiCommand(c) = h.pdu else { panic!() };
    let cdb = h.ahs.cdb(&c.cdb, dec.ahs());
    assert_eq!(cdb.len(), 24);
    assert_eq!(cdb.ext, &ext);
    assert_eq!(dec.bhs()[..], wire[..48]);
}

#[test]
fn encoder_refuses() {
    let tmf = Pdu::TaskMgmtResponse(TaskMgmtResponse { response: 0, itt: 1, stat_sn: 1, exp_cmd_sn: 1, max_cmd_sn: 1 });
    let mut out = [0u8; 256];
    assert_eq!(
        encode(&mut out, &target_rx(), &tmf, &[], &[b"x"]),
        Err(EncodeError::Unexpected { opcode: Opcode::TaskMgmtResponse })
    );
    let nop = Pdu::NopIn(NopIn { lun: 0, itt: 1, ttt: RESERVED_TAG, stat_sn: 1, exp_cmd_sn: 1, max_cmd_sn: 1 });
    let big = vec![0u8; 8193];
    assert_eq!(
        encode(&mut out, &PduParams::LOGIN, &nop, &[], &[&big]),
        Err(EncodeError::DataTooLong { len: 8193, limit: 8192 })
    );
    assert_eq!(encode(&mut out[..40], &target_rx(), &nop, &[], &[]), Err(EncodeError::BufferTooSmall { need: 48 }));
    let long = [0u8; 1100];
    assert_eq!(
        encode(&mut out, &target_rx(), &nop, &[Ahs::ExtendedCdb(&long)], &[]),
        Err(EncodeError::AhsTooLong { len: 1104 })
    );
    let f = encode(&mut out, &target_rx(), &nop, &[], &[b"abc", b"de"]).unwrap();
    assert_eq!((f.head_len, f.data_len, f.pad_len, f.data_digest, f.wire_len()), (48, 5, 3, None, 56));
}
