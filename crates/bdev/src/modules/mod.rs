//! Bdev modules: the base modules null, malloc and uring, and the virtual bdevs passthru,
//! delay and error.

pub mod delay;
pub mod error;
pub mod malloc;
pub mod null;
pub mod passthru;
pub mod uring;

use crate::bdev::{lookup, BdevError};
use crate::module::{register_module, BdevModule};
use std::sync::Arc;

/// A base module as the registry sees it: a name and its RPCs (base modules examine nothing).
struct Base {
    name: &'static str,
    rpcs: fn(&mut ferrite_rpc::Registry),
}

impl BdevModule for Base {
    fn name(&self) -> &'static str {
        self.name
    }
    fn register_rpcs(&self, reg: &mut ferrite_rpc::Registry) {
        (self.rpcs)(reg)
    }
}

/// Registers the modules built into Ferrite.
pub fn register_builtin() {
    for (name, rpcs) in [
        ("null", null::rpc::register as fn(&mut ferrite_rpc::Registry)),
        ("malloc", malloc::rpc::register),
        ("uring", uring::rpc::register),
        ("passthru", passthru::rpc::register),
        ("error", error::rpc::register),
        ("delay", delay::rpc::register),
    ] {
        register_module(Arc::new(Base { name, rpcs })).expect("base modules have no init to fail");
    }
}

/// The first free name of the form `{prefix}{n}` (SPDK names unnamed malloc bdevs Malloc0, ...).
pub(crate) fn next_free_name(prefix: &str) -> String {
    (0..).map(|n| format!("{prefix}{n}")).find(|n| lookup(n).is_none()).expect("some name is free")
}

/// Parses an optional UUID string. The all-zero UUID means "none given", as in SPDK (a random
/// one is made).
pub(crate) fn parse_uuid(s: Option<&str>) -> Result<Option<uuid::Uuid>, BdevError> {
    let u = s
        .map(|s| uuid::Uuid::parse_str(s).map_err(|e| BdevError::Invalid(format!("invalid uuid {s:?}: {e}"))))
        .transpose()?;
    Ok(u.filter(|u| !u.is_nil()))
}
