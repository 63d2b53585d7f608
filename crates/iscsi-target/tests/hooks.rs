//! The hooks the connection engine plugs in, driven through the RPC methods in-process: a
//! portal listener that sees groups opened (paused with `wait`), resumed and closed, and
//! refuses a bind; sessions whose connections `iscsi_get_connections`/`iscsi_get_stats` report,
//! that get logout requests, hold back `iscsi_target_node_add_lun` and make
//! `iscsi_delete_target_node` wait; and LUN events when a bdev is resized or deleted.

use ferrite_iscsi_target::{ConnState, ConnectionInfo, LoginPhase, LunEvent, PortalGroup, PortalListener, Sessions};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{Ctx, Params, Registry};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Listener {
    calls: Mutex<Vec<String>>,
}

impl PortalListener for Listener {
    fn open(&self, pg: &PortalGroup, paused: bool) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("open {} paused={paused}", pg.tag));
        if pg.portals.iter().any(|p| p.port == "1") {
            return Err("bind 127.0.0.1:1: permission denied".into());
        }
        Ok(())
    }
    fn resume(&self, tag: i32) {
        self.calls.lock().unwrap().push(format!("resume {tag}"));
    }
    fn close(&self, tag: i32) {
        self.calls.lock().unwrap().push(format!("close {tag}"));
    }
}

#[derive(Default)]
struct Conns {
    active: AtomicUsize,
    logouts: Mutex<Vec<(String, Option<i32>)>>,
    events: Mutex<Vec<(String, u32, LunEvent)>>,
}

impl Sessions for Conns {
    fn connections(&self) -> Vec<ConnectionInfo> {
        let c = ConnectionInfo {
            id: 0,
            cid: 1,
            tsih: Some(3),
            state: ConnState::Running,
            login_phase: LoginPhase::FullFeature,
            initiator_addr: "127.0.0.1".into(),
            target_addr: "127.0.0.1".into(),
            target_node_name: "disk1".into(),
            thread_name: "reactor_0".into(),
        };
        let mut login = c.clone();
        login.id = 1;
        login.tsih = None;
        login.state = ConnState::Exiting;
        login.login_phase = LoginPhase::NotStarted;
        vec![c, login]
    }
    fn request_logout(&self, target: &str, pg_tag: Option<i32>) {
        self.logouts.lock().unwrap().push((target.into(), pg_tag));
    }
    fn active_connections(&self, _target: &str) -> usize {
        // Each look sees one fewer, as if a connection logs out between looks.
        self.active.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(1))).unwrap()
    }
    fn lun_event(&self, target: &str, lun_id: u32, event: LunEvent) {
        self.events.lock().unwrap().push((target.into(), lun_id, event));
    }
}

struct Fixture {
    engine: Engine,
    ctx: Ctx,
}

