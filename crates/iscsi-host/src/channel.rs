//! An iSCSI bdev's channel on one reactor: its session ([`crate::session`]), to which every
//! request goes.

use crate::lun::LunShared;
use crate::session::Session;
use ferrite_bdev::{BackendChannel, BdevIo, IoStatus, IoType};
use std::rc::Rc;
use std::sync::Arc;

/// The bdev layer's handle on a reactor's session.
pub(crate) struct IscsiChannel(Rc<Session>);

impl IscsiChannel {
    /// The calling reactor's channel (its session logs in when the first request comes).
    pub(crate) fn new(lun: Arc<LunShared>) -> IscsiChannel {
        let qualifier = ferrite_reactor::current().unwrap_or(0) as u16;
        IscsiChannel(Session::new(lun, qualifier))
    }
}

impl BackendChannel for IscsiChannel {
    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.0.clone())
    }

    fn submit(&mut self, io: BdevIo) {
        if io.req.io_type == IoType::Reset {
            // It reaches the module once the requests before it have ended: nothing is left
            // to reset on the target's side.
            return io.complete_deferred(IoStatus::Success);
        }
        self.0.submit(io);
    }
}

impl Drop for IscsiChannel {
    fn drop(&mut self) {
        self.0.close();
    }
}
