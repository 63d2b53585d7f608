//! `ferrite rpc`: call one JSON-RPC method and print its result.

use ferrite_rpc::client::{CallError, RpcClient};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `ferrite rpc`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Parameters: a JSON object (ferrite rpc bdev_malloc_create '{\"num_blocks\":256,\"block_size\":512}'),\n\
or flags (ferrite rpc bdev_malloc_create --num-blocks 256 --block-size 512 --name M0), where dashes\n\
in names become underscores and values that parse as JSON (numbers, true, false, objects) are sent\n\
as such; others are strings."
)]
pub struct RpcArgs {
    /// Socket of the daemon.
    #[arg(short = 's', long = "server", default_value = ferrite_rpc::server::DEFAULT_SOCKET)]
    server: PathBuf,
    /// Seconds to wait for the answer.
    #[arg(short = 't', long = "timeout", default_value_t = 60.0)]
    timeout: f64,
    /// Method name, e.g. bdev_get_bdevs.
    method: String,
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

/// Calls the method; prints the result (strings bare, the rest as indented JSON).
pub fn run(a: RpcArgs) -> i32 {
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
    match client.call(&a.method, params) {
        Ok(Value::String(s)) => print_out(&s),
        Ok(v) => print_out(&serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(CallError::Rpc(e)) => {
            eprintln!("ferrite rpc: {} failed: {} (code {})", a.method, e.message, e.code);
            1
        }
        Err(e) => {
            eprintln!("ferrite rpc: {}: {e}", a.method);
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
