//! The iSCSI target's management plane over the daemon's RPC socket: every `iscsi_*` method with
//! good and bad params, answers and errors as SPDK v26.05 gives them (the same script runs
//! against SPDK's own iscsi_tgt when $SPDK_DIR is set, and must get the same answers), the
//! options at startup, bdev removal, save_config round trips, and SPDK's saved iSCSI config
//! loading unchanged (`fixtures/spdk-v26.05-iscsi_tgt-save_config.json`, made by
//! `fixtures/make-spdk-iscsi-config.sh` with SPDK's iscsi_tgt; regenerated and compared when
//! $SPDK_DIR is set).

mod common;

use common::{Daemon, TempDir};
use ferrite_rpc::client::{CallError, RpcClient};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FIXTURE: &str = include_str!("fixtures/spdk-v26.05-iscsi_tgt-save_config.json");

/// An answer: a result, or an error's code and message.
type Answer = Result<Value, (i64, String)>;

fn call(sock: &Path, method: &str, params: Option<Value>) -> Answer {
    let mut c = RpcClient::connect(sock, Duration::from_secs(10)).expect("connect");
    match c.call(method, params) {
        Ok(v) => Ok(v),
        Err(CallError::Rpc(e)) => Err((e.code as i64, e.message)),
        Err(e) => panic!("{method}: {e}"),
    }
}

/// True once the daemon at `sock` answers `framework_wait_init`.
fn answers(sock: &Path) -> bool {
    let Ok(mut c) = RpcClient::connect(sock, Duration::from_secs(2)) else { return false };
    c.call("framework_wait_init", None).is_ok()
}

