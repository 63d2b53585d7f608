//! A virtual bdev whose mapping onto its base is linear over a range (an lvol whose clusters lie
//! back to back) names that mapping to the layer (`BackendChannel::linear_base`, `linear_map`),
//! and the layer forwards the reads and writes within it itself: they reach the base at the
//! moved offset without a call into the module; everything else still goes to the module; and
//! the mapping is taken again, and only then, when the module's counter moves.
//!
//! The "window" module here stands in for such a module (no real client reaches this contract
//! below a bdev): its blocks are its base's from a shift on, and it counts the requests the layer
//! hands it.

mod common;

use common::*;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevDesc, BdevError, BdevIo, BdevProps, IoChannel,
    IoRequest, IoStatus, IoType, IoTypes, Limits, LinearMap,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::ReactorMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const BS: u32 = 512;

/// What the test and every channel of the window share.
#[derive(Default)]
struct Shared {
    /// The module's mapping: (shift, end of the linear range, or None: nothing linear).
    map: Mutex<(u64, Option<u64>)>,
    /// Moves whenever the test changes `map` and wants the layer to see it.
    generation: Arc<AtomicU64>,
    /// Requests the layer handed to the module's `submit`.
    submits: AtomicU64,
    /// Times the layer asked for the mapping.
    asks: AtomicU64,
}

struct Window {
    base: BdevDesc,
    shared: Arc<Shared>,
}

struct WindowChannel {
    base: IoChannel,
    shared: Arc<Shared>,
}

impl BackendChannel for WindowChannel {
    /// Maps every request itself, with the shift as it is now (the same blocks as the layer's
    /// linear range).
    fn submit(&mut self, mut io: BdevIo) {
        self.shared.submits.fetch_add(1, Ordering::SeqCst);
        match io.req.io_type {
            IoType::Read | IoType::Write => {
                io.req.offset_blocks += self.shared.map.lock().unwrap().0;
                self.base.forward_moved(io)
            }
            _ => io.complete_deferred(IoStatus::Success),
        }
    }

    fn linear_base(&self) -> Option<(IoChannel, Arc<AtomicU64>)> {
        Some((self.base.clone(), self.shared.generation.clone()))
    }

    fn linear_map(&mut self) -> Option<LinearMap> {
        self.shared.asks.fetch_add(1, Ordering::SeqCst);
        let (shift, end) = *self.shared.map.lock().unwrap();
        end.map(|end| LinearMap { shift, end })
    }
}

impl BdevBackend for Window {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(WindowChannel { base: self.base.channel()?, shared: self.shared.clone() }))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn window(name: &str, base: &str, num_blocks: u64, shared: Arc<Shared>) -> Bdev {
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: BS,
        num_blocks,
        product_name: "window",
        module: "window",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush]),
        limits: Limits::default(),
    };
    let base = Bdev::open(base, true, || {}).unwrap();
    register(props, Arc::new(Window { base, shared })).unwrap()
}

/// Reads one block of `ch` at `at`; its first byte (every block holds one byte value).
async fn byte_at(ch: &IoChannel, at: u64) -> u8 {
    let got = io_ok(ch, IoRequest::read(at, 1, buf_filled(BS as usize, 0))).await;
    assert!(got.iter().all(|&b| b == got[0]), "block {at} holds one value");
    got[0]
}

#[test]
fn the_layer_forwards_reads_and_writes_a_linear_map_covers_and_retakes_it_when_it_moves() {
    let e = engine(1, ReactorMode::Adaptive);
    malloc::create(MallocOpts { name: Some("lin_base".into()), num_blocks: 64, block_size: BS, ..Default::default() })
        .unwrap();
    let shared = Arc::new(Shared { map: Mutex::new((8, Some(12))), ..Default::default() });
    let w = window("lin_win", "lin_base", 16, shared.clone());
    let s = shared.clone();
    let w_id = w.id();
    let stat = run(&e, 0, move || async move {
        let submits = || s.submits.load(Ordering::SeqCst);
        let base = Bdev::open("lin_base", false, || {}).unwrap();
        let bch = base.channel().unwrap();
        // Block b of the base holds the byte b (the window takes no claim on its base).
        let wr = Bdev::open("lin_base", true, || {}).unwrap();
        let wrch = wr.channel().unwrap();
        for b in 0..64u64 {
            io_ok(&wrch, IoRequest::write(b, 1, buf_filled(BS as usize, b as u8))).await;
        }
        drop((wrch, wr));
        let d = Bdev::open("lin_win", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        assert_eq!(s.asks.load(Ordering::SeqCst), 1, "asked once, when the channel was made");
        // Within the linear range: the base's blocks from 8 on, and the module never sees them.
        for b in 0..12 {
            assert_eq!(byte_at(&ch, b).await, 8 + b as u8, "window block {b}");
        }
        assert_eq!(submits(), 0, "the layer forwarded every read in the range itself");
        // Past the range, or across its end: the module's.
        for b in 12..16 {
            assert_eq!(byte_at(&ch, b).await, 8 + b as u8, "window block {b}");
        }
        assert_eq!(submits(), 4);
        let two = io_ok(&ch, IoRequest::read(11, 2, buf_filled(2 * BS as usize, 0))).await;
        assert_eq!((two[0], two[BS as usize]), (19, 20));
        assert_eq!(submits(), 5, "a read across the range's end goes to the module");
        // A write in the range lands at the moved offset, and reads back through both bdevs.
        io_ok(&ch, IoRequest::write(3, 1, buf_filled(BS as usize, 0xab))).await;
        assert_eq!(submits(), 5, "the layer forwarded the write itself");
        assert_eq!(byte_at(&bch, 11).await, 0xab, "base block 11 holds the write to window block 3");
        assert_eq!(byte_at(&ch, 3).await, 0xab);
        // Other types always go to the module.
        assert_eq!(io(&ch, IoRequest::new(IoType::Flush, 0, 16)).await.status, IoStatus::Success);
        assert_eq!(submits(), 6);
        // A new mapping is not used until the counter moves...
        s.map.lock().unwrap().0 = 40;
        assert_eq!(byte_at(&ch, 0).await, 8, "the mapping holds until the counter moves");
        assert_eq!(s.asks.load(Ordering::SeqCst), 1);
        // ... and then at once, taken once.
        s.generation.fetch_add(1, Ordering::SeqCst);
        assert_eq!(byte_at(&ch, 0).await, 40);
        assert_eq!(byte_at(&ch, 1).await, 41);
        assert_eq!((s.asks.load(Ordering::SeqCst), submits()), (2, 6));
        // No linear range any more: everything goes to the module.
        s.map.lock().unwrap().1 = None;
        s.generation.fetch_add(1, Ordering::SeqCst);
        assert_eq!(byte_at(&ch, 0).await, 40);
        assert_eq!(submits(), 7, "with no linear range the module maps every request");
        drop((ch, d, bch, base));
        ferrite_bdev::channel::local_iostat(w_id)
    });
    // The window's own layer counted every read and write, forwarded by itself or not.
    assert_eq!((stat.num_read_ops, stat.num_write_ops, stat.io_errors), (22, 1, 0), "{stat:?}");
    drop(w);
    for name in ["lin_win", "lin_base"] {
        wait_timeout(unregister(name, None).unwrap(), TIMEOUT).expect("delete finishes");
    }
    shutdown(e);
}
