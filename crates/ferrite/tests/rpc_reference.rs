//! The RPC reference: docs/RPC.md is what the registry generates now, it documents every method
//! a daemon serves, and `ferrite rpc --help METHOD` prints a method's section without a daemon.

mod common;

use common::{run_ferrite, text, Daemon, TempDir};
use std::path::PathBuf;

const REGENERATE: &str = "cargo run -p ferrite -- rpc --doc-markdown > docs/RPC.md";

fn rpc_md_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/RPC.md")
}

fn generated() -> String {
    let out = run_ferrite(&["rpc", "--doc-markdown"]);
    assert!(out.status.success(), "ferrite rpc --doc-markdown failed: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn docs_rpc_md_is_current() {
    let now = generated();
    let path = rpc_md_path();
    let file = std::fs::read_to_string(&path).unwrap_or_default();
    if file != now {
        let line = file
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(file.lines().count().min(now.lines().count()));
        panic!(
            "docs/RPC.md is not what the registry generates (first difference at line {}); regenerate it: {REGENERATE}",
            line + 1
        );
    }
}

/// Each method's section in `md`: name → section text.
fn sections(md: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for part in md.split("\n### ").skip(1) {
        let (name, body) = part.split_once('\n').unwrap_or((part, ""));
        let body = body.split("\n## ").next().unwrap_or("");
        out.push((name.trim().to_string(), body.to_string()));
    }
    out
}

#[test]
fn every_method_a_daemon_serves_is_documented_with_its_params() {
    let md = generated();
    let secs = sections(&md);
    let dir = TempDir::new("rpcref");
    let d = Daemon::start(&dir, &[]);
    let served = d.call("rpc_get_methods", None);
    let served: Vec<&str> = served.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(served.len() > 150, "{} methods", served.len());
    for m in &served {
        let (_, body) = secs.iter().find(|(n, _)| n == m).unwrap_or_else(|| panic!("{m} is not in the reference"));
        let summary = body.trim_start().lines().next().unwrap_or("");
        assert!(!summary.is_empty() && !summary.starts_with("States:"), "{m} has no summary:\n{body}");
        assert!(body.contains("States: "), "{m}:\n{body}");
        assert!(
            body.contains("| parameter | type | required | default | description |")
                || body.contains("Parameters: none"),
            "{m} documents no parameters:\n{body}"
        );
        assert!(body.contains(&format!("ferrite rpc {m}")), "{m} has no example:\n{body}");
        // Each parameter says what it is (a doc comment on its field, or the option method's policy).
        for row in body.lines().filter(|l| l.starts_with("| `")) {
            assert!(!row.ends_with("|  |"), "{m}: a parameter without a description (add a doc comment): {row}");
        }
    }
    assert_eq!(secs.len(), served.len(), "the reference lists methods the daemon does not serve");
}

#[test]
fn rpc_help_prints_a_methods_parameters_without_a_daemon() {
    for args in [&["rpc", "--help", "bdev_malloc_create"][..], &["rpc", "bdev_malloc_create", "--help"][..]] {
        let out = run_ferrite(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(s.starts_with("### bdev_malloc_create\n"), "{s}");
        assert!(s.contains("| `num_blocks` | uint64 | yes |"), "{s}");
        assert!(s.contains("| `block_size` | uint32 | yes |"), "{s}");
        assert!(s.contains("| `name` | string | no |"), "{s}");
        assert!(s.contains("ferrite rpc bdev_malloc_create '{"), "{s}");
        // The same section as docs/RPC.md's.
        assert!(generated().contains(s.trim_end()), "{s}");
    }
    let out = run_ferrite(&["rpc", "--help", "bdev_malloc_crate"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("no method named \"bdev_malloc_crate\"") && err.contains("bdev_malloc_create"), "{err}");
}
