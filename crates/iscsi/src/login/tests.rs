//! Login sequences: no authentication, one-way and mutual CHAP, wrong secrets, discovery,
//! every failure status, continued text, the target's offers, joining connections.

use std::collections::HashMap;

use super::*;
use crate::chap::{self, Credentials};
use crate::keys::parse_text;
use crate::negotiate::DigestPolicy;
use crate::pdu::{decode_whole, Role, RESERVED_TAG};

const INITIATOR: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test";
const TARGET: &str = "iqn.2016-06.io.spdk:disk1";

#[derive(Default)]
struct Ctx {
    targets: HashMap<String, TargetLookup>,
    discovery: Option<AuthPolicy>,
    secrets: HashMap<String, ChapSecrets>,
    sessions: Vec<u16>,
    next_tsih: u16,
    random_calls: usize,
    joined: Vec<(u16, u16)>,
}

impl Ctx {
    fn new(auth: AuthPolicy) -> Ctx {
        let mut c = Ctx { discovery: Some(auth), next_tsih: 0x10, ..Ctx::default() };
        c.targets.insert(
            TARGET.to_string(),
            TargetLookup::Found(TargetInfo { name: TARGET.into(), alias: Some("disk1".into()), auth, options: None }),
        );
        c.secrets.insert(
            "user".into(),
            ChapSecrets {
                secret: b"initiator-secret".to_vec(),
                mutual: Some(Credentials { name: "target".into(), secret: b"target-secret!!".to_vec() }),
            },
        );
        c
    }
}

impl LoginContext for Ctx {
    fn lookup_target(&mut self, target_name: &str, _initiator: &str) -> TargetLookup {
        self.targets.get(target_name).cloned().unwrap_or(TargetLookup::NotFound)
    }
    fn discovery_auth(&mut self, _initiator: &str) -> Option<AuthPolicy> {
        self.discovery
    }
    fn chap_secrets(&mut self, _target: Option<&str>, name: &str) -> Option<ChapSecrets> {
        self.secrets.get(name).cloned()
    }
    fn join_session(&mut self, s: &SessionRef<'_>) -> Result<(), LoginStatus> {
        self.joined.push((s.tsih, s.cid));
        if self.sessions.contains(&s.tsih) {
            Ok(())
        } else {
            Err(LoginStatus::SESSION_DOES_NOT_EXIST)
        }
    }
    fn create_session(&mut self, _s: &SessionRef<'_>, _n: &Negotiated) -> Result<u16, LoginStatus> {
        self.next_tsih += 1;
        self.sessions.push(self.next_tsih);
        Ok(self.next_tsih)
    }
    fn random(&mut self, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (self.random_calls * 31 + i * 7 + 1) as u8;
        }
        self.random_calls += 1;
    }
}

fn counter_random() -> impl FnMut(&mut [u8]) {
    let mut n = 0u8;
    move |buf: &mut [u8]| {
        for b in buf {
            n = n.wrapping_add(37);
            *b = n;
        }
    }
}

/// Sends a request through the codec both ways (as a connection would) and answers it.
fn exchange(t: &mut TargetLogin, ctx: &mut Ctx, req: &LoginRequest, data: &[u8]) -> LoginReply {
    let wire = crate::pdu::encode_to_vec(&PduParams::LOGIN, &Pdu::LoginRequest(*req), &[], data).unwrap();
    let d = decode_whole(Role::Target, &PduParams::LOGIN, &wire).unwrap().unwrap();
    let Pdu::LoginRequest(r) = d.header.pdu else { panic!() };
    let reply = t.on_request(ctx, &r, d.data);
    let back = reply.encode();
    let d = decode_whole(Role::Initiator, &PduParams::LOGIN, &back).unwrap().unwrap();
    assert_eq!(d.header.pdu, Pdu::LoginResponse(reply.response));
    assert_eq!(d.data, &reply.data[..]);
    reply
}

/// The target's last reply, the initiator's last step, the request and response texts.
type Run = (LoginReply, Result<InitiatorStep, InitiatorLoginError>, Vec<(Vec<u8>, Vec<u8>)>);

