//! The NVMe/TCP transport (NVMe/TCP transport specification, NVMe-oF 1.1): PDU framing.
//!
//! - [`pdu`]: the wire layouts (common header, each type's header, flags, field offsets) and
//!   the fatal errors ([`PduError`], with the FES and FEI a termination request carries);
//! - [`digest`]: CRC32C header and data digests;
//! - [`negotiate`]: what ICReq/ICResp settle ([`Negotiated`]);
//! - [`decoder`]: the streaming receive side ([`Decoder`]), which stages headers only;
//! - [`encoder`]: the send side ([`encode`]), into caller buffers, data left in place.
//!
//! A controller's receive loop, sketched with an in-memory "socket" (a real one reads from
//! the socket into `buf` and, for large data, straight into the command's buffers):
//!
//! ```
//! use ferrite_nvme::tcp::{
//!     controller_accept, encode_contiguous, ControllerConfig, Decoder, Event, IcReq, Negotiated, Pdu, Role, Want,
//! };
//!
//! // What the host sends: ICReq, then a command with 4 bytes of in-capsule data.
//! let mut wire = vec![0u8; 256];
//! let ic = IcReq { pfv: 0, hpda: 0, hdgst: true, ddgst: true, maxr2t: 0 };
//! let n = encode_contiguous(&mut wire, &Negotiated::INITIAL, &Pdu::IcReq(ic), &[]).unwrap();
//! let cfg = ControllerConfig { header_digest: true, data_digest: true, cpda: 0, maxh2cdata: 131072 };
//! let (_, params) = controller_accept(&ic, &cfg);
//! let cmd = Pdu::CapsuleCmd(ferrite_nvme::tcp::CapsuleCmd { sqe: [0x01; 64] });
//! let m = encode_contiguous(&mut wire[n..], &params, &cmd, &[b"abcd"]).unwrap();
//! wire.truncate(n + m);
//!
//! let mut dec = Decoder::new(Role::Controller);
//! dec.set_max_icd(8192);
//! let mut buf: &[u8] = &wire; // bytes received and not yet used
//! let mut icd = Vec::new(); // stands for the command's buffer
//! while !buf.is_empty() {
//!     match dec.want() {
//!         Want::Data(left) => {
//!             // Place the data where it belongs (here: copy out of the receive buffer), then
//!             // show it to the decoder for the data digest.
//!             let k = (left as usize).min(buf.len());
//!             icd.extend_from_slice(&buf[..k]);
//!             let fed = dec.data(&buf[..k]);
//!             buf = &buf[fed.consumed..];
//!             assert!(fed.event.is_none()); // the data digest is still to come
//!         }
//!         Want::Bytes(_) => {
//!             let fed = dec.feed(buf).expect("a fatal error: send a C2HTermReq and close");
//!             buf = &buf[fed.consumed..];
//!             match fed.event {
//!                 Some(Event::Header(h)) => match h.pdu {
//!                     Pdu::IcReq(req) => {
//!                         let (_resp, params) = controller_accept(&req, &cfg); // send ICResp
//!                         dec.set_params(params);
//!                     }
//!                     Pdu::CapsuleCmd(_) => assert_eq!(h.data_len, 4), // get a 4-byte buffer
//!                     _ => unreachable!(),
//!                 },
//!                 Some(Event::DataEnd) => assert_eq!(icd, b"abcd"), // the command can run
//!                 Some(Event::DataDigestError { .. }) => unreachable!(), // fail the command
//!                 None => {}
//!             }
//!         }
//!         Want::Closed => unreachable!(),
//!     }
//! }
//! assert_eq!(icd, b"abcd");
//! ```

#![warn(missing_docs)]

pub mod decoder;
pub mod digest;
pub mod encoder;
pub mod negotiate;
pub mod pdu;

#[cfg(test)]
mod tests;

pub use decoder::{Decoder, Event, Fed, Header, Want};
pub use encoder::{encode, encode_contiguous, encode_term_req, EncodeError, Framing};
pub use negotiate::{controller_accept, host_accept, ControllerConfig, Negotiated};
pub use pdu::{
    C2hData, CapsuleCmd, CapsuleResp, Direction, Fes, H2cData, IcReq, IcResp, Pdu, PduError, PduType, R2t, Role,
    TermReq,
};
