//! Preconditioning before a timed run (`ferrite perf --fill`): every block of a bdev written once,
//! front to back, so that a thin volume is fully allocated (and a RAM disk's pages are real)
//! when the measurement starts. bdevperf users do the same with a `-w write` pass under `-z`.

use ferrite_bdev::{Bdev, IoRequest, IoStatus};
use std::cell::Cell;
use std::rc::Rc;

/// Bytes per fill write (less at the end of the bdev).
const FILL_IO: u64 = 1 << 20;
/// Fill writes in flight.
const FILL_DEPTH: u64 = 8;

/// Writes every block of `bdev` once with a non-zero pattern, `FILL_DEPTH` writes of up to
/// `FILL_IO` bytes at a time; returns the bytes written, or the first failure. Runs on the
/// calling reactor.
pub async fn fill(bdev: &str) -> Result<u64, String> {
    let desc = Bdev::open(bdev, true, || {}).map_err(|e| format!("cannot open {bdev}: {e}"))?;
    let b = desc.bdev().clone();
    let bs = b.block_size() as u64;
    let total = b.num_blocks();
    let per_io = (FILL_IO / bs).max(1);
    let ch = desc.channel().map_err(|e| e.to_string())?;
    let next = Rc::new(Cell::new(0u64));
    let mut workers = Vec::new();
    for w in 0..FILL_DEPTH {
        let (ch, next, name) = (ch.clone(), next.clone(), bdev.to_string());
        workers.push(ferrite_reactor::spawn_local(async move {
            let mut buf = ferrite_reactor::alloc_buf((per_io * bs) as usize);
            crate::job::fill_pattern(&mut buf, 0xf111 ^ w);
            loop {
                let at = next.get();
                if at >= total {
                    return Ok::<(), String>(());
                }
                let n = per_io.min(total - at);
                next.set(at + n);
                buf.set_len((n * bs) as usize);
                let mut done = ch.submit_wait(IoRequest::write(at, n, buf)).await;
                if done.status != IoStatus::Success {
                    return Err(format!("fill of {name}: write of {n} blocks at {at} failed: {}", done.status));
                }
                let mut req = done.take_req();
                buf = req.bufs.pop().ok_or_else(|| format!("fill of {name}: a write gave no buffer back"))?;
            }
        }));
    }
    let mut first_err = None;
    for w in workers {
        if let Err(e) = w.await {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total * bs),
    }
}
