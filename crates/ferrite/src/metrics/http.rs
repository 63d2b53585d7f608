//! The HTTP endpoint: one plain thread (never a reactor) that accepts connections one at a
//! time and answers `GET /metrics` with a fresh [`super::gather`] snapshot. HTTP/1.1 with
//! `Connection: close`; anything else is 404 or 405. Slow or silent clients time out.

use super::expo::CONTENT_TYPE;
use ferrite_rpc::Ctx;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
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
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and starts serving.
    pub fn start(addr: &str, ctx: Ctx) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new().name("metrics".into()).spawn(move || accept_loop(listener, ctx, s))?;
        log::info!("metrics: serving Prometheus metrics on http://{addr}/metrics");
        Ok(Server { addr, stop, thread: Some(thread) })
    }

    /// The bound address (the port chosen when ADDR had port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; returns the thread to join (the listener closes when it ends).
    pub fn stop(mut self) -> Option<JoinHandle<()>> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take()
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

fn accept_loop(listener: TcpListener, ctx: Ctx, stop: Arc<AtomicBool>) {
    avoid_reactor_cores(&ctx.engine);
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, _)) => {
                if let Err(e) = serve(conn, &ctx) {
                    log::debug!("metrics: client: {e}");
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

/// The request line's method and path, once the head has arrived.
fn read_head(conn: &mut TcpStream) -> std::io::Result<(String, String)> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too long"));
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    Ok((parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string()))
}

fn serve(mut conn: TcpStream, ctx: &Ctx) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    conn.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let (method, path) = read_head(&mut conn)?;
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method.as_str(), path) {
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
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    if method != "HEAD" {
        conn.write_all(body.as_bytes())?;
    }
    conn.flush()
}
