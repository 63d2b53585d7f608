//! CHAP authentication (RFC 1994 with MD5, iSCSI algorithm 5; RFC 7143 section 12.1.3).
//!
//! The authenticator sends CHAP_A (the algorithm it picked), CHAP_I (a one-byte identifier)
//! and CHAP_C (a random challenge); the other side answers CHAP_N (its name) and CHAP_R =
//! MD5(identifier || secret || challenge). In mutual CHAP the initiator adds its own CHAP_I
//! and CHAP_C to that answer and the target answers with its CHAP_N and CHAP_R.
//!
//! Binary values travel as hex (`0x...`, which libiscsi expects) or base64 (`0b...`);
//! both are accepted. A responder refuses a challenge equal to the one it sent (a reflection
//! attack), and the two directions may not share a secret.
//!
//! [`ChapTarget`] is the target's side of the exchange, [`ChapInitiator`] the initiator's;
//! both are pure: randomness comes from a caller-supplied function ([`system_random`] wraps
//! the operating system's generator).

use std::fmt;

use md5::{Digest, Md5};

use crate::keys::{self, KeyValue, TextWriter};

/// CHAP_A value of CHAP with MD5, the algorithm RFC 7143 requires.
pub const ALGORITHM_MD5: u8 = 5;
/// Length of an MD5 response.
pub const RESPONSE_LEN: usize = 16;
/// Challenge length this implementation sends by default.
pub const DEFAULT_CHALLENGE_LEN: usize = 16;
/// Longest challenge RFC 7143 allows (binary bytes).
pub const MAX_CHALLENGE_LEN: usize = 1024;

/// A source of random bytes (filled in place).
pub type RandomFn<'a> = &'a mut dyn FnMut(&mut [u8]);

/// Fills `buf` from the operating system's random generator (getrandom); panics only if the
/// operating system has none, which a storage target cannot run without anyway.
pub fn system_random(buf: &mut [u8]) {
    getrandom::fill(buf).expect("the operating system's random generator is available");
}

/// The CHAP response: MD5(identifier || secret || challenge).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; RESPONSE_LEN] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Whether `received` is the response to `challenge` under `id` and `secret` (compared in
/// constant time).
pub fn verify(id: u8, secret: &[u8], challenge: &[u8], received: &[u8]) -> bool {
    let expect = response(id, secret, challenge);
    received.len() == RESPONSE_LEN && expect.iter().zip(received).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The first algorithm of a CHAP_A list that this implementation supports (only 5).
pub fn select_algorithm(list: &str) -> Option<u8> {
    keys::list_values(list).find_map(|v| (keys::parse_number(v) == Some(u64::from(ALGORITHM_MD5))).then_some(5))
}

/// A CHAP_I value: a number from 0 to 255.
pub fn parse_identifier(v: &str) -> Option<u8> {
    keys::parse_number(v).and_then(|n| u8::try_from(n).ok())
}

/// A name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The name (CHAP_N).
    pub name: String,
    /// The secret.
    pub secret: Vec<u8>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("name", &self.name).finish_non_exhaustive()
    }
}

/// What a target knows of an initiator's CHAP name: its secret, and the target's own
/// credentials for mutual CHAP with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapSecrets {
    /// The initiator's secret.
    pub secret: Vec<u8>,
    /// The name and secret the target answers with in mutual CHAP.
    pub mutual: Option<Credentials>,
}

/// Why a CHAP exchange failed (the login fails with "authentication failure").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChapError {
    /// A CHAP key in the wrong step, or one missing from its step.
    Sequence(&'static str),
    /// No algorithm offered is supported.
    NoAlgorithm,
    /// A value that does not parse (an identifier, a hex or base64 value).
    BadValue(&'static str),
    /// The name is unknown.
    UnknownName,
    /// The response does not match.
    WrongResponse,
    /// The target wants mutual CHAP and the initiator did not ask for it, or the initiator
    /// asked and the target has no credentials for it.
    Mutual,
    /// The initiator's challenge is the target's (reflection), or both directions share a
    /// secret.
    Reflection,
    /// The challenge is empty or over 1024 bytes.
    ChallengeLength,
    /// The target answered with a name other than the one expected.
    TargetName,
}

impl fmt::Display for ChapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChapError::Sequence(k) => write!(f, "CHAP key {k} out of sequence"),
            ChapError::NoAlgorithm => f.write_str("no supported CHAP algorithm offered"),
            ChapError::BadValue(k) => write!(f, "invalid {k} value"),
            ChapError::UnknownName => f.write_str("unknown CHAP name"),
            ChapError::WrongResponse => f.write_str("wrong CHAP response"),
            ChapError::Mutual => f.write_str("mutual CHAP required on one side only"),
            ChapError::Reflection => f.write_str("reflected CHAP challenge or shared secret"),
            ChapError::ChallengeLength => f.write_str("CHAP challenge length out of range"),
            ChapError::TargetName => f.write_str("unexpected target CHAP name"),
        }
    }
}

