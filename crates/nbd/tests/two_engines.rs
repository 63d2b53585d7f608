//! Two engines in one process share no bdevs and no exports: each has its own bdev named `M0`,
//! exported as `m0` by its own NBD server, and a real client (qemu-io) reads from each what was
//! written through that one.

use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_nbd::export::{self, Export};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use std::path::Path;
use std::process::Command;

fn start() -> Engine {
    Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Adaptive, pin: false, ..Default::default() })
        .expect("engine starts")
}

/// Makes bdev M0 on `e`, exported as m0 on a unix socket at `sock`.
fn serve(e: &Engine, sock: &Path) {
    let addr = sock.to_str().unwrap().to_string();
    e.run_async(0, move || async move {
        let b = malloc::create(MallocOpts {
            name: Some("M0".into()),
            num_blocks: 256,
            block_size: 4096,
            ..Default::default()
        })
        .expect("each engine can have its own M0");
        export::add(Export {
            name: "m0".into(),
            bdev: "M0".into(),
            bdev_id: b.id(),
            read_only: false,
            description: String::new(),
        })
        .expect("each engine can have its own m0 export");
        ferrite_nbd::server::start(&addr, Default::default()).expect("server starts");
    })
    .wait()
    .expect("setup ran");
}

fn qemu_io(sock: &Path, cmd: &str) -> (bool, String) {
    let url = format!("nbd+unix:///m0?socket={}", sock.display());
    let out = Command::new("qemu-io").args(["-f", "raw", "-c", cmd, &url]).output().expect("qemu-io runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("Pattern verification failed"), text)
}

#[test]
fn two_engines_in_one_process_share_no_bdevs_or_exports() {
    if Command::new("qemu-io").arg("--version").output().is_err() {
        eprintln!("SKIPPED: qemu-io is not installed (scripts/test.sh installs qemu-utils)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferrite-two-engines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sa, sb) = (dir.join("a.sock"), dir.join("b.sock"));
    let a = start();
    let b = start();
    serve(&a, &sa);
    serve(&b, &sb);
    for (e, n) in [(&a, 1), (&b, 1)] {
        let names =
            e.run_async(0, || async { ferrite_bdev::list().iter().map(|b| b.name().to_string()).collect::<Vec<_>>() });
        assert_eq!(names.wait().unwrap(), vec!["M0".to_string()], "each engine lists only its bdev ({n})");
    }
    let (ok, out) = qemu_io(&sa, "write -P 0xaa 0 64k");
    assert!(ok, "write through engine A: {out}");
    let (ok, out) = qemu_io(&sb, "write -P 0x55 0 64k");
    assert!(ok, "write through engine B: {out}");
    let (ok, out) = qemu_io(&sa, "read -P 0xaa 0 64k");
    assert!(ok, "engine A's M0 kept its own data: {out}");
    let (ok, out) = qemu_io(&sb, "read -P 0x55 0 64k");
    assert!(ok, "engine B's M0 kept its own data: {out}");
    // Removing A's export leaves B's.
    a.run_async(0, || async { ferrite_nbd::export::remove("m0") }).wait().unwrap().expect("A's export goes");
    let (ok, _) = qemu_io(&sa, "read 0 4k");
    assert!(!ok, "A no longer serves m0");
    let (ok, out) = qemu_io(&sb, "read -P 0x55 0 4k");
    assert!(ok, "B still serves m0: {out}");
    for e in [a, b] {
        e.stop();
        e.join();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
