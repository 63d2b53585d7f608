//! The NBD server against real clients: nbdinfo (export listing and flags), qemu-io (patterned
//! writes and reads, FUA, write-zeroes, discard, flush), nbdcopy and qemu-img (256 MiB round
//! trips), fio's nbd engine (verified random writes, multi-connection) and a uring-backed
//! export whose bytes must reach its file. Every write is read back and compared.
//!
//! Each test skips (prints `SKIP ...`) when its client is not installed.

mod common;
mod nbd_common;

use common::TempDir;
use nbd_common::{assert_files_equal, fio, have, pattern, qemu_io, run_tool, NbdDaemon};
use serde_json::Value;
use std::io::{Seek, SeekFrom, Write};
use std::time::Duration;

fn export_json<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports array: {list}"))
        .iter()
        .find(|e| e["export-name"] == name)
        .unwrap_or_else(|| panic!("export {name} not listed: {list}"))
}

#[test]
fn nbdinfo_lists_exports_with_sizes_and_flags() {
    if !have("nbdinfo_lists_exports_with_sizes_and_flags", &["nbdinfo"]) {
        return;
    }
    let dir = TempDir::new("nbdinfo");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("Rw0", 4096, 4096);
    n.malloc("Ro0", 2048, 512);
    n.export("Rw0", "disk-rw", false, "read-write malloc");
    n.export("Ro0", "disk-ro", true, "read-only malloc");

    let tcp_base = format!("nbd://{}", n.tcp);
    let out = run_tool(&dir, "nbdinfo", &["--list", "--json", &tcp_base], Duration::from_secs(20));
    out.assert_ok("nbdinfo --list --json");
    let list: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(list["protocol"], "newstyle-fixed", "{list}");
    assert_eq!(list["structured"], true, "{list}");
    assert_eq!(list["exports"].as_array().unwrap().len(), 2, "{list}");

    let rw = export_json(&list, "disk-rw");
    assert_eq!(rw["export-size"], 16 << 20, "{rw}");
    assert_eq!(rw["description"], "read-write malloc", "{rw}");
    for (k, v) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_fast_zero", true),
        ("can_multi_conn", true),
    ] {
        assert_eq!(rw[k], v, "disk-rw {k}: {rw}");
    }
    assert_eq!(rw["block_size_minimum"], 4096, "{rw}");
    assert_eq!(rw["block_size_maximum"], 33554432, "{rw}");

    let ro = export_json(&list, "disk-ro");
    assert_eq!(ro["export-size"], 1 << 20, "{ro}");
    assert_eq!(ro["description"], "read-only malloc", "{ro}");
    assert_eq!(ro["is_read_only"], true, "{ro}");
    assert_eq!(ro["can_trim"], false, "{ro}");
    assert_eq!(ro["can_zero"], false, "{ro}");
    assert_eq!(ro["can_fast_zero"], false, "{ro}");
    assert_eq!(ro["block_size_minimum"], 512, "{ro}");
    assert_eq!(ro["block_size_maximum"], 33554432, "{ro}");

    // The human-readable listing shows both exports and their descriptions.
    let out = run_tool(&dir, "nbdinfo", &["--list", &tcp_base], Duration::from_secs(20));
    out.assert_ok("nbdinfo --list");
    for s in
        ["export=\"disk-rw\"", "export=\"disk-ro\"", "description: read-write malloc", "description: read-only malloc"]
    {
        assert!(out.stdout.contains(s), "{s:?} missing from:\n{}", out.stdout);
    }

    // One export over the unix socket, and its size alone.
    let out = run_tool(&dir, "nbdinfo", &["--json", &n.unix_uri("disk-ro")], Duration::from_secs(20));
    out.assert_ok("nbdinfo --json unix");
    let one: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let ro1 = export_json(&one, "disk-ro");
    assert_eq!(ro1["is_read_only"], true, "{one}");
    assert_eq!(ro1["export-size"], 1 << 20, "{one}");
    let out = run_tool(&dir, "nbdinfo", &["--size", &n.uri("disk-rw")], Duration::from_secs(20));
    out.assert_ok("nbdinfo --size");
    assert_eq!(out.stdout.trim(), (16u64 << 20).to_string());

    // An unknown export is refused.
    let out = run_tool(&dir, "nbdinfo", &["--size", &n.uri("nosuch")], Duration::from_secs(20));
    assert!(!out.status.success(), "nbdinfo on an unknown export succeeded: {}", out.stdout);
    n.assert_serves("disk-rw");
}