impl std::error::Error for ChapError {}

/// The CHAP keys of one login request or response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChapKeys {
    /// CHAP_A.
    pub a: Option<String>,
    /// CHAP_I.
    pub i: Option<String>,
    /// CHAP_C.
    pub c: Option<String>,
    /// CHAP_N.
    pub n: Option<String>,
    /// CHAP_R.
    pub r: Option<String>,
}

impl ChapKeys {
    /// Whether `key` is one of the CHAP keys.
    pub fn is_chap_key(key: &str) -> bool {
        matches!(key, "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R")
    }

    /// Collects the CHAP keys of `pairs` (a later duplicate replaces an earlier one; the
    /// negotiation refuses duplicates before this).
    pub fn collect(pairs: &[KeyValue]) -> ChapKeys {
        let mut k = ChapKeys::default();
        for p in pairs {
            let slot = match p.key.as_str() {
                "CHAP_A" => &mut k.a,
                "CHAP_I" => &mut k.i,
                "CHAP_C" => &mut k.c,
                "CHAP_N" => &mut k.n,
                "CHAP_R" => &mut k.r,
                _ => continue,
            };
            *slot = Some(p.value.clone());
        }
        k
    }

    /// Whether no CHAP key is present.
    pub fn is_empty(&self) -> bool {
        *self == ChapKeys::default()
    }
}

fn parse_challenge(v: &str) -> Result<Vec<u8>, ChapError> {
    let c = keys::parse_binary(v).ok_or(ChapError::BadValue("CHAP_C"))?;
    if c.is_empty() || c.len() > MAX_CHALLENGE_LEN {
        return Err(ChapError::ChallengeLength);
    }
    Ok(c)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetState {
    /// Waiting for CHAP_A.
    WaitAlgorithm,
    /// CHAP_I and CHAP_C sent; waiting for CHAP_N and CHAP_R.
    WaitResponse { id: u8, challenge: Vec<u8> },
    /// The initiator authenticated (and the target too, for mutual CHAP).
    Done,
}

/// What one step of the target's CHAP exchange came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChapProgress {
    /// More CHAP steps are needed (the target stays in the security stage).
    Continue,
    /// The initiator is authenticated as `name`.
    Authenticated {
        /// The initiator's CHAP name.
        name: String,
    },
}

/// The target's side of CHAP.
#[derive(Debug, Clone)]
pub struct ChapTarget {
    state: TargetState,
    challenge_len: usize,
    require_mutual: bool,
}

impl ChapTarget {
    /// An exchange that sends `challenge_len`-byte challenges (1..=1024) and, with
    /// `require_mutual`, refuses initiators that do not authenticate the target.
    pub fn new(challenge_len: usize, require_mutual: bool) -> ChapTarget {
        debug_assert!((1..=MAX_CHALLENGE_LEN).contains(&challenge_len));
        ChapTarget { state: TargetState::WaitAlgorithm, challenge_len, require_mutual }
    }

    /// Whether the initiator has authenticated.
    pub fn is_done(&self) -> bool {
        self.state == TargetState::Done
    }