/// Runs a whole login between an [`InitiatorLogin`] and a [`TargetLogin`]; returns the
/// target's last reply, the initiator's result (or error), and the texts exchanged.
fn run(icfg: InitiatorLoginConfig, tcfg: TargetLoginConfig, ctx: &mut Ctx) -> Run {
    let mut i = InitiatorLogin::new(icfg);
    let mut t = TargetLogin::new(tcfg);
    let mut rnd = counter_random();
    let mut step = i.start();
    let mut texts = Vec::new();
    for _ in 0..10 {
        let InitiatorStep::Send { request, data } = step else { unreachable!() };
        let reply = exchange(&mut t, ctx, &request, &data);
        texts.push((data.clone(), reply.data.clone()));
        let next = i.on_response(&reply.response, &reply.data, &mut rnd);
        match (&reply.outcome, next) {
            (Outcome::Continue, Ok(s @ InitiatorStep::Send { .. })) => step = s,
            (_, next) => return (reply, next, texts),
        }
    }
    panic!("login did not end");
}

fn pairs(data: &[u8]) -> Vec<(String, String)> {
    parse_text(data).unwrap().into_iter().map(|kv| (kv.key, kv.value)).collect()
}

fn icfg() -> InitiatorLoginConfig {
    InitiatorLoginConfig::new(INITIATOR, Some(TARGET))
}

fn chap_icfg(secret: &[u8], mutual: bool) -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        chap: Some(Credentials { name: "user".into(), secret: secret.to_vec() }),
        mutual: mutual.then(|| Credentials { name: "target".into(), secret: b"target-secret!!".to_vec() }),
        ..icfg()
    }
}

fn done(r: &LoginReply) -> &LoginResult {
    match &r.outcome {
        Outcome::FullFeature(d) => d,
        o => panic!("not done: {o:?}"),
    }
}

#[test]
fn no_auth_login_as_libiscsi_sends_it() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    let (reply, ires, texts) = run(icfg(), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(texts.len(), 1, "one request: operational stage straight to full feature");
    let r = done(&reply);
    assert_eq!(r.tsih, 0x11);
    assert!(r.leading && r.chap_name.is_none());
    assert_eq!(reply.response.tsih, 0x11);
    assert!(reply.response.transit);
    assert_eq!((reply.response.csg, reply.response.nsg), (1, 3));
    let answers = pairs(&reply.data);
    assert_eq!(answers[0], ("TargetAlias".into(), "disk1".into()));
    assert_eq!(answers[1], ("TargetPortalGroupTag".into(), "1".into()));
    assert!(answers.contains(&("FirstBurstLength".into(), "8192".into())));
    let Ok(InitiatorStep::Done(i)) = ires else { panic!("{ires:?}") };
    assert_eq!(i.tsih, 0x11);
    assert_eq!(i.negotiated.session.first_burst_length, r.negotiated.session.first_burst_length);
    assert_eq!(i.negotiated.session.target_alias.as_deref(), Some("disk1"));
    assert_eq!(i.negotiated.session.target_portal_group_tag, Some(1));
    assert_eq!(i.negotiated.connection.max_send_data_segment_length, 65536);
    assert_eq!(r.negotiated.session.initiator_name.as_deref(), Some(INITIATOR));
    assert_eq!(r.next_stat_sn, 1);
    assert_eq!(i.exp_stat_sn, 1);
}

#[test]
fn one_way_chap() {
    let policy = AuthPolicy { mode: AuthMode::Chap, mutual: false };
    let mut ctx = Ctx::new(policy);
    let (reply, ires, texts) = run(chap_icfg(b"initiator-secret", false), TargetLoginConfig::default(), &mut ctx);
    assert!(matches!(ires, Ok(InitiatorStep::Done(_))), "{ires:?}");
    assert_eq!(done(&reply).chap_name.as_deref(), Some("user"));
    // The sequence libiscsi sends (lib/login.c): AuthMethod, CHAP_A, CHAP_N/CHAP_R, then
    // the operational keys.
    assert_eq!(texts.len(), 4);
    assert!(pairs(&texts[0].0).contains(&("AuthMethod".into(), "CHAP,None".into())));
    assert_eq!(&pairs(&texts[0].1)[2..], &[("AuthMethod".into(), "CHAP".into())]);
    assert_eq!(pairs(&texts[1].0), vec![("CHAP_A".into(), "5".into())]);
    let challenge = pairs(&texts[1].1);
    assert_eq!(challenge[0], ("CHAP_A".into(), "5".into()));
    assert_eq!(challenge[1].0, "CHAP_I");
    assert_eq!(challenge[2].0, "CHAP_C");
    // The response is MD5(I || secret || C), as libiscsi's compute_chap_r_md5 computes it.
    let id: u8 = challenge[1].1.parse().unwrap();
    let c = crate::keys::parse_binary(&challenge[2].1).unwrap();
    assert_eq!(c.len(), chap::DEFAULT_CHALLENGE_LEN);
    let expect = crate::keys::hex_encode(&chap::response(id, b"initiator-secret", &c));
    assert_eq!(pairs(&texts[2].0), vec![("CHAP_N".into(), "user".into()), ("CHAP_R".into(), expect)]);
    assert!(texts[2].1.is_empty());
}

