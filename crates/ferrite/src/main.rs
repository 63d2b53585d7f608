//! `ferrite`: the target daemon (`serve`), its JSON-RPC client (`rpc`), a bdevperf-style
//! benchmark (`perf`), a live view of a daemon (`top`), offline blobstore tools (`blobstore`),
//! pictures of runs (`plot`), and its own shell completions and man page.

mod blobstore_cmd;
mod completions_cmd;
mod logger;
mod man_cmd;
mod metrics;
mod perf_cmd;
mod perf_html;
mod perf_plot;
mod perf_series;
mod plot_cmd;
mod rpc_cmd;
mod serve;
mod signals;
mod top;

use clap::{CommandFactory, Parser, Subcommand};

/// Ferrite: a polled, lock-free, thread-per-core user-space storage stack.
#[derive(Parser)]
#[command(name = "ferrite", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the storage daemon: reactors, bdevs, and the JSON-RPC server.
    Serve(serve::ServeArgs),
    /// Call a JSON-RPC method of a running daemon (SPDK's method names and parameters).
    Rpc(rpc_cmd::RpcArgs),
    /// Benchmark bdevs in-process, like SPDK's bdevperf (same flags).
    Perf(perf_cmd::PerfArgs),
    /// Inspect a blobstore (lvstore) image offline: dump its metadata or check it.
    Blobstore(blobstore_cmd::BlobstoreArgs),
    /// Watch a running daemon live (SPDK's spdk_top): reactors, bdevs and targets, each second.
    Top(top::TopArgs),
    /// Draw runs' IOPS-per-second series side by side in one SVG (the bench scripts' PLOT=DIR).
    Plot(plot_cmd::PlotArgs),
    /// Print a shell completion script: `ferrite completions bash > /etc/bash_completion.d/ferrite`.
    Completions(completions_cmd::CompletionsArgs),
    /// Print the man page (roff): `ferrite man > ferrite.1`, `ferrite man perf > ferrite-perf.1`.
    Man(man_cmd::ManArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Rpc(a) => rpc_cmd::run(a),
        Cmd::Perf(a) => perf_cmd::run(a),
        Cmd::Top(a) => top::run(a),
        Cmd::Plot(a) => plot_cmd::run(a),
        Cmd::Completions(a) => completions_cmd::run(a, Cli::command()),
        Cmd::Man(a) => man_cmd::run(a, Cli::command()),
        Cmd::Blobstore(a) => {
            // A reader that goes away (`dump | head`) ends the command quietly, as with other
            // Unix tools, instead of a panic on the broken pipe.
            // SAFETY: restoring the default action of a signal before any thread starts.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            blobstore_cmd::run(a)
        }
    };
    std::process::exit(code);
}

/// Writes `bytes` to stdout for `ferrite WHAT`; returns the exit code (a reader that went away,
/// as `| head` does, is no error).
pub(crate) fn write_stdout(what: &str, bytes: &[u8]) -> i32 {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("ferrite {what}: {e}");
            1
        }
    }
}

/// Builds the method registry of everything this binary serves.
pub(crate) fn registry() -> ferrite_rpc::Registry {
    ferrite_rpc::app::registry(|reg| {
        // The built-in modules first: the bdev layer's registration adds each module's RPCs.
        ferrite_modules::register_builtin();
        ferrite_bdev::rpc::register(reg);
        ferrite_lvol::register(reg);
        ferrite_raid::register(reg);
        ferrite_nexus::register(reg);
        ferrite_nbd::rpc::register(reg);
        ferrite_vhost::rpc::register(reg);
        ferrite_nvmf::target::rpc::register(reg);
        ferrite_nvmf_host::rpc::register(reg);
        ferrite_iscsi_host::rpc::register(reg);
        ferrite_virtio_user::rpc::register(reg);
        ferrite_fuse::rpc::register(reg);
        ferrite_iscsi_target::register(reg);
        metrics::register(reg);
    })
}

#[cfg(test)]
mod tests {
    use ferrite_rpc::options::SPDK_ORDER;

    /// With every crate registered, each option method SPDK's order lists is defined once, by
    /// its owner, validly (SPDK's schema and defaults, the honoured members among them), as a
    /// method in its states, in a subsystem this binary lists.
    #[test]
    fn every_option_method_is_registered_once_with_its_schema_and_defaults() {
        let reg = super::registry();
        let methods = reg.settings().methods();
        let mut names: Vec<&str> = methods.iter().map(|m| m.spec.method).collect();
        names.sort_unstable();
        let mut spdk: Vec<&str> = SPDK_ORDER.to_vec();
        spdk.sort_unstable();
        assert_eq!(names, spdk, "registered option methods");
        for m in methods {
            let name = m.spec.method;
            m.validate().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(reg.states_of(name), Some(m.spec.states), "{name}");
            assert!(reg.subsystems().iter().any(|s| s.name == m.spec.subsystem), "{name}: no {}", m.spec.subsystem);
        }
    }
}