/// (offset, length, pattern byte) of the writes the qemu-io test makes on a 32 MiB export.
const WRITES: [(u64, u64, u8); 8] = [
    (0, 4096, 0x11),
    (512, 1024, 0x22),  // 512-aligned, inside one 4 KiB block
    (7680, 1536, 0x33), // crosses a 4 KiB boundary
    (65536 + 512, 131072, 0x44),
    ((1 << 20) - 512, 1024, 0x55),
    (8 << 20, 4 << 20, 0x66),
    ((32 << 20) - 4096, 4096, 0x77), // the last block
    (3 << 20, 512, 0x88),
];

/// The expected contents of a `size`-byte export after WRITES (in order) as qemu-io `read -P`
/// commands, one per run of equal bytes, covering every byte.
fn expected_reads(size: u64) -> Vec<String> {
    let mut img = vec![0u8; size as usize];
    for (off, len, p) in WRITES {
        img[off as usize..(off + len) as usize].fill(p);
    }
    let mut cmds = Vec::new();
    let mut start = 0usize;
    for i in 1..=img.len() {
        if i == img.len() || img[i] != img[start] {
            cmds.push(format!("read -P {:#x} {start} {}", img[start], i - start));
            start = i;
        }
    }
    cmds
}

#[test]
fn qemu_io_patterns_fua_zeroes_discard_and_flush() {
    if !have("qemu_io_patterns_fua_zeroes_discard_and_flush", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("qemuio");
    let n = NbdDaemon::start(&dir, "0x3");
    const SIZE: u64 = 32 << 20;
    n.malloc("Q512", SIZE / 512, 512);
    n.malloc("Q4k", SIZE / 4096, 4096);
    n.export("Q512", "q512", false, "");
    n.export("Q4k", "q4k", false, "");

    // The 4 KiB export makes qemu read-modify-write the 512-byte-aligned writes.
    for (name, uri) in [("q512", n.uri("q512")), ("q4k", n.unix_uri("q4k"))] {
        // Writes, each read back in the same session right away.
        let mut cmds = Vec::new();
        for (off, len, p) in WRITES {
            cmds.push(format!("write -P {p:#x} {off} {len}"));
            cmds.push(format!("read -P {p:#x} {off} {len}"));
        }
        cmds.push("flush".into());
        qemu_io(&dir, &uri, &cmds);

        // A new connection sees every byte as expected (runs of patterns and zeroes).
        qemu_io(&dir, &uri, &expected_reads(SIZE));

        // FUA writes, write-zeroes and discard, each checked, with flushes in between.
        let cmds: Vec<String> = [
            "write -f -P 0x99 4096 8192",
            "read -P 0x99 4096 8192",
            "write -f -P 0x9a 1536 512",
            "read -P 0x11 0 512",
            "read -P 0x22 512 1024",
            "read -P 0x9a 1536 512",
            "read -P 0x11 2048 2048",
            "aio_flush",
            "write -z 65536 131072",
            "read -P 0 65536 131072",
            "read -P 0x44 196608 512",
            "write -z -f 8388608 1048576",
            "read -P 0 8388608 1048576",
            "read -P 0x66 9437184 3145728",
            "discard 10485760 1048576",
            "read -P 0 10485760 1048576",
            "read -P 0x66 11534336 1048576",
            "discard 0 4096",
            "read -P 0 0 4096",
            "read -P 0x99 4096 8192",
            "flush",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        qemu_io(&dir, &uri, &cmds);
        // And once more from a fresh connection.
        qemu_io(
            &dir,
            &uri,
            &[
                "read -P 0 0 4096".to_string(),
                "read -P 0x99 4096 8192".to_string(),
                "read -P 0 65536 131072".to_string(),
                "read -P 0 8388608 1048576".to_string(),
                "read -P 0x66 9437184 1048576".to_string(),
                "read -P 0 10485760 1048576".to_string(),
                "read -P 0x66 11534336 1048576".to_string(),
                "read -P 0x77 33550336 4096".to_string(),
            ],
        );
        eprintln!("qemu-io on {name}: ok");
    }
    n.assert_serves("q512");
}

/// Writes `len` bytes from /dev/urandom to `path`, leaving `hole` (offset, length) unwritten
/// (a sparse hole, which reads as zeroes).
fn random_file(path: &std::path::Path, len: u64, hole: Option<(u64, u64)>) {
    let mut src = std::fs::File::open("/dev/urandom").unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64);
        if let Some((h, hl)) = hole {
            if off >= h && off < h + hl {
                off += n;
                f.seek(SeekFrom::Start(off)).unwrap();
                continue;
            }
        }
        std::io::Read::read_exact(&mut src, &mut buf[..n as usize]).unwrap();
        f.write_all(&buf[..n as usize]).unwrap();
        off += n;
    }
    f.set_len(len).unwrap();
}