#[test]
fn mutual_chap() {
    let policy = AuthPolicy { mode: AuthMode::Chap, mutual: true };
    let mut ctx = Ctx::new(policy);
    let (reply, ires, texts) = run(chap_icfg(b"initiator-secret", true), TargetLoginConfig::default(), &mut ctx);
    assert!(matches!(ires, Ok(InitiatorStep::Done(_))), "{ires:?}");
    done(&reply);
    let target_answer = pairs(&texts[2].1);
    assert_eq!(target_answer[0], ("CHAP_N".into(), "target".into()));
    assert_eq!(target_answer[1].0, "CHAP_R");
    // One-way CHAP from the initiator when the target wants mutual: refused.
    let mut ctx = Ctx::new(policy);
    let (reply, _, _) = run(chap_icfg(b"initiator-secret", false), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // Mutual CHAP with a target that has no credentials for it: refused.
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Chap, mutual: false });
    ctx.secrets.get_mut("user").unwrap().mutual = None;
    let (reply, _, _) = run(chap_icfg(b"initiator-secret", true), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
}

#[test]
fn wrong_chap_secret_or_name() {
    let policy = AuthPolicy { mode: AuthMode::Chap, mutual: false };
    let mut ctx = Ctx::new(policy);
    let (reply, ires, _) = run(chap_icfg(b"wrong-secret", false), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    assert_eq!(ires, Err(InitiatorLoginError::Status(LoginStatus::AUTHENTICATION_FAILURE)));
    assert_eq!((reply.response.status_class, reply.response.status_detail), (2, 1));
    assert!(!reply.response.transit && reply.data.is_empty());
    let mut cfg = chap_icfg(b"initiator-secret", false);
    cfg.chap.as_mut().unwrap().name = "stranger".into();
    let mut ctx = Ctx::new(policy);
    let (reply, _, _) = run(cfg, TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // The initiator checks the target's mutual answer too.
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Chap, mutual: true });
    ctx.secrets.get_mut("user").unwrap().mutual.as_mut().unwrap().secret = b"other-target-secret".to_vec();
    let (_, ires, _) = run(chap_icfg(b"initiator-secret", true), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(ires, Err(InitiatorLoginError::Chap(chap::ChapError::WrongResponse)));
}

#[test]
fn chap_required_but_skipped() {
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Chap, mutual: false });
    let (reply, _, _) = run(icfg(), TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // An initiator offering only None to a target that requires CHAP.
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let req = request(0, Some(1), 0);
    let reply = t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")]),
    );
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
}

#[test]
fn optional_chap_takes_none() {
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Optional, mutual: false });
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let req = request(0, Some(1), 0);
    let reply = t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None,CHAP")]),
    );
    assert_eq!(reply.outcome, Outcome::Continue);
    assert!(reply.response.transit);
    assert_eq!(reply.response.nsg, 1);
    assert!(pairs(&reply.data).contains(&("AuthMethod".into(), "None".into())));
    assert_eq!(t.stage(), Stage::Operational);
}

fn request(csg: u8, nsg: Option<u8>, tsih: u16) -> LoginRequest {
    LoginRequest {
        transit: nsg.is_some(),
        continue_: false,
        csg,
        nsg: nsg.unwrap_or(0),
        version_max: 0,
        version_min: 0,
        isid: Isid([0x80, 1, 2, 3, 0, 0]),
        tsih,
        itt: 7,
        cid: 1,
        cmd_sn: 100,
        exp_stat_sn: 0,
    }
}

fn text(p: &[(&str, &str)]) -> Vec<u8> {
    let mut w = TextWriter::new();
    for (k, v) in p {
        w.push(k, v);
    }
    w.into_bytes()
}

fn status_of(ctx: &mut Ctx, req: &LoginRequest, p: &[(&str, &str)]) -> (Outcome, LoginReply) {
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let reply = t.on_request(ctx, req, &text(p));
    (reply.outcome.clone(), reply)
}

