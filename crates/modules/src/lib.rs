//! Bdev modules: the base modules null, malloc and uring, and the virtual bdevs passthru,
//! delay and error.

pub mod delay;
pub mod error;
pub mod malloc;
pub mod null;
pub mod passthru;
pub mod uring;

use ferrite_bdev::bdev::{lookup, BdevError};
use ferrite_bdev::module::{register_module, BdevModule};
use std::sync::Arc;

/// A built-in module as the registry sees it: a name, its RPCs, and whether its examine makes
/// virtual bdevs configured over a base that was missing (passthru, delay, error).
struct Builtin {
    name: &'static str,
    rpcs: fn(&mut ferrite_rpc::Registry),
    vbdev: bool,
}

impl BdevModule for Builtin {
    fn name(&self) -> &'static str {
        self.name
    }
    fn register_rpcs(&self, reg: &mut ferrite_rpc::Registry) {
        (self.rpcs)(reg)
    }
    fn examine_config(&self, bdev: &ferrite_bdev::bdev::Bdev) {
        if self.vbdev {
            passthru::deferred::examine(self.name, bdev);
        }
    }
}

/// Registers the modules built into Ferrite.
pub fn register_builtin() {
    for (name, rpcs, vbdev) in [
        ("null", null::rpc::register as fn(&mut ferrite_rpc::Registry), false),
        ("malloc", malloc::rpc::register, false),
        ("uring", uring::rpc::register, false),
        (passthru::MODULE, passthru::rpc::register, true),
        (error::MODULE, error::rpc::register, true),
        (delay::MODULE, delay::rpc::register, true),
    ] {
        register_module(Arc::new(Builtin { name, rpcs, vbdev })).expect("built-in modules have no init to fail");
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
