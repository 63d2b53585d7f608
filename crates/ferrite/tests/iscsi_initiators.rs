//! Real initiators against the iSCSI target: libiscsi's tools (discovery with `iscsi-ls`,
//! INQUIRY with `iscsi-inq`, READ CAPACITY(16) with `iscsi-readcapacity16`), CHAP one-way and
//! mutual, and a data round trip with qemu-img's libiscsi driver (a LUN written from a file and
//! read back, with and without header digests). Each test prints SKIP and returns when its tool
//! is missing (scripts/test.sh installs libiscsi-bin and qemu-block-extra).

mod common;
mod iscsi_common;

use common::TempDir;
use iscsi_common::{pattern, run, tools, IscsiDaemon, IO_TIMEOUT};
use serde_json::json;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn discovery_inquiry_and_capacity_with_libiscsi() {
    let Some(t) =
        tools("discovery_inquiry_and_capacity_with_libiscsi", &["iscsi-ls", "iscsi-inq", "iscsi-readcapacity16"])
    else {
        return;
    };
    let dir = TempDir::new("iscsi-tools");
    let d = IscsiDaemon::start(&dir, "0x3");
    d.malloc("Malloc0", 131072, 512);
    d.malloc("Malloc1", 8192, 4096);
    let a = d.target("disk1", "Malloc0", json!({"alias_name": "Disk1"}));
    let b = d.target("disk2", "Malloc1", json!({}));
    let portal = format!("iscsi://127.0.0.1:{}", d.port);
    let out = run(&t[0], &["-s", &portal], &[], IO_TIMEOUT);
    let ls = text(&out.stdout);
    assert!(out.status.success(), "iscsi-ls: {ls}{}", text(&out.stderr));
    for (iqn, size) in [(&a, "Size:63M"), (&b, "Size:31M")] {
        assert!(ls.contains(&format!("Target:{iqn} Portal:127.0.0.1:{},1", d.port)), "{ls}");
        assert!(ls.contains(size), "{ls}");
    }
    let out = run(&t[1], &[&d.url(&a, None)], &[], IO_TIMEOUT);
    let inq = text(&out.stdout);
    assert!(out.status.success(), "iscsi-inq: {inq}{}", text(&out.stderr));
    assert!(inq.contains("Peripheral Device Type:DIRECT_ACCESS") && inq.contains("Vendor:FERRITE"), "{inq}");
    let out = run(&t[1], &["-e", "1", "-c", "128", &d.url(&a, None)], &[], IO_TIMEOUT);
    assert!(text(&out.stdout).contains("Malloc0"), "unit serial number: {}", text(&out.stdout));
    let out = run(&t[2], &[&d.url(&b, None)], &[], IO_TIMEOUT);
    let cap = text(&out.stdout);
    assert!(out.status.success(), "iscsi-readcapacity16: {cap}{}", text(&out.stderr));
    assert!(
        cap.contains("RETURNED LOGICAL BLOCK ADDRESS:8191") && cap.contains("LOGICAL BLOCK LENGTH IN BYTES:4096"),
        "{cap}"
    );
    // A name no node has.
    let out = run(&t[1], &[&d.url(&format!("{}:nothere", iscsi_common::BASE), None)], &[], IO_TIMEOUT);
    assert!(!out.status.success());
    // Every connection logged out or closed.
    d.wait_connections(0, IO_TIMEOUT);
    d.d.assert_serving();
}