#[test]
fn failures_and_their_status() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    ctx.targets.insert("iqn.gone".into(), TargetLookup::Removed);
    ctx.targets.insert("iqn.secret".into(), TargetLookup::NotAuthorized);
    ctx.targets.insert("iqn.moved".into(), TargetLookup::Moved { address: "10.0.0.2:3260,1".into(), permanent: false });
    ctx.targets.insert("iqn.away".into(), TargetLookup::Moved { address: "[fe80::1]:3260,2".into(), permanent: true });
    let op = request(1, Some(3), 0);
    let fail = |s| Outcome::Failed(s);
    type Case<'a> = (LoginRequest, Vec<(&'a str, &'a str)>, LoginStatus);
    let long = format!("iqn.2024-01.x:{}", "i".repeat(224));
    let cases: Vec<Case> = vec![
        (op, vec![("TargetName", TARGET)], LoginStatus::MISSING_PARAMETER),
        (op, vec![("InitiatorName", INITIATOR)], LoginStatus::MISSING_PARAMETER),
        (op, vec![("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")], LoginStatus::NOT_FOUND),
        (op, vec![("InitiatorName", INITIATOR), ("TargetName", "iqn.gone")], LoginStatus::TARGET_REMOVED),
        (op, vec![("InitiatorName", INITIATOR), ("TargetName", "iqn.secret")], LoginStatus::AUTHORIZATION_FAILURE),
        (op, vec![("InitiatorName", INITIATOR), ("SessionType", "Boot")], LoginStatus::SESSION_TYPE_NOT_SUPPORTED),
        // Names that cannot be iSCSI names (a forged log line, an escape sequence, too long).
        (
            op,
            vec![("InitiatorName", "iqn.2024-01.y\n[x] ERROR forged"), ("TargetName", TARGET)],
            LoginStatus::INITIATOR_ERROR,
        ),
        (
            op,
            vec![("InitiatorName", "iqn.2024-01.y\u{1b}[31m"), ("SessionType", "Discovery")],
            LoginStatus::INITIATOR_ERROR,
        ),
        (op, vec![("InitiatorName", long.as_str()), ("TargetName", TARGET)], LoginStatus::INITIATOR_ERROR),
        (op, vec![("InitiatorName", INITIATOR), ("TargetName", "iqn.a b")], LoginStatus::NOT_FOUND),
        (LoginRequest { version_min: 1, version_max: 2, ..op }, vec![], LoginStatus::UNSUPPORTED_VERSION),
        (LoginRequest { continue_: true, ..op }, vec![], LoginStatus::INITIATOR_ERROR),
        (request(2, Some(3), 0), vec![], LoginStatus::INITIATOR_ERROR),
        (request(3, None, 0), vec![], LoginStatus::INITIATOR_ERROR),
        (request(1, Some(1), 0), vec![], LoginStatus::INITIATOR_ERROR),
        (request(0, Some(2), 0), vec![], LoginStatus::INITIATOR_ERROR),
        (
            op,
            vec![
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("MaxBurstLength", "512"),
                ("MaxBurstLength", "512"),
            ],
            LoginStatus::INITIATOR_ERROR,
        ),
        (op, vec![("InitiatorName", INITIATOR), ("TargetName", TARGET), ("CHAP_A", "5")], LoginStatus::INITIATOR_ERROR),
        (
            request(1, Some(3), 5),
            vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)],
            LoginStatus::SESSION_DOES_NOT_EXIST,
        ),
    ];
    for (req, p, status) in cases {
        let (outcome, reply) = status_of(&mut ctx, &req, &p);
        assert_eq!(outcome, fail(status), "{p:?}");
        assert_eq!((reply.response.status_class, reply.response.status_detail), (status.class, status.detail));
        assert!(!reply.response.transit && reply.response.csg == 0 && reply.response.nsg == 0);
    }
    // Redirections carry the new address.
    let (outcome, reply) = status_of(&mut ctx, &op, &[("InitiatorName", INITIATOR), ("TargetName", "iqn.moved")]);
    assert_eq!(outcome, fail(LoginStatus::TARGET_MOVED_TEMPORARILY));
    assert_eq!(pairs(&reply.data), vec![("TargetAddress".into(), "10.0.0.2:3260,1".into())]);
    let (outcome, _) = status_of(&mut ctx, &op, &[("InitiatorName", INITIATOR), ("TargetName", "iqn.away")]);
    assert_eq!(outcome, fail(LoginStatus::TARGET_MOVED_PERMANENTLY));
    let mut i = InitiatorLogin::new(InitiatorLoginConfig { itt: 7, isid: Isid([0x80, 1, 2, 3, 0, 0]), ..icfg() });
    let _ = i.start();
    assert_eq!(
        i.on_response(&reply.response, &reply.data, &mut counter_random()),
        Err(InitiatorLoginError::Redirect {
            status: LoginStatus::TARGET_MOVED_TEMPORARILY,
            address: Some("10.0.0.2:3260,1".into())
        })
    );
    assert_eq!(LoginStatus::AUTHENTICATION_FAILURE.to_string(), "authentication failure (0x0201)");
}

