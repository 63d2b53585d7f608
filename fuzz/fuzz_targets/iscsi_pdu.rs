//! Fuzzes the iSCSI PDU decoder and framing (crates/iscsi/src/pdu). The first 6 bytes set
//! things up, the rest is the byte stream a connection receives:
//!
//! - byte 0: bit 0 the decoder is a target's (else an initiator's), bit 1 header digests,
//!   bit 2 data digests;
//! - byte 1: MaxRecvDataSegmentLength, 512 × (1 + byte);
//! - byte 2: chunking: 0 offers the whole stream at once, n offers chunks of 1..=n bytes;
//! - bytes 3, 4: the seed of the chunk sizes;
//! - byte 5: unused (keeps seeds aligned).
//!
//! The stream is offered in those chunks the way a connection would: header, padding, digest
//! and skipped bytes to `feed`, data bytes to `data`. Nothing may panic, and the decoder keeps
//! its promises: data events only after exactly the announced data; every accepted header
//! re-encodes (with its AHS) and decodes to the same header, and the one-shot decoder agrees
//! on the first PDU; an invalid header comes with its BHS, whose check gives the same error;
//! a fatal error is sticky.

#![no_main]

use ferrite_iscsi::pdu::{
    check_header, decode_whole, encode_to_vec, frame_status, Ahs, Decoder, Event, FrameStatus, Header, Pdu, PduError,
    PduParams, Role, Want, BHS_LEN,
};
use libfuzzer_sys::fuzz_target;

const SETUP: usize = 6;

/// An accepted header, framed again with the AHS it came with, decodes to the same header.
fn reencode(role: Role, params: &PduParams, h: &Header, ahs: &[u8]) {
    let mut list = Vec::new();
    if let Some(b) = h.ahs.bidi_read_length {
        list.push(Ahs::BidiReadLength(b));
    }
    if let Some((off, len)) = h.ahs.extended_cdb {
        list.push(Ahs::ExtendedCdb(&ahs[usize::from(off)..usize::from(off) + usize::from(len)]));
    }
    let data = vec![0u8; h.data_len as usize];
    let wire =
        encode_to_vec(params, &h.pdu, &list, &data).unwrap_or_else(|e| panic!("accepted {h:?} does not encode: {e}"));
    let d = decode_whole(role, params, &wire).expect("whole").expect("a re-encoded header decodes");
    assert_eq!(d.header.pdu, h.pdu);
    assert_eq!(d.header.data_len, h.data_len);
    assert_eq!(d.header.ahs.bidi_read_length, h.ahs.bidi_read_length);
}

fuzz_target!(|input: &[u8]| {
    if input.len() < SETUP {
        return;
    }
    let role = if input[0] & 1 != 0 { Role::Target } else { Role::Initiator };
    let params = PduParams {
        header_digest: input[0] & 2 != 0,
        data_digest: input[0] & 4 != 0,
        max_data_segment: 512 * (1 + u32::from(input[1])),
    };
    let chunk_max = usize::from(input[2]);
    let mut rng = u32::from(u16::from_le_bytes([input[3], input[4]])) | 1;
    let stream = &input[SETUP..];

    // The one-shot decoder on the first PDU, for comparison.
    let first = match frame_status(stream, &params) {
        Ok(FrameStatus::Complete { len }) => {
            assert!(len <= stream.len());
            Some(decode_whole(role, &params, stream).expect("complete"))
        }
        Ok(FrameStatus::Need(n)) => {
            assert!(n > 0);
            assert!(decode_whole(role, &params, stream).is_none());
            None
        }
        Err(e) => {
            assert!(e.is_fatal());
            None
        }
    };

    let mut dec = Decoder::with_params(role, params);
    let mut pos = 0;
    let mut data_due: Option<u32> = None;
    let mut pdus = 0usize;
    while pos < stream.len() {
        let size = if chunk_max == 0 {
            stream.len()
        } else {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            1 + rng as usize % chunk_max
        };
        let end = pos.saturating_add(size).min(stream.len());
        let mut chunk = &stream[pos..end];
        pos = end;
        while !chunk.is_empty() {
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
                    assert!(n > 0);
                    match dec.feed(chunk) {
                        Ok(fed) => {
                            assert!(fed.consumed <= chunk.len());
                            assert!(fed.consumed > 0 || fed.event.is_some());
                            chunk = &chunk[fed.consumed..];
                            fed.event
                        }
                        Err(e) => {
                            assert!(e.is_fatal());
                            assert_eq!(dec.want(), Want::Closed);
                            assert_eq!(dec.feed(&[0; 4]), Err(e));
                            assert_eq!(dec.data(&[0; 4]).consumed, 0);
                            if pdus == 0 {
                                assert!(matches!(first, None | Some(Err(_))));
                            }
                            return;
                        }
                    }
                }
            };
            match event {
                None => {}
                Some(Event::Header(h)) => {
                    assert!(data_due.is_none() || data_due == Some(0));
                    data_due = (h.data_len > 0).then_some(h.data_len);
                    assert!(h.data_len <= params.max_data_segment);
                    if pdus == 0 {
                        if let Some(Ok(d)) = &first {
                            assert_eq!(d.header, h);
                        }
                    }
                    pdus += 1;
                    let ahs = dec.ahs().to_vec();
                    reencode(role, &params, &h, &ahs);
                }
                Some(Event::Invalid(inv)) => {
                    assert!(!inv.error.is_fatal());
                    assert!(inv.error.reject_reason().is_some());
                    data_due = None;
                    if pdus == 0 {
                        if let Some(r) = &first {
                            assert_eq!(r.as_ref().err(), Some(&inv.error));
                        }
                    }
                    pdus += 1;
                    // Without digests the BHS and AHS alone reproduce the error.
                    if !params.header_digest {
                        let again: Result<Header, PduError> = check_header(role, &params, &inv.bhs, dec.ahs(), None);
                        assert_eq!(again.err(), Some(inv.error));
                    }
                    let _: &[u8; BHS_LEN] = &inv.bhs;
                }
                Some(Event::DataEnd | Event::DataDigestError { .. }) => {
                    assert_eq!(data_due, Some(0));
                    data_due = None;
                }
            }
            let _ = Pdu::parse(dec.bhs());
        }
    }
});