    /// One login request's CHAP keys: writes the answer keys into `out`. `secrets` finds
    /// what the target knows of a CHAP name; `random` fills the identifier and challenge.
    pub fn step(
        &mut self,
        keys: &ChapKeys,
        secrets: &mut dyn FnMut(&str) -> Option<ChapSecrets>,
        random: RandomFn<'_>,
        out: &mut TextWriter,
    ) -> Result<ChapProgress, ChapError> {
        match &self.state {
            TargetState::WaitAlgorithm => {
                let Some(a) = &keys.a else {
                    if keys.is_empty() {
                        return Ok(ChapProgress::Continue);
                    }
                    return Err(ChapError::Sequence("CHAP_A"));
                };
                if keys.n.is_some() || keys.r.is_some() {
                    return Err(ChapError::Sequence("CHAP_N"));
                }
                let Some(alg) = select_algorithm(a) else {
                    out.push("CHAP_A", keys::REJECT);
                    return Err(ChapError::NoAlgorithm);
                };
                let mut id = [0u8; 1];
                random(&mut id);
                let mut challenge = vec![0u8; self.challenge_len];
                random(&mut challenge);
                out.push_num("CHAP_A", u64::from(alg));
                out.push_num("CHAP_I", u64::from(id[0]));
                out.push("CHAP_C", &keys::hex_encode(&challenge));
                self.state = TargetState::WaitResponse { id: id[0], challenge };
                Ok(ChapProgress::Continue)
            }
            TargetState::WaitResponse { id, challenge } => {
                if keys.a.is_some() {
                    return Err(ChapError::Sequence("CHAP_A"));
                }
                let name = keys.n.as_deref().ok_or(ChapError::Sequence("CHAP_N"))?;
                let r = keys.r.as_deref().ok_or(ChapError::Sequence("CHAP_R"))?;
                let r = keys::parse_binary(r).ok_or(ChapError::BadValue("CHAP_R"))?;
                let known = secrets(name).ok_or(ChapError::UnknownName)?;
                if !verify(*id, &known.secret, challenge, &r) {
                    return Err(ChapError::WrongResponse);
                }
                match (&keys.i, &keys.c) {
                    (Some(i), Some(c)) => {
                        let mid = parse_identifier(i).ok_or(ChapError::BadValue("CHAP_I"))?;
                        let mc = parse_challenge(c)?;
                        let mutual = known.mutual.as_ref().ok_or(ChapError::Mutual)?;
                        if mc == *challenge || mutual.secret == known.secret {
                            return Err(ChapError::Reflection);
                        }
                        out.push("CHAP_N", &mutual.name);
                        out.push("CHAP_R", &keys::hex_encode(&response(mid, &mutual.secret, &mc)));
                    }
                    (None, None) if self.require_mutual => return Err(ChapError::Mutual),
                    (None, None) => {}
                    _ => return Err(ChapError::Sequence("CHAP_I")),
                }
                self.state = TargetState::Done;
                Ok(ChapProgress::Authenticated { name: name.to_string() })
            }
            TargetState::Done => {
                if keys.is_empty() {
                    Ok(ChapProgress::Continue)
                } else {
                    Err(ChapError::Sequence("CHAP_*"))
                }
            }
        }
    }
}

/// The initiator's side of CHAP: answers the target's challenge and, for mutual CHAP,
/// challenges the target and checks its answer.
#[derive(Debug, Clone)]
pub struct ChapInitiator {
    creds: Credentials,
    target: Option<Credentials>,
    sent: Option<(u8, Vec<u8>)>,
    target_challenge: Option<Vec<u8>>,
}

impl ChapInitiator {
    /// An initiator that authenticates with `creds` and, if `target` is given, expects the
    /// target to answer with that name and secret (mutual CHAP).
    pub fn new(creds: Credentials, target: Option<Credentials>) -> ChapInitiator {
        ChapInitiator { creds, target, sent: None, target_challenge: None }
    }

    /// The algorithm offer: `CHAP_A=5`.
    pub fn offer_algorithm(&self, out: &mut TextWriter) {
        out.push_num("CHAP_A", u64::from(ALGORITHM_MD5));
    }

