//! Fuzzes the NVMe/TCP PDU decoder (crates/nvmf/src/tcp). The first 8 bytes set things up,
//! the rest is the byte stream a connection receives:
//!
//! - byte 0: bit 0 the decoder is a controller's (else a host's), bit 1 it starts initialized
//!   (else the first PDU must be ICReq/ICResp), bit 2 header digests, bit 3 data digests;
//! - bytes 1, 2: HPDA and CPDA (modulo 32);
//! - byte 3: MAXH2CDATA, 4096 * (1 + byte);
//! - byte 4: the in-capsule data limit, 256 * byte;
//! - byte 5: chunking: 0 offers the whole stream at once, n offers chunks of 1..=n bytes;
//! - bytes 6, 7: the seed of the chunk sizes.
//!
//! The stream is offered in those chunks the way a connection would: header, padding and
//! digest bytes to `feed`, data bytes to `data`. Nothing may panic, and the decoder keeps its
//! promises: steps bounded by PDO, data events only after exactly the announced data, every
//! accepted header re-encodes and decodes to the same value, and a fatal error is sticky and
//! turns into a termination request that decodes back to its FES and FEI. No step allocates.

#![no_main]

use ferrite_nvmf::tcp::pdu::{MAX_HLEN, TERM_REQ_MAX_DATA};
use ferrite_nvmf::tcp::{
    encode_contiguous, encode_term_req, Decoder, Event, Header, Negotiated, Pdu, PduError, Role, Want,
};
use libfuzzer_sys::fuzz_target;

const SETUP: usize = 8;
/// Headers whose data is at most this long are re-encoded (the data is zeroes from here).
const REENCODE_DATA: usize = 16 * 1024;
static ZEROES: [u8; REENCODE_DATA] = [0; REENCODE_DATA];

struct Setup {
    role: Role,
    initialized: bool,
    params: Negotiated,
    max_icd: u32,
    chunk_max: usize,
    seed: u32,
}

fn setup(b: &[u8; SETUP]) -> Setup {
    Setup {
        role: if b[0] & 1 != 0 { Role::Controller } else { Role::Host },
        initialized: b[0] & 2 != 0,
        params: Negotiated {
            header_digest: b[0] & 4 != 0,
            data_digest: b[0] & 8 != 0,
            hpda: b[1] % 32,
            cpda: b[2] % 32,
            maxh2cdata: 4096 * (1 + u32::from(b[3])),
        },
        max_icd: 256 * u32::from(b[4]),
        chunk_max: usize::from(b[5]),
        seed: u32::from(u16::from_le_bytes([b[6], b[7]])) | 1,
    }
}

fn other(role: Role) -> Role {
    match role {
        Role::Controller => Role::Host,
        Role::Host => Role::Controller,
    }
}

/// An accepted header, framed again with the parameters it was received under, decodes to the
/// same header.
fn reencode(role: Role, params: &Negotiated, max_icd: u32, h: &Header) {
    let len = h.data_len as usize;
    if len > REENCODE_DATA {
        return;
    }
    let mut wire = [0u8; 160 + REENCODE_DATA];
    let n = encode_contiguous(&mut wire, params, &h.pdu, &[&ZEROES[..len]])
        .unwrap_or_else(|e| panic!("accepted {h:?} does not encode: {e}"));
    let mut dec = match h.pdu {
        Pdu::IcReq(_) | Pdu::IcResp(_) => Decoder::new(role),
        _ => Decoder::initialized(role, *params, max_icd),
    };
    let fed = dec.feed(&wire[..n]).expect("a re-encoded header decodes");
    assert_eq!(fed.event, Some(Event::Header(*h)));
}

/// A fatal error is sticky and makes a termination request that the other end decodes.
fn check_failure(dec: &mut Decoder, e: PduError) {
    assert_eq!(dec.want(), Want::Closed);
    assert_eq!(dec.feed(&[0; 8]), Err(e));
    assert_eq!(dec.data(&[0; 8]).consumed, 0);
    let offending = dec.received_header();
    assert!(offending.len() <= MAX_HLEN);
    let Some(fes) = e.fes() else { return };
    if !fes.has_fei() {
        assert_eq!(e.fei(), 0);
    }
    let mut out = [0u8; 160];
    let n = encode_term_req(&mut out, dec.role(), fes, e.fei(), offending).expect("TermReq encodes");
    let mut peer = Decoder::new(other(dec.role()));
    let fed = peer.feed(&out[..n]).expect("TermReq decodes");
    let Some(Event::Header(h)) = fed.event else { panic!("no TermReq header") };
    let (Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t)) = h.pdu else { panic!("not a TermReq: {h:?}") };
    assert_eq!((t.fes, t.fei), (fes.to_u16(), e.fei()));
    let data_len = offending.len().min(TERM_REQ_MAX_DATA);
    assert_eq!(h.data_len as usize, data_len);
    assert_eq!(peer.data(&out[fed.consumed..n]).consumed, data_len);
}

fuzz_target!(|input: &[u8]| {
    if input.len() < SETUP {
        return;
    }
    let mut head = [0u8; SETUP];
    head.copy_from_slice(&input[..SETUP]);
    let s = setup(&head);
    let stream = &input[SETUP..];
    let mut dec =
        if s.initialized { Decoder::initialized(s.role, s.params, s.max_icd) } else { Decoder::new(s.role) };
    dec.set_max_icd(s.max_icd);

    let mut rng = s.seed;
    let mut pos = 0;
    // Data bytes still announced by the last header, or None between PDUs' data.
    let mut data_due: Option<u32> = None;
    while pos < stream.len() {
        let size = if s.chunk_max == 0 {
            stream.len()
        } else {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            1 + rng as usize % s.chunk_max
        };
        let end = pos.saturating_add(size).min(stream.len());
        let mut chunk = &stream[pos..end];
        pos = end;
        while !chunk.is_empty() {
            let params = *dec.params();
            let event = match dec.want() {
                Want::Closed => unreachable!("the loop stops at the error"),
                Want::Data(n) => {
                    assert_eq!(data_due, Some(n));
                    let fed = dec.data(chunk);
                    assert_eq!(fed.consumed, chunk.len().min(n as usize));
                    data_due = Some(n - fed.consumed as u32);
                    chunk = &chunk[fed.consumed..];
                    fed.event
                }
                Want::Bytes(n) => {
                    assert!(n > 0 && n <= 255);
                    match dec.feed(chunk) {
                        Ok(fed) => {
                            assert!(fed.consumed <= chunk.len());
                            assert!(fed.consumed > 0 || fed.event.is_some());
                            chunk = &chunk[fed.consumed..];
                            fed.event
                        }
                        Err(e) => {
                            check_failure(&mut dec, e);
                            return;
                        }
                    }
                }
            };
            match event {
                None => {}
                Some(Event::Header(h)) => {
                    assert!(data_due.is_none());
                    data_due = (h.data_len > 0).then_some(h.data_len);
                    reencode(s.role, &params, s.max_icd, &h);
                    if let Pdu::IcReq(_) | Pdu::IcResp(_) = h.pdu {
                        assert!(dec.is_initialized());
                        dec.set_params(s.params);
                    }
                }
                Some(Event::DataEnd | Event::DataDigestError { .. }) => {
                    assert_eq!(data_due, Some(0));
                    data_due = None;
                }
            }
        }
    }
});
