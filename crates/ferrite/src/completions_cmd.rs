//! `ferrite completions SHELL`: the shell's completion script for `ferrite`, on stdout
//! (clap_complete, from the same definition as the command line itself).

use clap_complete::Shell;

/// Options of `ferrite completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Writes the script for `a.shell` of `cmd` to stdout; returns the exit code.
pub fn run(a: CompletionsArgs, mut cmd: clap::Command) -> i32 {
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, name, &mut script);
    crate::write_stdout("completions", &script)
}
