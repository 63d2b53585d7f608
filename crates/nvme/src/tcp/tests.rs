//! Unit tests of the PDU codec against byte vectors written out from the specification's
//! layouts (offsets from the start of the PDU), and of every check the decoder makes.

use super::digest::crc32c;
use super::encoder::MAX_HEAD_LEN;
use super::pdu::{flags as fl, offset};
use super::*;

mod proptests;

/// What decoding produced, data gathered per PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Got {
    Header(Header),
    Data(Vec<u8>),
    DataEnd,
    DigestError,
    Error(PduError),
}

/// Feeds `wire` to `dec` in chunks whose sizes `sizes` gives (cycled), placing data in a
/// buffer of its own; sets `on_ic` as the parameters once an ICReq or ICResp arrives.
pub(super) fn run(dec: &mut Decoder, wire: &[u8], sizes: &[usize], on_ic: Option<Negotiated>) -> Vec<Got> {
    run_with(dec, wire, sizes, on_ic, false)
}

/// [`run`], trying [`Decoder::capsule_in_place`] before every [`Decoder::feed`] when `fast`
/// (as the target's reader does): the events must be the same either way.
pub(super) fn run_with(
    dec: &mut Decoder,
    wire: &[u8],
    sizes: &[usize],
    on_ic: Option<Negotiated>,
    fast: bool,
) -> Vec<Got> {
    let mut out = Vec::new();
    let mut data = Vec::new();
    let mut pos = 0;
    let mut turn = 0;
    while pos < wire.len() {
        let size = sizes.get(turn % sizes.len().max(1)).copied().unwrap_or(usize::MAX).max(1);
        turn += 1;
        let end = pos.saturating_add(size).min(wire.len());
        let mut chunk = &wire[pos..end];
        pos = end;
        while !chunk.is_empty() {
            let event = match dec.want() {
                Want::Closed => return out,
                Want::Data(n) => {
                    assert!(n > 0);
                    let fed = dec.data(chunk);
                    assert!(fed.consumed > 0);
                    data.extend_from_slice(&chunk[..fed.consumed]);
                    chunk = &chunk[fed.consumed..];
                    fed.event
                }
                Want::Bytes(n) => {
                    // Header steps stay within the staging area; padding (skipped, not
                    // staged) within PDO.
                    assert!(n > 0 && n <= 255);
                    let in_place = if fast { dec.capsule_in_place(chunk) } else { None };
                    if let Some((used, data_len)) = in_place {
                        let sqe: [u8; 64] = chunk[pdu::CH_LEN..pdu::CH_LEN + 64].try_into().unwrap();
                        assert!(used == 72 || used == 76);
                        chunk = &chunk[used..];
                        Some(Event::Header(Header { pdu: Pdu::CapsuleCmd(CapsuleCmd { sqe }), data_len }))
                    } else {
                        match dec.feed(chunk) {
                            Ok(fed) => {
                                assert!(fed.consumed > 0 || fed.event.is_some());
                                chunk = &chunk[fed.consumed..];
                                fed.event
                            }
                            Err(e) => {
                                out.push(Got::Error(e));
                                return out;
                            }
                        }
                    }
                }
            };
            match event {
                None => {}
                Some(Event::Header(h)) => {
                    if let (Pdu::IcReq(_) | Pdu::IcResp(_), Some(n)) = (h.pdu, on_ic) {
                        dec.set_params(n);
                    }
                    out.push(Got::Header(h));
                }
                Some(Event::DataEnd) => {
                    out.push(Got::Data(std::mem::take(&mut data)));
                    out.push(Got::DataEnd);
                }
                Some(Event::DataDigestError { .. }) => {
                    out.push(Got::Data(std::mem::take(&mut data)));
                    out.push(Got::DigestError);
                }
            }
        }
    }
    out
}

fn whole(dec: &mut Decoder, wire: &[u8]) -> Vec<Got> {
    run(dec, wire, &[usize::MAX], None)
}

fn params(hdgst: bool, ddgst: bool, hpda: u8, cpda: u8) -> Negotiated {
    Negotiated { header_digest: hdgst, data_digest: ddgst, hpda, cpda, maxh2cdata: 8192 }
}

fn controller(p: Negotiated) -> Decoder {
    Decoder::initialized(Role::Controller, p, 4096)
}

fn host(p: Negotiated) -> Decoder {
    Decoder::initialized(Role::Host, p, 0)
}

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

fn header(pdu: Pdu, data_len: u32) -> Got {
    Got::Header(Header { pdu, data_len })
}

/// The only error decoding `wire` gives.
fn error_of(dec: &mut Decoder, wire: &[u8]) -> PduError {
    match whole(dec, wire).pop() {
        Some(Got::Error(e)) => e,
        other => panic!("no error: {other:?}"),
    }
}

