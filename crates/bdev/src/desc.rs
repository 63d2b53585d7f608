//! Open descriptors: read or write access to a bdev, exclusive write claims, and closing.

use crate::bdev::{Bdev, BdevError};
use crate::channel::IoChannel;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) type RemoveCallback = Arc<dyn Fn() + Send + Sync>;

pub(crate) struct DescEntry {
    pub(crate) id: u64,
    pub(crate) write: bool,
    /// The reactor that opened it (and the engine to reach it), if any.
    pub(crate) core: Option<(usize, ferrite_reactor::Engine)>,
    pub(crate) on_remove: RemoveCallback,
}

static NEXT_DESC: AtomicU64 = AtomicU64::new(1);

/// An open handle on a bdev. Dropping it closes it.
pub struct BdevDesc {
    bdev: Bdev,
    id: u64,
    write: bool,
}

impl BdevDesc {
    pub(crate) fn open(bdev: Bdev, write: bool, on_remove: RemoveCallback) -> Result<Self, BdevError> {
        if bdev.is_removing() {
            return Err(BdevError::Removing(bdev.name().to_string()));
        }
        let id = NEXT_DESC.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = bdev.0.state.lock().unwrap();
            if write {
                if let Some((_, module)) = &st.claim {
                    return Err(BdevError::Claimed(format!(
                        "bdev {} is claimed by module {module}; it cannot be opened for writing",
                        bdev.name()
                    )));
                }
            }
            st.descs.push(DescEntry {
                id,
                write,
                core: ferrite_reactor::current().map(|c| (c, ferrite_reactor::engine())),
                on_remove,
            });
        }
        Ok(Self { bdev, id, write })
    }

    /// The bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// True if opened for writing.
    pub fn writable(&self) -> bool {
        self.write
    }

    /// Takes the exclusive write claim for `module` (so that, say, an lvol store owns its base
    /// bdev): fails if another module holds it or another descriptor can write.
    pub fn claim(&self, module: &str) -> Result<(), BdevError> {
        let mut st = self.bdev.0.state.lock().unwrap();
        if let Some((_, m)) = &st.claim {
            return Err(BdevError::Claimed(format!("bdev {} is already claimed by module {m}", self.bdev.name())));
        }
        if st.descs.iter().any(|d| d.write && d.id != self.id) {
            return Err(BdevError::Claimed(format!("bdev {} has other writers", self.bdev.name())));
        }
        st.claim = Some((self.id, module.to_string()));
        Ok(())
    }

    /// Gets this core's I/O channel for the bdev (made on first use on each core).
    pub fn channel(&self) -> Result<IoChannel, BdevError> {
        IoChannel::get(&self.bdev, self.write)
    }
}

impl Drop for BdevDesc {
    fn drop(&mut self) {
        let waiters = {
            let mut st = self.bdev.0.state.lock().unwrap();
            st.descs.retain(|d| d.id != self.id);
            if matches!(st.claim, Some((id, _)) if id == self.id) {
                st.claim = None;
            }
            if st.descs.is_empty() {
                std::mem::take(&mut st.removed_waiters)
            } else {
                Vec::new()
            }
        };
        for w in waiters {
            w.send(());
        }
    }
}
