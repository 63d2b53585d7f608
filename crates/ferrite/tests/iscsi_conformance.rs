//! libiscsi's conformance suite against the iSCSI target: `iscsi-test-cu` runs family ALL (every
//! test once, about 30 s) on a malloc LUN with data-loss tests allowed and a second path for the
//! multipath suites. Every test must pass but those docs/ISCSI_CONFORMANCE.md names (with the
//! reason for each), and each of those must still fail: the list is read from the document, so
//! the document and the test cannot disagree. Prints SKIP without iscsi-test-cu (libiscsi-bin).

mod common;
mod iscsi_common;

use common::TempDir;
use iscsi_common::{run, tools, IscsiDaemon};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// The tests docs/ISCSI_CONFORMANCE.md lists as failing, as `Suite.Test`.
fn expected_failures() -> BTreeSet<String> {
    let doc = include_str!("../../../docs/ISCSI_CONFORMANCE.md");
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `ALL."))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn iscsi_test_cu_passes_all_but_the_documented_tests() {
    let Some(t) = tools("iscsi_test_cu_passes_all_but_the_documented_tests", &["iscsi-test-cu"]) else { return };
    let expected = expected_failures();
    assert!(expected.len() >= 5, "the failing tests' table was not found in the document: {expected:?}");
    let dir = TempDir::new("iscsi-cu");
    let d = IscsiDaemon::start(&dir, "0x3");
    d.malloc("Malloc0", 131072, 512);
    let iqn = d.target("disk1", "Malloc0", json!({"queue_depth": 64}));
    let url = d.url(&iqn, None);
    let out = run(&t[0], &["-d", "-n", "--test=ALL", &url, &url], &[], Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let log = dir.join("iscsi-test-cu.log");
    std::fs::write(&log, &text).unwrap();
    // "Suite iSCSIResiduals, Test Write10Residuals had failures:"
    let failed: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Suite "))
        .filter_map(|l| l.strip_suffix(" had failures:"))
        .filter_map(|l| l.split_once(", Test ").map(|(s, t)| format!("{s}.{t}")))
        .collect();
    let summary = text.lines().find(|l| l.trim_start().starts_with("tests")).unwrap_or("no summary").to_string();
    println!("iscsi-test-cu --test=ALL: {summary}");
    let unexpected: Vec<_> = failed.difference(&expected).collect();
    assert!(unexpected.is_empty(), "tests that fail and are not documented: {unexpected:?}\n{summary}\nlog: {text}");
    let fixed: Vec<_> = expected.difference(&failed).collect();
    assert!(fixed.is_empty(), "documented failures that pass now (update docs/ISCSI_CONFORMANCE.md): {fixed:?}");
    let ran: Vec<u64> = summary.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(ran.first().is_some_and(|n| *n >= 200), "iscsi-test-cu ran too few tests: {summary}");
    d.d.assert_serving();
}