fn ic_req_bytes() -> Vec<u8> {
    let mut b = vec![0u8; 128];
    b[..8].copy_from_slice(&[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
    b[8..10].copy_from_slice(&[0, 0]); // PFV 0
    b[10] = 2; // HPDA: 12-byte alignment
    b[11] = 0x03; // DGST: header and data digests
    b[12..16].copy_from_slice(&le32(15)); // MAXR2T
    b
}

#[test]
fn ic_req_vector() {
    let b = ic_req_bytes();
    let want = IcReq { pfv: 0, hpda: 2, hdgst: true, ddgst: true, maxr2t: 15 };
    let mut dec = Decoder::new(Role::Controller);
    assert!(!dec.is_initialized());
    assert_eq!(whole(&mut dec, &b), vec![header(Pdu::IcReq(want), 0)]);
    assert!(dec.is_initialized());
    let mut out = [0u8; 256];
    assert_eq!(encode_contiguous(&mut out, &Negotiated::INITIAL, &Pdu::IcReq(want), &[]), Ok(128));
    assert_eq!(&out[..128], &b[..]);
    // Whatever was negotiated, IC PDUs carry no digest and no padding.
    let f = encode(&mut out, &params(true, true, 31, 31), &Pdu::IcReq(want), &[]).unwrap();
    assert_eq!((f.head_len, f.plen, f.pdo, f.data_digest), (128, 128, 0, None));
}

#[test]
fn ic_resp_vector() {
    let mut b = vec![0u8; 128];
    b[..8].copy_from_slice(&[0x01, 0x00, 128, 0, 128, 0, 0, 0]);
    b[10] = 1; // CPDA: 8-byte alignment
    b[11] = 0x01; // DGST: header digests only
    b[12..16].copy_from_slice(&le32(131_072)); // MAXH2CDATA
    b[100] = 0xee; // reserved: ignored
    let want = IcResp { pfv: 0, cpda: 1, hdgst: true, ddgst: false, maxh2cdata: 131_072 };
    let mut dec = Decoder::new(Role::Host);
    assert_eq!(whole(&mut dec, &b), vec![header(Pdu::IcResp(want), 0)]);
    let mut out = [0u8; 128];
    encode_contiguous(&mut out, &Negotiated::INITIAL, &Pdu::IcResp(want), &[]).unwrap();
    b[100] = 0;
    assert_eq!(&out[..], &b[..]);
}

fn sqe(opcode: u8, cid: u16) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opcode;
    s[2..4].copy_from_slice(&cid.to_le_bytes());
    for (i, b) in s.iter_mut().enumerate().skip(4) {
        *b = i as u8;
    }
    s
}

#[test]
fn capsule_cmd_vector_with_digests() {
    // HDGST and DDGST, CPDA 0: data at 72 + 4 = 76, PLEN 76 + 8 + 4.
    let s = sqe(0x01, 0x1234);
    let data = *b"8 bytes!";
    let mut b = vec![0x04, fl::HDGSTF | fl::DDGSTF, 72, 76];
    b.extend_from_slice(&le32(88));
    b.extend_from_slice(&s);
    let hd = crc32c(&b[..72]);
    b.extend_from_slice(&le32(hd));
    b.extend_from_slice(&data);
    b.extend_from_slice(&le32(crc32c(&data)));
    let p = params(true, true, 0, 0);
    let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: s });
    assert_eq!(whole(&mut controller(p), &b), vec![header(cmd, 8), Got::Data(data.to_vec()), Got::DataEnd]);
    let mut out = [0u8; 128];
    assert_eq!(encode_contiguous(&mut out, &p, &cmd, &[b"8 by", b"tes!"]), Ok(88));
    assert_eq!(&out[..88], &b[..]);
}

#[test]
fn capsule_cmd_padding_and_no_data() {
    // CPDA 3 (16 bytes): with a header digest the data moves from 76 to 80.
    let p = params(true, false, 0, 3);
    let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x01, 7) });
    let mut out = [0u8; 256];
    let f = encode(&mut out, &p, &cmd, &[&[0xab; 20]]).unwrap();
    assert_eq!((f.head_len, f.pdo, f.plen, f.data_digest), (80, 80, 100, None));
    assert_eq!(&out[..4], &[0x04, fl::HDGSTF, 72, 80]);
    assert_eq!(&out[76..80], &[0, 0, 0, 0]);
    let n = encode_contiguous(&mut out, &p, &cmd, &[&[0xab; 20]]).unwrap();
    assert_eq!(whole(&mut controller(p), &out[..n]), vec![header(cmd, 20), Got::Data(vec![0xab; 20]), Got::DataEnd]);
    // Without data: PDO 0, no DDGSTF even with data digests on.
    let p = params(true, true, 0, 3);
    let f = encode(&mut out, &p, &cmd, &[]).unwrap();
    assert_eq!((f.head_len, f.pdo, f.plen, f.data_digest), (76, 0, 76, None));
    assert_eq!(out[1], fl::HDGSTF);
    assert_eq!(whole(&mut controller(p), &out[..76]), vec![header(cmd, 0)]);
}

#[test]
fn capsules_run_in_place() {
    let mut out = [0u8; 256];
    for (hdgst, ddgst) in [(false, false), (true, false), (true, true)] {
        let p = params(hdgst, ddgst, 0, 0);
        let hl = if hdgst { 76 } else { 72 };
        // No data: the header is taken, the next PDU follows.
        let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x02, 9) });
        let n = encode_contiguous(&mut out, &p, &cmd, &[]).unwrap();
        let mut dec = controller(p);
        assert_eq!(dec.capsule_in_place(&out[..n]), Some((hl, 0)));
        assert_eq!(dec.want(), Want::Bytes(8));
        // In-capsule data: the caller places it next.
        let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x01, 9) });
        let n = encode_contiguous(&mut out, &p, &cmd, &[&[7; 16]]).unwrap();
        let mut dec = controller(p);
        assert_eq!(dec.capsule_in_place(&out[..n]), Some((hl, 16)));
        assert_eq!(dec.want(), Want::Data(16));
        let fed = dec.data(&out[hl..hl + 16]);
        let fed = if ddgst { dec.feed(&out[hl + 16..n]).unwrap() } else { fed };
        assert_eq!(fed.event, Some(Event::DataEnd));
        // Not all here, a Fabrics command, or after part of a header: left to feed.
        let mut dec = controller(p);
        assert_eq!(dec.capsule_in_place(&out[..hl - 1]), None);
        assert_eq!(dec.feed(&out[..3]).unwrap().consumed, 3);
        assert_eq!(dec.capsule_in_place(&out[3..n]), None);
        let fabrics = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x7f, 1) });
        let n = encode_contiguous(&mut out, &p, &fabrics, &[]).unwrap();
        assert_eq!(controller(p).capsule_in_place(&out[..n]), None);
    }
    // A bad header digest is left to feed, which fails with it.
    let p = params(true, false, 0, 0);
    let n = encode_contiguous(&mut out, &p, &Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x02, 1) }), &[]).unwrap();
    out[20] ^= 1;
    let mut dec = controller(p);
    assert_eq!(dec.capsule_in_place(&out[..n]), None);
    assert!(matches!(dec.feed(&out[..n]), Err(PduError::HeaderDigest { .. })));
}

