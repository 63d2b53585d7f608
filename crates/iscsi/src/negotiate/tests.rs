//! Negotiation tests: each key type and rule, the target's offers, both sides together.

use proptest::prelude::*;

use super::target::Phase;
use super::*;
use crate::keys::{parse_text, KeyValue, TextWriter};
use crate::pdu::Stage;

const OP: Phase = Phase::Login(Stage::Operational);

fn kv(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    pairs.iter().map(|(k, v)| KeyValue::new(k, v)).collect()
}

fn answers(out: &TextWriter) -> Vec<(String, String)> {
    out.pairs().into_iter().map(|p| (p.key, p.value)).collect()
}

fn respond(t: &mut TargetNegotiator, phase: Phase, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out = TextWriter::new();
    t.respond(phase, &kv(pairs), &mut out).unwrap();
    answers(&out)
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// libiscsi's operational keys (lib/login.c), answered by a target with SPDK's defaults:
/// what SPDK's iscsi_negotiate_params answers, FirstBurstLength moved last.
#[test]
fn libiscsi_offer_against_spdk_defaults() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    let got = respond(
        &mut t,
        OP,
        &[
            ("InitiatorName", "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test"),
            ("TargetName", "iqn.2016-06.io.spdk:disk1"),
            ("SessionType", "Normal"),
            ("HeaderDigest", "None,CRC32C"),
            ("DataDigest", "None"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "262144"),
            ("FirstBurstLength", "262144"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("MaxOutstandingR2T", "1"),
            ("ErrorRecoveryLevel", "0"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
            ("MaxConnections", "1"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
        ],
    );
    assert_eq!(
        got,
        owned(&[
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "262144"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("MaxOutstandingR2T", "1"),
            ("ErrorRecoveryLevel", "0"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
            ("MaxConnections", "1"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("FirstBurstLength", "8192"),
        ])
    );
    let mut out = TextWriter::new();
    assert!(!t.offer(&mut out), "libiscsi offered everything the target needs");
    assert!(out.is_empty());
    let n = t.finish().unwrap();
    assert_eq!(n.session.first_burst_length, 8192);
    assert_eq!(n.session.max_burst_length, 262_144);
    assert!(n.session.initial_r2t && n.session.immediate_data);
    assert_eq!(n.session.default_time2retain, 0);
    assert_eq!(n.session.initiator_name.as_deref(), Some("iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test"));
    assert_eq!(n.session.target_name.as_deref(), Some("iqn.2016-06.io.spdk:disk1"));
    assert_eq!(
        n.connection,
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 65_536,
            max_send_data_segment_length: 262_144
        }
    );
    assert_eq!(n.connection.rx().max_data_segment, 65_536);
    assert_eq!(n.connection.tx().max_data_segment, 262_144);
}

#[test]
fn list_keys() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    // The first offered value the target supports, in the initiator's order.
    assert_eq!(respond(&mut t, OP, &[("HeaderDigest", "CRC32C,None")]), owned(&[("HeaderDigest", "CRC32C")]));
    assert_eq!(respond(&mut t, OP, &[("DataDigest", "X-vendor,None")]), owned(&[("DataDigest", "None")]));
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(respond(&mut t, OP, &[("HeaderDigest", "MD5,SHA1")]), owned(&[("HeaderDigest", "Reject")]));
    assert_eq!(respond(&mut t, OP, &[("TaskReporting", "FastAbort,RFC3720")]), owned(&[("TaskReporting", "RFC3720")]));
    assert_eq!(t.value("HeaderDigest"), Some(Val::Str("None")));
    // A target that requires digests.
    let opts = TargetOptions { header_digest: DigestPolicy::Required, ..TargetOptions::default() };
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(respond(&mut t, OP, &[("HeaderDigest", "None,CRC32C")]), owned(&[("HeaderDigest", "CRC32C")]));
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(respond(&mut t, OP, &[("HeaderDigest", "None")]), owned(&[("HeaderDigest", "Reject")]));
    assert_eq!(t.finish(), Err(NegotiationError::Unacceptable("HeaderDigest".into())));
    // A target without digests.
    let opts = TargetOptions { data_digest: DigestPolicy::Off, ..TargetOptions::default() };
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(respond(&mut t, OP, &[("DataDigest", "CRC32C,None")]), owned(&[("DataDigest", "None")]));
}

#[test]
fn numerical_keys() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(
        respond(
            &mut t,
            OP,
            &[
                ("MaxBurstLength", "16777215"), // Min with the target's 1 MiB
                ("DefaultTime2Wait", "0"),      // Max with the target's 2
                ("DefaultTime2Retain", "3600"), // Min with 20
                ("MaxConnections", "0x10"),     // hex
                ("MaxOutstandingR2T", "65536"), // out of range
                ("ErrorRecoveryLevel", "-1"),   // malformed
                ("iSCSIProtocolLevel", "2"),    // Min with 1
            ]
        ),
        owned(&[
            ("MaxBurstLength", "1048576"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "20"),
            ("MaxConnections", "2"),
            ("MaxOutstandingR2T", "Reject"),
            ("ErrorRecoveryLevel", "Reject"),
            ("iSCSIProtocolLevel", "1"),
        ])
    );
    // A rejected key keeps its value.
    assert_eq!(t.value("MaxOutstandingR2T"), Some(Val::Num(1)));
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(respond(&mut t, OP, &[("MaxBurstLength", "511")]), owned(&[("MaxBurstLength", "Reject")]));
    let long = "1".repeat(256);
    assert_eq!(respond(&mut t, OP, &[("MaxConnections", &long)]), owned(&[("MaxConnections", "Reject")]));
    // Values that are answers, not offers.
    assert_eq!(respond(&mut t, OP, &[("DefaultTime2Wait", "NotUnderstood")]), owned(&[("DefaultTime2Wait", "Reject")]));
}

#[test]
fn boolean_keys() {
    let opts = TargetOptions { initial_r2t: false, immediate_data: true, ..TargetOptions::default() };
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(
        respond(
            &mut t,
            OP,
            &[("InitialR2T", "No"), ("ImmediateData", "No"), ("DataPDUInOrder", "No"), ("DataSequenceInOrder", "yes")]
        ),
        owned(&[
            ("InitialR2T", "No"),              // OR of No and No
            ("ImmediateData", "No"),           // AND of No and Yes
            ("DataPDUInOrder", "Yes"),         // OR of No and the target's Yes
            ("DataSequenceInOrder", "Reject"), // values are case-sensitive
        ])
    );
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(respond(&mut t, OP, &[("InitialR2T", "No")]), owned(&[("InitialR2T", "Yes")]));
}

#[test]
fn first_burst_rules() {
    // Irrelevant when InitialR2T=Yes and ImmediateData=No, whatever the order of the keys.
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(
        respond(&mut t, OP, &[("FirstBurstLength", "4096"), ("InitialR2T", "Yes"), ("ImmediateData", "No")]),
        owned(&[("InitialR2T", "Yes"), ("ImmediateData", "No"), ("FirstBurstLength", "Irrelevant")])
    );
    let mut out = TextWriter::new();
    assert!(!t.offer(&mut out), "no FirstBurstLength offer when it is irrelevant");
    t.finish().unwrap();
    // Never above MaxBurstLength, even one negotiated in the same request.
    let opts = TargetOptions { first_burst_length: 65536, max_burst_length: 1 << 20, ..TargetOptions::default() };
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(
        respond(&mut t, OP, &[("FirstBurstLength", "262144"), ("MaxBurstLength", "16384")]),
        owned(&[("MaxBurstLength", "16384"), ("FirstBurstLength", "16384")])
    );
    let n = t.finish().unwrap();
    assert_eq!((n.session.first_burst_length, n.session.max_burst_length), (16384, 16384));
    // A MaxBurstLength lowered after FirstBurstLength was settled fails the login.
    let mut t = TargetNegotiator::new(opts, true);
    respond(&mut t, OP, &[("FirstBurstLength", "65536")]);
    respond(&mut t, OP, &[("MaxBurstLength", "8192")]);
    assert_eq!(t.finish(), Err(NegotiationError::FirstBurstOverMaxBurst { first: 65536, max: 8192 }));
}

#[test]
fn unknown_irrelevant_and_misplaced_keys() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(
        respond(
            &mut t,
            OP,
            &[
                ("X-com.example.foo", "1"),
                ("X#NodeArchitecture", "libiscsi/1.20"),
                ("FooBar", "1"),
                ("headerdigest", "None"),
                ("IFMarkInt", "1~65535"),
                ("OFMarker", "Yes"),
                ("TargetAlias", "mine"),
                ("TargetPortalGroupTag", "1"),
                ("SendTargets", "All"),
                ("RDMAExtensions", "No"),
            ]
        ),
        owned(&[
            ("X-com.example.foo", "NotUnderstood"),
            ("FooBar", "NotUnderstood"),
            ("headerdigest", "NotUnderstood"), // keys are case-sensitive
            ("IFMarkInt", "Reject"),           // obsolete: RFC 7143 section 13.25
            ("OFMarker", "No"),
            ("TargetAlias", "Reject"), // the target's own keys
            ("TargetPortalGroupTag", "Reject"),
            ("SendTargets", "Reject"), // full feature phase only
            ("RDMAExtensions", "NotUnderstood"),
        ])
    );
    assert_eq!(t.declared("X#NodeArchitecture"), Some("libiscsi/1.20"));
    // Discovery: the session keys are irrelevant.
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(
        respond(
            &mut t,
            Phase::Login(Stage::Security),
            &[
                ("MaxBurstLength", "4096"),
                ("SessionType", "Discovery"),
                ("InitialR2T", "No"),
                ("DefaultTime2Wait", "5"),
                ("TaskReporting", "RFC3720")
            ]
        ),
        owned(&[
            ("MaxBurstLength", "Irrelevant"),
            ("InitialR2T", "Irrelevant"),
            ("DefaultTime2Wait", "5"),
            ("TaskReporting", "Irrelevant")
        ])
    );
    assert_eq!(t.session_type(), SessionType::Discovery);
    let n = t.finish().unwrap();
    assert_eq!(n.session.session_type, SessionType::Discovery);
    assert_eq!(n.session.max_burst_length, 262_144);
    // A connection joining a session: leading-only keys are irrelevant, declarations fine.
    let mut t = TargetNegotiator::new(TargetOptions::default(), false);
    assert_eq!(
        respond(&mut t, OP, &[("SessionType", "Normal"), ("MaxConnections", "4"), ("HeaderDigest", "CRC32C")]),
        owned(&[("MaxConnections", "Irrelevant"), ("HeaderDigest", "CRC32C")])
    );
    // Full feature phase: login-only keys are rejected, SendTargets goes to the caller.
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    let mut out = TextWriter::new();
    let s = t
        .respond(
            Phase::FullFeature,
            &kv(&[("SendTargets", "All"), ("MaxBurstLength", "512"), ("AuthMethod", "None"), ("InitiatorAlias", "a")]),
            &mut out,
        )
        .unwrap();
    assert_eq!(s.send_targets.as_deref(), Some("All"));
    assert_eq!(answers(&out), owned(&[("MaxBurstLength", "Reject"), ("AuthMethod", "Reject")]));
}

#[test]
fn many_keys_stay_cheap() {
    // 64 KiB of continued text makes some 20000 pairs: duplicates are found by hashing, not
    // by comparing every pair with every other.
    let pairs: Vec<KeyValue> = (0..20_000).map(|i| KeyValue::new(&format!("X-k{i}"), "1")).collect();
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    let mut out = TextWriter::new();
    let start = std::time::Instant::now();
    t.respond(Phase::FullFeature, &pairs, &mut out).unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(out.as_bytes().iter().filter(|b| **b == 0).count(), 20_000);
}

#[test]
fn security_keys_go_to_the_caller() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    let mut out = TextWriter::new();
    let s = t
        .respond(
            Phase::Login(Stage::Security),
            &kv(&[("AuthMethod", "CHAP,None"), ("HeaderDigest", "None"), ("CHAP_A", "5")]),
            &mut out,
        )
        .unwrap();
    assert_eq!(s.security, kv(&[("AuthMethod", "CHAP,None"), ("CHAP_A", "5")]));
    assert_eq!(answers(&out), owned(&[("HeaderDigest", "None")]));
    let e = t.respond(OP, &kv(&[("CHAP_N", "user")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::SecurityKeyOutOfStage("CHAP_N".into()));
}

#[test]
fn repeats() {
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    let mut out = TextWriter::new();
    // Twice in one request.
    let e = t.respond(OP, &kv(&[("InitialR2T", "Yes"), ("InitialR2T", "Yes")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::Duplicate("InitialR2T".into()));
    // Again in a later request.
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    respond(&mut t, OP, &[("MaxBurstLength", "8192"), ("InitiatorName", "iqn.a")]);
    let e = t.respond(OP, &kv(&[("MaxBurstLength", "8192")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::Duplicate("MaxBurstLength".into()));
    // Declarations may repeat with the same value (libiscsi does), not another.
    assert_eq!(respond(&mut t, OP, &[("InitiatorName", "iqn.a")]), vec![]);
    let e = t.respond(OP, &kv(&[("InitiatorName", "iqn.b")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::Redeclared("InitiatorName".into()));
    // MaxRecvDataSegmentLength is declared once by the target, answered with its own.
    let mut t = TargetNegotiator::new(TargetOptions::default(), true);
    assert_eq!(
        respond(&mut t, OP, &[("MaxRecvDataSegmentLength", "100")]),
        owned(&[("MaxRecvDataSegmentLength", "Reject"), ("MaxRecvDataSegmentLength", "65536")])
    );
    assert_eq!(respond(&mut t, OP, &[("MaxRecvDataSegmentLength", "4096")]), vec![]);
    assert_eq!(t.peer_max_recv_data_segment_length(), Some(4096));
}

#[test]
fn target_offers_what_defaults_do_not_give() {
    let opts = TargetOptions {
        immediate_data: false,
        default_time2retain: 10,
        header_digest: DigestPolicy::Required,
        ..TargetOptions::default()
    };
    let mut t = TargetNegotiator::new(opts, true);
    assert_eq!(respond(&mut t, OP, &[("InitiatorName", "iqn.a")]), vec![]);
    let mut out = TextWriter::new();
    assert!(t.offer(&mut out));
    // FirstBurstLength is irrelevant once ImmediateData=No settles with InitialR2T=Yes, but
    // ImmediateData is only offered yet: the target offers its 8192 too.
    assert_eq!(
        answers(&out),
        owned(&[
            ("HeaderDigest", "CRC32C"),
            ("ImmediateData", "No"),
            ("FirstBurstLength", "8192"),
            ("DefaultTime2Retain", "10"),
        ])
    );
    assert_eq!(t.finish(), Err(NegotiationError::Unanswered("HeaderDigest".into())));
    // The initiator's answers: possible outcomes only.
    let mut t2 = t.clone();
    let mut out = TextWriter::new();
    let e = t2.respond(OP, &kv(&[("DefaultTime2Retain", "30")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::BadAnswer("DefaultTime2Retain".into()));
    assert_eq!(
        respond(
            &mut t,
            OP,
            &[
                ("HeaderDigest", "CRC32C"),
                ("ImmediateData", "No"),
                ("FirstBurstLength", "4096"),
                ("DefaultTime2Retain", "0")
            ]
        ),
        vec![],
        "answers are not answered"
    );
    let mut out = TextWriter::new();
    assert!(!t.offer(&mut out));
    let n = t.finish().unwrap();
    assert!(n.connection.header_digest && !n.session.immediate_data);
    assert_eq!((n.session.first_burst_length, n.session.default_time2retain), (4096, 0));
    // An offer refused leaves an outcome the target cannot take: the login fails.
    let mut t = TargetNegotiator::new(opts, true);
    t.offer(&mut TextWriter::new());
    respond(
        &mut t,
        OP,
        &[
            ("HeaderDigest", "Reject"),
            ("ImmediateData", "No"),
            ("FirstBurstLength", "8192"),
            ("DefaultTime2Retain", "0"),
        ],
    );
    assert_eq!(t.finish(), Err(NegotiationError::Unacceptable("HeaderDigest".into())));
}

fn pairs_of(out: &TextWriter) -> Vec<KeyValue> {
    parse_text(out.as_bytes()).unwrap()
}

/// An initiator and a target negotiate to the same session parameters.
fn run(iopts: InitiatorOptions, topts: TargetOptions, session_type: SessionType) -> (Negotiated, Negotiated) {
    let mut i = InitiatorNegotiator::new(iopts, session_type);
    let mut t = TargetNegotiator::new(topts, true);
    let mut req = TextWriter::new();
    req.push("InitiatorName", "iqn.i");
    req.push("SessionType", session_type.as_str());
    i.offer(&mut req);
    for _ in 0..3 {
        let mut resp = TextWriter::new();
        t.respond(OP, &pairs_of(&req), &mut resp).unwrap();
        let pending = t.offer(&mut resp);
        req = TextWriter::new();
        i.apply(&pairs_of(&resp), &mut req).unwrap();
        if !pending {
            break;
        }
    }
    (i.finish().unwrap(), t.finish().unwrap())
}

#[test]
fn initiator_and_target_agree() {
    let (i, t) = run(InitiatorOptions::default(), TargetOptions::default(), SessionType::Normal);
    assert_eq!(i.session.first_burst_length, 8192);
    assert_eq!(i.connection.max_send_data_segment_length, t.connection.max_recv_data_segment_length);
    assert_eq!(t.connection.max_send_data_segment_length, i.connection.max_recv_data_segment_length);
    let strip = |mut s: SessionParams| {
        s.initiator_name = None;
        s.target_name = None;
        s.initiator_alias = None;
        s
    };
    assert_eq!(strip(i.session), strip(t.session));
    let (i, t) = run(InitiatorOptions::default(), TargetOptions::default(), SessionType::Discovery);
    assert_eq!(i.session.session_type, SessionType::Discovery);
    assert_eq!(t.session.session_type, SessionType::Discovery);
}

#[test]
fn initiator_checks_answers() {
    let mut i = InitiatorNegotiator::new(InitiatorOptions::default(), SessionType::Normal);
    let mut req = TextWriter::new();
    i.offer(&mut req);
    let mut out = TextWriter::new();
    // Above the initiator's MaxBurstLength offer: not a Min outcome.
    let e = i.apply(&kv(&[("MaxBurstLength", "1048576")]), &mut out).unwrap_err();
    assert_eq!(e, NegotiationError::BadAnswer("MaxBurstLength".into()));
    let mut i = InitiatorNegotiator::new(InitiatorOptions::default(), SessionType::Normal);
    i.offer(&mut TextWriter::new());
    // The target's declarations and an offer of its own.
    let sec = i
        .apply(
            &kv(&[
                ("TargetAlias", "disk"),
                ("TargetPortalGroupTag", "1"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("X-target-thing", "1"),
                ("CHAP_A", "5"),
                ("HeaderDigest", "None"),
            ]),
            &mut out,
        )
        .unwrap();
    assert_eq!(sec, kv(&[("CHAP_A", "5")]));
    assert_eq!(answers(&out), owned(&[("X-target-thing", "NotUnderstood")]));
    // Unanswered offers: only AND with No and OR with Yes may go without an answer.
    assert_eq!(i.finish(), Err(NegotiationError::Unanswered("DataDigest".into())));
}

fn arb_target_options() -> impl Strategy<Value = TargetOptions> {
    (
        512u32..=(1 << 20),
        512u32..=(1 << 20),
        any::<(bool, bool, bool, bool)>(),
        (1u16..=8, 1u16..=8, 0u16..=10, 0u16..=30, 0u8..=2),
        prop::sample::select(&[DigestPolicy::Off, DigestPolicy::Allowed, DigestPolicy::Preferred][..]),
    )
        .prop_map(|(fbl, mbl, (imm, r2t, pio, sio), (mc, mor2t, t2w, t2r, erl), dig)| TargetOptions {
            max_recv_data_segment_length: 8192,
            first_burst_length: fbl.min(mbl),
            max_burst_length: mbl,
            immediate_data: imm,
            initial_r2t: r2t,
            error_recovery_level: erl,
            max_connections: mc,
            max_outstanding_r2t: mor2t,
            default_time2wait: t2w,
            default_time2retain: t2r,
            data_pdu_in_order: pio,
            data_sequence_in_order: sio,
            header_digest: dig,
            data_digest: DigestPolicy::Allowed,
        })
}

fn arb_initiator_options() -> impl Strategy<Value = InitiatorOptions> {
    (
        512u32..=(1 << 20),
        512u32..=(1 << 20),
        any::<(bool, bool, bool, bool)>(),
        (1u16..=8, 1u16..=8, 0u16..=10, 0u16..=30, 0u8..=2),
        prop::sample::select(&[DigestPolicy::Allowed, DigestPolicy::Preferred][..]),
    )
        .prop_map(|(fbl, mbl, (imm, r2t, pio, sio), (mc, mor2t, t2w, t2r, erl), dig)| InitiatorOptions {
            header_digest: dig,
            data_digest: DigestPolicy::Preferred,
            max_recv_data_segment_length: 16384,
            max_burst_length: mbl,
            first_burst_length: fbl,
            initial_r2t: r2t,
            immediate_data: imm,
            max_connections: mc,
            max_outstanding_r2t: mor2t,
            default_time2wait: t2w,
            default_time2retain: t2r,
            error_recovery_level: erl,
            data_pdu_in_order: pio,
            data_sequence_in_order: sio,
        })
}

proptest! {
    /// Whatever both sides want, they settle on the same values, within both sides' limits.
    #[test]
    fn both_sides_agree(iopts in arb_initiator_options(), topts in arb_target_options()) {
        let (i, t) = run(iopts, topts, SessionType::Normal);
        prop_assert_eq!(i.session.max_burst_length, t.session.max_burst_length);
        prop_assert_eq!(i.session.first_burst_length, t.session.first_burst_length);
        prop_assert_eq!(i.session.immediate_data, t.session.immediate_data);
        prop_assert_eq!(i.session.initial_r2t, t.session.initial_r2t);
        prop_assert_eq!(i.session.max_connections, t.session.max_connections);
        prop_assert_eq!(i.session.default_time2wait, t.session.default_time2wait);
        prop_assert_eq!(i.session.default_time2retain, t.session.default_time2retain);
        prop_assert_eq!(i.session.error_recovery_level, t.session.error_recovery_level);
        prop_assert_eq!(i.connection.header_digest, t.connection.header_digest);
        prop_assert_eq!(i.connection.data_digest, t.connection.data_digest);
        prop_assert!(u64::from(t.session.max_burst_length) <= u64::from(topts.max_burst_length.min(iopts.max_burst_length)));
        prop_assert!(t.session.max_connections <= topts.max_connections);
        prop_assert!(!t.session.immediate_data || topts.immediate_data);
        prop_assert!(t.session.initial_r2t || !topts.initial_r2t);
        prop_assert!(t.session.default_time2wait >= topts.default_time2wait);
        if !t.session.initial_r2t || t.session.immediate_data {
            prop_assert!(t.session.first_burst_length <= topts.first_burst_length);
            prop_assert!(t.session.first_burst_length <= t.session.max_burst_length);
        }
        if topts.header_digest == DigestPolicy::Off {
            prop_assert!(!t.connection.header_digest);
        }
    }

    /// Any key=value text gets an answer or a clean error, never a panic.
    #[test]
    fn arbitrary_text(bytes in prop::collection::vec(any::<u8>(), 0..300), leading in any::<bool>(), stage in 0u8..3) {
        let phase = match stage {
            0 => Phase::Login(Stage::Security),
            1 => OP,
            _ => Phase::FullFeature,
        };
        if let Ok(pairs) = parse_text(&bytes) {
            let mut t = TargetNegotiator::new(TargetOptions::default(), leading);
            let mut out = TextWriter::new();
            if t.respond(phase, &pairs, &mut out).is_ok() {
                t.offer(&mut out);
                let _ = t.finish();
            }
        }
    }
}
