//! `ferrite man [SUBCOMMAND]`: the man page of `ferrite` (section 1), or of one subcommand
//! (`ferrite-SUBCOMMAND`), in roff on stdout (clap_mangen, from the command line's definition):
//! `ferrite man > ferrite.1; man -l ferrite.1`.

/// Options of `ferrite man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The subcommand whose page to print (default: the page of `ferrite` itself).
    subcommand: Option<String>,
}

/// Writes the page to stdout; returns the exit code.
pub fn run(a: ManArgs, cmd: clap::Command) -> i32 {
    let page = match &a.subcommand {
        None => cmd,
        Some(name) => match cmd.find_subcommand(name) {
            Some(sub) => {
                let full = format!("{}-{}", cmd.get_name(), sub.get_name());
                let bin = format!("{} {}", cmd.get_name(), sub.get_name());
                sub.clone().display_name(full).bin_name(bin).version(env!("CARGO_PKG_VERSION"))
            }
            None => {
                let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
                eprintln!("ferrite man: no subcommand {name:?} (one of: {})", names.join(", "));
                return 2;
            }
        },
    };
    let mut out = Vec::new();
    match clap_mangen::Man::new(page).render(&mut out) {
        Ok(()) => crate::write_stdout("man", &out),
        Err(e) => {
            eprintln!("ferrite man: {e}");
            1
        }
    }
}