#[test]
fn capsule_resp_vector() {
    let mut cqe = [0u8; 16];
    cqe[12..14].copy_from_slice(&0x1234u16.to_le_bytes()); // CID
    cqe[14] = 0x01; // phase
    let mut b = vec![0x05, 0x00, 24, 0];
    b.extend_from_slice(&le32(24));
    b.extend_from_slice(&cqe);
    let resp = Pdu::CapsuleResp(CapsuleResp { cqe });
    assert_eq!(whole(&mut host(params(false, true, 0, 0)), &b), vec![header(resp, 0)]);
    let mut out = [0u8; 64];
    assert_eq!(encode_contiguous(&mut out, &params(false, true, 0, 0), &resp, &[]), Ok(24));
    assert_eq!(&out[..24], &b[..]);
    // With a header digest: HDGSTF and PLEN 28.
    let p = params(true, false, 0, 0);
    let n = encode_contiguous(&mut out, &p, &resp, &[]).unwrap();
    assert_eq!(n, 28);
    assert_eq!(&out[..8], &[0x05, fl::HDGSTF, 24, 0, 28, 0, 0, 0]);
    assert_eq!(&out[24..28], &le32(crc32c(&out[..24])));
    assert_eq!(whole(&mut host(p), &out[..28]), vec![header(resp, 0)]);
}

#[test]
fn h2c_data_vector() {
    // CPDA 3 (16 bytes), no digests: data at 32 after 8 bytes of padding.
    let mut b = vec![0x06, fl::LAST_PDU, 24, 32];
    b.extend_from_slice(&le32(32 + 5));
    b.extend_from_slice(&0x0007u16.to_le_bytes()); // CCCID
    b.extend_from_slice(&0x0003u16.to_le_bytes()); // TTAG
    b.extend_from_slice(&le32(0x1000)); // DATAO
    b.extend_from_slice(&le32(5)); // DATAL
    b.extend_from_slice(&[0; 4]); // reserved
    b.extend_from_slice(&[0; 8]); // padding
    b.extend_from_slice(b"hello");
    let d = H2cData { cccid: 7, ttag: 3, datao: 0x1000, datal: 5, last: true };
    let p = params(false, false, 0, 3);
    let got = whole(&mut controller(p), &b);
    assert_eq!(got, vec![header(Pdu::H2cData(d), 5), Got::Data(b"hello".to_vec()), Got::DataEnd]);
    let mut out = [0u8; 64];
    assert_eq!(encode_contiguous(&mut out, &p, &Pdu::H2cData(d), &[b"hello"]), Ok(37));
    assert_eq!(&out[..37], &b[..]);
}

#[test]
fn c2h_data_vector() {
    // HPDA 0, data digest: data right after the header at 24.
    let mut b = vec![0x07, fl::DDGSTF | fl::LAST_PDU | fl::SUCCESS, 24, 24];
    b.extend_from_slice(&le32(24 + 6 + 4));
    b.extend_from_slice(&0xbeefu16.to_le_bytes()); // CCCID
    b.extend_from_slice(&[0xaa, 0xbb]); // reserved: ignored
    b.extend_from_slice(&le32(4096)); // DATAO
    b.extend_from_slice(&le32(6)); // DATAL
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(b"world!");
    b.extend_from_slice(&le32(crc32c(b"world!")));
    let d = C2hData { cccid: 0xbeef, datao: 4096, datal: 6, last: true, success: true };
    let p = params(false, true, 0, 0);
    assert_eq!(whole(&mut host(p), &b), vec![header(Pdu::C2hData(d), 6), Got::Data(b"world!".to_vec()), Got::DataEnd]);
    let mut out = [0u8; 64];
    encode_contiguous(&mut out, &p, &Pdu::C2hData(d), &[b"world!"]).unwrap();
    b[10] = 0;
    b[11] = 0;
    assert_eq!(&out[..34], &b[..]);
}

#[test]
fn r2t_vector() {
    let mut b = vec![0x09, 0x00, 24, 0];
    b.extend_from_slice(&le32(24));
    b.extend_from_slice(&0x0011u16.to_le_bytes()); // CCCID
    b.extend_from_slice(&0x0022u16.to_le_bytes()); // TTAG
    b.extend_from_slice(&le32(8192)); // R2TO
    b.extend_from_slice(&le32(65536)); // R2TL
    b.extend_from_slice(&[0; 4]);
    let r = R2t { cccid: 0x11, ttag: 0x22, r2to: 8192, r2tl: 65536 };
    assert_eq!(whole(&mut host(params(false, false, 0, 0)), &b), vec![header(Pdu::R2t(r), 0)]);
    let mut out = [0u8; 32];
    assert_eq!(encode_contiguous(&mut out, &params(false, false, 0, 0), &Pdu::R2t(r), &[]), Ok(24));
    assert_eq!(&out[..24], &b[..]);
}

