//! The end of a bdev's life: once it is unregistered and its last descriptor has closed, the
//! layer calls its module's [`crate::BdevBackend::destruct`] exactly once, and the module
//! releases what it holds (its base descriptors, its memory) then or later, and says so with
//! [`Destructed::finish`]. Only then does `unregister`'s receiver fire, as SPDK's
//! `spdk_bdev_unregister` callback runs after the module's asynchronous destruct.

use crate::bdev::{Bdev, BdevShared};
use ferrite_reactor::oneshot::Sender;
use std::sync::Arc;

/// Handed to a module's `destruct`: finishing it (or dropping it) tells whoever waits for the
/// bdev's removal.
pub struct Destructed {
    bdev: Bdev,
    waiters: Vec<Sender<()>>,
}

impl Destructed {
    /// The bdev being destructed (unregistered, no descriptor open).
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// The module has released the bdev's resources.
    pub fn finish(self) {}
}

impl Drop for Destructed {
    fn drop(&mut self) {
        log::debug!("bdev {}: destructed", self.bdev.name().escape_debug());
        for w in self.waiters.drain(..) {
            w.send(());
        }
    }
}

/// Calls the module's destruct, once, if the bdev is unregistered and nobody has it open.
pub(crate) fn maybe_destruct(shared: &Arc<BdevShared>) {
    let waiters = {
        let mut st = shared.state.lock().unwrap();
        if !shared.removing.load(std::sync::atomic::Ordering::SeqCst) || !st.descs.is_empty() || st.destruct_started {
            return;
        }
        st.destruct_started = true;
        std::mem::take(&mut st.removed_waiters)
    };
    let bdev = Bdev(shared.clone());
    log::debug!("bdev {}: last descriptor closed; destructing", bdev.name().escape_debug());
    let done = Destructed { bdev: bdev.clone(), waiters };
    shared.backend.destruct(done);
}
