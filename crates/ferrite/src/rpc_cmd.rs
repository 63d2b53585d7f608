//! `ferrite rpc`: call one JSON-RPC method and print its result; `--help METHOD` prints the
//! method's reference (docs/RPC.md's section) without a daemon.

use ferrite_rpc::client::{CallError, RpcClient};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `ferrite rpc`.
#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Parameters: a JSON object (ferrite rpc bdev_malloc_create '{\"num_blocks\":256,\"block_size\":512}'),\n\
or flags (ferrite rpc bdev_malloc_create --num-blocks 256 --block-size 512 --name M0), where dashes\n\
in names become underscores and values that parse as JSON (numbers, true, false, objects) are sent\n\
as such; others are strings.\n\n\
`ferrite rpc --help METHOD` (or `ferrite rpc METHOD --help`) prints what METHOD takes, with an example;\n\
docs/RPC.md lists every method."
)]
pub struct RpcArgs {
    /// Socket of the daemon.
    #[arg(short = 's', long = "server", default_value = ferrite_rpc::server::DEFAULT_SOCKET)]
    server: PathBuf,
    /// Seconds to wait for the answer.
    #[arg(short = 't', long = "timeout", default_value_t = 60.0)]
    timeout: f64,
    /// Print this help, or with METHOD the method's parameters and an example (no daemon needed).
    #[arg(short = 'h', long = "help", value_name = "METHOD", num_args = 0..=1)]
    help: Option<Option<String>>,
    /// Print the reference of every method as Markdown (docs/RPC.md).
    #[arg(long = "doc-markdown", hide = true, conflicts_with_all = ["help", "method"])]
    doc_markdown: bool,
    /// Method name, e.g. bdev_get_bdevs.
    #[arg(required_unless_present_any = ["help", "doc_markdown"])]
    method: Option<String>,
    /// Parameters: one JSON object, or --name value pairs.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    params: Vec<String>,
}

/// Turns the trailing arguments into a params object (None when there are none).
pub fn parse_params(args: &[String]) -> Result<Option<Value>, String> {
    if args.is_empty() {
        return Ok(None);
    }
    if args.len() == 1 && args[0].trim_start().starts_with(['{', '[']) {
        return serde_json::from_str(&args[0]).map(Some).map_err(|e| format!("parameters are not valid JSON: {e}"));
    }
    let mut map = Map::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (key, value) = if let Some((k, v)) = flag.trim_start_matches('-').split_once('=') {
            (k.to_string(), v.to_string())
        } else if flag.starts_with("--") {
            let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            (flag.trim_start_matches('-').to_string(), v.clone())
        } else {
            return Err(format!("unexpected argument {flag:?} (use --name value or one JSON object)"));
        };
        let value = serde_json::from_str(&value).unwrap_or(Value::String(value));
        map.insert(key.replace('-', "_"), value);
    }
    Ok(Some(Value::Object(map)))
}

/// What `ferrite rpc` was asked to print instead of calling a method, if anything.
enum Offline {
    /// The command's own help.
    Usage,
    /// One method's reference.
    Method(String),
    /// The whole reference as Markdown.
    Markdown,
}

/// What `a` asks to print without a daemon: `--doc-markdown`, `--help [METHOD]`, or
/// `METHOD --help`.
fn offline(a: &RpcArgs) -> Option<Offline> {
    if a.doc_markdown {
        return Some(Offline::Markdown);
    }
    match (&a.help, &a.method) {
        (Some(Some(m)), _) | (Some(None), Some(m)) => return Some(Offline::Method(m.clone())),
        (Some(None), None) => return Some(Offline::Usage),
        (None, _) => {}
    }
    match (a.method.as_ref(), a.params.as_slice()) {
        (Some(m), [h]) if h == "--help" || h == "-h" => Some(Offline::Method(m.clone())),
        _ => None,
    }
}

/// The reference section of `method` as `ferrite rpc --help METHOD` prints it, or an error that
/// names the methods with close names.
pub fn method_help(reg: &ferrite_rpc::Registry, method: &str) -> Result<String, String> {
    match ferrite_rpc::reference::section(reg, method) {
        Some(s) => Ok(s.trim_end().to_string()),
        None => {
            let close = ferrite_rpc::reference::close_names(reg, method);
            let hint = if close.is_empty() {
                "docs/RPC.md lists every method".to_string()
            } else {
                format!("close names: {}", close.join(", "))
            };
            let shown: String = method.chars().take(64).collect();
            let more = if shown.len() < method.len() { "..." } else { "" };
            Err(format!("no method named {shown:?}{more} ({hint})"))
        }
    }
}

/// Prints what `what` asks for; the exit code.
fn print_offline(what: Offline) -> i32 {
    match what {
        Offline::Usage => {
            let mut cmd = <RpcArgs as clap::Args>::augment_args(clap::Command::new("ferrite rpc"));
            print_out(&cmd.render_long_help().to_string())
        }
        Offline::Markdown => print_out(&ferrite_rpc::reference::markdown(&crate::registry())),
        Offline::Method(m) => match method_help(&crate::registry(), &m) {
            Ok(s) => print_out(&s),
            Err(e) => {
                eprintln!("ferrite rpc: {e}");
                2
            }
        },
    }
}

/// Calls the method; prints the result (strings bare, the rest as indented JSON).
pub fn run(a: RpcArgs) -> i32 {
    if let Some(what) = offline(&a) {
        return print_offline(what);
    }
    let Some(method) = a.method.clone() else {
        return print_offline(Offline::Usage);
    };
    let params = match parse_params(&a.params) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ferrite rpc: {e}");
            return 2;
        }
    };
    let mut client = match RpcClient::connect(&a.server, Duration::from_secs_f64(a.timeout.max(0.001))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrite rpc: {e}");
            return 1;
        }
    };
    match client.call(&method, params) {
        Ok(Value::String(s)) => print_out(&s),
        Ok(v) => print_out(&serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(CallError::Rpc(e)) => {
            eprintln!("ferrite rpc: {} failed: {} (code {})", method, e.message, e.code);
            1
        }
        Err(e) => {
            eprintln!("ferrite rpc: {}: {e}", method);
            1
        }
    }
}

/// Prints `text` and a newline; a reader that went away (`| head`) ends the command quietly.
fn print_out(text: &str) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|_| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("ferrite rpc: cannot write the result: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_become_params() {
        let p = parse_params(&s(&["--num-blocks", "256", "--name", "M0", "--flag", "true", "x=1"])).unwrap();
        assert_eq!(p, Some(json!({"num_blocks": 256, "name": "M0", "flag": true, "x": 1})));
        assert_eq!(parse_params(&s(&["{\"a\": [1]}"])).unwrap(), Some(json!({"a": [1]})));
        assert_eq!(parse_params(&[]).unwrap(), None);
        assert!(parse_params(&s(&["--name"])).is_err());
        assert!(parse_params(&s(&["bare"])).is_err());
        assert!(parse_params(&s(&["{bad"])).is_err());
    }
}