impl Fixture {
    fn new() -> Fixture {
        let engine = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Interrupt, ..Default::default() })
            .expect("engine");
        let reg = ferrite_rpc::app::registry(|reg| {
            ferrite_modules::register_builtin();
            ferrite_bdev::rpc::register(reg);
            ferrite_iscsi_target::register(reg);
        });
        reg.set_state(RUNTIME);
        Fixture { ctx: Ctx { engine: engine.clone(), registry: Arc::new(reg) }, engine }
    }

    fn call(&self, method: &'static str, params: Value) -> Result<Value, (i32, String)> {
        let ctx = self.ctx.clone();
        let p = if params.is_null() { None } else { Some(params) };
        self.engine
            .run_async(0, move || async move { Registry::call(&ctx, method, Params(p)).await })
            .wait()
            .expect("reactor 0 answers")
            .map_err(|e| (e.code, e.message))
    }

    fn ok(&self, method: &'static str, params: Value) -> Value {
        self.call(method, params.clone()).unwrap_or_else(|e| panic!("{method} {params}: {e:?}"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.engine.stop();
        self.engine.join();
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_engine_listens_reports_and_hears_of_luns_through_its_hooks() {
    let f = Fixture::new();
    let listener = Arc::new(Listener::default());
    let conns = Arc::new(Conns::default());
    // A group created before the engine registers is opened when it does.
    f.ok(
        "iscsi_create_portal_group",
        json!({"tag": 9, "portals": [{"host": "0.0.0.0", "port": "3269"}], "wait": true}),
    );
    ferrite_iscsi_target::set_portal_listener(listener.clone());
    ferrite_iscsi_target::set_sessions(conns.clone());
    f.ok(
        "iscsi_create_portal_group",
        json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}], "wait": true}),
    );
    f.ok("iscsi_start_portal_group", json!({"tag": 1}));
    let e = f
        .call("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": "1"}]}))
        .unwrap_err();
    assert!(e.0 == -32602 && e.1.contains("permission denied"), "{e:?}");
    assert!(ferrite_iscsi_target::portal_group(2).is_none(), "a group that cannot listen is not recorded");
    f.ok("iscsi_delete_portal_group", json!({"tag": 9}));
    assert_eq!(
        *listener.calls.lock().unwrap(),
        ["open 9 paused=true", "open 1 paused=true", "resume 1", "open 2 paused=false", "close 9"]
    );
    assert!(ferrite_iscsi_target::portal_group(1).unwrap().started);

    // Connections as SPDK lists them; stats count their states.
    let c = f.ok("iscsi_get_connections", Value::Null);
    assert_eq!(
        c[0],
        json!({"id": 0, "cid": 1, "tsih": 3, "state": "running", "login_phase": "full_feature_phase",
            "initiator_addr": "127.0.0.1", "target_addr": "127.0.0.1", "target_node_name": "disk1",
            "thread_name": "reactor_0"})
    );
    assert_eq!((&c[1]["tsih"], &c[1]["login_phase"]), (&json!(65535), &json!("not_started")));
    assert_eq!(f.ok("iscsi_get_stats", Value::Null), json!({"invalid": 0, "running": 1, "exiting": 1, "exited": 0}));

    // A node over two null bdevs.
    for (name, mb) in [("N0", 8), ("N1", 8)] {
        f.ok("bdev_null_create", json!({"name": name, "num_blocks": mb * 256, "block_size": 4096}));
    }
    f.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    f.ok(
        "iscsi_create_target_node",
        json!({"name": "disk1", "alias_name": "", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
            "luns": [{"bdev_name": "N0", "lun_id": 0}, {"bdev_name": "N1", "lun_id": 1}], "queue_depth": 8}),
    );
    let name = "iqn.2016-06.io.spdk:disk1";
    let node = ferrite_iscsi_target::target(name).unwrap();
    assert!(ferrite_iscsi_target::allowed(&node, "iqn.x", "10.0.0.1".parse().unwrap(), 1));
    assert_eq!(ferrite_iscsi_target::targets_for_portal_group(1).len(), 1);
    assert_eq!(node.lun(1).unwrap().desc().bdev().name(), "N1", "the engine takes channels from the LUN's descriptor");

    // A LUN is not added while connections are logged in (SPDK's rule).
    conns.active.store(1, Ordering::SeqCst);
    let e = f.call("iscsi_target_node_add_lun", json!({"name": name, "bdev_name": "N0"})).unwrap_err();
    assert!(e.1.contains("active connections"), "{e:?}");

    // Logouts are passed on.
    f.ok("iscsi_target_node_request_logout", json!({"name": name, "pg_tag": 1}));
    assert_eq!(conns.logouts.lock().unwrap().last().unwrap(), &(name.to_string(), Some(1)));

    // Resizing and deleting a bdev: the engine hears of it; the deleted one's LUN goes once the
    // snapshot the engine held is dropped.
    f.ok("bdev_null_resize", json!({"name": "N1", "new_size": 16}));
    wait_for("resize event", || conns.events.lock().unwrap().contains(&(name.into(), 1, LunEvent::Resized)));
    let before = ferrite_iscsi_target::generation();
    std::thread::scope(|s| {
        // The deletion finishes when the last descriptor closes: the engine's snapshot holds
        // one until the engine drops it on the event.
        let deleting = s.spawn(|| f.ok("bdev_null_delete", json!({"name": "N1"})));
        wait_for("remove event", || conns.events.lock().unwrap().contains(&(name.into(), 1, LunEvent::Removed)));
        assert!(ferrite_iscsi_target::generation() > before);
        assert!(ferrite_iscsi_target::target(name).unwrap().lun(1).is_none());
        assert!(node.lun(1).is_some(), "the engine's snapshot is as it was");
        assert!(!deleting.is_finished(), "the snapshot holds the bdev open");
        drop(node);
        deleting.join().unwrap();
    });
    assert!(ferrite_bdev::lookup("N1").is_none());

    // Deleting the node asks its connections to log out and answers once none is left.
    conns.active.store(3, Ordering::SeqCst);
    f.ok("iscsi_delete_target_node", json!({"name": name}));
    assert_eq!(conns.active.load(Ordering::SeqCst), 0);
    assert_eq!(conns.logouts.lock().unwrap().last().unwrap(), &(name.to_string(), None));
    assert!(ferrite_iscsi_target::target(name).is_none());
    ferrite_iscsi_target::shutdown();
    assert!(listener.calls.lock().unwrap().ends_with(&["close 1".to_string()]));
}
