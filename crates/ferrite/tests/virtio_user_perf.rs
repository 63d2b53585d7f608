//! `ferrite perf` over a virtio-user bdev: a config that attaches qemu-storage-daemon's
//! vhost-user-blk export, a verify run that must find every block it wrote.

mod common;

use common::{Proc, TempDir};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const QSD: &str = "/usr/bin/qemu-storage-daemon";

/// qemu-storage-daemon exporting `image` as a vhost-user-blk socket; killed when dropped.
struct Qsd(Child);

impl Qsd {
    fn start(image: &std::path::Path, socket: &std::path::Path) -> Qsd {
        let mut cmd = Command::new(QSD);
        cmd.arg("--blockdev")
            .arg(format!("driver=file,node-name=file0,filename={}", image.display()))
            .arg("--blockdev")
            .arg("driver=raw,node-name=disk0,file=file0")
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path={},node-name=disk0,writable=on,num-queues=2",
                socket.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl in the child before exec: the daemon dies with the test.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let child = cmd.spawn().expect("qemu-storage-daemon starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "qemu-storage-daemon made no socket within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Qsd(child)
    }
}

impl Drop for Qsd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn perf_verify_over_qemu_storage_daemon() {
    if !std::path::Path::new(QSD).exists() {
        eprintln!("SKIPPED: {QSD} is not installed");
        return;
    }
    let dir = TempDir::new("perfvu");
    let image = dir.file_filled("disk.raw", 64 << 20, 0);
    let socket = dir.join("vhost.sock");
    let _qsd = Qsd::start(&image, &socket);
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_virtio_attach_controller", "params": {"name": "VirtioBlk0", "trtype": "user",
            "traddr": socket.to_str().unwrap(), "dev_type": "blk"}},
        {"method": "bdev_wait_for_examine"}]}]});
    let cfg = dir.write_json("virtio.json", &doc);
    let results = dir.join("results.json");
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-T",
        "VirtioBlk0",
        "-w",
        "verify",
        "-q",
        "32",
        "-o",
        "4096",
        "-t",
        "3",
        "--results-json",
        results.to_str().unwrap(),
    ];
    let mut p = Proc::spawn(&dir, "perfvu", &args);
    let st = p.expect_exit(Duration::from_secs(30), "ferrite perf over virtio-user");
    let (stdout, stderr) = (p.stdout(), p.stderr());
    assert_eq!(st.code(), Some(0), "perf failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stdout.contains("Verify errors"), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let r = &doc["results"][0];
    assert_eq!(r["job"], "VirtioBlk0", "{doc}");
    assert_eq!(r["workload"], "verify", "{doc}");
    assert_eq!(r["queue_depth"], 32, "{doc}");
    assert_eq!(r["verify_errors"], 0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}");
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    // The verify pass wrote patterns into the file through the daemon: some blocks are no
    // longer zero.
    let written = std::fs::read(&image).unwrap().chunks(4096).filter(|c| c.iter().any(|&b| b != 0)).count();
    assert!(written > 0, "no write reached the file");
}
