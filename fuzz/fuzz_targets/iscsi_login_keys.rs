//! Fuzzes the iSCSI text key parser, the key negotiation and the target's login
//! (crates/iscsi/src/{keys,negotiate,login}). The first 4 bytes set things up, the rest is
//! text:
//!
//! - byte 0: bits 0-1 the authentication policy (none, optional, CHAP, mutual CHAP), bit 2
//!   the negotiation runs in the full feature phase (else in a login stage), bit 3 the
//!   connection is not the session's leading one, bit 4 the target requires digests, bit 5
//!   the target refuses immediate data;
//! - byte 1: where the text is split for the C-bit continuation test;
//! - bytes 2, 3: the first login request's flags (T, C, CSG, NSG as in a BHS byte 1) and
//!   those of the following ones.
//!
//! The text is parsed whole and in two continued pieces (same pairs either way), negotiated
//! (answers parse back; a refused key never leaves the negotiator half-settled), and split at
//! 0xff bytes into the data of successive Login Requests for a TargetLogin. Nothing may panic,
//! every response fits the login's 8192 bytes, a finished login stays finished, and a
//! successful one has a TSIH and FirstBurstLength within MaxBurstLength.

#![no_main]

use ferrite_iscsi::chap::{ChapSecrets, Credentials};
use ferrite_iscsi::keys::{self, parse_text, TextAssembler, TextWriter};
use ferrite_iscsi::login::{
    AuthMode, AuthPolicy, LoginContext, LoginStatus, Outcome, SessionRef, TargetInfo, TargetLogin, TargetLoginConfig,
    TargetLookup,
};
use ferrite_iscsi::negotiate::target::Phase;
use ferrite_iscsi::negotiate::{DigestPolicy, Negotiated, TargetNegotiator, TargetOptions};
use ferrite_iscsi::pdu::{Isid, LoginRequest, Stage, DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH};
use libfuzzer_sys::fuzz_target;

struct Ctx {
    auth: AuthPolicy,
    options: TargetOptions,
    seed: u8,
}

impl LoginContext for Ctx {
    fn lookup_target(&mut self, name: &str, _initiator: &str) -> TargetLookup {
        match name.len() % 5 {
            0 => TargetLookup::NotFound,
            1 => TargetLookup::Moved { address: "10.0.0.1:3260,1".into(), permanent: false },
            _ => TargetLookup::Found(TargetInfo {
                name: name.into(),
                alias: Some("alias".into()),
                auth: self.auth,
                options: Some(self.options),
            }),
        }
    }
    fn discovery_auth(&mut self, _initiator: &str) -> Option<AuthPolicy> {
        Some(self.auth)
    }
    fn chap_secrets(&mut self, _target: Option<&str>, name: &str) -> Option<ChapSecrets> {
        (name == "user").then(|| ChapSecrets {
            secret: b"0123456789ab".to_vec(),
            mutual: Some(Credentials { name: "tgt".into(), secret: b"ba9876543210".to_vec() }),
        })
    }
    fn join_session(&mut self, s: &SessionRef<'_>) -> Result<(), LoginStatus> {
        if s.tsih == 1 {
            Ok(())
        } else {
            Err(LoginStatus::SESSION_DOES_NOT_EXIST)
        }
    }
    fn create_session(&mut self, _s: &SessionRef<'_>, n: &Negotiated) -> Result<u16, LoginStatus> {
        assert!(n.connection.max_recv_data_segment_length >= 512);
        Ok(1)
    }
    fn random(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.seed = self.seed.wrapping_mul(13).wrapping_add(7);
            *b = self.seed;
        }
    }
}