#[test]
fn nbdcopy_and_qemu_img_round_trip_256_mib() {
    if !have("nbdcopy_and_qemu_img_round_trip_256_mib", &["nbdcopy", "qemu-img"]) {
        return;
    }
    const SIZE: u64 = 256 << 20;
    let dir = TempDir::new("copy");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("Big", SIZE / 4096, 4096);
    n.export("Big", "big", false, "256 MiB");

    // nbdcopy: file -> export -> file over the unix socket.
    let a = dir.join("a.bin");
    random_file(&a, SIZE, None);
    let t = Duration::from_secs(60);
    run_tool(&dir, "nbdcopy", &[a.to_str().unwrap(), &n.unix_uri("big")], t).assert_ok("nbdcopy to the export");
    let a_out = dir.join("a.out");
    run_tool(&dir, "nbdcopy", &[&n.unix_uri("big"), a_out.to_str().unwrap()], t).assert_ok("nbdcopy from the export");
    assert_files_equal(&a, &a_out);
    std::fs::remove_file(&a_out).unwrap();

    // qemu-img convert over TCP, with a 16 MiB hole that must overwrite a's data with zeroes.
    let b = dir.join("b.bin");
    random_file(&b, SIZE, Some((100 << 20, 16 << 20)));
    run_tool(&dir, "qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", b.to_str().unwrap(), &n.uri("big")], t)
        .assert_ok("qemu-img convert to the export");
    let b_out = dir.join("b.out");
    run_tool(&dir, "qemu-img", &["convert", "-f", "raw", "-O", "raw", &n.uri("big"), b_out.to_str().unwrap()], t)
        .assert_ok("qemu-img convert from the export");
    assert_files_equal(&b, &b_out);
    std::fs::remove_file(&b_out).unwrap();

    // And the other way round: nbdcopy reads what qemu-img wrote.
    run_tool(&dir, "nbdcopy", &[&n.uri("big"), a_out.to_str().unwrap()], t).assert_ok("nbdcopy from the export");
    assert_files_equal(&b, &a_out);
    n.assert_serves("big");
}

fn fio_bytes(v: &Value, dir: &str) -> u64 {
    v["jobs"].as_array().unwrap().iter().map(|j| j[dir]["io_bytes"].as_u64().unwrap()).sum()
}

#[test]
fn fio_verified_random_writes_at_qd1_and_qd32() {
    if !have("fio_verified_random_writes_at_qd1_and_qd32", &["fio"]) {
        return;
    }
    let dir = TempDir::new("fio");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("F0", 16384, 4096);
    n.export("F0", "f0", false, "");
    let uri = format!("--uri={}", n.uri("f0"));
    for (tag, qd, bs) in [("qd1", "1", "--bs=4k"), ("qd32", "32", "--bsrange=4k-128k")] {
        let v = fio(
            &dir,
            tag,
            &[
                "--name=rw",
                "--ioengine=nbd",
                &uri,
                "--rw=randwrite",
                bs,
                "--size=32m",
                &format!("--iodepth={qd}"),
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
            ],
            Duration::from_secs(60),
        );
        assert_eq!(fio_bytes(&v, "write"), 32 << 20, "{tag}: {v}");
        assert_eq!(fio_bytes(&v, "read"), 32 << 20, "{tag}: every written byte verified: {v}");
    }
    n.assert_serves("f0");
}