#[test]
fn term_req_vectors() {
    // H2CTermReq: FES 01h, FEI 3, then the offending 8-byte common header. Termination
    // requests never carry digests, even when they were negotiated.
    let bad = [0x04u8, 0, 72, 0, 72, 0, 0, 0];
    let mut b = vec![0x02, 0x00, 24, 0];
    b.extend_from_slice(&le32(32));
    b.extend_from_slice(&1u16.to_le_bytes()); // FES
    b.extend_from_slice(&le32(3)); // FEI
    b.extend_from_slice(&[0; 10]);
    b.extend_from_slice(&bad);
    let t = TermReq { fes: 1, fei: 3 };
    let p = params(true, true, 0, 0);
    let got = whole(&mut controller(p), &b);
    assert_eq!(got, vec![header(Pdu::H2cTermReq(t), 8), Got::Data(bad.to_vec()), Got::DataEnd]);
    let mut out = [0u8; 200];
    assert_eq!(encode_term_req(&mut out, Role::Host, Fes::InvalidHeaderField, 3, &bad), Ok(32));
    assert_eq!(&out[..32], &b[..]);

    // C2HTermReq to a host, before initialization (a refused ICReq), with no data.
    let mut b = vec![0x03, 0x00, 24, 0];
    b.extend_from_slice(&le32(24));
    b.extend_from_slice(&6u16.to_le_bytes());
    b.extend_from_slice(&le32(8));
    b.extend_from_slice(&[0; 10]);
    let t = TermReq { fes: 6, fei: 8 };
    assert_eq!(whole(&mut Decoder::new(Role::Host), &b), vec![header(Pdu::C2hTermReq(t), 0)]);
    assert_eq!(encode_term_req(&mut out, Role::Controller, Fes::UnsupportedParameter, 8, &[]), Ok(24));
    assert_eq!(&out[..24], &b[..]);

    // FEI is reserved for the other statuses; data is capped at 128 bytes.
    let n = encode_term_req(&mut out, Role::Controller, Fes::HeaderDigestError, 77, &[0x55; 140]).unwrap();
    assert_eq!(n, 152);
    let got = whole(&mut host(p), &out[..n]);
    assert_eq!(got[0], header(Pdu::C2hTermReq(TermReq { fes: 3, fei: 0 }), 128));
}

#[test]
fn one_byte_at_a_time_and_many_at_once() {
    let p = params(true, true, 2, 1);
    let mut wire = vec![0u8; 4096];
    let mut n = 0;
    let pdus: [(Pdu, &[u8]); 4] = [
        (Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x01, 1) }), b"in-capsule"),
        (Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x02, 2) }), b""),
        (Pdu::H2cData(H2cData { cccid: 1, ttag: 9, datao: 0, datal: 3, last: true }), b"abc"),
        (Pdu::H2cTermReq(TermReq { fes: 2, fei: 0 }), b""),
    ];
    let mut want = Vec::new();
    for (pdu, data) in pdus {
        n += encode_contiguous(&mut wire[n..], &p, &pdu, &[data]).unwrap();
        want.push(header(pdu, data.len() as u32));
        if !data.is_empty() {
            want.push(Got::Data(data.to_vec()));
            want.push(Got::DataEnd);
        }
    }
    let wire = &wire[..n];
    for sizes in [&[1usize][..], &[usize::MAX], &[3, 7, 1, 64], &[100, 1]] {
        assert_eq!(run(&mut controller(p), wire, sizes, None), want, "chunks {sizes:?}");
    }
}

#[test]
fn want_never_reads_past_a_step() {
    // A caller reading straight from a socket asks for exactly what `want` says.
    let p = params(true, true, 0, 3);
    let mut wire = [0u8; 256];
    let d = H2cData { cccid: 1, ttag: 1, datao: 0, datal: 9, last: false };
    let n = encode_contiguous(&mut wire, &p, &Pdu::H2cData(d), &[b"123456789"]).unwrap();
    let mut dec = controller(p);
    let mut pos = 0;
    let mut steps = Vec::new();
    while pos < n {
        match dec.want() {
            Want::Bytes(k) => {
                steps.push(("bytes", k));
                let fed = dec.feed(&wire[pos..pos + k]).unwrap();
                assert_eq!(fed.consumed, k);
                pos += k;
            }
            Want::Data(k) => {
                steps.push(("data", k as usize));
                assert_eq!(dec.data(&wire[pos..pos + k as usize]).consumed, k as usize);
                pos += k as usize;
            }
            Want::Closed => unreachable!(),
        }
    }
    // Common header, rest of the header and its digest, padding from 28 to 32, data, digest.
    assert_eq!(steps, vec![("bytes", 8), ("bytes", 20), ("bytes", 4), ("data", 9), ("bytes", 4)]);
}

#[test]
fn decoder_owns_no_heap() {
    // No field needs dropping: the decoder holds no allocation, whatever it is fed.
    assert!(!std::mem::needs_drop::<Decoder>());
    assert!(std::mem::size_of::<Decoder>() < 512);
}

#[test]
fn data_over_a_scatter_list() {
    let p = params(false, true, 0, 0);
    let mut wire = [0u8; 128];
    let d = H2cData { cccid: 1, ttag: 1, datao: 0, datal: 10, last: true };
    let n = encode_contiguous(&mut wire, &p, &Pdu::H2cData(d), &[b"0123456789"]).unwrap();
    let mut dec = controller(p);
    let fed = dec.feed(&wire[..n]).unwrap();
    assert_eq!(fed.consumed, 24);
    assert_eq!(dec.want(), Want::Data(10));
    // The caller received the data into three buffers of its own.
    let (a, b, c) = (&wire[24..27], &wire[27..28], &wire[28..34]);
    assert_eq!(dec.data_sg(&[a, b, c]), Fed { consumed: 10, event: None });
    assert_eq!(dec.want(), Want::Bytes(4));
    assert_eq!(dec.feed(&wire[34..n]).unwrap().event, Some(Event::DataEnd));
    assert_eq!(dec.want(), Want::Bytes(8));
}