/// SPDK's iscsi_tgt, killed on drop.
struct SpdkIscsi {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl SpdkIscsi {
    fn start(spdk: &Path, dir: &TempDir) -> SpdkIscsi {
        let sock = dir.join("spdk-iscsi.sock");
        let log = dir.join("spdk-iscsi.log");
        let child = Command::new(spdk.join("build/bin/iscsi_tgt"))
            .args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()))
            .spawn()
            .expect("spawn iscsi_tgt");
        let mut t = SpdkIscsi { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = t.child.try_wait().unwrap() {
                panic!("iscsi_tgt exited ({st}); log:\n{}", std::fs::read_to_string(&t.log).unwrap_or_default());
            }
            if t.sock.exists() && answers(&t.sock) {
                return t;
            }
            assert!(Instant::now() < deadline, "iscsi_tgt did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SpdkIscsi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a step must answer: this result (or any success), or this error code and message
/// (SPDK's exactly; Ferrite's may go on after it with what is wrong).
enum Expect {
    Ok(Option<Value>),
    Err(i64, String),
}

fn ok() -> Expect {
    Expect::Ok(Some(json!(true)))
}

fn is(v: Value) -> Expect {
    Expect::Ok(Some(v))
}

fn err(code: i64, msg: &str) -> Expect {
    Expect::Err(code, msg.to_string())
}

fn invalid() -> Expect {
    err(-32602, "Invalid parameters")
}

/// Free TCP ports on the loopback addresses (SPDK binds its portals).
fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<std::net::TcpListener> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// The script: (method, params, expected answer), in order.
fn script(p: &[u16]) -> Vec<(&'static str, Option<Value>, Expect)> {
    let n1 = "iqn.2016-06.io.spdk:disk1";
    let n2 = "iqn.2016-06.io.spdk:disk2";
    let n3 = "iqn.2020-01.com.example:d3";
    let portal = |host: &str, port: String| json!({"host": host, "port": port});
    let p1 = p[0].to_string();
    let hex = format!("0x{:X}", p[4]);
    let tn = |name: &str, maps: Value, luns: Value| json!({"name": name, "alias_name": "x", "pg_ig_maps": maps, "luns": luns, "queue_depth": 64});
    let m11 = json!([{"pg_tag": 1, "ig_tag": 1}]);
    let l0 = json!([{"bdev_name": "Malloc0", "lun_id": 0}]);
    let redirect_fail = format!("Failed to redirect target {n1}, (-22): Invalid argument");
    let mut opts = json!({"node_base": "iqn.2016-06.io.spdk", "max_sessions": 128, "max_connections_per_session": 2,
        "max_queue_depth": 64, "default_time2wait": 2, "default_time2retain": 20, "first_burst_length": 8192,
        "immediate_data": true, "allow_duplicated_isid": false, "error_recovery_level": 0, "nop_timeout": 60,
        "nop_in_interval": 30, "disable_chap": false, "require_chap": false, "mutual_chap": false, "chap_group": 0,
        "max_large_datain_per_connection": 64, "max_r2t_per_connection": 4, "pdu_pool_size": 36864,
        "immediate_data_pool_size": 16384, "data_out_pool_size": 2048});
    let defaults = opts.clone();
    opts["require_chap"] = json!(true);
    opts["mutual_chap"] = json!(true);
    opts["chap_group"] = json!(1);
    let disk1 = |maps: Value| {
        json!({"name": n1, "alias_name": "Data Disk1", "pg_ig_maps": maps,
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1},
                {"bdev_name": "Malloc1", "lun_id": 5}, {"bdev_name": "Malloc1", "lun_id": 255}],
            "queue_depth": 64, "disable_chap": false, "require_chap": true, "mutual_chap": false, "chap_group": 1,
            "header_digest": false, "data_digest": false})
    };
    let disk2 = json!({"name": n2, "alias_name": "x", "pg_ig_maps": m11,
        "luns": [{"bdev_name": "Malloc1", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}], "queue_depth": 64,
        "disable_chap": false, "require_chap": false, "mutual_chap": false, "chap_group": 0,
        "header_digest": false, "data_digest": false});
    let d3 = json!({"name": n3, "pg_ig_maps": m11, "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
        "queue_depth": 64, "disable_chap": false, "require_chap": true, "mutual_chap": true, "chap_group": 1,
        "header_digest": true, "data_digest": false});
    vec![
        // Options and the discovery auth.
        ("iscsi_get_options", Some(json!({})), err(-32602, "iscsi_get_options requires no parameters")),
        ("iscsi_get_options", None, is(defaults)),
        (
            "iscsi_set_options",
            Some(json!({})),
            err(
                -1,
                "Method may only be called before framework is initialized. Use --wait-for-rpc command line \
                 parameter and then issue this RPC before the framework_start_init RPC.",
            ),
        ),
        ("iscsi_set_discovery_auth", None, invalid()),
        (
            "iscsi_set_discovery_auth",
            Some(json!({"disable_chap": true, "require_chap": true})),
            err(-32602, "Invalid combination of CHAP params"),
        ),
        (
            "iscsi_set_discovery_auth",
            Some(json!({"chap_group": -1})),
            err(-32602, "Invalid combination of CHAP params"),
        ),
        ("iscsi_set_discovery_auth", Some(json!({"require_chap": true, "mutual_chap": true, "chap_group": 1})), ok()),
        ("iscsi_get_options", None, is(opts)),
        // Auth groups.
        ("iscsi_create_auth_group", Some(json!({"tag": 1})), ok()),
        ("iscsi_create_auth_group", Some(json!({"tag": 1})), err(-32602, "Could not add auth group (1), File exists")),
        (
            "iscsi_create_auth_group",
            Some(json!({"tag": -4, "secrets": [{"user": "u", "secret": "s"}, {"user": "u", "secret": "t"}]})),
            err(-32602, "Could not add secret to auth group (-4), File exists"),
        ),
        (
            "iscsi_create_auth_group",
            Some(json!({"tag": 2, "secrets": [{"user": "u", "secret": "s", "muser": "m"}]})),
            err(-32602, "Could not add secret to auth group (2), Invalid argument"),
        ),
        (
            "iscsi_create_auth_group",
            Some(json!({"tag": 2, "secrets": [{"user": "u", "secret": "s", "msecret": "m"}]})),
            ok(),
        ),
        ("iscsi_create_auth_group", Some(json!({"tag": 3, "secrets": [{"user": "u"}]})), invalid()),
        (
            "iscsi_create_auth_group",
            Some(json!({"tag": 4, "secrets": [{"user": "u".repeat(256), "secret": "s"}]})),
            err(-32602, "Could not add secret to auth group (4), Invalid argument"),
        ),
        ("iscsi_create_auth_group", Some(json!({"tag": 5, "x": 1})), invalid()),
        ("iscsi_create_auth_group", Some(json!({"tag": "5"})), invalid()),
        (
            "iscsi_auth_group_add_secret",
            Some(json!({"tag": 9, "user": "a", "secret": "b"})),
            err(-32602, "Could not find auth group (9)"),
        ),
        ("iscsi_auth_group_add_secret", Some(json!({"tag": 1, "user": "a", "secret": "b"})), ok()),
        (
            "iscsi_auth_group_add_secret",
            Some(json!({"tag": 1, "user": "a", "secret": "b"})),
            err(-32602, "Could not add secret to auth group (1), File exists"),
        ),
        (
            "iscsi_auth_group_add_secret",
            Some(json!({"tag": 1, "user": "c", "secret": "d", "muser": "e", "msecret": "f"})),
            ok(),
        ),
        (
            "iscsi_auth_group_add_secret",
            Some(json!({"tag": 1, "user": "g", "secret": "h", "muser": "e"})),
            err(-32602, "Could not add secret to auth group (1), Invalid argument"),
        ),
        ("iscsi_auth_group_add_secret", Some(json!({"tag": 1, "user": "g"})), invalid()),
        (
            "iscsi_auth_group_remove_secret",
            Some(json!({"tag": 1, "user": "zz"})),
            err(-32602, "Could not delete secret from CHAP group (1), No such device"),
        ),
        (
            "iscsi_auth_group_remove_secret",
            Some(json!({"tag": 9, "user": "zz"})),
            err(-32602, "Could not find auth group (9)"),
        ),
        ("iscsi_auth_group_remove_secret", Some(json!({"tag": 1, "user": "a"})), ok()),
        ("iscsi_delete_auth_group", Some(json!({"tag": 9})), err(-32602, "Could not find auth group (9)")),
        ("iscsi_get_auth_groups", Some(json!({})), err(-32602, "iscsi_get_auth_groups requires no parameters")),
        (
            "iscsi_get_auth_groups",
            None,
            is(json!([
            {"tag": 1, "secrets": [{"user": "c", "secret": "d", "muser": "e", "msecret": "f"}]},
            {"tag": 2, "secrets": [{"user": "u", "secret": "s"}]}])),
        ),
        ("iscsi_delete_auth_group", Some(json!({"tag": 2})), ok()),
        // Portal groups.
        ("iscsi_create_portal_group", Some(json!({"tag": 1, "portals": [portal("127.0.0.1", p1.clone())]})), ok()),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 1, "portals": [portal("127.0.0.1", p[1].to_string())]})),
            invalid(),
        ),
        ("iscsi_create_portal_group", Some(json!({"tag": 2, "portals": [portal("127.0.0.1", p1.clone())]})), invalid()),
        ("iscsi_create_portal_group", Some(json!({"tag": 3, "portals": []})), ok()),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 4, "portals": [portal("localhost", p[1].to_string())]})),
            invalid(),
        ),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 5, "portals": [portal("127.0.0.1", "abc".into())]})),
            invalid(),
        ),
        ("iscsi_create_portal_group", Some(json!({"tag": 6, "portals": [{"host": "127.0.0.1"}]})), invalid()),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 7, "portals": [portal("*", p[2].to_string())], "wait": true})),
            ok(),
        ),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 8, "portals": [portal("[::1]", p[3].to_string())], "private": true})),
            ok(),
        ),
        ("iscsi_create_portal_group", Some(json!({"tag": 9, "portals": [portal("127.0.0.1", hex.clone())]})), ok()),
        (
            "iscsi_create_portal_group",
            Some(json!({"tag": 10, "portals": [portal("127.0.0.1", p[5].to_string())]})),
            ok(),
        ),
        ("iscsi_start_portal_group", Some(json!({"tag": 7})), ok()),
        ("iscsi_start_portal_group", Some(json!({"tag": 7})), ok()),
        ("iscsi_start_portal_group", Some(json!({"tag": 99})), invalid()),
        ("iscsi_delete_portal_group", Some(json!({"tag": 99})), invalid()),
        ("iscsi_delete_portal_group", Some(json!({"tag": 3})), ok()),
        ("iscsi_portal_group_set_auth", Some(json!({"tag": 99})), err(-32602, "Could not find portal group 99")),
        (
            "iscsi_portal_group_set_auth",
            Some(json!({"tag": 1, "disable_chap": true, "require_chap": true})),
            err(-32602, "Invalid combination of auth params"),
        ),
        (
            "iscsi_portal_group_set_auth",
            Some(json!({"tag": 1, "mutual_chap": true})),
            err(-32602, "Invalid combination of auth params"),
        ),
        ("iscsi_portal_group_set_auth", Some(json!({"tag": 1, "require_chap": true, "chap_group": 5})), ok()),
        ("iscsi_portal_group_set_auth", Some(json!({"tag": 1, "foo": 1})), invalid()),
        ("iscsi_get_portal_groups", Some(json!({})), err(-32602, "iscsi_get_portal_groups requires no parameters")),
        (
            "iscsi_get_portal_groups",
            None,
            is(json!([
            {"tag": 1, "portals": [portal("127.0.0.1", p1.clone())], "private": false},
            {"tag": 7, "portals": [portal("0.0.0.0", p[2].to_string())], "private": false},
            {"tag": 8, "portals": [portal("[::1]", p[3].to_string())], "private": true},
            {"tag": 9, "portals": [portal("127.0.0.1", hex.clone())], "private": false},
            {"tag": 10, "portals": [portal("127.0.0.1", p[5].to_string())], "private": false}])),
        ),
        // Initiator groups.
        ("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})), ok()),
        (
            "iscsi_create_initiator_group",
            Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})),
            invalid(),
        ),
        ("iscsi_create_initiator_group", Some(json!({"tag": 2, "initiators": [], "netmasks": ["ANY"]})), invalid()),
        (
            "iscsi_create_initiator_group",
            Some(json!({"tag": 2, "initiators": ["ALL", "iqn.x"], "netmasks": ["ALL", "10.0.0.0/8", "[fe80::]/64"]})),
            ok(),
        ),
        (
            "iscsi_create_initiator_group",
            Some(json!({"tag": 3, "initiators": ["a", "a"], "netmasks": ["ANY"]})),
            invalid(),
        ),
        ("iscsi_create_initiator_group", Some(json!({"tag": 4, "initiators": ["a"]})), invalid()),
        ("iscsi_create_initiator_group", Some(json!({"tag": 5, "initiators": ["!ANY"], "netmasks": ["ANY"]})), ok()),
        (
            "iscsi_create_initiator_group",
            Some(json!({"tag": 6, "initiators": ["a".repeat(224)], "netmasks": ["ANY"]})),
            invalid(),
        ),
        (
            "iscsi_create_initiator_group",
            Some(json!({"tag": 6, "initiators": ["a"], "netmasks": ["1".repeat(65)]})),
            invalid(),
        ),
        ("iscsi_initiator_group_add_initiators", Some(json!({"tag": 1, "initiators": ["iqn.b"]})), ok()),
        ("iscsi_initiator_group_add_initiators", Some(json!({"tag": 1, "initiators": ["iqn.c", "ANY"]})), invalid()),
        (
            "iscsi_initiator_group_add_initiators",
            Some(json!({"tag": 1, "initiators": ["iqn.d"], "netmasks": ["ANY"]})),
            invalid(),
        ),
        ("iscsi_initiator_group_add_initiators", Some(json!({"tag": 1})), ok()),
        ("iscsi_initiator_group_add_initiators", Some(json!({"tag": 77, "initiators": ["iqn.b"]})), invalid()),
        ("iscsi_initiator_group_remove_initiators", Some(json!({"tag": 1, "initiators": ["iqn.zz"]})), invalid()),
        (
            "iscsi_initiator_group_remove_initiators",
            Some(json!({"tag": 1, "initiators": ["iqn.b"], "netmasks": ["1.1.1.1"]})),
            invalid(),
        ),
        ("iscsi_initiator_group_remove_initiators", Some(json!({"tag": 2, "netmasks": ["10.0.0.0/8"]})), ok()),
        ("iscsi_delete_initiator_group", Some(json!({"tag": 77})), invalid()),
        (
            "iscsi_get_initiator_groups",
            Some(json!({})),
            err(-32602, "iscsi_get_initiator_groups requires no parameters"),
        ),
        (
            "iscsi_get_initiator_groups",
            None,
            is(json!([
            {"tag": 1, "initiators": ["ANY", "iqn.b"], "netmasks": ["ANY"]},
            {"tag": 2, "initiators": ["ANY", "iqn.x"], "netmasks": ["ANY", "[fe80::]/64"]},
            {"tag": 5, "initiators": ["!ANY"], "netmasks": ["ANY"]}])),
        ),
        // Target nodes.
        (
            "iscsi_create_target_node",
            Some(
                json!({"name": "disk1", "alias_name": "Data Disk1", "pg_ig_maps": m11, "luns": l0, "queue_depth": 64}),
            ),
            ok(),
        ),
        ("iscsi_create_target_node", Some(tn("disk1", m11.clone(), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn("DISK1", m11.clone(), l0.clone())), invalid()),
        (
            "iscsi_create_target_node",
            Some(tn("disk2", m11.clone(), json!([{"bdev_name": "Malloc1", "lun_id": 1}]))),
            invalid(),
        ),
        ("iscsi_create_target_node", Some(tn("disk2", json!([]), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn("disk2", m11.clone(), json!([]))), invalid()),
        ("iscsi_create_target_node", Some(tn("disk2", json!([{"pg_tag": 1, "ig_tag": 99}]), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn("disk2", json!([{"pg_tag": 99, "ig_tag": 1}]), l0.clone())), invalid()),
        (
            "iscsi_create_target_node",
            Some(tn("disk2", m11.clone(), json!([{"bdev_name": "Nope", "lun_id": 0}]))),
            invalid(),
        ),
        ("iscsi_create_target_node", Some(tn("disk2", m11.clone(), json!([{"lun_id": 0}]))), invalid()),
        ("iscsi_create_target_node", Some(tn("bad_name", m11.clone(), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn("bad name", m11.clone(), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn("iqn.20a0-01.com.x:d", m11.clone(), l0.clone())), invalid()),
        ("iscsi_create_target_node", Some(tn(&"a".repeat(204), m11.clone(), l0.clone())), invalid()),
        (
            "iscsi_create_target_node",
            Some(
                json!({"name": "disk2", "alias_name": "a".repeat(224), "pg_ig_maps": m11, "luns": l0, "queue_depth": 64}),
            ),
            invalid(),
        ),
        (
            "iscsi_create_target_node",
            Some(json!({"name": "disk2", "alias_name": "x", "pg_ig_maps": m11, "luns": l0, "queue_depth": 64,
            "disable_chap": true, "require_chap": true})),
            invalid(),
        ),
        (
            "iscsi_create_target_node",
            Some(tn("disk2", json!([{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 1}]), l0.clone())),
            invalid(),
        ),
        (
            "iscsi_create_target_node",
            Some(tn(
                "disk2",
                m11.clone(),
                json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 256}]),
            )),
            invalid(),
        ),
        (
            "iscsi_create_target_node",
            Some(json!({"name": "disk2", "alias_name": "x", "pg_ig_maps": m11,
            "luns": [{"bdev_name": "Malloc1", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": -1}], "queue_depth": 500})),
            ok(),
        ),
        (
            "iscsi_create_target_node",
            Some(json!({"name": n3, "alias_name": "", "pg_ig_maps": m11, "luns": [{"bdev_name": "Malloc0"}],
            "queue_depth": 0, "require_chap": true, "mutual_chap": true, "chap_group": 1, "header_digest": true})),
            ok(),
        ),
        ("iscsi_target_node_add_lun", Some(json!({"name": "disk1", "bdev_name": "Malloc1"})), invalid()),
        ("iscsi_target_node_add_lun", Some(json!({"name": "IQN.2016-06.io.spdk:DISK1", "bdev_name": "Malloc1"})), ok()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Malloc1", "lun_id": 5})), ok()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Malloc1", "lun_id": 5})), invalid()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Malloc1", "lun_id": -2})), invalid()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Malloc1", "lun_id": 256})), invalid()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Malloc1", "lun_id": 255})), ok()),
        ("iscsi_target_node_add_lun", Some(json!({"name": n1, "bdev_name": "Nope"})), invalid()),
        (
            "iscsi_target_node_add_lun",
            Some(json!({"name": "iqn.2016-06.io.spdk:nope", "bdev_name": "Malloc1"})),
            invalid(),
        ),
        (
            "iscsi_target_node_add_pg_ig_maps",
            Some(
                json!({"name": n1, "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}, {"pg_tag": 7, "ig_tag": 2}, {"pg_tag": 8, "ig_tag": 2}]}),
            ),
            ok(),
        ),
        (
            "iscsi_target_node_add_pg_ig_maps",
            Some(json!({"name": n1, "pg_ig_maps": [{"pg_tag": 9, "ig_tag": 2}]})),
            ok(),
        ),
        (
            "iscsi_target_node_add_pg_ig_maps",
            Some(json!({"name": n1, "pg_ig_maps": [{"pg_tag": 10, "ig_tag": 2}]})),
            invalid(),
        ),
        (
            "iscsi_target_node_add_pg_ig_maps",
            Some(json!({"name": n1, "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]})),
            invalid(),
        ),
        ("iscsi_target_node_add_pg_ig_maps", Some(json!({"name": n1, "pg_ig_maps": []})), ok()),
        ("iscsi_target_node_add_pg_ig_maps", Some(json!({"name": "disk1", "pg_ig_maps": m11})), invalid()),
        (
            "iscsi_target_node_remove_pg_ig_maps",
            Some(json!({"name": n1, "pg_ig_maps": [{"pg_tag": 7, "ig_tag": 2}, {"pg_tag": 7, "ig_tag": 1}]})),
            invalid(),
        ),
        (
            "iscsi_target_node_remove_pg_ig_maps",
            Some(json!({"name": n1, "pg_ig_maps": [{"pg_tag": 7, "ig_tag": 2}]})),
            ok(),
        ),
        ("iscsi_target_node_remove_pg_ig_maps", Some(json!({"name": n1, "pg_ig_maps": []})), ok()),
        ("iscsi_target_node_set_auth", Some(json!({"name": "nope"})), err(-32602, "Could not find target nope")),
        (
            "iscsi_target_node_set_auth",
            Some(json!({"name": n1, "disable_chap": true, "mutual_chap": true})),
            err(-32602, "Invalid combination of auth params"),
        ),
        ("iscsi_target_node_set_auth", Some(json!({"name": n1, "require_chap": true, "chap_group": 1})), ok()),
        ("iscsi_target_node_set_auth", Some(json!({"name": n1, "chap_group": "1"})), invalid()),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": "nope", "pg_tag": 1})),
            err(-32602, "Target nope is not found"),
        ),
        ("iscsi_target_node_set_redirect", Some(json!({"name": n1, "pg_tag": 99})), err(-32602, &redirect_fail)),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 8, "redirect_host": "127.0.0.1", "redirect_port": "3260"})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 10, "redirect_host": "127.0.0.1", "redirect_port": "3260"})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 1, "redirect_host": "127.0.0.1", "redirect_port": p1.clone()})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 1, "redirect_host": "localhost", "redirect_port": "3260"})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 1, "redirect_host": "[::1]", "redirect_port": "3260"})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 1, "redirect_host": "127.0.0.1"})),
            err(-32602, &redirect_fail),
        ),
        (
            "iscsi_target_node_set_redirect",
            Some(json!({"name": n1, "pg_tag": 1, "redirect_host": "::1", "redirect_port": "3260"})),
            ok(),
        ),
        ("iscsi_target_node_set_redirect", Some(json!({"name": n1, "pg_tag": 1})), ok()),
        ("iscsi_target_node_request_logout", Some(json!({"name": "nope"})), err(-32602, "Target nope is not found")),
        ("iscsi_target_node_request_logout", Some(json!({"name": n1, "pg_tag": 99})), ok()),
        ("iscsi_target_node_request_logout", Some(json!({"name": n1})), ok()),
        ("iscsi_get_target_nodes", Some(json!({})), err(-32602, "iscsi_get_target_nodes requires no parameters")),
        (
            "iscsi_get_target_nodes",
            None,
            is(json!([
                disk1(
                    json!([{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 2}, {"pg_tag": 8, "ig_tag": 2}, {"pg_tag": 9, "ig_tag": 2}])
                ),
                disk2,
                d3
            ])),
        ),
        // Deleting groups that nodes use unmaps them (SPDK does not refuse).
        ("iscsi_delete_portal_group", Some(json!({"tag": 9})), ok()),
        ("iscsi_delete_initiator_group", Some(json!({"tag": 2})), ok()),
        ("iscsi_get_target_nodes", None, Expect::Ok(None)),
        ("iscsi_delete_target_node", Some(json!({"name": "nope"})), err(-2, "No such file or directory")),
        ("iscsi_delete_target_node", Some(json!({})), invalid()),
        ("iscsi_delete_target_node", Some(json!({"name": "IQN.2016-06.io.spdk:disk2"})), ok()),
        ("iscsi_get_connections", Some(json!({})), err(-32602, "iscsi_get_connections requires no parameters")),
        ("iscsi_get_connections", None, is(json!([]))),
        ("iscsi_get_stats", Some(json!({})), err(-32602, "iscsi_get_stats requires no parameters")),
        ("iscsi_get_stats", None, is(json!({"invalid": 0, "running": 0, "exiting": 0, "exited": 0}))),
    ]
}

