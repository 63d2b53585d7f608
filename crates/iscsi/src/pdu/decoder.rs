//! A streaming PDU decoder for a polled connection: bytes go in as they arrive, one at a time
//! or many PDUs at once; checked, typed headers come out; data never passes through it.
//!
//! The decoder stages headers only: the BHS, then the AHS and the header digest (at most
//! 1072 bytes, a fixed array: nothing is allocated, whatever the lengths say). The data
//! segment the caller places where it likes (a bdev buffer for Data-Out, a text buffer for a
//! Login Request) and then shows the decoder, which digests it in passing; the padding and
//! the data digest go through [`Decoder::feed`].
//!
//! Driving it:
//!
//! - [`Decoder::want`] says what comes next: [`Want::Bytes`]`(n)`, header, padding, digest or
//!   skipped bytes (at most `n` belong to the current step, so a caller reading straight from
//!   a socket never reads past them), or [`Want::Data`]`(n)`, data bytes.
//! - [`Decoder::feed`] takes header, padding, digest and skipped bytes and says how many it
//!   used; it stops at the first event and before any data.
//! - [`Decoder::data`] is told about data bytes the caller placed.
//!
//! Events: [`Event::Header`] once a header has arrived and passed every check; then, if it
//! has data, [`Event::DataEnd`] once the data, its padding and its digest have, or
//! [`Event::DataDigestError`] if the digest did not match (not fatal: the decoder is at the
//! next PDU; a target discards the data and answers with a Reject, reason data digest
//! error). A header that arrived intact but is invalid ([`PduError::reject_reason`]) gives
//! [`Event::Invalid`] with its BHS (a target's Reject carries it); the decoder then skips the
//! PDU's data by itself and goes on.
//!
//! Fatal errors ([`PduError::is_fatal`]: a header digest mismatch, a data segment over the
//! limit) stop the decoder; every later call returns the same error.
//!
//! Left to the caller: everything that needs connection or session state (CmdSN windows,
//! tags, whether a Data-Out belongs to a command and fits it, login stages), and the
//! parameters the login settles ([`Decoder::set_params`], after the final Login Response).

use super::frame::{check_header, Header};
use super::{data_segment_len, padding, total_ahs_len, PduError, PduParams, Role, BHS_LEN, DIGEST_LEN, MAX_HEADER_LEN};
use crate::digest::{self, DataDigest};

/// What the decoder needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Header, padding, digest or skipped bytes: [`Decoder::feed`] takes up to this many for
    /// the current step (more are fine; it stops where the step ends).
    Bytes(usize),
    /// This many bytes of the current PDU's data remain: place them, then pass them to
    /// [`Decoder::data`].
    Data(u32),
    /// A fatal error stopped the decoder.
    Closed,
}

/// A header that arrived intact but breaks RFC 7143: the caller answers it (a target sends a
/// Reject with `reason` and `bhs` as data); the decoder skips the rest of the PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid {
    /// What is wrong.
    pub error: PduError,
    /// The BHS as received.
    pub bhs: [u8; BHS_LEN],
}

/// What [`Decoder::feed`] or [`Decoder::data`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A header arrived and passed every check; [`Header::data_len`] data bytes follow.
    Header(Header),
    /// The data of the PDU whose header came last has all arrived, with its padding, and its
    /// digest (if negotiated) matched.
    DataEnd,
    /// The data has all arrived but its digest did not match.
    DataDigestError {
        /// The digest received.
        received: u32,
        /// The digest of the data and padding received.
        computed: u32,
    },
    /// An invalid header; the PDU is being skipped.
    Invalid(Invalid),
}

/// The result of one [`Decoder::feed`] or [`Decoder::data`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the input used; the rest is the caller's to offer again.
    pub consumed: usize,
    /// What those bytes completed, if anything.
    pub event: Option<Event>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Collecting header bytes into the staging area, up to `need`.
    Header,
    /// The caller places data bytes.
    Data { left: u32 },
    /// Digesting the padding after the data.
    Pad { left: u8 },
    /// Collecting the data digest.
    DataDigest,
    /// Skipping the rest of an invalid PDU.
    Skip { left: u64 },
    /// A fatal error happened.
    Failed,
}

