//! The NVMe base specification's and NVMe-oF's data structures, as bytes on the wire.
//!
//! Every structure is a plain struct with named fields that encodes into and decodes from a
//! fixed-size little-endian byte array (`encode(&self, &mut [u8; N])`, `decode(&[u8; N])`),
//! without `unsafe` and without allocating. Decoding accepts every byte pattern: reserved bits
//! are dropped, fields of unknown value are kept as numbers, and the few variable-length lists
//! (namespace ID descriptors, DSM ranges, ANA groups, discovery entries) are read through
//! bounds-checked slices.
//!
//! Sources: SPDK's `include/spdk/nvme_spec.h` and `nvmf_spec.h` (their `SPDK_STATIC_ASSERT`s
//! and layouts give the offsets the unit tests pin), cross-checked with Linux's
//! `include/linux/nvme.h`, libnvme's `types.h`, the NVMe Base Specification 2.0, the NVM Command
//! Set Specification 1.0 and NVMe over Fabrics 1.1. Each item names the section it comes from.

#![deny(missing_docs)]

mod le;

pub mod admin;
pub mod aer;
pub mod cqe;
pub mod discovery;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod identify_ctrl;
pub mod identify_ns;
pub mod io;
pub mod log;
pub mod nqn;
pub mod opcode;
pub mod registers;
pub mod resv;
pub mod sgl;
pub mod sqe;
pub mod status;