/// Runs the script against the daemon at `sock`; `spdk` holds messages to SPDK's exactly.
fn run_script(sock: &Path, ports: &[u16], spdk: bool) -> Vec<Answer> {
    let who = if spdk { "SPDK" } else { "Ferrite" };
    for (name, blocks, bs) in [("Malloc0", 32, 512), ("Malloc1", 16, 4096)] {
        call(sock, "bdev_malloc_create", Some(json!({"name": name, "num_blocks": blocks, "block_size": bs}))).unwrap();
    }
    let mut answers = Vec::new();
    for (i, (method, params, expect)) in script(ports).into_iter().enumerate() {
        let got = call(sock, method, params.clone());
        let what = format!("{who}: step {i}: {method} {}", params.map(|p| p.to_string()).unwrap_or_default());
        match (&expect, &got) {
            (Expect::Ok(None), Ok(_)) => {}
            (Expect::Ok(Some(want)), Ok(v)) => assert_eq!(v, want, "{what}"),
            (Expect::Err(code, msg), Err((c, m))) => {
                assert_eq!(c, code, "{what}: {m}");
                let same = if spdk { m == msg } else { m.starts_with(msg.as_str()) };
                assert!(same, "{what}: message {m:?}, expected {msg:?}");
            }
            _ => panic!("{what}: got {got:?}"),
        }
        answers.push(got);
    }
    answers
}

