//! The iSCSI target's I/O path allocates nothing per command in steady state: an engine of
//! one reactor in this process, configured through the RPC handlers `ferrite serve` uses, with
//! the iSCSI engine installed, serves a malloc LUN on 127.0.0.1 to the tests' own synchronous
//! initiator (tests/iscsi_common) on the test thread. A global allocator counts allocations per
//! thread, so the reactor's count is the target's alone. After a warm-up the count is read, a
//! run of commands is made, and it is read again. Cases: 4 KiB reads and writes (immediate
//! data), 64 KiB writes (immediate data, then an R2T and Data-Out) and reads (Data-In of several
//! PDUs), each read compared with what was written.
//!
//! `FERRITE_ALLOC_TRACE=N` prints the backtraces of the reactor's first N allocations of each
//! measured run.

mod common;
mod iscsi_common;

use ferrite_iscsi::negotiate::InitiatorOptions;
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_rpc::{Ctx, Params, Registry};
use iscsi_common::{pattern, Ini};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

/// Allocations a run may make besides `SLACK_PER_S` per second of it: timers that fire by the
/// clock, not by I/O (the connection watchdog collects the reactor's connections into a `Vec`
/// once a second).
const SLACK: u64 = 3;
const SLACK_PER_S: u64 = 2;
/// Commands per measured run.
const RUN: usize = 400;

fn allocs() -> u64 {
    ferrite_alloc_count::allocs()
}

struct Target {
    engine: Engine,
    ctx: Ctx,
}

impl Target {
    fn rpc(&self, method: &'static str, params: Value) -> Value {
        let c = self.ctx.clone();
        self.engine
            .run_async(0, move || async move { Registry::call(&c, method, Params(Some(params))).await })
            .wait()
            .expect("reactor answers")
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    fn allocs(&self) -> u64 {
        self.engine.call(0, allocs).wait().expect("reactor answers")
    }

    fn trace(&self, n: u32) {
        self.engine.call(0, move || ferrite_alloc_count::trace_next(n)).wait().expect("reactor answers");
    }
}

#[test]
fn iscsi_io_allocates_nothing_per_command_on_the_target() {
    let engine =
        Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Adaptive, pin: false, ..Default::default() })
            .expect("engine starts");
    ferrite_iscsi_target::engine::install();
    let registry = ferrite_rpc::app::registry(|reg| {
        ferrite_modules::register_builtin();
        ferrite_bdev::rpc::register(reg);
        ferrite_iscsi_target::register(reg);
    });
    let ctx = Ctx { engine: engine.clone(), registry: Arc::new(registry) };
    let c = ctx.clone();
    engine
        .run_async(0, move || async move { ferrite_rpc::config::start_framework(&c).await })
        .wait()
        .unwrap()
        .expect("framework starts");
    let t = Target { engine, ctx };
    t.rpc("bdev_malloc_create", json!({"name": "Malloc0", "num_blocks": 8192, "block_size": 512}));
    let port = iscsi_common::free_port();
    t.rpc("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]}));
    t.rpc("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    t.rpc(
        "iscsi_create_target_node",
        json!({"name": "noalloc", "alias_name": "", "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 32}),
    );
    let opts = InitiatorOptions { max_recv_data_segment_length: 16384, ..InitiatorOptions::default() };
    let mut ini = Ini::login(port, Some("iqn.2016-06.io.spdk:noalloc"), opts).expect("login");
    let trace = ferrite_alloc_count::trace_from_env();
    let small = pattern(1, 4096);
    let large = pattern(2, 64 << 10);
    let mut report = Vec::new();
    type Op = fn(&mut Ini, usize, &[u8]);
    let cases: [(&str, Op, &[u8]); 2] = [
        ("4 KiB write+read", |ini, i, d| io(ini, (i % 64) as u32 * 8, d), &small),
        ("64 KiB write (R2T) + read", |ini, i, d| io(ini, (i % 4) as u32 * 128 + 1024, d), &large),
    ];
    for (name, op, data) in cases {
        for i in 0..RUN / 4 {
            op(&mut ini, i, data);
        }
        t.trace(trace);
        let before = t.allocs();
        let start = Instant::now();
        for i in 0..RUN {
            op(&mut ini, i, data);
        }
        let made = t.allocs() - before;
        t.trace(0);
        let allowed = SLACK + SLACK_PER_S * start.elapsed().as_secs_f64().ceil() as u64;
        report.push(format!(
            "{name}: {made} allocations over {RUN} commands in {:?} (allowed {allowed})",
            start.elapsed()
        ));
        assert!(made <= allowed, "{}", report.join("\n"));
    }
    println!("{}", report.join("\n"));
    drop(ini);
    t.engine.stop();
    t.engine.join();
}

/// Writes `data` at `lba` and reads it back.
fn io(ini: &mut Ini, lba: u32, data: &[u8]) {
    assert_eq!(ini.write10(lba, data).status, 0);
    let r = ini.read10(lba, (data.len() / 512) as u16);
    assert_eq!(r.status, 0);
    assert!(r.data == data, "read back differs at {lba}");
}
