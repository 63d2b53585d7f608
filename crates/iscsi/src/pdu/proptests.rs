//! Property tests of the PDU codec: round trips of every opcode's fields under random
//! parameters, streaming decodes in random chunkings, corruption, arbitrary bytes.

use proptest::prelude::*;

use super::*;

const OPCODES: [u8; 18] =
    [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f];

/// A random BHS of a defined opcode whose fields pass [`Pdu::parse`].
fn arb_pdu() -> impl Strategy<Value = Pdu> {
    (prop::sample::select(&OPCODES[..]), any::<bool>(), prop::collection::vec(any::<u8>(), 47)).prop_filter_map(
        "fields a receiver refuses",
        |(op, imm, rest)| {
            let mut b = [0u8; BHS_LEN];
            b[0] = op | if imm { IMMEDIATE_BIT } else { 0 };
            b[1..].copy_from_slice(&rest);
            Pdu::parse(&b).ok()
        },
    )
}

fn arb_params() -> impl Strategy<Value = PduParams> {
    (any::<bool>(), any::<bool>(), 512u32..=65536).prop_map(|(h, d, m)| PduParams {
        header_digest: h,
        data_digest: d,
        max_data_segment: m,
    })
}

/// A PDU with AHS and data it may carry.
#[derive(Debug, Clone)]
struct Case {
    pdu: Pdu,
    ext_cdb: Vec<u8>,
    bidi: Option<u32>,
    data: Vec<u8>,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (arb_pdu(), prop::collection::vec(any::<u8>(), 0..40), any::<u32>(), prop::collection::vec(any::<u8>(), 0..512))
        .prop_map(|(pdu, ext, bidi_len, data)| {
            let op = pdu.opcode();
            let (ext_cdb, bidi) = match &pdu {
                Pdu::ScsiCommand(c) => (ext, (c.read && c.write).then_some(bidi_len)),
                _ => (Vec::new(), None),
            };
            let data = if op.may_carry_data() { data } else { Vec::new() };
            Case { pdu, ext_cdb, bidi, data }
        })
}

fn ahs_of(c: &Case) -> Vec<Ahs<'_>> {
    let mut v = Vec::new();
    if let Some(b) = c.bidi {
        v.push(Ahs::BidiReadLength(b));
    }
    if !c.ext_cdb.is_empty() {
        v.push(Ahs::ExtendedCdb(&c.ext_cdb));
    }
    v
}