    /// Answers the target's CHAP_A, CHAP_I and CHAP_C with CHAP_N and CHAP_R, and for mutual
    /// CHAP with a challenge of `challenge_len` bytes of `random`.
    pub fn respond(
        &mut self,
        keys: &ChapKeys,
        challenge_len: usize,
        random: RandomFn<'_>,
        out: &mut TextWriter,
    ) -> Result<(), ChapError> {
        let a = keys.a.as_deref().ok_or(ChapError::Sequence("CHAP_A"))?;
        if keys::parse_number(a) != Some(u64::from(ALGORITHM_MD5)) {
            return Err(ChapError::NoAlgorithm);
        }
        let id = parse_identifier(keys.i.as_deref().ok_or(ChapError::Sequence("CHAP_I"))?)
            .ok_or(ChapError::BadValue("CHAP_I"))?;
        let challenge = parse_challenge(keys.c.as_deref().ok_or(ChapError::Sequence("CHAP_C"))?)?;
        out.push("CHAP_N", &self.creds.name);
        out.push("CHAP_R", &keys::hex_encode(&response(id, &self.creds.secret, &challenge)));
        if let Some(t) = &self.target {
            if t.secret == self.creds.secret {
                return Err(ChapError::Reflection);
            }
            let mut mid = [0u8; 1];
            random(&mut mid);
            let mut mc = vec![0u8; challenge_len.clamp(1, MAX_CHALLENGE_LEN)];
            loop {
                random(&mut mc);
                if mc != challenge {
                    break;
                }
            }
            out.push_num("CHAP_I", u64::from(mid[0]));
            out.push("CHAP_C", &keys::hex_encode(&mc));
            self.sent = Some((mid[0], mc));
        }
        self.target_challenge = Some(challenge);
        Ok(())
    }

    /// Checks the target's answer in mutual CHAP (nothing to check otherwise).
    pub fn verify_target(&self, keys: &ChapKeys) -> Result<(), ChapError> {
        let (Some(t), Some((id, challenge))) = (&self.target, &self.sent) else {
            return Ok(());
        };
        let n = keys.n.as_deref().ok_or(ChapError::Sequence("CHAP_N"))?;
        if n != t.name {
            return Err(ChapError::TargetName);
        }
        let r = keys::parse_binary(keys.r.as_deref().ok_or(ChapError::Sequence("CHAP_R"))?)
            .ok_or(ChapError::BadValue("CHAP_R"))?;
        if verify(*id, &t.secret, challenge, &r) {
            Ok(())
        } else {
            Err(ChapError::WrongResponse)
        }
    }

    /// Whether mutual CHAP is configured.
    pub fn is_mutual(&self) -> bool {
        self.target.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        keys::parse_binary(&format!("0x{s}")).unwrap()
    }

    #[test]
    fn md5_vectors() {
        // RFC 1321 appendix A.5 through the CHAP formula: id, secret and challenge are simply
        // concatenated before hashing.
        assert_eq!(response(b'a', b"", b""), hex("0cc175b9c0f1b6a831c399e269772661").as_slice());
        assert_eq!(response(b'a', b"b", b"c"), hex("900150983cd24fb0d6963f7d28e17f72").as_slice());
        assert_eq!(response(b'm', b"essage ", b"digest"), hex("f96b697d7cb7938d525a2f31aaf161d0").as_slice());
    }

    #[test]
    fn chap_vector() {
        // RFC 1994's computation: MD5(0x01 || "secret" || challenge), checked against an
        // independent MD5 (Python hashlib) of the same 23 bytes.
        let challenge = hex("00112233445566778899aabbccddeeff");
        let r = response(0x01, b"secret", &challenge);
        let mut msg = vec![0x01];
        msg.extend_from_slice(b"secret");
        msg.extend_from_slice(&challenge);
        assert_eq!(r, <[u8; 16]>::from(Md5::digest(&msg)));
        assert_eq!(keys::hex_encode(&r), "0x204bb003332f6932b63b47c2c4e1a547");
        assert!(verify(0x01, b"secret", &challenge, &r));
        assert!(!verify(0x02, b"secret", &challenge, &r));
        assert!(!verify(0x01, b"secreT", &challenge, &r));
        assert!(!verify(0x01, b"secret", &challenge, &r[..15]));
    }

    #[test]
    fn algorithm_selection() {
        assert_eq!(select_algorithm("5"), Some(5));
        assert_eq!(select_algorithm("7,6,5"), Some(5));
        assert_eq!(select_algorithm("0x5"), Some(5));
        assert_eq!(select_algorithm("6,7"), None);
        assert_eq!(parse_identifier("255"), Some(255));
        assert_eq!(parse_identifier("256"), None);
    }
}