/// The receiving half of an iSCSI connection's framing; see the module documentation.
#[derive(Debug, Clone)]
pub struct Decoder {
    role: Role,
    params: PduParams,
    stage: Stage,
    staging: [u8; MAX_HEADER_LEN],
    have: usize,
    need: usize,
    /// The staged header is complete and stays readable until the next PDU's first byte.
    header_done: bool,
    data_digest_on: bool,
    digest: DataDigest,
    ddgst: [u8; DIGEST_LEN],
    ddgst_have: usize,
    failure: Option<PduError>,
}

impl Decoder {
    /// A decoder for the PDUs `role` receives, starting in the login phase
    /// ([`PduParams::LOGIN`]).
    pub fn new(role: Role) -> Decoder {
        Decoder::with_params(role, PduParams::LOGIN)
    }

    /// A decoder for the PDUs `role` receives under `params`.
    pub fn with_params(role: Role, params: PduParams) -> Decoder {
        Decoder {
            role,
            params,
            stage: Stage::Header,
            staging: [0; MAX_HEADER_LEN],
            have: 0,
            need: BHS_LEN,
            header_done: false,
            data_digest_on: false,
            digest: DataDigest::new(),
            ddgst: [0; DIGEST_LEN],
            ddgst_have: 0,
            failure: None,
        }
    }

    /// Sets the digests and data limit negotiated at login (they apply from the next header
    /// on: call it after the Login Request that ends the login phase).
    pub fn set_params(&mut self, params: PduParams) {
        self.params = params;
    }

    /// The parameters in force.
    pub fn params(&self) -> &PduParams {
        &self.params
    }

    /// The end this decoder receives for.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The fatal error that stopped the decoder, if one did.
    pub fn failure(&self) -> Option<PduError> {
        self.failure
    }

    /// What comes next.
    pub fn want(&self) -> Want {
        match self.stage {
            Stage::Header => Want::Bytes(if self.header_done { BHS_LEN } else { self.need - self.have }),
            Stage::Data { left } => Want::Data(left),
            Stage::Pad { left } => Want::Bytes(usize::from(left)),
            Stage::DataDigest => Want::Bytes(DIGEST_LEN - self.ddgst_have),
            Stage::Skip { left } => Want::Bytes(usize::try_from(left).unwrap_or(usize::MAX)),
            Stage::Failed => Want::Closed,
        }
    }

    /// The BHS of the last (or current) header, as received.
    pub fn bhs(&self) -> &[u8; BHS_LEN] {
        self.staging.first_chunk::<BHS_LEN>().expect("staging holds a BHS")
    }

    /// The AHS area of the last header whose [`Event::Header`] came (empty before one).
    pub fn ahs(&self) -> &[u8] {
        if !self.header_done {
            return &[];
        }
        let n = total_ahs_len(self.bhs());
        &self.staging[BHS_LEN..BHS_LEN + n]
    }

