//! iSCSI without I/O (RFC 7143): what a target's and an initiator's connection engines need
//! that does not touch a socket, a reactor or a SCSI device.
//!
//! - [`pdu`]: the PDU codec. Typed 48-byte headers for the eighteen opcodes ([`pdu::Pdu`]),
//!   AHS, a streaming [`pdu::Decoder`] that stages headers only and lets the caller place
//!   data, an encoder into caller buffers ([`pdu::encode`]), [`pdu::frame_status`] (how many
//!   bytes a PDU still needs) and [`pdu::decode_whole`]. Received headers are checked; an
//!   invalid one comes with the Reject reason to answer ([`pdu::PduError`]).
//! - [`digest`]: CRC32C header and data digests.
//! - [`keys`]: key=value text, continued text, value encodings.
//! - [`negotiate`]: the keys of RFC 7143 section 13 and their negotiation, for the target
//!   ([`negotiate::TargetNegotiator`], settings in [`negotiate::TargetOptions`]) and the
//!   initiator ([`negotiate::InitiatorNegotiator`]); the outcome is a
//!   [`negotiate::Negotiated`] (session and connection parameters).
//! - [`chap`]: CHAP with MD5, one-way and mutual, both sides.
//! - [`login`]: the login phase as a state machine: [`login::TargetLogin`] (asking the
//!   target's tables through [`login::LoginContext`]) and [`login::InitiatorLogin`].
//! - [`text`]: full feature phase Text Request/Response exchanges at a target.
//! - [`discovery`]: SendTargets answers.
//!
//! SCSI itself (CDBs, sense data, the task set) is another crate's.
//!
//! # Driving a target connection
//!
//! Per connection: a [`pdu::Decoder`] for [`pdu::Role::Target`] (it starts with the login's
//! parameters: no digests, 8192-byte data segments) and a [`login::TargetLogin`].
//!
//! 1. Feed received bytes to the decoder ([`pdu::Decoder::want`] says how many it wants).
//!    During login only Login Requests may come (close the connection on anything else);
//!    put a request's data (at most 8192 bytes) in a buffer and, at
//!    [`pdu::Event::DataEnd`], pass header and data to [`login::TargetLogin::on_request`].
//! 2. Send [`login::LoginReply::encode`]. On [`login::Outcome::Failed`] close after sending;
//!    on [`login::Outcome::FullFeature`] switch the decoder to the negotiated
//!    [`negotiate::ConnectionParams::rx`] and encode with
//!    [`negotiate::ConnectionParams::tx`] from then on.
//! 3. In the full feature phase, headers come as [`pdu::Event::Header`]: a SCSI Command's
//!    CDB is [`pdu::AhsInfo::cdb`] over [`pdu::Decoder::ahs`]; immediate data and Data-Out
//!    data go straight to the command's buffers ([`pdu::Want::Data`]); Text Requests go to a
//!    [`text::TargetText`] whose answer function runs a [`negotiate::TargetNegotiator`] in
//!    the full feature phase and [`discovery::send_targets`]. An
//!    [`pdu::Event::Invalid`] is answered with a Reject carrying its BHS; a fatal
//!    [`pdu::PduError`] closes the connection. Sequence numbers, tags, R2Ts and Data-In
//!    sequences are the engine's.
//!
//! A login end to end, both sides in memory (the initiator is what an initiator bdev would
//! drive; the context stands for the target's tables):
//!
//! ```
//! use ferrite_iscsi::chap::ChapSecrets;
//! use ferrite_iscsi::login::*;
//! use ferrite_iscsi::negotiate::Negotiated;
//! use ferrite_iscsi::pdu::{decode_whole, encode_to_vec, Pdu, PduParams, Role};
//!
//! struct Tables;
//! impl LoginContext for Tables {
//!     fn lookup_target(&mut self, name: &str, _initiator: &str) -> TargetLookup {
//!         TargetLookup::Found(TargetInfo { name: name.into(), alias: None, auth: AuthPolicy::default(), options: None })
//!     }
//!     fn discovery_auth(&mut self, _initiator: &str) -> Option<AuthPolicy> { Some(AuthPolicy::default()) }
//!     fn chap_secrets(&mut self, _target: Option<&str>, _name: &str) -> Option<ChapSecrets> { None }
//!     fn join_session(&mut self, _s: &SessionRef<'_>) -> Result<(), LoginStatus> { Err(LoginStatus::SESSION_DOES_NOT_EXIST) }
//!     fn create_session(&mut self, _s: &SessionRef<'_>, _n: &Negotiated) -> Result<u16, LoginStatus> { Ok(1) }
//!     fn random(&mut self, buf: &mut [u8]) { ferrite_iscsi::chap::system_random(buf) }
//! }
//!
//! let mut initiator = InitiatorLogin::new(InitiatorLoginConfig::new("iqn.2024-01.example:host", Some("iqn.2024-01.example:disk")));
//! let mut target = TargetLogin::new(TargetLoginConfig::default());
//! let mut step = initiator.start();
//! let negotiated = loop {
//!     let InitiatorStep::Send { request, data } = step else { unreachable!() };
//!     // The initiator's bytes, as the target's decoder sees them.
//!     let wire = encode_to_vec(&PduParams::LOGIN, &Pdu::LoginRequest(request), &[], &data).unwrap();
//!     let got = decode_whole(Role::Target, &PduParams::LOGIN, &wire).unwrap().unwrap();
//!     let Pdu::LoginRequest(req) = got.header.pdu else { unreachable!() };
//!     let reply = target.on_request(&mut Tables, &req, got.data);
//!     step = initiator.on_response(&reply.response, &reply.data, &mut ferrite_iscsi::chap::system_random).unwrap();
//!     if let (Outcome::FullFeature(done), InitiatorStep::Done(_)) = (&reply.outcome, &step) {
//!         break done.negotiated.clone();
//!     }
//! };
//! // SPDK's default FirstBurstLength (8192) the target offered, libiscsi's MaxBurstLength.
//! assert_eq!(negotiated.session.first_burst_length, 8192);
//! assert_eq!(negotiated.session.max_burst_length, 262144);
//! assert_eq!(negotiated.connection.rx().max_data_segment, 65536);
//! ```
#![warn(missing_docs)]

pub mod chap;
pub mod digest;
pub mod discovery;
pub mod keys;
pub mod login;
pub mod negotiate;
pub mod pdu;
pub mod text;