#[test]
fn request_fields_must_not_change() {
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Chap, mutual: false });
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let req = request(0, Some(1), 0);
    let r = t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")]),
    );
    assert_eq!(r.outcome, Outcome::Continue);
    assert!(!r.response.transit, "CHAP under way: no transit");
    let moved = LoginRequest { isid: Isid([0x80, 9, 9, 9, 0, 0]), transit: false, ..req };
    let r = t.on_request(&mut ctx, &moved, &text(&[("CHAP_A", "5")]));
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::INITIATOR_ERROR));
    assert!(t.is_finished());
    let r = t.on_request(&mut ctx, &req, &[]);
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn session_type_is_settled_by_the_first_request() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let req = request(1, None, 0);
    let r = t.on_request(&mut ctx, &req, &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]));
    assert_eq!(r.outcome, Outcome::Continue);
    let r = t.on_request(&mut ctx, &req, &text(&[("SessionType", "Discovery")]));
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::INITIATOR_ERROR));
    // Names may be repeated, not changed.
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    t.on_request(&mut ctx, &req, &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]));
    let r = t.on_request(&mut ctx, &req, &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]));
    assert_eq!(r.outcome, Outcome::Continue);
    let r = t.on_request(&mut ctx, &req, &text(&[("TargetName", "iqn.other")]));
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn chap_out_of_sequence() {
    let mut ctx = Ctx::new(AuthPolicy { mode: AuthMode::Chap, mutual: false });
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let req = request(0, None, 0);
    t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")]),
    );
    // CHAP_N/CHAP_R before the challenge.
    let r = t.on_request(&mut ctx, &req, &text(&[("CHAP_N", "user"), ("CHAP_R", "0x00")]));
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // An unsupported algorithm: CHAP_A=Reject, then failure.
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")]),
    );
    let r = t.on_request(&mut ctx, &req, &text(&[("CHAP_A", "7")]));
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // A reflected challenge in mutual CHAP.
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")]),
    );
    let r = t.on_request(&mut ctx, &req, &text(&[("CHAP_A", "5")]));
    let ch = pairs(&r.data);
    let id: u8 = ch[1].1.parse().unwrap();
    let c = crate::keys::parse_binary(&ch[2].1).unwrap();
    let resp = crate::keys::hex_encode(&chap::response(id, b"initiator-secret", &c));
    let r = t.on_request(
        &mut ctx,
        &LoginRequest { transit: true, nsg: 1, ..req },
        &text(&[("CHAP_N", "user"), ("CHAP_R", &resp), ("CHAP_I", "1"), ("CHAP_C", &ch[2].1)]),
    );
    assert_eq!(r.outcome, Outcome::Failed(LoginStatus::AUTHENTICATION_FAILURE));
    // Base64 responses are accepted.
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    t.on_request(
        &mut ctx,
        &req,
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")]),
    );
    let r = t.on_request(&mut ctx, &req, &text(&[("CHAP_A", "5")]));
    let ch = pairs(&r.data);
    let id: u8 = ch[1].1.parse().unwrap();
    let c = crate::keys::parse_binary(&ch[2].1).unwrap();
    let resp = crate::keys::base64_encode(&chap::response(id, b"initiator-secret", &c));
    let r = t.on_request(
        &mut ctx,
        &LoginRequest { transit: true, nsg: 1, ..req },
        &text(&[("CHAP_N", "user"), ("CHAP_R", &resp)]),
    );
    assert_eq!(r.outcome, Outcome::Continue);
    assert!(r.response.transit && r.response.nsg == 1);
}

#[test]
fn discovery_sessions() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    let cfg = InitiatorLoginConfig::new(INITIATOR, None);
    let (reply, ires, texts) = run(cfg.clone(), TargetLoginConfig::default(), &mut ctx);
    let r = done(&reply);
    assert_eq!(r.negotiated.session.session_type, SessionType::Discovery);
    assert!(r.target.is_none());
    assert!(matches!(ires, Ok(InitiatorStep::Done(_))));
    assert!(!pairs(&texts[0].1).iter().any(|(k, _)| k == "TargetPortalGroupTag"));
    // Refused by the context.
    ctx.discovery = None;
    let (reply, _, _) = run(cfg, TargetLoginConfig::default(), &mut ctx);
    assert_eq!(reply.outcome, Outcome::Failed(LoginStatus::SESSION_TYPE_NOT_SUPPORTED));
}

