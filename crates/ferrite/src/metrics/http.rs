//! The HTTP endpoint: plain threads (never a reactor): one accepts, and each client is served
//! on a thread of its own, at most [`MAX_CLIENTS`] at once (more are closed at once), so that
//! idle or slow clients cannot keep Prometheus out. `GET /metrics` answers a fresh
//! [`super::gather`] snapshot; HTTP/1.1 with `Connection: close`; anything else is 404 or 405.
//! Every client has a deadline for its whole request head and one for the whole answer, so a
//! client that sends or reads a byte at a time is dropped within seconds, and stopping the
//! endpoint waits for no client longer than that.

use super::expo::CONTENT_TYPE;
use ferrite_rpc::Ctx;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a client may take to send its whole request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client may take to read the whole answer.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// Clients served at once; more are closed as they come.
pub const MAX_CLIENTS: usize = 32;
/// How long a scrape waits for reactor 0.
const GATHER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the accept loop looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Largest request head read.
const MAX_HEAD: usize = 8192;

/// A running endpoint; [`Server::stop`] ends it.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    clients: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

/// One client counted while it is served.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    /// Binds `addr` and starts serving.
    pub fn start(addr: &str, ctx: Ctx) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let clients = Arc::new(AtomicUsize::new(0));
        let (s, c) = (stop.clone(), clients.clone());
        let thread =
            std::thread::Builder::new().name("metrics".into()).spawn(move || accept_loop(listener, ctx, s, c))?;
        log::info!("metrics: serving Prometheus metrics on http://{addr}/metrics");
        Ok(Server { addr, stop, clients, thread: Some(thread) })
    }

    /// The bound address (the port chosen when ADDR had port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops: the listener closes, and the clients being served end (each within its
    /// deadlines); waits for both, at most a few seconds.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let t0 = Instant::now();
        while self.clients.load(Ordering::SeqCst) > 0 && t0.elapsed() < HEAD_DEADLINE + WRITE_DEADLINE {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Keeps the calling thread off the reactors' cores where other cores are allowed: a scrape's
/// rendering then never takes time from a polling reactor.
fn avoid_reactor_cores(engine: &ferrite_reactor::Engine) {
    // SAFETY: cpu_set_t is plain data; the CPU_* macros stay within it; the affinity calls
    // read and write one set of the given size for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        for id in 0..engine.count() {
            libc::CPU_CLR(engine.core_of(id), &mut set);
        }
        if libc::CPU_COUNT(&set) > 0 {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

fn accept_loop(listener: TcpListener, ctx: Ctx, stop: Arc<AtomicBool>, clients: Arc<AtomicUsize>) {
    avoid_reactor_cores(&ctx.engine);
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, peer)) => {
                if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::SeqCst);
                    log::debug!("metrics: {peer}: {MAX_CLIENTS} clients served already; closed");
                    continue;
                }
                let counted = Counted(clients.clone());
                let (ctx, stop) = (ctx.clone(), stop.clone());
                let spawned = std::thread::Builder::new().name("metrics-client".into()).spawn(move || {
                    let _counted = counted;
                    if let Err(e) = serve(conn, &ctx, &stop) {
                        log::debug!("metrics: client {peer}: {e}");
                    }
                });
                if let Err(e) = spawned {
                    log::warn!("metrics: no thread for a client: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut pfd =
                    libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&listener), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut pfd, 1, STOP_POLL.as_millis() as i32) };
            }
            Err(e) => {
                log::warn!("metrics: accept: {e}");
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

/// The time left before `deadline`, or a timeout error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client too slow"));
    }
    Ok(d)
}

/// What a client asked for.
enum Head {
    /// The request line's method and path (origin form: an absolute-form target's scheme and
    /// authority are dropped, as RFC 9112 3.2.2 has a server accept them).
    Request(String, String),
    /// A head longer than [`MAX_HEAD`]: answered 431.
    TooLarge,
}

/// The request line, once the head has arrived (all of it within [`HEAD_DEADLINE`]).
fn read_head(conn: &mut TcpStream) -> std::io::Result<Head> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        conn.set_read_timeout(Some(left(deadline)?))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Ok(Head::TooLarge);
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    Ok(Head::Request(method, origin_form(parts.next().unwrap_or("")).to_string()))
}

/// The path of a request target: `http://host:port/metrics?x` gives `/metrics?x`; an origin-form
/// target is returned as it is.
fn origin_form(target: &str) -> &str {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    let rest = if lower.starts_with("http://") {
        &target[7..]
    } else if lower.starts_with("https://") {
        &target[8..]
    } else {
        return target;
    };
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// Writes all of `bytes` by `deadline`.
fn write_by(conn: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    for chunk in bytes.chunks(64 << 10) {
        conn.set_write_timeout(Some(left(deadline)?))?;
        conn.write_all(chunk)?;
    }
    Ok(())
}

fn serve(mut conn: TcpStream, ctx: &Ctx, stop: &AtomicBool) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let (method, path) = match read_head(&mut conn)? {
        Head::Request(method, path) => (method, path),
        Head::TooLarge => {
            let body = "request head too long\n";
            answer(&mut conn, "431 Request Header Fields Too Large", "text/plain", body, true)?;
            return drain(conn);
        }
    };
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method.as_str(), path) {
        _ if stop.load(Ordering::SeqCst) => ("503 Service Unavailable", "text/plain", "stopping\n".into()),
        ("GET" | "HEAD", "/metrics") => {
            let snap = super::gather::snapshot(ctx, GATHER_TIMEOUT);
            ("200 OK", CONTENT_TYPE, super::render::render(&snap))
        }
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/html; charset=utf-8",
            "<html><body><a href=\"/metrics\">metrics</a></body></html>\n".into(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".into()),
    };
    answer(&mut conn, status, ctype, &body, method != "HEAD")
}

/// Reads what the client still sends, briefly and boundedly, after the answer: closing a socket
/// with unread input resets the connection, and the client may lose the answer with it.
fn drain(mut conn: TcpStream) -> std::io::Result<()> {
    conn.shutdown(std::net::Shutdown::Write)?;
    let deadline = Instant::now() + Duration::from_millis(500);
    let (mut buf, mut total) = ([0u8; 4096], 0);
    while total < 64 << 10 {
        let Ok(wait) = left(deadline) else { break };
        conn.set_read_timeout(Some(wait))?;
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    Ok(())
}

/// Writes the answer: status line, headers and (unless `with_body` is false, for HEAD) the body.
fn answer(conn: &mut TcpStream, status: &str, ctype: &str, body: &str, with_body: bool) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + WRITE_DEADLINE;
    write_by(conn, head.as_bytes(), deadline)?;
    if with_body {
        write_by(conn, body.as_bytes(), deadline)?;
    }
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::origin_form;

    #[test]
    fn absolute_form_targets_become_paths() {
        assert_eq!(origin_form("/metrics"), "/metrics");
        assert_eq!(origin_form("http://127.0.0.1:9100/metrics?a=1"), "/metrics?a=1");
        assert_eq!(origin_form("HTTP://host/metrics"), "/metrics");
        assert_eq!(origin_form("http://host"), "/");
        assert_eq!(origin_form("*"), "*");
    }
}
