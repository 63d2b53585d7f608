//! Bdev modules: the base modules null, malloc and uring, and the virtual bdevs passthru,
//! delay and error.

pub mod delay;
pub mod error;
pub mod malloc;
pub mod null;
pub mod passthru;
pub mod uring;

use crate::bdev::{lookup, BdevError};

/// The first free name of the form `{prefix}{n}` (SPDK names unnamed malloc bdevs Malloc0, ...).
pub(crate) fn next_free_name(prefix: &str) -> String {
    (0..).map(|n| format!("{prefix}{n}")).find(|n| lookup(n).is_none()).expect("some name is free")
}

/// Parses an optional UUID string.
pub(crate) fn parse_uuid(s: Option<&str>) -> Result<Option<uuid::Uuid>, BdevError> {
    s.map(|s| uuid::Uuid::parse_str(s).map_err(|e| BdevError::Invalid(format!("invalid uuid {s:?}: {e}")))).transpose()
}