#[test]
fn every_method_answers_as_spdk_does() {
    let dir = TempDir::new("iscsi-rpc");
    let ports = free_ports(6);
    let d = Daemon::start(&dir, &[]);
    let ours = run_script(&d.sock, &ports, false);
    // After the groups went: disk1 keeps 1:1 only (pg 9 and ig 2 unmapped, pg 8 left with none).
    let nodes = d.call("iscsi_get_target_nodes", None);
    let maps: Vec<Value> = nodes.as_array().unwrap().iter().map(|t| t["pg_ig_maps"].clone()).collect();
    assert_eq!(maps, [json!([{"pg_tag": 1, "ig_tag": 1}]), json!([{"pg_tag": 1, "ig_tag": 1}])], "{nodes}");
    d.assert_serving();
    // Ferrite's portals listen on `ports`: they go with the daemon, for SPDK's to bind them.
    drop(d);
    match common::spdk_dir() {
        Err(why) => eprintln!("SKIP the same script against SPDK's iscsi_tgt: {why}"),
        Ok(spdk) => {
            let t = SpdkIscsi::start(&spdk, &dir);
            let theirs = run_script(&t.sock, &ports, true);
            // The same results (errors are compared by the script).
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                if let (Ok(a), Ok(b)) = (a, b) {
                    assert_eq!(a, b, "step {i}");
                }
            }
        }
    }
}

