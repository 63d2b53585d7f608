//! The passthru bdev: forwards every request to its base bdev unchanged, as SPDK's
//! `vbdev_passthru`. It is the reference for virtual bdevs: open and claim the base
//! ([`base::BaseBdev`]), register a bdev with the base's geometry, limits and I/O types, and
//! forward each request with `IoChannel::forward`, which hands the request itself on to the
//! base's channel (the passthru's own per-trip state waits on the request's frame stack). As it
//! forwards everything unchanged, it names its base channel (`forwards_to`) and the layer
//! forwards for it. The buffers never move, so a zero-copy read of a lending base (malloc)
//! reaches the caller as the base's own memory, and nothing per I/O is allocated, copied, locked
//! or looked up in a table.

pub mod base;
pub mod deferred;
pub mod rpc;

use base::BaseBdev;
use ferrite_bdev::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError};
use ferrite_bdev::channel::IoChannel;
use ferrite_bdev::io::BdevIo;
use serde_json::{json, Value};
use std::sync::Arc;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "passthru";

struct PassthruBackend {
    base: Arc<BaseBdev>,
}

struct PassthruChannel {
    base: IoChannel,
    lends: bool,
}

impl BackendChannel for PassthruChannel {
    fn lends_reads(&self) -> bool {
        self.lends
    }

    /// Everything, abort and reset included, goes to the base: an abort names the caller's
    /// request, which the base finds by the caller's identity the forwarded request keeps.
    fn forwards_to(&self) -> Option<IoChannel> {
        Some(self.base.clone())
    }

    /// Not called (`forwards_to`); what the layer does for it.
    #[inline]
    fn submit(&mut self, io: BdevIo) {
        self.base.forward(io);
    }
}

impl BdevBackend for PassthruBackend {
    fn destruct(&self, done: ferrite_bdev::Destructed) {
        // Every opener has closed the bdev: the base's descriptor (and its claim) can go.
        self.base.close();
        done.finish();
    }

    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(PassthruChannel { base: self.base.channel()?, lends: self.base.lends_reads() }))
    }

    fn zcopy(&self) -> bool {
        self.base.lends_reads()
    }

    fn base_bdevs(&self) -> Vec<Bdev> {
        vec![self.base.bdev().clone()]
    }

    fn driver_specific(&self) -> Value {
        json!({"passthru": {"base_bdev_name": self.base.bdev().name()}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        Some(json!({"method": "bdev_passthru_create", "params": {
            "base_bdev_name": self.base.bdev().name(), "name": bdev.name(), "uuid": bdev.uuid().to_string()}}))
    }
}

/// Creates passthru bdev `name` over `base_name` (which it opens for writing and claims).
pub fn create(base_name: &str, name: &str, uuid: Option<&str>) -> Result<Bdev, BdevError> {
    ferrite_bdev::bdev::check_name(name)?;
    let uuid = super::parse_uuid(uuid)?;
    if ferrite_bdev::bdev::lookup(name).is_some() {
        return Err(BdevError::Exists(name.to_string()));
    }
    let base = BaseBdev::open(base_name, MODULE)?;
    let props = base.props(name.to_string(), uuid, "passthru", MODULE);
    let bdev = register(props, Arc::new(PassthruBackend { base: base.clone() }))?;
    base.attach(&bdev);
    Ok(bdev)
}
