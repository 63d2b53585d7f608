//! A connection's outstanding commands: a bounded table of slots, reused without allocation
//! once grown to the queue depth, and the end of a session (every bdev request the connection
//! still has in flight asked to end at once).

use ferrite_bdev::{Completed, IoChannel, IoCompleter, IoRequest};
use std::rc::Rc;

/// Slots of outstanding commands, each a `T` (a command's state). A slot index travels as the
/// bdev request's tag, so completion finds its command in O(1).
pub struct SlotTable<T> {
    slots: Vec<T>,
    /// Free slot indexes (reused last in, first out: the warmest first).
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for SlotTable<T> {
    fn default() -> Self {
        SlotTable { slots: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T> SlotTable<T> {
    /// Takes a slot for a new command, if fewer than `cap` are in use. A slot used before keeps
    /// its last value (the caller sets what a new command needs, without rebuilding the whole
    /// value on the hot path); a new one is made with `make`.
    pub fn take(&mut self, cap: usize, make: impl FnOnce() -> T) -> Option<u32> {
        let i = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < cap => {
                self.slots.push(make());
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        self.live += 1;
        Some(i)
    }

    /// Gives slot `i` back (its value stays until the slot is taken again).
    pub fn release(&mut self, i: u32) {
        debug_assert!((i as usize) < self.slots.len(), "released a slot that was never taken");
        debug_assert!(!self.free.contains(&i), "a slot released twice");
        debug_assert!(self.live > 0, "more releases than takes");
        self.free.push(i);
        self.live -= 1;
    }

    /// Commands in their slots.
    #[inline]
    pub fn live(&self) -> usize {
        self.live
    }

    /// Slot `i`'s value (taken or not).
    #[inline]
    pub fn get(&self, i: u32) -> Option<&T> {
        self.slots.get(i as usize)
    }

    /// Slot `i`'s value, to change (taken or not).
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.slots.get_mut(i as usize)
    }

    /// True if slot `i` is taken (not free). Costs a look through the free slots: for checks
    /// and the end of a connection, not for the I/O path.
    pub fn is_taken(&self, i: u32) -> bool {
        (i as usize) < self.slots.len() && !self.free.contains(&i)
    }

    /// The slots taken, lowest first: what a forced close ends (`close::end_all`). Made when a
    /// connection ends, not on the I/O path.
    pub fn taken(&self) -> Vec<u32> {
        let mut free = vec![false; self.slots.len()];
        for &i in &self.free {
            free[i as usize] = true;
        }
        (0..self.slots.len() as u32).filter(|&i| !free[i as usize]).collect()
    }

    /// Every slot with its index (free ones too: the value says whether it is in use).
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().enumerate().map(|(i, s)| (i as u32, s))
    }

    /// Every slot with its index, to change (free ones too).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots.iter_mut().enumerate().map(|(i, s)| (i as u32, s))
    }
}

impl<T> std::ops::Index<usize> for SlotTable<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.slots[i]
    }
}

impl<T> std::ops::IndexMut<usize> for SlotTable<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.slots[i]
    }
}

/// Asks the bdev layer to end every request `completer` has in flight on `channels` (one
/// abort of all per channel: SCSI ABORT TASK SET, a connection that went away): those that wait
/// in the layer or in a module that can stop them complete as Aborted, into `completer`, which
/// drops them as it drops any completion of a dead connection. Returns how many aborts went out.
pub fn abort_all<C: IoCompleter + 'static>(completer: &Rc<C>, channels: &[IoChannel]) -> usize {
    struct Ignore;
    impl IoCompleter for Ignore {
        fn io_done(&self, _tag: u64, _io: Completed) {}
    }
    let ignore: Rc<dyn IoCompleter> = Rc::new(Ignore);
    for ch in channels {
        ch.submit(IoRequest::abort_all(completer), ignore.clone(), 0);
    }
    channels.len()
}