#[test]
fn chap_one_way_and_mutual_with_iscsi_inq() {
    let Some(t) = tools("chap_one_way_and_mutual_with_iscsi_inq", &["iscsi-inq"]) else { return };
    let dir = TempDir::new("iscsi-chap");
    let d = IscsiDaemon::start(&dir, "0x1");
    d.malloc("Malloc0", 2048, 512);
    d.malloc("Malloc1", 2048, 512);
    d.d.call(
        "iscsi_create_auth_group",
        Some(json!({"tag": 1, "secrets": [
            {"user": "alice", "secret": "alice-secret-1"},
            {"user": "bob", "secret": "bob-secret-22", "muser": "target", "msecret": "target-secret-333"}]})),
    );
    let one = d.target("oneway", "Malloc0", json!({"require_chap": true, "chap_group": 1}));
    let mutual = d.target("mutual", "Malloc1", json!({"require_chap": true, "mutual_chap": true, "chap_group": 1}));
    let inq = |url: &str, env: &[(&str, &str)]| {
        let o = run(&t[0], &[url], env, IO_TIMEOUT);
        (o.status.success(), text(&o.stdout) + &text(&o.stderr))
    };
    let (ok, out) = inq(&d.url(&one, Some(("alice", "alice-secret-1"))), &[]);
    assert!(ok && out.contains("Vendor:FERRITE"), "one-way CHAP: {out}");
    let (ok, out) = inq(&d.url(&one, Some(("alice", "wrong-secret"))), &[]);
    assert!(!ok, "a wrong secret logs in: {out}");
    let (ok, out) = inq(&d.url(&one, None), &[]);
    assert!(!ok, "no CHAP logs in to a node that requires it: {out}");
    let target = [("LIBISCSI_CHAP_TARGET_USERNAME", "target"), ("LIBISCSI_CHAP_TARGET_PASSWORD", "target-secret-333")];
    let (ok, out) = inq(&d.url(&mutual, Some(("bob", "bob-secret-22"))), &target);
    assert!(ok && out.contains("Vendor:FERRITE"), "mutual CHAP: {out}");
    let wrong = [("LIBISCSI_CHAP_TARGET_USERNAME", "target"), ("LIBISCSI_CHAP_TARGET_PASSWORD", "not-the-target")];
    let (ok, out) = inq(&d.url(&mutual, Some(("bob", "bob-secret-22"))), &wrong);
    assert!(!ok, "the initiator accepted a target that does not know the mutual secret: {out}");
    let (ok, out) = inq(&d.url(&mutual, Some(("bob", "bob-secret-22"))), &[]);
    assert!(!ok, "mutual CHAP without the initiator asking for it logs in: {out}");
    d.d.assert_serving();
}

#[test]
fn qemu_img_writes_and_reads_back_a_lun() {
    let Some(t) = tools("qemu_img_writes_and_reads_back_a_lun", &["qemu-img"]) else { return };
    let probe = run(&t[0], &["--help"], &[], IO_TIMEOUT);
    if !text(&probe.stdout).contains(" iscsi ") {
        println!("SKIP qemu_img_writes_and_reads_back_a_lun: qemu-img has no iscsi driver");
        return;
    }
    let dir = TempDir::new("iscsi-qemu");
    let d = IscsiDaemon::start(&dir, "0x3");
    d.malloc("Malloc0", 65536, 512);
    d.malloc("Malloc1", 8192, 4096);
    let plain = d.target("plain", "Malloc0", json!({}));
    let digests = d.target("digests", "Malloc1", json!({"header_digest": true}));
    let src = dir.join("src.raw");
    let data = pattern(7, 32 << 20);
    std::fs::write(&src, &data).unwrap();
    for iqn in [&plain, &digests] {
        let url = d.url(iqn, None);
        let src_s = src.to_str().unwrap();
        let o = run(&t[0], &["convert", "-n", "-f", "raw", "-O", "raw", src_s, &url], &[], IO_TIMEOUT * 6);
        if !o.status.success() && text(&o.stderr).contains("Unknown protocol") {
            println!("SKIP qemu_img_writes_and_reads_back_a_lun: {}", text(&o.stderr));
            return;
        }
        assert!(o.status.success(), "qemu-img convert to {url}: {}", text(&o.stderr));
        let back = dir.join("back.raw");
        let _ = std::fs::remove_file(&back);
        let o = run(&t[0], &["convert", "-f", "raw", "-O", "raw", &url, back.to_str().unwrap()], &[], IO_TIMEOUT * 6);
        assert!(o.status.success(), "qemu-img convert from {url}: {}", text(&o.stderr));
        let got = std::fs::read(&back).unwrap();
        assert_eq!(got.len(), 32 << 20, "{iqn}: the LUN's size");
        assert!(got == data, "{iqn}: the bytes read back differ from those written");
    }
    d.wait_connections(0, IO_TIMEOUT);
}