#[test]
fn data_digest_error_is_not_fatal() {
    let p = params(true, true, 0, 0);
    let mut wire = vec![0u8; 512];
    let d = H2cData { cccid: 1, ttag: 1, datao: 0, datal: 4, last: true };
    let mut n = encode_contiguous(&mut wire, &p, &Pdu::H2cData(d), &[b"data"]).unwrap();
    wire[n - 5] ^= 0x40; // the last data byte
    let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(2, 2) });
    n += encode_contiguous(&mut wire[n..], &p, &cmd, &[]).unwrap();
    let got = run(&mut controller(p), &wire[..n], &[5], None);
    let d_pdu = Pdu::H2cData(d);
    assert_eq!(got, vec![header(d_pdu, 4), Got::Data(b"dat!".to_vec()), Got::DigestError, header(cmd, 0)]);
}

#[test]
fn sticky_failure_and_received_header() {
    let p = params(false, false, 0, 0);
    let mut dec = controller(p);
    // An R2T sent to a controller: refused at its common header.
    let wire = [0x09u8, 0, 24, 0, 24, 0, 0, 0, 1, 2, 3];
    let e = dec.feed(&wire).unwrap_err();
    assert_eq!(e, PduError::WrongDirection { pdu_type: PduType::R2t });
    assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidHeaderField), 0));
    assert_eq!(dec.received_header(), &wire[..8]);
    assert_eq!(dec.want(), Want::Closed);
    assert_eq!(dec.feed(&[0; 8]), Err(e));
    assert_eq!(dec.data(&[0; 8]).consumed, 0);
    assert_eq!(dec.failure(), Some(e));

    // A bad PSH: the whole header is reported.
    let mut dec = Decoder::new(Role::Controller);
    let mut b = ic_req_bytes();
    b[10] = 32; // HPDA
    assert_eq!(
        dec.feed(&b).unwrap_err(),
        PduError::InvalidField { pdu_type: PduType::IcReq, offset: offset::HPDA, value: 32 }
    );
    assert_eq!(dec.received_header(), &b[..]);
    let mut out = [0u8; 200];
    let e = dec.failure().unwrap();
    let n = encode_term_req(&mut out, Role::Controller, e.fes().unwrap(), e.fei(), dec.received_header()).unwrap();
    assert_eq!(n, 24 + 128);
    let got = whole(&mut Decoder::new(Role::Host), &out[..n]);
    assert_eq!(got, vec![header(Pdu::C2hTermReq(TermReq { fes: 1, fei: 10 }), 128), Got::Data(b), Got::DataEnd]);
}

/// A common header with a zeroed PSH of `hlen` bytes and `extra` bytes after it.
fn raw(t: u8, f: u8, hlen: u8, pdo: u8, plen: u32, extra: usize) -> Vec<u8> {
    let mut b = vec![t, f, hlen, pdo];
    b.extend_from_slice(&le32(plen));
    b.resize(usize::from(hlen) + extra, 0);
    b
}

fn invalid(t: PduType, at: u8) -> (Option<Fes>, u32, Option<PduType>) {
    (Some(Fes::InvalidHeaderField), u32::from(at), Some(t))
}

fn summary(e: PduError) -> (Option<Fes>, u32, Option<PduType>) {
    (e.fes(), e.fei(), e.pdu_type())
}

#[test]
fn pdu_type_and_sequence_checks() {
    let p = params(false, false, 0, 0);
    for t in [0x08u8, 0x0a, 0x0b, 0x0c, 0x7f, 0xff] {
        let e = error_of(&mut controller(p), &raw(t, 0, 24, 0, 24, 0));
        assert_eq!(e, PduError::UnknownType { pdu_type: t });
        assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidHeaderField), 0));
    }
    // Each end refuses the other's PDUs.
    for t in [0x01u8, 0x03, 0x05, 0x07, 0x09] {
        let e = error_of(&mut controller(p), &raw(t, 0, 24, 0, 24, 0));
        assert!(matches!(e, PduError::WrongDirection { .. }), "{e}");
    }
    for t in [0x00u8, 0x02, 0x04, 0x06] {
        let e = error_of(&mut host(p), &raw(t, 0, 24, 0, 24, 0));
        assert!(matches!(e, PduError::WrongDirection { .. }), "{e}");
    }
    // Nothing but ICReq (or a termination request) before initialization...
    let e = error_of(&mut Decoder::new(Role::Controller), &raw(0x04, 0, 72, 0, 72, 0));
    assert_eq!(e, PduError::NotInitialized { pdu_type: PduType::CapsuleCmd });
    assert_eq!((e.fes(), e.fei()), (Some(Fes::PduSequenceError), 0));
    let e = error_of(&mut Decoder::new(Role::Host), &raw(0x05, 0, 24, 0, 24, 0));
    assert_eq!(e.fes(), Some(Fes::PduSequenceError));
    // ...and no second one.
    let mut dec = Decoder::new(Role::Controller);
    let mut two = ic_req_bytes();
    two.extend_from_slice(&ic_req_bytes());
    let got = whole(&mut dec, &two);
    assert_eq!(got[1], Got::Error(PduError::RepeatedIc { pdu_type: PduType::IcReq }));
    let e = error_of(&mut controller(p), &ic_req_bytes());
    assert_eq!(e.fes(), Some(Fes::PduSequenceError));
}

