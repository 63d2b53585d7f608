//! libiscsi's conformance suite against the iSCSI target: `iscsi-test-cu` runs family ALL (every
//! test once, about 30 s) with data-loss tests allowed and a second path for the multipath
//! suites, on a malloc LUN and on a uring LUN over a file, and once more with the first burst
//! of each write sent as unsolicited Data-Out. Every test must pass; the tests that
//! skip themselves are named, with the reason, in docs/ISCSI_CONFORMANCE.md. Prints SKIP without
//! iscsi-test-cu (libiscsi-bin).

mod common;
mod iscsi_common;

use common::TempDir;
use iscsi_common::{run, tools, IscsiDaemon};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// Runs family ALL against LUN 0 of target `disk1` over `bdev`, made by `make`, and asserts
/// that no test fails.
fn suite_passes(test: &str, options: Option<Value>, make: impl FnOnce(&IscsiDaemon, &TempDir) -> &'static str) {
    let Some(t) = tools(test, &["iscsi-test-cu"]) else { return };
    let dir = TempDir::new(test);
    let d = IscsiDaemon::start_with_options(&dir, "0x3", options);
    let bdev = make(&d, &dir);
    let iqn = d.target("disk1", bdev, json!({"queue_depth": 64}));
    let url = d.url(&iqn, None);
    let out = run(&t[0], &["-d", "-n", "--test=ALL", &url, &url], &[], Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    std::fs::write(dir.join("iscsi-test-cu.log"), &text).unwrap();
    // "Suite iSCSIResiduals, Test Write10Residuals had failures:"
    let failed: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Suite "))
        .filter_map(|l| l.strip_suffix(" had failures:"))
        .filter_map(|l| l.split_once(", Test ").map(|(s, t)| format!("{s}.{t}")))
        .collect();
    // "tests    230    230    230      0        0": total, ran, passed, failed, inactive.
    let summary = text.lines().find(|l| l.trim_start().starts_with("tests")).unwrap_or("no summary").to_string();
    println!("{test}: iscsi-test-cu --test=ALL: {summary}");
    assert!(failed.is_empty(), "{test}: tests that fail: {failed:?}\n{summary}\nlog: {text}");
    let n: Vec<u64> = summary.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(n.len() == 5 && n[1] >= 230 && n[2] == n[1] && n[3] == 0, "{test}: {summary}\nlog: {text}");
    d.d.assert_serving();
}

#[test]
fn iscsi_test_cu_passes_on_a_malloc_lun() {
    suite_passes("iscsi_cu_malloc", None, |d, _| {
        d.malloc("Malloc0", 131072, 512);
        "Malloc0"
    });
}

#[test]
fn iscsi_test_cu_passes_on_a_uring_lun() {
    suite_passes("iscsi_cu_uring", None, |d, dir| {
        let file = dir.file_filled("lun.img", 64 << 20, 0);
        d.d.call(
            "bdev_uring_create",
            Some(json!({"name": "Uring0", "filename": file.to_str().unwrap(), "block_size": 512})),
        );
        "Uring0"
    });
}

/// With a FirstBurstLength (64 KiB) above the target's MaxRecvDataSegmentLength (8 KiB),
/// libiscsi (which asks for InitialR2T=No) sends 8 KiB of a write as immediate data, the rest
/// of its first burst as unsolicited Data-Out, and R2Ts fetch what is left. (Without immediate
/// data, AbortTaskSimpleAsync fails in the client: it counts one PDU queued per write.)
#[test]
fn iscsi_test_cu_passes_with_unsolicited_data_out() {
    suite_passes("iscsi_cu_unsolicited", Some(json!({"first_burst_length": 65536})), |d, _| {
        d.malloc("Malloc0", 131072, 512);
        "Malloc0"
    });
}