/// The "iscsi" subsystem's entries of a config document.
fn iscsi_config(doc: &Value) -> Value {
    doc["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "iscsi").expect("iscsi subsystem")["config"]
        .clone()
}

#[test]
fn options_at_startup_are_honoured_once_and_saved_with_the_discovery_auth() {
    let dir = TempDir::new("iscsi-opts");
    let d = Daemon::start(&dir, &["--wait-for-rpc"]);
    for (bad, says) in [
        (json!({"max_queue_depth": 0}), "MaxQueueDepth"),
        (json!({"first_burst_length": 100}), "FirstBurstLength"),
        (json!({"error_recovery_level": 3}), "ErrorRecoveryLevel"),
        (json!({"disable_chap": true, "mutual_chap": true}), "CHAP"),
        (json!({"allow_duplicated_isid": true}), "allow_duplicated_isid"),
        (json!({"auth_file": "/tmp/x"}), "auth_file"),
        (json!({"max_sessions": "1"}), "max_sessions"),
        (json!({"frob": 1}), "frob"),
    ] {
        let e = d.call_err("iscsi_set_options", Some(bad.clone()));
        assert!(e.code == -32602 && e.message.contains(says), "{bad}: {e:?}");
    }
    let opts = json!({"node_base": "iqn.2020-02.org.example", "max_queue_depth": 16, "max_sessions": 4,
        "error_recovery_level": 2, "pdu_pool_size": 1000, "immediate_data": false});
    assert_eq!(d.call("iscsi_set_options", Some(opts)), json!(true));
    let e = d.call_err("iscsi_set_options", Some(json!({})));
    assert_eq!((e.code, e.message.as_str()), (-32603, "Must not call more than once"));
    d.call("framework_start_init", None);
    let got = d.call("iscsi_get_options", None);
    assert_eq!(
        (&got["node_base"], &got["max_queue_depth"], &got["error_recovery_level"], &got["immediate_data"]),
        (&json!("iqn.2020-02.org.example"), &json!(16), &json!(2), &json!(false)),
        "{got}"
    );
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 64, "block_size": 512})));
    d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": free_ports(1)[0].to_string()}]})),
    );
    d.call("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})));
    d.call(
        "iscsi_create_target_node",
        Some(json!({"name": "t1", "alias_name": "", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
            "luns": [{"bdev_name": "M0", "lun_id": 0}], "queue_depth": 64})),
    );
    let t = &d.call("iscsi_get_target_nodes", None)[0];
    assert_eq!((&t["name"], &t["queue_depth"]), (&json!("iqn.2020-02.org.example:t1"), &json!(16)), "{t}");
    d.call("iscsi_set_discovery_auth", Some(json!({"require_chap": true, "chap_group": 3})));
    let saved = d.call("save_config", None);
    let cfg = iscsi_config(&saved);
    let set = &cfg[0];
    assert_eq!(set["method"], "iscsi_set_options");
    assert_eq!((&set["params"]["require_chap"], &set["params"]["chap_group"]), (&json!(true), &json!(3)), "{set}");
    assert_eq!(set["params"]["pdu_pool_size"], 1000);
    assert_eq!(common::saved_entries(&saved, "iscsi_set_options").len(), 1, "written once: {saved}");
    // The saved config restarts into the same state (the first daemon gone: the iSCSI engine
    // binds the portal again).
    let file = dir.write_json("saved.json", &saved);
    drop(d);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", file.to_str().unwrap()]);
    assert_eq!(d2.call("save_config", None), saved);
}

