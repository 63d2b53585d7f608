//! FUSE export: a bdev as a regular file, used by the host kernel (losetup, ext4) and compared
//! with what NBD serves from the same bdev. Needs root, /dev/fuse, losetup and mkfs.ext4; prints
//! SKIP with the reason otherwise.

mod common;

use common::{Daemon, TempDir};
use serde_json::json;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::process::Command;

fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_or(true, |o| !o.status.success())
        {
            return Some(format!("{tool} not installed"));
        }
    }
    None
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh runs");
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Attaches `file` to a free loop device (with extra losetup `opts`), runs `f` with the
/// device's path, then unmounts whatever `f` left mounted from it and detaches it, whatever
/// happened; returns `f`'s outcome (a panic is caught for the caller to clean up and rethrow).
fn with_loop_device(file: &std::path::Path, opts: &str, f: impl FnOnce(&str)) -> std::thread::Result<()> {
    let lo = sh(&format!("losetup -f --show {opts} {}", file.display()));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&lo)));
    let _ = Command::new("umount").arg(&lo).output();
    sh(&format!("losetup -d {lo}"));
    result
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed).collect()
}

#[test]
fn fuse_file_serves_bytes_ext4_and_matches_nbd() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIP fuse_file_serves_bytes_ext4_and_matches_nbd: {why}");
        return;
    }
    let dir = TempDir::new("fuse");
    let d = Daemon::start_with(&dir, "ferrite.sock", "0x3", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "Fuse0", "num_blocks": 32768, "block_size": 4096})));
    let img = dir.join("disk.img");
    d.call("fuse_export_add", Some(json!({"bdev_name": "Fuse0", "path": img.to_str().unwrap()})));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 128 << 20, "the file has the bdev's size");
    let exports = d.call("fuse_get_exports", None);
    assert_eq!(exports[0]["bdev_name"], "Fuse0");

    // Byte-level I/O, aligned and not (read-modify-write), read back through the file.
    {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&img).unwrap();
        let a = pattern(1, 64 << 10);
        f.write_all_at(&a, 1 << 20).unwrap();
        let b = pattern(2, 5000);
        f.write_all_at(&b, (2 << 20) + 123).unwrap();
        let mut got = vec![0u8; 64 << 10];
        f.read_exact_at(&mut got, 1 << 20).unwrap();
        assert_eq!(got, a);
        let mut got = vec![0u8; 5000];
        f.read_exact_at(&mut got, (2 << 20) + 123).unwrap();
        assert_eq!(got, b);
        // The bytes around the unaligned write are untouched zeroes.
        let mut edge = [9u8; 2];
        f.read_exact_at(&mut edge[..1], (2 << 20) + 122).unwrap();
        f.read_exact_at(&mut edge[1..], (2 << 20) + 123 + 5000).unwrap();
        assert_eq!(edge, [0, 0]);
        // Punch a hole that starts and ends inside blocks: zeroes inside, data kept outside.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: fallocate on our open descriptor with a valid range.
        let rc = unsafe {
            libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, (1 << 20) + 1000, 10_000)
        };
        assert_eq!(rc, 0, "punch hole: {}", std::io::Error::last_os_error());
        let mut got = vec![0u8; 64 << 10];
        f.read_exact_at(&mut got, 1 << 20).unwrap();
        assert_eq!(got[..1000], a[..1000]);
        assert!(got[1000..11_000].iter().all(|&x| x == 0), "hole reads zeroes");
        assert_eq!(got[11_000..], a[11_000..]);
        f.sync_all().unwrap();
    }

    // The host kernel on top: loop device, ext4, files survive a remount.
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let data = pattern(3, 8 << 20);
    let result = with_loop_device(&img, "", |lo| {
        sh(&format!("mkfs.ext4 -q -F {lo}"));
        sh(&format!("mount {lo} {}", mnt.display()));
        std::fs::write(mnt.join("file"), &data).unwrap();
        sh(&format!("umount {}", mnt.display()));
        sh("echo 3 > /proc/sys/vm/drop_caches");
        sh(&format!("mount -o ro {lo} {}", mnt.display()));
        let back = std::fs::read(mnt.join("file")).unwrap();
        sh(&format!("umount {}", mnt.display()));
        assert!(back == data, "ext4 file read back differs");
    });
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }

    // NBD serves the same bytes as the file.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    d.call("nbd_server_start", Some(json!({"address": format!("127.0.0.1:{port}")})));
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "Fuse0"})));
    let have_qemu_io = Command::new("sh").args(["-c", "command -v qemu-io"]).output().is_ok_and(|o| o.status.success());
    let mut file = std::fs::File::open(&img).unwrap();
    let mut head = vec![0u8; 4 << 20];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut head).unwrap();
    if have_qemu_io {
        let dump = dir.join("nbd-head.bin");
        std::fs::File::create(&dump).unwrap().write_all(&[]).unwrap();
        sh(&format!(
            "qemu-img convert -f raw -O raw 'json:{{\"driver\":\"raw\",\"file\":{{\"driver\":\"nbd\",\"host\":\"127.0.0.1\",\"port\":\"{port}\",\"export\":\"Fuse0\"}}}}' {}",
            dump.display()
        ));
        let via_nbd = std::fs::read(&dump).unwrap();
        assert_eq!(via_nbd.len(), 128 << 20);
        assert!(via_nbd[..4 << 20] == head[..], "NBD and FUSE disagree");
    } else {
        eprintln!("note: qemu-img not installed; NBD comparison skipped");
    }

    // Removal unmounts and removes the file Ferrite created.
    d.call("fuse_export_remove", Some(json!({"path": img.to_str().unwrap()})));
    assert!(!img.exists(), "the export's file is gone");
    assert!(!std::fs::read_to_string("/proc/mounts").unwrap().contains(img.to_str().unwrap()));
}