fn receiver(pdu: &Pdu) -> Role {
    pdu.opcode().sender().peer()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Every opcode's typed fields survive encode and decode, and encoding is a function of
    /// the typed value (reserved bytes are zero).
    #[test]
    fn round_trip_every_opcode(c in arb_case(), params in arb_params()) {
        let ahs = ahs_of(&c);
        let wire = encode_to_vec(&params, &c.pdu, &ahs, &c.data).unwrap();
        prop_assert!(wire.len().is_multiple_of(4));
        let d = decode_whole(receiver(&c.pdu), &params, &wire).unwrap().unwrap();
        prop_assert_eq!(d.len, wire.len());
        prop_assert_eq!(d.header.pdu, c.pdu);
        prop_assert_eq!(d.data, &c.data[..]);
        prop_assert_eq!(d.header.ahs.bidi_read_length, c.bidi);
        if let Pdu::ScsiCommand(cmd) = &c.pdu {
            let cdb = d.header.ahs.cdb(&cmd.cdb, d.ahs);
            prop_assert_eq!(cdb.ext, &c.ext_cdb[..]);
        }
        let expect_dd = if params.data_digest && !c.data.is_empty() { DigestCheck::Ok } else { DigestCheck::Absent };
        prop_assert_eq!(d.data_digest, expect_dd);
        let again = encode_to_vec(&params, &d.header.pdu, &ahs, d.data).unwrap();
        prop_assert_eq!(again, wire);
    }

    /// A stream of PDUs offered in random chunks decodes to the same headers and data as the
    /// one-shot decode, and the decoder never reads past the step it announced.
    #[test]
    fn streaming_matches_whole(
        cases in prop::collection::vec(arb_case(), 1..6),
        params in arb_params(),
        chunks in prop::collection::vec(1usize..200, 1..64),
    ) {
        let role = Role::Target;
        let cases: Vec<Case> = cases.into_iter().filter(|c| receiver(&c.pdu) == role).collect();
        let mut wire = Vec::new();
        let mut expect = Vec::new();
        for c in &cases {
            let ahs = ahs_of(c);
            let w = encode_to_vec(&params, &c.pdu, &ahs, &c.data).unwrap();
            expect.push((c.pdu, c.data.clone()));
            wire.extend_from_slice(&w);
        }
        let mut dec = Decoder::with_params(role, params);
        let mut got: Vec<(Pdu, Vec<u8>)> = Vec::new();
        let mut pos = 0;
        let mut k = 0;
        while pos < wire.len() {
            let size = chunks[k % chunks.len()];
            k += 1;
            let end = (pos + size).min(wire.len());
            let mut chunk = &wire[pos..end];
            pos = end;
            while !chunk.is_empty() {
                let fed = match dec.want() {
                    Want::Data(n) => {
                        let fed = dec.data(chunk);
                        prop_assert_eq!(fed.consumed, chunk.len().min(n as usize));
                        got.last_mut().unwrap().1.extend_from_slice(&chunk[..fed.consumed]);
                        fed
                    }
                    Want::Bytes(_) => {
                        let fed = dec.feed(chunk).unwrap();
                        prop_assert!(fed.consumed > 0);
                        fed
                    }
                    Want::Closed => unreachable!(),
                };
                chunk = &chunk[fed.consumed..];
                match fed.event {
                    Some(Event::Header(h)) => got.push((h.pdu, Vec::new())),
                    Some(Event::DataEnd) | None => {}
                    Some(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
        }
        prop_assert_eq!(got, expect);
        prop_assert_eq!(dec.want(), Want::Bytes(BHS_LEN));
    }

    /// A flipped bit in the header is a header digest error; one in the data (or padding or
    /// digest) a data digest error.
    #[test]
    fn corruption_is_caught(c in arb_case(), bit in any::<prop::sample::Index>()) {
        let params = PduParams { header_digest: true, data_digest: true, max_data_segment: 65536 };
        let ahs = ahs_of(&c);
        let mut wire = encode_to_vec(&params, &c.pdu, &ahs, &c.data).unwrap();
        let i = bit.index(wire.len() * 8);
        wire[i / 8] ^= 1 << (i % 8);
        let head = 48 + ahs::wire_len(&ahs) + 4;
        let r = decode_whole(receiver(&c.pdu), &params, &wire);
        if i / 8 < head {
            // A flip in a length field may leave the buffer short, or over the limit.
            match r {
                None | Some(Err(PduError::HeaderDigest { .. })) | Some(Err(PduError::DataSegmentTooLong { .. })) => {}
                Some(other) => prop_assert!(false, "header flip at {} gave {:?}", i, other),
            }
        } else {
            let d = r.unwrap().unwrap();
            let mismatch = matches!(d.data_digest, DigestCheck::Mismatch { .. });
            prop_assert!(mismatch);
        }
    }

    /// Arbitrary bytes never panic the decoders, and the streaming decoder's events are
    /// consistent (data only after a header announcing it).
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400), params in arb_params(), target in any::<bool>()) {
        let role = if target { Role::Target } else { Role::Initiator };
        let _ = frame_status(&bytes, &params);
        let _ = decode_whole(role, &params, &bytes);
        let mut dec = Decoder::with_params(role, params);
        let mut buf = &bytes[..];
        while !buf.is_empty() {
            let fed = match dec.want() {
                Want::Data(_) => dec.data(buf),
                Want::Bytes(_) => match dec.feed(buf) {
                    Ok(f) => f,
                    Err(e) => {
                        prop_assert!(e.is_fatal());
                        prop_assert_eq!(dec.want(), Want::Closed);
                        break;
                    }
                },
                Want::Closed => unreachable!(),
            };
            prop_assert!(fed.consumed > 0 || fed.event.is_some());
            buf = &buf[fed.consumed..];
        }
    }
}