fn request(flags: u8, tsih: u16) -> LoginRequest {
    LoginRequest {
        transit: flags & 0x80 != 0,
        continue_: flags & 0x40 != 0,
        csg: (flags >> 2) & 3,
        nsg: flags & 3,
        version_max: 0,
        version_min: 0,
        isid: Isid([0x80, 0, 0, 1, 0, 0]),
        tsih,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 4 {
        return;
    }
    let setup = input[0];
    let text = &input[4..];
    let auth = AuthPolicy {
        mode: match setup & 3 {
            0 => AuthMode::None,
            1 => AuthMode::Optional,
            _ => AuthMode::Chap,
        },
        mutual: setup & 3 == 3,
    };
    let options = TargetOptions {
        header_digest: if setup & 0x10 != 0 { DigestPolicy::Required } else { DigestPolicy::Allowed },
        immediate_data: setup & 0x20 == 0,
        ..TargetOptions::default()
    };
    let leading = setup & 8 == 0;

    // Parsing: whole, and continued at any cut, give the same pairs.
    let whole = parse_text(text);
    let cut = usize::from(input[1]).min(text.len());
    let mut asm = TextAssembler::new();
    let joined = asm.push(&text[..cut], true).and_then(|none| {
        assert!(none.is_none());
        asm.push(&text[cut..], false)
    });
    match (&whole, joined) {
        (Ok(a), Ok(Some(b))) => assert_eq!(a, &b),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole {a:?} vs continued {b:?}"),
    }
    if let Ok(pairs) = &whole {
        for kv in pairs {
            assert!(!kv.key.is_empty() && kv.key.len() <= keys::MAX_KEY_LEN);
            assert!(kv.value.len() <= keys::MAX_VALUE_LEN);
            let _ = keys::parse_number(&kv.value);
            let _ = keys::parse_binary(&kv.value);
        }
        // Negotiation: answers are well-formed text about the keys asked (plus the target's
        // own MaxRecvDataSegmentLength).
        let phase = if setup & 4 != 0 { Phase::FullFeature } else { Phase::Login(Stage::Operational) };
        let mut neg = TargetNegotiator::new(options, leading);
        let mut out = TextWriter::new();
        if neg.respond(phase, pairs, &mut out).is_ok() {
            let answers = parse_text(out.as_bytes()).expect("answers parse");
            for a in &answers {
                assert!(
                    pairs.iter().any(|p| p.key == a.key) || a.key == "MaxRecvDataSegmentLength",
                    "answer to a key not asked: {a:?}"
                );
            }
            let mut offers = TextWriter::new();
            let pending = neg.offer(&mut offers);
            assert_eq!(pending, !offers.is_empty());
            if !pending {
                if let Ok(n) = neg.finish() {
                    let s = &n.session;
                    if !(s.initial_r2t && !s.immediate_data) {
                        assert!(s.first_burst_length <= s.max_burst_length);
                    }
                }
            }
        }
    }

    // A whole login: the text split at 0xff bytes into successive requests.
    let mut ctx = Ctx { auth, options, seed: input[1] };
    let mut login = TargetLogin::new(TargetLoginConfig { options, ..TargetLoginConfig::default() });
    let tsih = if leading { 0 } else { 1 };
    for (i, piece) in text.split(|b| *b == 0xff).enumerate().take(16) {
        let flags = if i == 0 { input[2] } else { input[3] };
        let finished = login.is_finished();
        let reply = login.on_request(&mut ctx, &request(flags, tsih), piece);
        assert!(reply.data.len() <= DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH as usize);
        let _ = reply.encode();
        match reply.outcome {
            Outcome::Continue => assert!(!finished),
            Outcome::FullFeature(r) => {
                assert!(!finished);
                assert_ne!(r.tsih, 0);
                assert_eq!(reply.response.tsih, r.tsih);
                assert!(reply.response.transit && reply.response.nsg == 3);
                let s = &r.negotiated.session;
                if !(s.initial_r2t && !s.immediate_data) && leading {
                    assert!(s.first_burst_length <= s.max_burst_length);
                }
            }
            Outcome::Failed(st) => {
                assert!(!st.is_success());
                assert!(!reply.response.transit);
                assert_eq!((reply.response.status_class, reply.response.status_detail), (st.class, st.detail));
            }
        }
        if finished {
            assert!(matches!(login.on_request(&mut ctx, &request(flags, tsih), b"").outcome, Outcome::Failed(_)));
        }
    }
});