#[test]
fn a_deleted_bdev_takes_its_luns_and_the_node_stays() {
    let dir = TempDir::new("iscsi-hotremove");
    let d = Daemon::start(&dir, &[]);
    for b in ["B0", "B1"] {
        d.call("bdev_malloc_create", Some(json!({"name": b, "num_blocks": 64, "block_size": 512})));
    }
    d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": free_ports(1)[0].to_string()}]})),
    );
    d.call("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})));
    d.call(
        "iscsi_create_target_node",
        Some(json!({"name": "t", "alias_name": "", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
            "luns": [{"bdev_name": "B0", "lun_id": 0}, {"bdev_name": "B1", "lun_id": 3}], "queue_depth": 8})),
    );
    let luns = |d: &Daemon| d.call("iscsi_get_target_nodes", None)[0]["luns"].clone();
    d.call("bdev_malloc_delete", Some(json!({"name": "B1"})));
    let deadline = Instant::now() + Duration::from_secs(5);
    while luns(&d).as_array().unwrap().len() != 1 {
        assert!(Instant::now() < deadline, "LUN 3 still there: {}", luns(&d));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(luns(&d), json!([{"bdev_name": "B0", "lun_id": 0}]));
    assert!(!d.bdev_names().contains(&"B1".to_string()), "the bdev went (its LUN closed it)");
    d.call("bdev_malloc_delete", Some(json!({"name": "B0"})));
    while !luns(&d).as_array().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "LUN 0 still there");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The node stays without LUNs (as SPDK's), and takes a LUN again.
    d.call("bdev_malloc_create", Some(json!({"name": "B2", "num_blocks": 64, "block_size": 512})));
    d.call("iscsi_target_node_add_lun", Some(json!({"name": "iqn.2016-06.io.spdk:t", "bdev_name": "B2"})));
    assert_eq!(luns(&d), json!([{"bdev_name": "B2", "lun_id": 0}]));
    // A bdev under a LUN is deleted at shutdown too: the daemon stops cleanly.
    let mut d = d;
    d.proc.sigterm();
    assert!(d.proc.expect_exit(Duration::from_secs(10), "daemon").success());
}

#[test]
fn ferrites_own_rules_where_it_differs_from_spdk() {
    let dir = TempDir::new("iscsi-diff");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 64, "block_size": 512})));
    // A portal group tag is a 16-bit TPGT; SPDK takes any int32.
    for tag in [-5, 65536] {
        let e = d.call_err(
            "iscsi_create_portal_group",
            Some(json!({"tag": tag, "portals": [{"host": "127.0.0.1", "port": free_ports(1)[0].to_string()}]})),
        );
        assert!(e.code == -32602 && e.message.contains("tag"), "{e:?}");
    }
    d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 0, "portals": [{"host": "127.0.0.1", "port": free_ports(1)[0].to_string()}]})),
    );
    d.call("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})));
    // SPDK's save_config omits alias_name for a node without alias; such a node loads here.
    d.call(
        "iscsi_create_target_node",
        Some(json!({"name": "noalias", "pg_ig_maps": [{"pg_tag": 0, "ig_tag": 1}],
            "luns": [{"bdev_name": "M0", "lun_id": 0}], "queue_depth": 8})),
    );
    let t = &d.call("iscsi_get_target_nodes", None)[0];
    assert!(t.get("alias_name").is_none(), "{t}");
    // Messages say what is wrong after SPDK's words.
    let e = d.call_err(
        "iscsi_create_initiator_group",
        Some(json!({"tag": 2, "initiators": ["a", "a"], "netmasks": ["ANY"]})),
    );
    assert!(e.message.starts_with("Invalid parameters: ") && e.message.contains("already"), "{e:?}");
}