    /// Takes header, padding, digest and skipped bytes from `input`, up to the first event or
    /// the start of data (then [`Decoder::want`] is [`Want::Data`]).
    pub fn feed(&mut self, input: &[u8]) -> Result<Fed, PduError> {
        if let Some(e) = self.failure {
            return Err(e);
        }
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.stage {
                Stage::Header => {
                    if rest.is_empty() {
                        return Ok(Fed { consumed: used, event: None });
                    }
                    if self.header_done {
                        self.header_done = false;
                        self.have = 0;
                        self.need = BHS_LEN;
                    }
                    let take = (self.need - self.have).min(rest.len());
                    self.staging[self.have..self.have + take].copy_from_slice(&rest[..take]);
                    self.have += take;
                    used += take;
                    if self.have == BHS_LEN && self.need == BHS_LEN {
                        let bhs = self.bhs();
                        self.need = BHS_LEN + total_ahs_len(bhs) + self.params.header_digest_len();
                    }
                    if self.have < self.need {
                        continue;
                    }
                    let event = self.header_complete()?;
                    return Ok(Fed { consumed: used, event: Some(event) });
                }
                Stage::Data { .. } => return Ok(Fed { consumed: used, event: None }),
                Stage::Pad { left } => {
                    let take = usize::from(left).min(rest.len());
                    self.digest.update(&rest[..take]);
                    used += take;
                    let left = left - take as u8;
                    if left > 0 {
                        self.stage = Stage::Pad { left };
                        return Ok(Fed { consumed: used, event: None });
                    }
                    if let Some(ev) = self.after_padding() {
                        return Ok(Fed { consumed: used, event: Some(ev) });
                    }
                }
                Stage::DataDigest => {
                    let take = (DIGEST_LEN - self.ddgst_have).min(rest.len());
                    self.ddgst[self.ddgst_have..self.ddgst_have + take].copy_from_slice(&rest[..take]);
                    self.ddgst_have += take;
                    used += take;
                    if self.ddgst_have < DIGEST_LEN {
                        return Ok(Fed { consumed: used, event: None });
                    }
                    let received = digest::from_wire(self.ddgst);
                    let computed = self.digest.finish();
                    self.stage = Stage::Header;
                    let ev = if received == computed {
                        Event::DataEnd
                    } else {
                        Event::DataDigestError { received, computed }
                    };
                    return Ok(Fed { consumed: used, event: Some(ev) });
                }
                Stage::Skip { left } => {
                    let take = (rest.len() as u64).min(left);
                    used += take as usize;
                    let left = left - take;
                    self.stage = if left == 0 { Stage::Header } else { Stage::Skip { left } };
                    if left > 0 || rest.len() as u64 == take {
                        return Ok(Fed { consumed: used, event: None });
                    }
                }
                Stage::Failed => unreachable!("failure is returned above"),
            }
        }
    }

    /// Tells the decoder about data bytes the caller placed: the first of `bytes` are the next
    /// data bytes of the current PDU. Takes at most what [`Want::Data`] said (none in any other
    /// stage) and digests them if data digests are on.
    pub fn data(&mut self, bytes: &[u8]) -> Fed {
        let Stage::Data { left } = self.stage else {
            return Fed { consumed: 0, event: None };
        };
        let take = (left as usize).min(bytes.len());
        if self.data_digest_on {
            self.digest.update(&bytes[..take]);
        }
        let left = left - take as u32;
        if left > 0 {
            self.stage = Stage::Data { left };
            return Fed { consumed: take, event: None };
        }
        let len = data_segment_len(self.bhs());
        let pad = padding(len) as u8;
        if pad > 0 {
            self.stage = Stage::Pad { left: pad };
            return Fed { consumed: take, event: None };
        }
        Fed { consumed: take, event: self.after_padding() }
    }

    /// The data and padding are in: on to the digest, or the data's end.
    fn after_padding(&mut self) -> Option<Event> {
        if self.data_digest_on {
            self.stage = Stage::DataDigest;
            self.ddgst_have = 0;
            None
        } else {
            self.stage = Stage::Header;
            Some(Event::DataEnd)
        }
    }

    fn header_complete(&mut self) -> Result<Event, PduError> {
        debug_assert_eq!(self.have, self.need);
        self.header_done = true;
        let mut bhs = [0u8; BHS_LEN];
        bhs.copy_from_slice(&self.staging[..BHS_LEN]);
        let ahs_end = BHS_LEN + total_ahs_len(&bhs);
        let hd = self.params.header_digest.then(|| {
            let d = &self.staging[ahs_end..ahs_end + DIGEST_LEN];
            [d[0], d[1], d[2], d[3]]
        });
        match check_header(self.role, &self.params, &bhs, &self.staging[BHS_LEN..ahs_end], hd) {
            Ok(h) => {
                self.data_digest_on = self.params.data_digest && h.data_len > 0;
                self.digest = DataDigest::new();
                self.stage = if h.data_len > 0 { Stage::Data { left: h.data_len } } else { Stage::Header };
                Ok(Event::Header(h))
            }
            Err(e) if e.is_fatal() => {
                self.stage = Stage::Failed;
                self.failure = Some(e);
                Err(e)
            }
            Err(error) => {
                let len = data_segment_len(&bhs);
                let mut skip = 0u64;
                if len > 0 {
                    skip = u64::from(len) + u64::from(padding(len));
                    if self.params.data_digest {
                        skip += DIGEST_LEN as u64;
                    }
                }
                self.stage = if skip > 0 { Stage::Skip { left: skip } } else { Stage::Header };
                Ok(Event::Invalid(Invalid { error, bhs }))
            }
        }
    }
}