#[test]
fn flags_checks() {
    use PduType as T;
    let none = params(false, false, 0, 0);
    let both = params(true, true, 0, 0);
    let cases: Vec<(Decoder, Vec<u8>, PduType)> = vec![
        // Bits a type does not define.
        (controller(none), raw(0x02, fl::HDGSTF, 24, 0, 24, 0), T::H2cTermReq),
        (controller(none), raw(0x06, fl::SUCCESS | fl::LAST_PDU, 24, 24, 25, 1), T::H2cData),
        (controller(none), raw(0x04, 0x10, 72, 0, 72, 0), T::CapsuleCmd),
        (host(none), raw(0x05, fl::LAST_PDU, 24, 0, 24, 0), T::CapsuleResp),
        (host(none), raw(0x09, 0x80, 24, 0, 24, 0), T::R2t),
        (Decoder::new(Role::Controller), raw(0x00, 0x01, 128, 0, 128, 0), T::IcReq),
        // SUCCESS without LAST_PDU.
        (host(none), raw(0x07, fl::SUCCESS, 24, 24, 25, 1), T::C2hData),
        // Digest flags that disagree with what was negotiated.
        (controller(both), raw(0x04, 0, 72, 0, 72, 0), T::CapsuleCmd),
        (controller(none), raw(0x04, fl::HDGSTF, 72, 0, 76, 4), T::CapsuleCmd),
        (host(both), raw(0x05, 0, 24, 0, 28, 4), T::CapsuleResp),
        // DDGSTF goes with data: missing on data, present without data or on a type without.
        (controller(both), raw(0x04, fl::HDGSTF, 72, 76, 80, 8), T::CapsuleCmd),
        (controller(both), raw(0x04, fl::HDGSTF | fl::DDGSTF, 72, 0, 76, 4), T::CapsuleCmd),
        (host(both), raw(0x09, fl::HDGSTF | fl::DDGSTF, 24, 0, 28, 4), T::R2t),
    ];
    for (mut dec, b, t) in cases {
        let e = error_of(&mut dec, &b);
        assert_eq!(summary(e), invalid(t, offset::FLAGS), "{b:?}: {e}");
    }
}

#[test]
fn hlen_checks() {
    let p = params(false, false, 0, 0);
    for (mut dec, b, t) in [
        (controller(p), raw(0x04, 0, 24, 0, 72, 48), PduType::CapsuleCmd),
        (controller(p), raw(0x06, 0, 72, 0, 100, 0), PduType::H2cData),
        (host(p), raw(0x05, 0, 0, 0, 24, 24), PduType::CapsuleResp),
        (host(p), raw(0x03, 0, 128, 0, 128, 0), PduType::C2hTermReq),
        (Decoder::new(Role::Host), raw(0x01, 0, 24, 0, 128, 104), PduType::IcResp),
    ] {
        let e = error_of(&mut dec, &b);
        assert_eq!(summary(e), invalid(t, offset::HLEN), "{e}");
    }
}

#[test]
fn pdo_checks() {
    use PduType as T;
    let p = params(false, false, 0, 1); // CPDA 1: 8-byte alignment of H2C data
    let hd = params(true, false, 0, 1);
    for (mut dec, b, t) in [
        // Types without aligned data have PDO 0.
        (host(p), raw(0x09, 0, 24, 24, 24, 0), T::R2t),
        (host(p), raw(0x05, 0, 24, 4, 24, 0), T::CapsuleResp),
        (controller(p), raw(0x02, 0, 24, 24, 30, 6), T::H2cTermReq),
        (Decoder::new(Role::Controller), raw(0x00, 0, 128, 128, 128, 0), T::IcReq),
        // Data inside the header or its digest.
        (controller(p), raw(0x04, 0, 72, 64, 80, 8), T::CapsuleCmd),
        (controller(hd), raw(0x06, fl::HDGSTF, 24, 24, 40, 16), T::H2cData),
        // Off the alignment: 28 is a dword but not a multiple of 8.
        (controller(hd), raw(0x06, fl::HDGSTF, 24, 28, 40, 16), T::H2cData),
        // Past PLEN.
        (controller(p), raw(0x06, 0, 24, 32, 30, 6), T::H2cData),
        // Data without PDO.
        (controller(p), raw(0x06, 0, 24, 0, 30, 6), T::H2cData),
    ] {
        let e = error_of(&mut dec, &b);
        assert_eq!(summary(e), invalid(t, offset::PDO), "{b:?}: {e}");
    }
    // The alignment is the receiver's: a host (HPDA 0) takes C2H data at 28.
    let c2h = C2hData { cccid: 1, datao: 0, datal: 4, last: false, success: false };
    let mut out = [0u8; 64];
    let n = encode_contiguous(&mut out, &hd, &Pdu::C2hData(c2h), &[b"abcd"]).unwrap();
    assert_eq!(out[3], 28);
    assert_eq!(whole(&mut host(hd), &out[..n])[0], header(Pdu::C2hData(c2h), 4));
}

#[test]
fn any_aligned_pdo_is_taken() {
    // A sender may pad more than it must: PDO 252 after a 24-byte header (4-byte alignment).
    let p = params(false, false, 0, 0);
    let mut b = data_psh(0x06, fl::LAST_PDU, 252 + 4, 1, 2, 0, 4);
    b[3] = 252;
    b.resize(252, 0x5a);
    b.extend_from_slice(b"data");
    let mut dec = controller(p);
    assert_eq!(dec.feed(&b[..24]).unwrap(), Fed { consumed: 24, event: None });
    assert_eq!(dec.want(), Want::Bytes(228));
    let d = H2cData { cccid: 1, ttag: 2, datao: 0, datal: 4, last: true };
    assert_eq!(
        dec.feed(&b[24..]).unwrap(),
        Fed { consumed: 228, event: Some(Event::Header(Header { pdu: Pdu::H2cData(d), data_len: 4 })) }
    );
    assert_eq!(dec.want(), Want::Data(4));
}

