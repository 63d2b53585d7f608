//! A small client of etcd's v3 HTTP/JSON gateway (`POST /v3/kv/put`, `POST /v3/kv/range`,
//! keys and values in base64), over a plain `TcpStream` with timeouts. It blocks: call it off
//! the reactors (the store runs it on `spawn_blocking`'s threads).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long connecting, sending and reading may each take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// An etcd endpoint (`host:port`).
#[derive(Debug, Clone)]
pub struct Etcd {
    /// `host:port` of the client URL.
    pub endpoint: String,
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional).
pub fn b64_decode(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for ch in s.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&x| x == ch).ok_or_else(|| format!("bad base64 byte {ch:#x}"))? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

impl Etcd {
    /// Posts `body` to `path` and returns the JSON answer.
    fn post(&self, path: &str, body: &serde_json::Value) -> Result<serde_json::Value, String> {
        let addr = self
            .endpoint
            .to_socket_addrs()
            .map_err(|e| format!("etcd {}: {e}", self.endpoint))?
            .next()
            .ok_or_else(|| format!("etcd {}: no address", self.endpoint))?;
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("etcd {}: {e}", self.endpoint))?;
        s.set_read_timeout(Some(TIMEOUT))
            .and_then(|_| s.set_write_timeout(Some(TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.endpoint,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| format!("etcd {}: {e}", self.endpoint))?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(|e| format!("etcd {}: {e}", self.endpoint))?;
        let text = String::from_utf8_lossy(&resp);
        let (head, body) = text.split_once("\r\n\r\n").ok_or("etcd: no HTTP header end")?;
        let status = head.split_whitespace().nth(1).unwrap_or("");
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)?
        } else {
            body.to_string()
        };
        if status != "200" {
            return Err(format!("etcd {path}: HTTP {status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("etcd {path}: {e}"))
    }

    /// Puts `value` at `key`.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let body = serde_json::json!({"key": b64_encode(key.as_bytes()), "value": b64_encode(value)});
        self.post("/v3/kv/put", &body).map(|_| ())
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let body = serde_json::json!({"key": b64_encode(key.as_bytes())});
        let v = self.post("/v3/kv/range", &body)?;
        match v["kvs"].as_array().and_then(|a| a.first()) {
            None => Ok(None),
            Some(kv) => b64_decode(kv["value"].as_str().unwrap_or("")).map(Some),
        }
    }
}

/// Joins an HTTP/1.1 chunked body.
fn dechunk(mut s: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (len, rest) = s.split_once("\r\n").ok_or("etcd: bad chunk")?;
        let n = usize::from_str_radix(len.trim(), 16).map_err(|_| "etcd: bad chunk length")?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).ok_or("etcd: short chunk")?);
        s = rest.get(n + 2..).ok_or("etcd: short chunk")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for (raw, enc) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg==")] {
            assert_eq!(b64_encode(raw.as_bytes()), enc);
            assert_eq!(b64_decode(enc).unwrap(), raw.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(b64_decode(&b64_encode(&all)).unwrap(), all);
        assert!(b64_decode("a*b").is_err());
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(), "abcde");
    }
}
