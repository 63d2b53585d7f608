//! Helpers of the SCSI tests: an engine, a target with malloc logical units, sessions, and
//! commands run to their response.

#![allow(dead_code)]

use ferrite_bdev::Initiator;
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_scsi::sense::parse;
use ferrite_scsi::{Lun, LunConfig, PortInfo, Response, Session, Target, Task, TaskDone};
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// How long one test step may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// An engine of `n` reactors.
pub fn engine(n: usize) -> Engine {
    Engine::start(EngineConfig { cores: (0..n).collect(), mode: ReactorMode::Interrupt, ..Default::default() })
        .expect("engine starts")
}

/// Runs the future `f` makes on reactor `id` and returns its output.
pub fn run<F, Fut>(e: &Engine, id: usize, f: F) -> Fut::Output
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let mut rx = e.run_async(id, f);
    match rx.wait_for(TIMEOUT) {
        Some(Ok(v)) => v,
        Some(Err(_)) => panic!("the task on reactor {id} failed (see its panic above)"),
        None => panic!("the task on reactor {id} did not finish within {TIMEOUT:?}"),
    }
}

/// A malloc bdev.
pub fn malloc(name: &str, num_blocks: u64, block_size: u32) {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size, ..Default::default() })
        .expect("malloc create");
}

/// A target with ports 1 and 2 (group 1) and LUN 0 over the malloc bdev `name`.
pub fn target(name: &str, num_blocks: u64, block_size: u32) -> Arc<Target> {
    target_with(name, num_blocks, block_size, |_| {})
}

/// As [`target`], with the LUN's configuration changed by `f`.
pub fn target_with(name: &str, num_blocks: u64, block_size: u32, f: impl FnOnce(&mut LunConfig)) -> Arc<Target> {
    malloc(name, num_blocks, block_size);
    let t = Target::new(&format!("iqn.2026-01.io.ferrite:{name}"));
    for rel_id in [1, 2] {
        t.add_port(PortInfo {
            rel_id,
            group: 1,
            name: format!("iqn.2026-01.io.ferrite:{name},t,0x000{rel_id}"),
            protocol: Some(5),
        })
        .unwrap();
    }
    let mut cfg = LunConfig::new(name);
    f(&mut cfg);
    t.add_lun(0, Lun::new(cfg).expect("lun")).unwrap();
    t
}

/// Initiator port `n`.
pub fn initiator(n: u8) -> Initiator {
    Initiator::Scsi { name: format!("iqn.2026-01.io.ferrite:initiator{n}"), isid: [0x80, 0, 0, 0, 0, n] }
}

/// A completer that drops what it gets (tests use `Session::execute`).
pub struct Drop;

impl TaskDone for Drop {
    fn task_done(&self, _tag: u64, _resp: Response) {}
}

/// A session of initiator `n` through port 1.
pub fn session(t: &Arc<Target>, n: u8) -> Session {
    Session::new(t, initiator(n), 1, Rc::new(Drop)).expect("session")
}

/// Runs `cdb` on LUN 0 with `expected` bytes expected and `data` as data-out.
pub async fn cmd(s: &Session, cdb: &[u8], expected: u32, data: Option<&[u8]>) -> Response {
    cmd_lun(s, 0, cdb, expected, data).await
}

/// Runs `cdb` on `lun`.
pub async fn cmd_lun(s: &Session, lun: u64, cdb: &[u8], expected: u32, data: Option<&[u8]>) -> Response {
    let mut t = Task::new(lun, cdb, expected);
    if let Some(d) = data {
        let n = s.data_out_len(lun, cdb, expected) as usize;
        let mut b = ferrite_reactor::alloc_buf(n);
        b.copy_from_slice(&d[..n]);
        t = t.with_data(b);
    }
    s.execute(t, 7).await
}

/// The data-in sent.
pub fn data(r: &Response) -> Vec<u8> {
    let mut v = Vec::new();
    for b in &r.data {
        v.extend_from_slice(b);
    }
    v.truncate(r.data_len as usize);
    v
}

/// Status, key, ASC, ASCQ.
pub fn outcome(r: &Response) -> (u8, u8, u8, u8) {
    let (k, a, q) = parse(r.sense.as_slice()).unwrap_or((0, 0, 0));
    (r.status, k, a, q)
}

/// CHECK CONDITION with key, ASC, ASCQ.
pub fn check(key: u8, asc: u8, ascq: u8) -> (u8, u8, u8, u8) {
    (2, key, asc, ascq)
}

/// GOOD.
pub const GOOD: (u8, u8, u8, u8) = (0, 0, 0, 0);

/// A READ(10) or WRITE(10)-shaped CDB.
pub fn cdb10(op: u8, flags: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A 16-byte block CDB.
pub fn cdb16(op: u8, flags: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A 12-byte block CDB.
pub fn cdb12(op: u8, flags: u8, lba: u32, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = op;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// `n` bytes of a pattern seeded by `seed`.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}