#[test]
fn plen_checks() {
    use PduType as T;
    let p = params(false, false, 0, 0);
    let dd = params(false, true, 0, 0);
    for (mut dec, b, t) in [
        (Decoder::new(Role::Controller), raw(0x00, 0, 128, 0, 127, 0), T::IcReq),
        (Decoder::new(Role::Host), raw(0x01, 0, 128, 0, 132, 4), T::IcResp),
        (host(p), raw(0x05, 0, 24, 0, 28, 4), T::CapsuleResp),
        (host(p), raw(0x09, 0, 24, 0, 20, 0), T::R2t),
        (controller(p), raw(0x04, 0, 72, 0, 71, 0), T::CapsuleCmd),
        (controller(p), raw(0x04, 0, 72, 0, 0, 0), T::CapsuleCmd),
        // Data PDUs whose PLEN leaves nothing after PDO but the digest (or nothing at all).
        (controller(dd), raw(0x06, fl::DDGSTF, 24, 24, 28, 4), T::H2cData),
        (controller(p), raw(0x06, 0, 24, 32, 32, 8), T::H2cData),
    ] {
        let e = error_of(&mut dec, &b);
        assert_eq!(summary(e), invalid(t, offset::PLEN), "{b:?}: {e}");
    }
    // A termination request outside 24..=152 ends the connection without a reply.
    for plen in [0u32, 23, 153, u32::MAX] {
        let e = error_of(&mut controller(p), &raw(0x02, 0, 24, 0, plen, 0));
        assert_eq!(e, PduError::TermReqLength { pdu_type: T::H2cTermReq, plen });
        assert_eq!(e.fes(), None);
    }
}

#[test]
fn header_digest_checks() {
    let p = params(true, false, 0, 0);
    let mut out = [0u8; 64];
    let r = Pdu::R2t(R2t { cccid: 5, ttag: 6, r2to: 0, r2tl: 512 });
    let n = encode_contiguous(&mut out, &p, &r, &[]).unwrap();
    let good = crc32c(&out[..24]);
    for i in [8, 12, 19, 23, 24, 27] {
        let mut b = out;
        b[i] ^= 0x01;
        let e = error_of(&mut host(p), &b[..n]);
        assert!(matches!(e, PduError::HeaderDigest { pdu_type: PduType::R2t, .. }), "{e}");
        assert_eq!((e.fes(), e.fei()), (Some(Fes::HeaderDigestError), 0));
        if i < 24 {
            assert_eq!(
                e,
                PduError::HeaderDigest { pdu_type: PduType::R2t, received: good, computed: crc32c(&b[..24]) }
            );
        }
    }
}

#[test]
fn ic_field_checks() {
    let mut b = ic_req_bytes();
    b[8] = 1; // PFV 1
    let e = error_of(&mut Decoder::new(Role::Controller), &b);
    assert_eq!(summary(e), (Some(Fes::UnsupportedParameter), 8, Some(PduType::IcReq)));

    let resp = |cpda: u8, maxh2cdata: u32| {
        let mut b = raw(0x01, 0, 128, 0, 128, 0);
        b[10] = cpda;
        b[12..16].copy_from_slice(&le32(maxh2cdata));
        b
    };
    let e = error_of(&mut Decoder::new(Role::Host), &resp(32, 8192));
    assert_eq!(summary(e), invalid(PduType::IcResp, offset::CPDA));
    for m in [0, 4092, 4098, 1 << 31 | 2] {
        let e = error_of(&mut Decoder::new(Role::Host), &resp(0, m));
        assert_eq!(e, PduError::InvalidField { pdu_type: PduType::IcResp, offset: offset::MAXH2CDATA, value: m });
    }
    assert_eq!(whole(&mut Decoder::new(Role::Host), &resp(31, 4096)).len(), 1);
}

#[test]
fn in_capsule_data_limit() {
    let p = params(false, false, 0, 0);
    let mut wire = vec![0u8; 9000];
    let write = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(0x01, 1) });
    let connect = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(super::pdu::FABRICS_OPCODE, 1) });
    let mut dec = Decoder::initialized(Role::Controller, p, 4096);
    let n = encode_contiguous(&mut wire, &p, &write, &[&[1; 4096]]).unwrap();
    assert_eq!(whole(&mut dec, &wire[..n]).len(), 3);
    let n = encode_contiguous(&mut wire, &p, &write, &[&[1; 4097]]).unwrap();
    let e = error_of(&mut dec, &wire[..n]);
    assert_eq!(e, PduError::DataLimit { pdu_type: PduType::CapsuleCmd, len: 4097, limit: 4096 });
    assert_eq!((e.fes(), e.fei()), (Some(Fes::DataTransferLimitExceeded), 0));
    // Fabrics commands (Connect's 1 KiB of data) may carry 8 KiB whatever the queue's limit.
    let mut dec = Decoder::new(Role::Controller);
    dec.set_params(p);
    let mut ic = ic_req_bytes();
    ic[11] = 0;
    let mut w = ic.clone();
    let n = encode_contiguous(&mut wire, &p, &connect, &[&[2; 8192]]).unwrap();
    w.extend_from_slice(&wire[..n]);
    assert_eq!(whole(&mut dec, &w).len(), 4);
    let n = encode_contiguous(&mut wire, &p, &connect, &[&[2; 8193]]).unwrap();
    assert_eq!(error_of(&mut dec, &wire[..n]).fes(), Some(Fes::DataTransferLimitExceeded));
    // A huge PLEN is just a number: refused against the limit, nothing allocated or awaited.
    let e = error_of(&mut controller(p), &raw(0x04, 0, 72, 72, u32::MAX, 0));
    assert_eq!(e, PduError::DataLimit { pdu_type: PduType::CapsuleCmd, len: u32::MAX - 72, limit: 4096 });
}

fn data_psh(t: u8, f: u8, plen: u32, a: u16, b: u16, off: u32, len: u32) -> Vec<u8> {
    let mut v = raw(t, f, 24, if plen > 24 { 24 } else { 0 }, plen, 0);
    v[8..10].copy_from_slice(&a.to_le_bytes());
    v[10..12].copy_from_slice(&b.to_le_bytes());
    v[12..16].copy_from_slice(&le32(off));
    v[16..20].copy_from_slice(&le32(len));
    v
}

