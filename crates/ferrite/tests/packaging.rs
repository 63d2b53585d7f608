//! What a distribution package ships besides the binary: `ferrite completions` (bash accepts
//! the script and completes subcommands and options with it; zsh and fish get theirs), `ferrite
//! man` (groff renders the pages without warnings), and contrib/systemd/ferrite.service
//! (`systemd-analyze verify` accepts it; its offline security analysis rates it well).

mod common;

use common::{run_ferrite, TempDir, FERRITE};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// True if `bin` runs; otherwise prints why `test` is skipped.
fn have(test: &str, bin: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        println!("SKIP {test}: {bin} not installed (package {package})");
    }
    found
}

/// `ferrite args...`, which must succeed; its stdout.
fn ferrite_ok(args: &[&str]) -> String {
    let out = run_ferrite(args);
    assert!(out.status.success(), "ferrite {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn bash_completion_script_parses_and_completes_subcommands_and_options() {
    if !have("bash_completion", "bash", "bash") {
        return;
    }
    let dir = TempDir::new("compl");
    let script = ferrite_ok(&["completions", "bash"]);
    let path = dir.join("ferrite.bash");
    std::fs::write(&path, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(check.status.success() && check.stderr.is_empty(), "bash -n: {}", text(&check));
    for sub in ["serve", "rpc", "perf", "top", "plot", "completions", "man"] {
        assert!(script.contains(sub), "no {sub} in the script");
    }
    // Completion itself: `ferrite pe<TAB>` and `ferrite perf --res<TAB>`.
    let probe = r#"source "$1"
        COMP_WORDS=(ferrite pe); COMP_CWORD=1; COMP_LINE="ferrite pe"; COMP_POINT=${#COMP_LINE}
        _ferrite ferrite pe ferrite; echo "sub: ${COMPREPLY[*]}"
        COMP_WORDS=(ferrite perf --res); COMP_CWORD=2; COMP_LINE="ferrite perf --res"; COMP_POINT=${#COMP_LINE}
        _ferrite ferrite --res perf; echo "opt: ${COMPREPLY[*]}""#;
    let out = Command::new("bash").args(["-c", probe, "probe"]).arg(&path).output().unwrap();
    let said = text(&out);
    assert!(said.contains("sub: perf\n") && said.contains("opt: --results-json\n"), "{said}");
}

#[test]
fn zsh_and_fish_scripts_are_produced_and_parse_where_the_shell_exists() {
    let zsh = ferrite_ok(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef ferrite") && zsh.contains("perf"), "{zsh}");
    let fish = ferrite_ok(&["completions", "fish"]);
    assert!(fish.contains("complete -c ferrite") && fish.contains("results-json"), "{fish}");
    let dir = TempDir::new("complzf");
    for (shell, script) in [("zsh", zsh), ("fish", fish)] {
        if !have("zsh_and_fish_scripts (syntax check)", shell, shell) {
            continue;
        }
        let path = dir.join(&format!("ferrite.{shell}"));
        std::fs::write(&path, script).unwrap();
        let check = Command::new(shell).arg("-n").arg(&path).output().unwrap();
        assert!(check.status.success(), "{shell} -n: {}", text(&check));
    }
    let bad = run_ferrite(&["completions", "tcsh"]);
    assert!(!bad.status.success(), "an unknown shell is an error");
}

/// Renders the roff `page` with groff's man macros; asserts no warning; returns the text.
fn groff(page: &str, dir: &TempDir, name: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, page).unwrap();
    // -ww: every warning (to stderr); -P-cbou: plain text, no bold or underlining.
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
        .arg(&path)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "groff {name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn man_pages_render_without_warnings() {
    if !have("man_pages", "groff", "groff-base") {
        return;
    }
    let dir = TempDir::new("man");
    let main = groff(&ferrite_run_stdout(&["man"]), &dir, "ferrite.1");
    for want in ["NAME", "SYNOPSIS", "SUBCOMMANDS", "ferrite-perf(1)", "ferrite-serve(1)"] {
        assert!(main.contains(want), "no {want} in\n{main}");
    }
    let perf = groff(&ferrite_run_stdout(&["man", "perf"]), &dir, "ferrite-perf.1");
    assert!(perf.contains("ferrite perf") && perf.contains("--results-json"), "{perf}");
    let bad = run_ferrite(&["man", "nonesuch"]);
    assert!(!bad.status.success() && text(&bad).contains("serve"), "{}", text(&bad));
}

fn ferrite_run_stdout(args: &[&str]) -> String {
    let page = ferrite_ok(args);
    assert!(page.starts_with(".ie") || page.starts_with(".TH") || page.contains("\n.TH "), "not roff: {page}");
    page
}

#[test]
fn systemd_unit_verifies_and_asks_for_no_privileges() {
    if !have("systemd_unit", "systemd-analyze", "systemd") {
        return;
    }
    let unit =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/ferrite.service"))
            .expect("contrib/systemd/ferrite.service");
    // No root, no capabilities.
    for line in ["DynamicUser=yes", "CapabilityBoundingSet=\n", "AmbientCapabilities=\n", "NoNewPrivileges=yes"] {
        assert!(unit.contains(line), "no {line:?} in the unit");
    }
    let settings: Vec<&str> = unit.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        !settings.iter().any(|l| l.starts_with("User=root") || l.contains("CAP_")),
        "the unit asks for privileges: {settings:?}"
    );
    // verify checks that ExecStart's program exists: point it at the binary under test.
    assert!(unit.contains("ExecStart=/usr/local/bin/ferrite serve"), "{unit}");
    let dir = TempDir::new("unit");
    let path = dir.join("ferrite.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/ferrite", FERRITE)).unwrap();
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "systemd-analyze verify: {}", text(&out));
    // The offline security analysis: systemd rates 0 (locked down) to 10 (exposed).
    let out =
        Command::new("systemd-analyze").args(["security", "--offline=yes", "--no-pager"]).arg(&path).output().unwrap();
    let said = text(&out);
    let Some(level) = said.lines().find_map(|l| l.split("Overall exposure level for ferrite.service:").nth(1)) else {
        println!("SKIP systemd_unit (security score): this systemd-analyze has no offline security analysis: {said}");
        return;
    };
    let score: f64 = level.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    assert!(score < 3.0, "exposure {score}: {said}");
}