#[test]
fn fuse_export_errors_and_read_only() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIP fuse_export_errors_and_read_only: {why}");
        return;
    }
    let dir = TempDir::new("fuseerr");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "Ro0", "num_blocks": 256, "block_size": 512})));
    let img = dir.join("ro.img");
    let p = img.to_str().unwrap();
    assert_eq!(d.call_err("fuse_export_add", Some(json!({"bdev_name": "Nope", "path": p}))).code, -19);
    assert_eq!(d.call_err("fuse_export_add", Some(json!({"bdev_name": "Ro0", "path": "rel.img"}))).code, -22);
    d.call("fuse_export_add", Some(json!({"bdev_name": "Ro0", "path": p, "read_only": true})));
    assert_eq!(d.call_err("fuse_export_add", Some(json!({"bdev_name": "Ro0", "path": p}))).code, -17);
    let err = std::fs::OpenOptions::new().write(true).open(&img).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let mut buf = vec![1u8; 512];
    std::fs::File::open(&img).unwrap().read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a fresh malloc bdev reads zeroes");
    // Deleting the bdev under the export: reads fail cleanly, the daemon keeps serving.
    d.call("bdev_malloc_delete", Some(json!({"name": "Ro0"})));
    let err = std::fs::File::open(&img).unwrap().read_exact(&mut buf).unwrap_err();
    assert!(err.raw_os_error().is_some(), "{err}");
    assert_eq!(d.call("fuse_get_exports", None)[0]["bdev_removed"], true);
    d.call("fuse_export_remove", Some(json!({"path": p})));
    d.assert_serving();
}