#[test]
fn data_pdu_field_checks() {
    use PduType as T;
    let p = params(false, false, 0, 0); // MAXH2CDATA 8192
                                        // DATAL must be the data PLEN leaves, and not 0.
    let e = error_of(&mut controller(p), &data_psh(0x06, 0, 24 + 10, 1, 1, 0, 9));
    assert_eq!(e, PduError::InvalidField { pdu_type: T::H2cData, offset: offset::DATAL, value: 9 });
    assert_eq!(summary(e), invalid(T::H2cData, 16));
    let e = error_of(&mut controller(p), &data_psh(0x06, 0, 24, 1, 1, 0, 0));
    assert_eq!(summary(e), invalid(T::H2cData, 16));
    let e = error_of(&mut host(p), &data_psh(0x07, 0, 24 + 10, 1, 0, 0, 11));
    assert_eq!(summary(e), invalid(T::C2hData, 16));
    // More than MAXH2CDATA in one H2CData.
    let e = error_of(&mut controller(p), &data_psh(0x06, 0, 24 + 8193, 1, 1, 0, 8193));
    assert_eq!(e, PduError::DataLimit { pdu_type: T::H2cData, len: 8193, limit: 8192 });
    assert_eq!((e.fes(), e.fei()), (Some(Fes::DataTransferLimitExceeded), 0));
    // Ranges past 2^32 bytes.
    let e = error_of(&mut controller(p), &data_psh(0x06, 0, 24 + 16, 1, 1, u32::MAX - 15, 16));
    assert_eq!(e, PduError::OutOfRange { pdu_type: T::H2cData, offset: u32::MAX - 15, len: 16 });
    assert_eq!((e.fes(), e.fei()), (Some(Fes::DataTransferOutOfRange), 0));
    let ok = whole(&mut controller(p), &data_psh(0x06, 0, 24 + 16, 1, 1, u32::MAX - 16, 16));
    assert!(matches!(ok[0], Got::Header(_)));
    let e = error_of(&mut host(p), &data_psh(0x07, 0, 24 + 4, 1, 0, u32::MAX, 4));
    assert_eq!(e.fes(), Some(Fes::DataTransferOutOfRange));
    // R2T: a zero length, or a range past 2^32.
    let e = error_of(&mut host(p), &data_psh(0x09, 0, 24, 1, 1, 0, 0));
    assert_eq!(summary(e), invalid(T::R2t, offset::R2TL));
    let e = error_of(&mut host(p), &data_psh(0x09, 0, 24, 1, 1, 1, u32::MAX));
    assert_eq!(e, PduError::OutOfRange { pdu_type: T::R2t, offset: 1, len: u32::MAX });
    // An R2T may ask for more than MAXH2CDATA: the host splits it.
    let ok = whole(&mut host(p), &data_psh(0x09, 0, 24, 1, 1, 0, 1 << 20));
    assert_eq!(ok, vec![header(Pdu::R2t(R2t { cccid: 1, ttag: 1, r2to: 0, r2tl: 1 << 20 }), 0)]);
}

#[test]
fn encoder_refusals() {
    let p = params(true, true, 0, 0);
    let mut out = [0u8; 256];
    let d = H2cData { cccid: 1, ttag: 1, datao: 0, datal: 4, last: true };
    assert_eq!(
        encode(&mut out, &p, &Pdu::H2cData(d), &[b"abc"]),
        Err(EncodeError::DataLength { pdu_type: PduType::H2cData, datal: 4, len: 3 })
    );
    let big = vec![0u8; 8193];
    let d = H2cData { datal: 8193, ..d };
    assert_eq!(encode(&mut out, &p, &Pdu::H2cData(d), &[&big]), Err(EncodeError::DataLimit { len: 8193, limit: 8192 }));
    let c = C2hData { cccid: 1, datao: 0, datal: 1, last: false, success: true };
    assert_eq!(encode(&mut out, &p, &Pdu::C2hData(c), &[b"x"]), Err(EncodeError::SuccessWithoutLast));
    let r = Pdu::R2t(R2t { cccid: 1, ttag: 1, r2to: 0, r2tl: 1 });
    assert_eq!(encode(&mut out, &p, &r, &[b"x"]), Err(EncodeError::UnexpectedData { pdu_type: PduType::R2t, len: 1 }));
    let t = Pdu::C2hTermReq(TermReq { fes: 1, fei: 0 });
    assert!(matches!(encode(&mut out, &p, &t, &[&[0; 129]]), Err(EncodeError::UnexpectedData { .. })));
    let cmd = Pdu::CapsuleCmd(CapsuleCmd { sqe: sqe(1, 1) });
    assert_eq!(encode(&mut out[..75], &p, &cmd, &[]), Err(EncodeError::BufferTooSmall { need: 76 }));
    assert_eq!(encode_contiguous(&mut out[..80], &p, &cmd, &[b"abcd"]), Err(EncodeError::BufferTooSmall { need: 84 }));
    // The largest head fits MAX_HEAD_LEN.
    let p = params(true, true, 31, 31);
    let f = encode(&mut out, &p, &cmd, &[b"abcd"]).unwrap();
    assert_eq!((f.head_len, f.pdo), (128, 128));
    let mut most = 0;
    for pda in 0..=31 {
        let f = encode(&mut out, &params(true, true, 0, pda), &cmd, &[b"abcd"]).unwrap();
        most = most.max(f.head_len);
    }
    assert_eq!(most, MAX_HEAD_LEN);
    // PDA 17 is 72 bytes: data at 144 after a 76-byte header and digest.
    assert_eq!(encode(&mut out, &params(true, true, 0, 17), &cmd, &[b"abcd"]).unwrap().pdo, 144);
}
