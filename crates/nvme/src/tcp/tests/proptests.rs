//! Property tests: every PDU type with random fields, digests and paddings survives
//! encode → decode fed in random chunks; header corruption is caught by the header digest (or
//! lands in bytes the decoder ignores); data corruption by the data digest; and arbitrary
//! bytes never make the decoder misbehave.

use proptest::prelude::*;

use super::super::*;
use super::{run, run_with, Got};

/// In-capsule data limit the controller decoders use here.
const MAX_ICD: u32 = 2048;

fn arb_params() -> impl Strategy<Value = Negotiated> {
    (any::<bool>(), any::<bool>(), 0u8..=31, 0u8..=31, 1024u32..=(1 << 20)).prop_map(|(h, d, hpda, cpda, m)| {
        Negotiated { header_digest: h, data_digest: d, hpda, cpda, maxh2cdata: m * 4 }
    })
}

fn bytes(len: impl Into<proptest::sample::SizeRange>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), len)
}

/// A PDU the host sends, with its data, valid under MAXH2CDATA `maxh2cdata`.
fn arb_h2c(maxh2cdata: u32) -> BoxedStrategy<(Pdu, Vec<u8>)> {
    let data_max = maxh2cdata.min(3000) as usize;
    prop_oneof![
        (any::<u16>(), any::<u32>(), bytes(0..=128))
            .prop_map(|(fes, fei, d)| (Pdu::H2cTermReq(TermReq { fes, fei }), d)),
        (proptest::array::uniform::<_, 64>(any::<u8>()), bytes(0..=MAX_ICD as usize)).prop_map(|(mut sqe, d)| {
            sqe[0] &= 0x7e; // not a Fabrics command: the queue's limit applies
            (Pdu::CapsuleCmd(CapsuleCmd { sqe }), d)
        }),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<bool>(), bytes(1..=data_max)).prop_map(
            |(cccid, ttag, datao, last, d)| {
                let datal = d.len() as u32;
                let datao = datao.min(u32::MAX - datal);
                (Pdu::H2cData(H2cData { cccid, ttag, datao, datal, last }), d)
            }
        ),
    ]
    .boxed()
}

/// A PDU the controller sends, with its data.
fn arb_c2h() -> BoxedStrategy<(Pdu, Vec<u8>)> {
    prop_oneof![
        (any::<u16>(), any::<u32>(), bytes(0..=128))
            .prop_map(|(fes, fei, d)| (Pdu::C2hTermReq(TermReq { fes, fei }), d)),
        proptest::array::uniform::<_, 16>(any::<u8>()).prop_map(|cqe| (Pdu::CapsuleResp(CapsuleResp { cqe }), vec![])),
        (any::<u16>(), any::<u32>(), any::<bool>(), any::<bool>(), bytes(1..=3000)).prop_map(
            |(cccid, datao, last, success, d)| {
                let datal = d.len() as u32;
                let datao = datao.min(u32::MAX - datal);
                let c = C2hData { cccid, datao, datal, last: last || success, success };
                (Pdu::C2hData(c), d)
            }
        ),
        (any::<u16>(), any::<u16>(), any::<u32>(), 1u32..=u32::MAX).prop_map(|(cccid, ttag, r2to, r2tl)| {
            let r2to = r2to.min(u32::MAX - r2tl);
            (Pdu::R2t(R2t { cccid, ttag, r2to, r2tl }), vec![])
        }),
    ]
    .boxed()
}

/// A role, parameters, and 1 to 5 PDUs that role receives.
fn arb_stream() -> impl Strategy<Value = (Role, Negotiated, Vec<(Pdu, Vec<u8>)>)> {
    (any::<bool>(), arb_params()).prop_flat_map(|(at_controller, p)| {
        let (role, pdus) =
            if at_controller { (Role::Controller, arb_h2c(p.maxh2cdata)) } else { (Role::Host, arb_c2h()) };
        (Just(role), Just(p), proptest::collection::vec(pdus, 1..=5))
    })
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(prop_oneof![1usize..=8, 1usize..=300, Just(usize::MAX)], 1..=6)
}

/// Encodes `pdus` one after the other, checking that the zero-copy framing (head, data,
/// digest) and the contiguous one agree; returns the wire bytes and the events expected.
fn encode_all(p: &Negotiated, pdus: &[(Pdu, Vec<u8>)]) -> (Vec<u8>, Vec<Got>) {
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for (pdu, data) in pdus {
        let mut head = [0u8; encoder::MAX_HEAD_LEN];
        // Split the data in two to exercise scatter lists.
        let (a, b) = data.split_at(data.len() / 3);
        let f = encode(&mut head, p, pdu, &[a, b]).expect("valid PDU");
        let mut whole = vec![0u8; f.plen as usize];
        assert_eq!(encode_contiguous(&mut whole, p, pdu, &[data]), Ok(f.plen as usize));
        let mut parts = head[..f.head_len].to_vec();
        parts.extend_from_slice(data);
        if let Some(d) = f.data_digest {
            parts.extend_from_slice(&d);
        }
        assert_eq!(parts, whole);
        assert_eq!(f.data_len as usize, data.len());
        wire.extend_from_slice(&whole);
        want.push(Got::Header(Header { pdu: *pdu, data_len: data.len() as u32 }));
        if !data.is_empty() {
            want.push(Got::Data(data.clone()));
            want.push(Got::DataEnd);
        }
    }
    (wire, want)
}