#[test]
fn continued_text() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    // (FirstBurstLength offered, or the target would offer its 8192 below the default.)
    let whole = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("MaxBurstLength", "65536"),
        ("FirstBurstLength", "8192"),
    ]);
    let (a, b) = whole.split_at(20);
    let first = LoginRequest { continue_: true, ..request(1, None, 0) };
    let r = t.on_request(&mut ctx, &first, a);
    assert_eq!(r.outcome, Outcome::Continue);
    assert!(r.data.is_empty() && !r.response.transit);
    let r = t.on_request(&mut ctx, &request(1, Some(3), 0), b);
    let d = done(&r);
    assert_eq!(d.negotiated.session.max_burst_length, 65536);
    assert_eq!(r.response.stat_sn, 1, "the second response");
}

#[test]
fn target_offers_before_full_feature() {
    let opts =
        TargetOptions { immediate_data: false, header_digest: DigestPolicy::Required, ..TargetOptions::default() };
    let mut ctx = Ctx::new(AuthPolicy::default());
    let mut t = TargetLogin::new(TargetLoginConfig { options: opts, ..TargetLoginConfig::default() });
    let req = request(1, Some(3), 0);
    let r = t.on_request(&mut ctx, &req, &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]));
    assert_eq!(r.outcome, Outcome::Continue);
    assert!(!r.response.transit, "offers pending");
    let p = pairs(&r.data);
    assert!(p.contains(&("HeaderDigest".into(), "CRC32C".into())));
    assert!(p.contains(&("ImmediateData".into(), "No".into())));
    let r = t.on_request(
        &mut ctx,
        &req,
        &text(&[("HeaderDigest", "CRC32C"), ("ImmediateData", "No"), ("FirstBurstLength", "8192")]),
    );
    let d = done(&r);
    assert!(d.negotiated.connection.header_digest);
    assert!(!d.negotiated.session.immediate_data);
    assert!(pairs(&r.data).contains(&("MaxRecvDataSegmentLength".into(), "65536".into())));
    // The initiator side answers offers by itself.
    let mut ctx = Ctx::new(AuthPolicy::default());
    let iopts = crate::negotiate::InitiatorOptions { header_digest: DigestPolicy::Preferred, ..Default::default() };
    let (reply, ires, _) = run(
        InitiatorLoginConfig { options: iopts, ..icfg() },
        TargetLoginConfig { options: opts, ..TargetLoginConfig::default() },
        &mut ctx,
    );
    let Ok(InitiatorStep::Done(i)) = ires else { panic!("{ires:?}") };
    assert!(i.negotiated.connection.header_digest && done(&reply).negotiated.connection.header_digest);
}

#[test]
fn joining_connection() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    ctx.sessions.push(0x42);
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let r = t.on_request(
        &mut ctx,
        &request(1, Some(3), 0x42),
        &text(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("MaxConnections", "2"),
            ("HeaderDigest", "None"),
        ]),
    );
    let d = done(&r);
    assert_eq!((d.tsih, d.leading), (0x42, false));
    assert_eq!(ctx.joined, vec![(0x42, 1)]);
    assert!(pairs(&r.data).contains(&("MaxConnections".into(), "Irrelevant".into())));
    assert_eq!(r.response.tsih, 0x42);
}

#[test]
fn response_numbers() {
    let mut ctx = Ctx::new(AuthPolicy::default());
    let mut t =
        TargetLogin::new(TargetLoginConfig { initial_stat_sn: 0x1000, cmd_window: 32, ..TargetLoginConfig::default() });
    let r = t.on_request(
        &mut ctx,
        &request(1, Some(3), 0),
        &text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("FirstBurstLength", "4096")]),
    );
    let resp = r.response;
    assert_eq!((resp.itt, resp.isid, resp.version_max, resp.version_active), (7, Isid([0x80, 1, 2, 3, 0, 0]), 0, 0));
    assert_eq!((resp.stat_sn, resp.exp_cmd_sn, resp.max_cmd_sn), (0x1000, 100, 131));
    assert_eq!(done(&r).next_stat_sn, 0x1001);
    assert_eq!(done(&r).exp_cmd_sn, 100);
    assert_ne!(resp.itt, RESERVED_TAG);
}