/// `cfg` with `alias_name: ""` in each target node entry without one.
fn with_empty_aliases(mut cfg: Value) -> Value {
    for e in cfg.as_array_mut().unwrap() {
        if e["method"] == "iscsi_create_target_node" {
            e["params"].as_object_mut().unwrap().entry("alias_name").or_insert(json!(""));
        }
    }
    cfg
}

/// SPDK's fixture, or a fresh save_config of the same script when $SPDK_DIR is set (checked
/// against the fixture: same entries and members; the malloc UUIDs differ).
fn spdk_iscsi_config(dir: &TempDir) -> Value {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let spdk = match common::spdk_dir() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("note: using the committed iscsi_tgt save_config fixture ({why})");
            return fixture;
        }
    };
    let out = dir.join("fresh.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make-spdk-iscsi-config.sh");
    let st =
        Command::new("bash").arg(script).arg(&out).env("SPDK_DIR", &spdk).status().expect("run the fixture script");
    assert!(st.success(), "make-spdk-iscsi-config.sh failed");
    let fresh: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(iscsi_config(&fresh), iscsi_config(&fixture), "SPDK's iSCSI config no longer matches the fixture");
    fresh
}

#[test]
fn spdks_saved_iscsi_config_loads_unchanged_and_round_trips() {
    let dir = TempDir::new("iscsi-spdk-config");
    let spdk_cfg = spdk_iscsi_config(&dir);
    let file = dir.write_json("spdk.json", &spdk_cfg);
    let d = Daemon::start(&dir, &["--json", file.to_str().unwrap()]);
    let saved = d.call("save_config", None);
    // Every iSCSI entry comes back as SPDK wrote it, in SPDK's order (options with the
    // discovery auth set at runtime, portal groups, initiator groups, target nodes, auth groups),
    // but for the empty alias_name Ferrite writes where SPDK leaves it out (and cannot load it).
    assert_eq!(iscsi_config(&saved), with_empty_aliases(iscsi_config(&spdk_cfg)));
    let nodes = d.call("iscsi_get_target_nodes", None);
    assert_eq!(nodes[0]["luns"], json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}]));
    assert_eq!(d.call("iscsi_get_options", None)["chap_group"], 2);
    // Ferrite's save_config of it restarts into the same state.
    let again = dir.write_json("ferrite.json", &saved);
    drop(d);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", again.to_str().unwrap()]);
    assert_eq!(d2.call("save_config", None), saved);
    drop(d2);
    // And through SPDK's rpc.py load_config into a daemon waiting in the startup state, and SPDK
    // takes Ferrite's config back.
    let Ok(spdk) = common::spdk_dir() else { return };
    let w = Daemon::start_with(&dir, "wait.sock", "0x1", &["--wait-for-rpc"]);
    let mut cmd = Command::new("python3");
    cmd.arg(spdk.join("scripts/rpc.py"))
        .arg("-s")
        .arg(&w.sock)
        .arg("load_config")
        .env("PYTHONPATH", spdk.join("python"));
    let text = serde_json::to_string(&spdk_cfg).unwrap();
    let out = run_with_stdin(cmd, &text);
    assert!(out.status.success(), "rpc.py load_config: {}", common::text(&out.stderr));
    assert_eq!(iscsi_config(&w.call("save_config", None)), iscsi_config(&saved));
    drop(w);
    let t = SpdkIscsiWithConfig::start(&spdk, &dir, &again);
    let theirs = call(&t.0.sock, "iscsi_get_target_nodes", None).unwrap();
    assert_eq!(theirs, nodes, "SPDK's view of Ferrite's saved config");
}

/// SPDK's iscsi_tgt started with a config.
struct SpdkIscsiWithConfig(SpdkIscsi);

impl SpdkIscsiWithConfig {
    fn start(spdk: &Path, dir: &TempDir, config: &Path) -> SpdkIscsiWithConfig {
        let sock = dir.join("spdk-cfg.sock");
        let log = dir.join("spdk-cfg.log");
        let child = Command::new(spdk.join("build/bin/iscsi_tgt"))
            .args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .arg("--json")
            .arg(config)
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(std::fs::File::options().append(true).open(&log).unwrap()))
            .spawn()
            .expect("spawn iscsi_tgt");
        let mut t = SpdkIscsi { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(t.sock.exists() && answers(&t.sock)) {
            if let Some(st) = t.child.try_wait().unwrap() {
                panic!("iscsi_tgt exited ({st}); log:\n{}", std::fs::read_to_string(&t.log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "iscsi_tgt did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        SpdkIscsiWithConfig(t)
    }
}

fn run_with_stdin(mut cmd: Command, stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}