#[test]
fn fio_two_connections_on_one_export_verify() {
    if !have("fio_two_connections_on_one_export_verify", &["fio"]) {
        return;
    }
    let dir = TempDir::new("fio2");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("F1", 16384, 4096);
    n.export("F1", "f1", false, "");
    let uri = format!("--uri={}", n.unix_uri("f1"));
    let v = fio(
        &dir,
        "multi",
        &[
            "--name=mc",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=24m",
            "--numjobs=2",
            "--offset_increment=24m",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
        Duration::from_secs(60),
    );
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{v}");
    for j in jobs {
        assert_eq!(j["write"]["io_bytes"], 24 << 20, "{j}");
        assert_eq!(j["read"]["io_bytes"], 24 << 20, "{j}");
    }
    n.wait_connections("fio's connections closed", |c| c.is_empty());
    n.assert_serves("f1");
}

#[test]
fn uring_export_writes_reach_the_file() {
    if !have("uring_export_writes_reach_the_file", &["qemu-io"]) {
        return;
    }
    const SIZE: usize = 8 << 20;
    let dir = TempDir::new("uring");
    let img = dir.file_filled("u.img", SIZE, 0);
    let n = NbdDaemon::start(&dir, "0x3");
    n.d.call(
        "bdev_uring_create",
        Some(serde_json::json!({"name": "U0", "filename": img.to_str().unwrap(), "block_size": 512})),
    );
    n.export("U0", "u0", false, "file-backed");

    // Patterned writes (one with FUA), write-zeroes over part of one, each read back.
    let writes: [(usize, usize, u8, &str); 5] = [
        (0, 4096, 0xa1, ""),
        (1024, 512, 0xa2, "-f "),
        (4096 * 3 + 512, 65536, 0xa3, ""),
        ((4 << 20) - 1536, 4096, 0xa4, "-f "),
        (SIZE - 512, 512, 0xa5, ""),
    ];
    let mut expect = vec![0u8; SIZE];
    let mut cmds = Vec::new();
    for (off, len, p, flags) in writes {
        cmds.push(format!("write {flags}-P {p:#x} {off} {len}"));
        cmds.push(format!("read -P {p:#x} {off} {len}"));
        expect[off..off + len].fill(p);
    }
    cmds.push(format!("write -z {} 8192", 4096 * 4));
    cmds.push(format!("read -P 0 {} 8192", 4096 * 4));
    expect[4096 * 4..4096 * 6].fill(0);
    cmds.push("flush".into());
    qemu_io(&dir, &n.uri("u0"), &cmds);
    n.wait_connections("qemu-io disconnected", |c| c.is_empty());

    let got = std::fs::read(&img).unwrap();
    assert_eq!(got.len(), SIZE);
    if got != expect {
        let i = got.iter().zip(&expect).position(|(a, b)| a != b).unwrap();
        panic!("{} differs from what was written at byte {i}: {:#x} != {:#x}", img.display(), got[i], expect[i]);
    }
    // The random-data path too: a raw client's write lands byte for byte.
    let data = pattern(7, 12288);
    let (mut c, _) = nbd_common::Raw::open(n.port, "u0", false);
    c.write_ok(1, 2 << 20, &data, ferrite_nbd::proto::FLAG_FUA);
    assert_eq!(c.read_ok(2, 2 << 20, data.len() as u32), data);
    c.disc();
    drop(c);
    n.wait_connections("raw client disconnected", |c| c.is_empty());
    let got = std::fs::read(&img).unwrap();
    assert_eq!(&got[2 << 20..(2 << 20) + data.len()], &data[..], "FUA write not in the file");
}

#[test]
fn fio_random_reads_at_qd2048() {
    if !have("fio_random_reads_at_qd2048", &["fio"]) {
        return;
    }
    let dir = TempDir::new("fio2048");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("F2", 8192, 4096);
    n.export("F2", "f2", false, "");
    let uri = format!("--uri={}", n.uri("f2"));
    let v = fio(
        &dir,
        "qd2048",
        &[
            "--name=deep",
            "--ioengine=nbd",
            &uri,
            "--rw=randread",
            "--bs=4k",
            "--size=32m",
            "--io_size=512m",
            "--iodepth=2048",
            "--iodepth_batch_submit=2048",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(fio_bytes(&v, "read"), 512 << 20, "{v}");
    n.assert_serves("f2");
}