fn decoder(role: Role, p: Negotiated) -> Decoder {
    Decoder::initialized(role, p, MAX_ICD)
}

/// Offsets of bytes a PDU type's header reserves (ignored on receipt).
fn reserved(t: PduType) -> Vec<usize> {
    match t {
        PduType::IcReq | PduType::IcResp => (16..128).collect(),
        PduType::H2cTermReq | PduType::C2hTermReq => (14..24).collect(),
        PduType::H2cData | PduType::R2t => (20..24).collect(),
        PduType::C2hData => [10, 11, 20, 21, 22, 23].to_vec(),
        PduType::CapsuleCmd | PduType::CapsuleResp => vec![],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_decode_round_trip((role, p, pdus) in arb_stream(), sizes in chunk_sizes()) {
        let (wire, want) = encode_all(&p, &pdus);
        let mut dec = decoder(role, p);
        prop_assert_eq!(run(&mut dec, &wire, &sizes, None), want);
        prop_assert_eq!(dec.want(), Want::Bytes(8));
    }

    #[test]
    fn initialization_then_traffic(
        req in (0u8..=31, any::<bool>(), any::<bool>(), any::<u32>())
            .prop_map(|(hpda, hdgst, ddgst, maxr2t)| IcReq { pfv: 0, hpda, hdgst, ddgst, maxr2t }),
        cfg in (any::<bool>(), any::<bool>(), 0u8..=31, any::<u32>())
            .prop_map(|(h, d, cpda, m)| ControllerConfig { header_digest: h, data_digest: d, cpda, maxh2cdata: m }),
        h2c_seed in proptest::collection::vec(arb_h2c(4096), 0..=3),
        c2h in proptest::collection::vec(arb_c2h(), 0..=3),
        sizes in chunk_sizes(),
    ) {
        let (resp, at_controller) = controller_accept(&req, &cfg);
        let at_host = host_accept(&req, &resp).unwrap();
        prop_assert_eq!(at_host, at_controller);
        // Host to controller: ICReq, then PDUs framed with what was negotiated.
        let (mut wire, mut want) = encode_all(&Negotiated::INITIAL, &[(Pdu::IcReq(req), vec![])]);
        let (w, e) = encode_all(&at_host, &h2c_seed);
        wire.extend_from_slice(&w);
        want.extend(e);
        let mut dec = Decoder::new(Role::Controller);
        dec.set_max_icd(MAX_ICD);
        prop_assert_eq!(run(&mut dec, &wire, &sizes, Some(at_controller)), want);
        // Controller to host: ICResp, then PDUs.
        let (mut wire, mut want) = encode_all(&Negotiated::INITIAL, &[(Pdu::IcResp(resp), vec![])]);
        let (w, e) = encode_all(&at_controller, &c2h);
        wire.extend_from_slice(&w);
        want.extend(e);
        prop_assert_eq!(run(&mut Decoder::new(Role::Host), &wire, &sizes, Some(at_host)), want);
    }

    /// With header digests, any change to a header byte or its digest is an error; padding is
    /// ignored.
    #[test]
    fn header_corruption_is_caught(
        (role, mut p, pdus) in arb_stream(),
        at in any::<proptest::sample::Index>(),
        flip in 1u8..=255,
        sizes in chunk_sizes(),
    ) {
        p.header_digest = true;
        let (pdu, data) = &pdus[0];
        let t = pdu.pdu_type();
        let (mut wire, want) = encode_all(&p, &pdus[..1]);
        let mut head = [0u8; encoder::MAX_HEAD_LEN];
        let head_len = encode(&mut head, &p, pdu, &[data]).unwrap().head_len;
        let i = at.index(head_len);
        wire[i] ^= flip;
        let got = run(&mut decoder(role, p), &wire, &sizes, None);
        let digested = usize::from(t.hlen()) + if t.has_header_digest() { 4 } else { 0 };
        if i >= digested {
            // Padding between the header and PDO.
            prop_assert_eq!(got, want);
        } else if t.has_header_digest() {
            prop_assert!(matches!(got.last(), Some(Got::Error(_))), "undetected: {:?}", got);
        } else if reserved(t).contains(&i) {
            prop_assert_eq!(got, want);
        } else {
            // Termination requests have no digest: a field may change, undetected, but the
            // decoder still frames the stream (error, or a termination request).
            prop_assert!(matches!(got.first(), Some(Got::Error(_)) | Some(Got::Header(_))), "{:?}", got);
        }
    }

    /// Without header digests, reserved bytes (and DGST's reserved bits) change nothing.
    #[test]
    fn reserved_bytes_are_ignored(
        (role, p, pdus) in arb_stream(),
        at in any::<proptest::sample::Index>(),
        flip in 1u8..=255,
        ic in any::<bool>(),
    ) {
        let q = Negotiated { header_digest: false, ..p };
        let (first, enc, mut dec) = if ic {
            let pdu = match role {
                Role::Controller => Pdu::IcReq(IcReq { pfv: 0, hpda: p.hpda, hdgst: true, ddgst: false, maxr2t: 7 }),
                Role::Host => Pdu::IcResp(IcResp { pfv: 0, cpda: p.cpda, hdgst: false, ddgst: true, maxh2cdata: 8192 }),
            };
            ((pdu, vec![]), Negotiated::INITIAL, Decoder::new(role))
        } else {
            (pdus[0].clone(), q, decoder(role, q))
        };
        let t = first.0.pdu_type();
        let mut spots = reserved(t);
        if t.is_ic() {
            spots.push(usize::from(pdu::offset::DGST));
        }
        prop_assume!(!spots.is_empty());
        let (mut wire, want) = encode_all(&enc, std::slice::from_ref(&first));
        let i = spots[at.index(spots.len())];
        wire[i] ^= if i == usize::from(pdu::offset::DGST) { (flip & 0xfc) | 0x04 } else { flip };
        prop_assert_eq!(run(&mut dec, &wire, &[usize::MAX], None), want);
    }

    /// With data digests, a changed data byte is reported, not fatally: the next PDU decodes.
    #[test]
    fn data_corruption_is_caught(
        (role, mut p, pdus) in arb_stream(),
        at in any::<proptest::sample::Index>(),
        flip in 1u8..=255,
        sizes in chunk_sizes(),
    ) {
        p.data_digest = true;
        let (pdu, data) = &pdus[0];
        prop_assume!(pdu.pdu_type().has_data_digest() && !data.is_empty());
        let (mut wire, mut want) = encode_all(&p, &pdus);
        let mut head = [0u8; encoder::MAX_HEAD_LEN];
        let head_len = encode(&mut head, &p, pdu, &[data]).unwrap().head_len;
        let i = at.index(data.len());
        wire[head_len + i] ^= flip;
        let Got::Data(d) = &mut want[1] else { unreachable!() };
        d[i] ^= flip;
        want[2] = Got::DigestError;
        prop_assert_eq!(run(&mut decoder(role, p), &wire, &sizes, None), want);
    }

    /// The target's fast path for command capsules (`Decoder::capsule_in_place`) decodes
    /// every stream as `feed` does: valid streams, streams with a flipped byte anywhere (bad
    /// digests, fields, lengths), any chunking, and leaves the decoder in the same state.
    #[test]
    fn capsules_in_place_decode_as_feed_does(
        (role, p, pdus) in arb_stream(),
        flip in proptest::option::of((any::<proptest::sample::Index>(), 1u8..=255)),
        sizes in chunk_sizes(),
    ) {
        let (mut wire, _) = encode_all(&p, &pdus);
        if let Some((at, x)) = flip {
            let i = at.index(wire.len());
            wire[i] ^= x;
        }
        let mut slow = decoder(role, p);
        let mut fast = decoder(role, p);
        let want = run_with(&mut slow, &wire, &sizes, None, false);
        prop_assert_eq!(run_with(&mut fast, &wire, &sizes, None, true), want);
        prop_assert_eq!(fast.want(), slow.want());
    }

    /// Arbitrary bytes under arbitrary parameters: no panic, steps stay within the staging
    /// area (`run` asserts it), and a failed decoder stays failed.
    #[test]
    fn arbitrary_bytes(
        wire in bytes(0..=700),
        p in arb_params(),
        at_controller in any::<bool>(),
        initialized in any::<bool>(),
        sizes in chunk_sizes(),
    ) {
        let role = if at_controller { Role::Controller } else { Role::Host };
        let mut dec = if initialized { decoder(role, p) } else { Decoder::new(role) };
        let got = run(&mut dec, &wire, &sizes, Some(p));
        if let Some(Got::Error(e)) = got.last() {
            prop_assert_eq!(dec.want(), Want::Closed);
            prop_assert_eq!(dec.feed(&wire), Err(*e));
            prop_assert!(dec.received_header().len() <= pdu::MAX_HLEN);
            if let Some(fes) = e.fes() {
                prop_assert!(fes.has_fei() || e.fei() == 0);
                prop_assert!(e.fei() < 128);
            }
        }
    }
}