#[test]
fn fuse_loop_device_survives_fio_verify_with_sub_block_writes() {
    // The host kernel's loop driver (direct I/O, so writes reach the export concurrently) under
    // fio with 512 B to 16 KiB writes at QD 16 on a 4 KiB-block bdev: most writes are read-modify-
    // writes, many of them sharing a block with another write in flight. fio then reads every
    // block back and checks its checksum.
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIP fuse_loop_device_survives_fio_verify_with_sub_block_writes: {why}");
        return;
    }
    if !Command::new("sh").args(["-c", "command -v fio"]).output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP fuse_loop_device_survives_fio_verify_with_sub_block_writes: fio not installed");
        return;
    }
    let dir = TempDir::new("fusefio");
    let d = Daemon::start_with(&dir, "ferrite.sock", "0x3", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "Fio0", "num_blocks": 16384, "block_size": 4096})));
    let img = dir.join("fio.img");
    d.call("fuse_export_add", Some(json!({"bdev_name": "Fio0", "path": img.to_str().unwrap()})));
    let result = with_loop_device(&img, "--direct-io=on --sector-size 512", |lo| {
        let out = Command::new("fio")
            .args([
                "--name=rmw",
                &format!("--filename={lo}"),
                "--direct=1",
                "--ioengine=libaio",
                "--rw=randwrite",
                "--bsrange=512-16k",
                "--iodepth=16",
                "--size=32M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--randseed=7",
                // No verify state file in the working directory (fio writes one on a failure).
                "--verify_state_save=0",
            ])
            .output()
            .expect("fio runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "fio failed:\n{text}");
        assert!(!text.contains("verify: bad"), "fio found corrupt blocks:\n{text}");
    });
    // Unmount before any failure is reported: a daemon killed with the mount up leaves it dead.
    d.call("fuse_export_remove", Some(json!({"path": img.to_str().unwrap()})));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    d.assert_serving();
}

#[test]
fn fuse_export_removed_under_a_loop_device_fails_its_io_without_hanging() {
    // The loop device keeps the exported file open while the export goes away: the unmount is
    // lazy, the loop device's I/O fails at once (nothing hangs), and the daemon serves on.
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIP fuse_export_removed_under_a_loop_device_fails_its_io_without_hanging: {why}");
        return;
    }
    let dir = TempDir::new("fusegone");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "Gone0", "num_blocks": 1024, "block_size": 4096})));
    let img = dir.join("gone.img");
    let p = img.to_str().unwrap();
    d.call("fuse_export_add", Some(json!({"bdev_name": "Gone0", "path": p})));
    let result = with_loop_device(&img, "--direct-io=on", |lo| {
        let data = pattern(9, 1 << 20);
        let mut dev = std::fs::OpenOptions::new().read(true).write(true).open(lo).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
        d.call("fuse_export_remove", Some(json!({"path": p})));
        let started = std::time::Instant::now();
        let out = Command::new("timeout")
            .args(["20", "dd", &format!("if={lo}"), "of=/dev/null", "bs=4k", "count=16", "iflag=direct"])
            .output()
            .expect("dd runs");
        assert!(!out.status.success(), "reads through the removed export must fail");
        assert_ne!(out.status.code(), Some(124), "dd hung: {}", String::from_utf8_lossy(&out.stderr));
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "the failure took {:?}", started.elapsed());
    });
    if let Err(e) = result {
        // Unmount if the failure came before the removal (a killed daemon leaves a dead mount).
        let _ = d.client().call("fuse_export_remove", Some(json!({"path": p})));
        std::panic::resume_unwind(e);
    }
    assert!(!std::fs::read_to_string("/proc/mounts").unwrap().contains(p), "no mount left behind");
    assert_eq!(d.call("fuse_get_exports", None), json!([]));
    // The bdev still holds what was written before the removal: export it again and compare.
    d.call("fuse_export_add", Some(json!({"bdev_name": "Gone0", "path": p})));
    let mut back = vec![0u8; 1 << 20];
    std::fs::File::open(&img).unwrap().read_exact(&mut back).unwrap();
    assert!(back == pattern(9, 1 << 20), "acknowledged data survives the export's removal");
    d.call("fuse_export_remove", Some(json!({"path": p})));
    d.assert_serving();
}
