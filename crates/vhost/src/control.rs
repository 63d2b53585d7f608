//! The controllers and their control plane: one thread ("vhost-ctl") for every controller's
//! socket, as SPDK's rte_vhost has one for its sockets. It accepts the front end (one at a time
//! per controller, as vhost-user has it), reads its messages and applies them
//! (`backend::Session`); the rings themselves run on the reactors.
//!
//! Messages are small and come whole in one send (QEMU writes header and body together); a
//! front end that stalls inside a message, or does not read its replies, holds the thread for
//! at most [`MSG_TIMEOUT`] before its connection is dropped. A ring's start or stop waits for its
//! reactor, at most `backend::RING_OP_TIMEOUT`.

use crate::backend::{CtrlrInfo, Session};
use ferrite_rpc::sockfile::{self, SocketFile};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use vhost::vhost_user::{BackendReqHandler, Error};

/// Longest a front end may take to send the rest of a message it started.
pub const MSG_TIMEOUT: Duration = Duration::from_secs(1);

/// A controller as the RPCs see it.
pub struct Controller {
    /// What its sessions need.
    pub info: Arc<CtrlrInfo>,
    /// The cpumask as given (or the engine's, formatted).
    pub cpumask: String,
    /// Its socket's path.
    pub socket: PathBuf,
    /// A front end is connected.
    pub connected: AtomicBool,
    /// The socket file this controller bound.
    file: SocketFile,
    /// The controller's own descriptor of its bdev (as SPDK's controller holds one): its events
    /// (resize, removal) reach the controller whether or not a queue runs. Closed on removal.
    pub desc: Mutex<Option<ferrite_bdev::BdevDesc>>,
}

/// What the control thread is asked to do.
enum Cmd {
    Add(Arc<Controller>, UnixListener),
    /// The bdev of controller `id` changed size: tell its front end.
    ConfigChanged(u64),
    Remove {
        id: u64,
        force: bool,
        done: ferrite_reactor::oneshot::Sender<Result<(), String>>,
    },
}

struct Control {
    cmds: Mutex<VecDeque<Cmd>>,
    wake: OwnedFd,
}

static CONTROL: OnceLock<Control> = OnceLock::new();
static CONTROLLERS: Mutex<Vec<Arc<Controller>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static SOCKET_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Sets the folder controllers' sockets go in (`ferrite serve -S DIR`; default: the working
/// directory, as SPDK's vhost app).
pub fn set_socket_dir(dir: PathBuf) {
    *SOCKET_DIR.lock().unwrap() = Some(dir);
}

/// The socket path of controller `name`.
pub fn socket_path(name: &str) -> PathBuf {
    let dir = SOCKET_DIR.lock().unwrap().clone().unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
    dir.join(name)
}

/// Every controller, in creation order.
pub fn controllers() -> Vec<Arc<Controller>> {
    CONTROLLERS.lock().unwrap().clone()
}

/// The controller named `name`.
pub fn find(name: &str) -> Option<Arc<Controller>> {
    CONTROLLERS.lock().unwrap().iter().find(|c| c.info.dev.ctrlr == name).cloned()
}

fn control() -> &'static Control {
    CONTROL.get_or_init(|| {
        let wake = ferrite_reactor::eventfd::new().expect("an eventfd for the vhost control thread");
        std::thread::Builder::new().name("vhost-ctl".into()).spawn(run).expect("the vhost control thread starts");
        Control { cmds: Mutex::new(VecDeque::new()), wake }
    })
}

fn send(cmd: Cmd) {
    let c = control();
    c.cmds.lock().unwrap().push_back(cmd);
    let _ = ferrite_reactor::eventfd::signal(c.wake.as_fd());
}

/// Creates controller `info.dev.ctrlr`: binds its socket (private, never over anything but a
/// stale socket) and hands it to the control thread.
pub fn add(info: Arc<CtrlrInfo>, cpumask: String, desc: ferrite_bdev::BdevDesc) -> Result<Arc<Controller>, String> {
    let name = info.dev.ctrlr.clone();
    let mut all = CONTROLLERS.lock().unwrap();
    if all.iter().any(|c| c.info.dev.ctrlr == name) {
        return Err(format!("controller {name} already exists"));
    }
    let socket = socket_path(&name);
    let bound = sockfile::bind(&socket, 0o600).map_err(|e| format!("socket {}: {e}", socket.display()))?;
    let ctrl = Arc::new(Controller {
        info,
        cpumask,
        socket,
        connected: AtomicBool::new(false),
        file: bound.file,
        desc: Mutex::new(Some(desc)),
    });
    all.push(ctrl.clone());
    drop(all);
    send(Cmd::Add(ctrl.clone(), bound.listener));
    log::info!("vhost controller {name}: listening on {}", ctrl.socket.display());
    Ok(ctrl)
}

/// Deletes controller `name`: refused while a front end is connected unless `force` (as SPDK
/// refuses with EBUSY); with `force`, the session's rings are stopped first.
pub async fn remove(name: &str, force: bool) -> Result<(), (i32, String)> {
    let Some(c) = find(name) else {
        return Err((libc::ENODEV, format!("controller {name} not found")));
    };
    if !force && c.connected.load(Ordering::SeqCst) {
        return Err((libc::EBUSY, format!("controller {name} has a front end connected")));
    }
    let (tx, rx) = ferrite_reactor::oneshot::channel();
    send(Cmd::Remove { id: c.info.id, force, done: tx });
    match rx.await {
        Ok(Ok(())) => {
            CONTROLLERS.lock().unwrap().retain(|x| x.info.id != c.info.id);
            c.desc.lock().unwrap().take();
            c.file.remove(&c.socket);
            log::info!("vhost controller {name} deleted");
            Ok(())
        }
        Ok(Err(e)) => Err((libc::EBUSY, e)),
        Err(_) => Err((libc::EIO, "the vhost control thread is gone".into())),
    }
}

/// Tells controller `id`'s front end, if any, that the disk's configuration changed.
pub fn config_changed(id: u64) {
    send(Cmd::ConfigChanged(id));
}

/// A new controller id.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A connected front end: the message handler and the session it applies messages to.
type Conn = (BackendReqHandler<Mutex<Session>>, Arc<Mutex<Session>>);

/// A controller's socket and session on the control thread.
struct Live {
    ctrl: Arc<Controller>,
    listener: UnixListener,
    conn: Option<Conn>,
    /// Our copy of the front end's back channel (VHOST_USER_SET_BACKEND_REQ_FD), for config
    /// change notices.
    back: Option<OwnedFd>,
}

impl Live {
    fn disconnect(&mut self, why: &str) {
        let _in = self.ctrl.info.engine.enter();
        self.back = None;
        if let Some((_, session)) = self.conn.take() {
            let mut s = session.lock().unwrap();
            let running = s.running();
            s.stop_all();
            self.ctrl.connected.store(false, Ordering::SeqCst);
            log::info!(
                "vhost controller {}: front end gone ({why}); {running} queue(s) stopped",
                self.ctrl.info.dev.ctrlr
            );
        }
    }

    fn config_changed(&mut self) {
        let name = &self.ctrl.info.dev.ctrlr;
        if self.conn.is_none() {
            return;
        }
        let Some(back) = self.back.as_ref() else {
            log::warn!("vhost controller {name}: the disk changed size; the front end gave no back channel to hear it");
            return;
        };
        // VHOST_USER_BACKEND_CONFIG_CHANGE_MSG: request 2, version 1, no payload, no reply asked.
        let mut msg = [0u8; 12];
        msg[0..4].copy_from_slice(&2u32.to_le_bytes());
        msg[4..8].copy_from_slice(&1u32.to_le_bytes());
        // SAFETY: writes 12 bytes from a local to a socket we own.
        let n = unsafe { libc::send(back.as_raw_fd(), msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
        if n == msg.len() as isize {
            log::info!("vhost controller {name}: told the front end the disk changed size");
        } else {
            log::warn!("vhost controller {name}: config change notice: {}", std::io::Error::last_os_error());
        }
    }

    fn accept(&mut self) {
        if self.conn.as_ref().is_some_and(|(h, _)| hung_up(h.as_raw_fd())) {
            // A front end that closed and connected again at once: the old connection's end
            // may not have been seen yet (what it left unread is for a session that is gone).
            self.disconnect("hang-up");
        }
        let name = &self.ctrl.info.dev.ctrlr;
        let stream = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                ferrite_reactor::log_limited!(log::Level::Warn, "vhost controller {name}: accept: {e}");
                return;
            }
        };
        if self.conn.is_some() {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "vhost controller {name}: a second front end connected while one is; closed"
            );
            return;
        }
        let _ = stream.set_read_timeout(Some(MSG_TIMEOUT));
        let _ = stream.set_write_timeout(Some(MSG_TIMEOUT));
        let session = Arc::new(Mutex::new(Session::new(self.ctrl.info.clone())));
        let handler = BackendReqHandler::from_stream(stream, session.clone());
        self.ctrl.connected.store(true, Ordering::SeqCst);
        log::info!("vhost controller {name}: front end connected");
        self.conn = Some((handler, session));
    }

    fn serve(&mut self) {
        // Bdev lookups go to the engine's registry.
        let _in = self.ctrl.info.engine.enter();
        let Some((handler, _)) = self.conn.as_mut() else { return };
        if let Err(why) = ready_for_message(handler.as_raw_fd()) {
            log::warn!("vhost controller {}: {why}; disconnecting", self.ctrl.info.dev.ctrlr);
            return self.disconnect(why);
        }
        if let Some(fd) = peek_backend_channel(handler.as_raw_fd()) {
            self.back = Some(fd);
        }
        match handler.handle_request() {
            Ok(()) => {}
            Err(Error::Disconnected) | Err(Error::PartialMessage) => self.disconnect("disconnected"),
            Err(e) => {
                let why = format!("{e}");
                log::warn!("vhost controller {}: message refused: {why}; disconnecting", self.ctrl.info.dev.ctrlr);
                self.disconnect(&why);
            }
        }
    }
}

/// If the next message on `sock` is VHOST_USER_SET_BACKEND_REQ_FD, a copy of the descriptor
/// it carries, taken without consuming the message (a peek delivers the descriptor as a new one
/// of ours; the `vhost` crate then takes the message and its own copy). The crate offers no way
/// to send BACKEND_CONFIG_CHANGE_MSG on the channel it keeps.
fn peek_backend_channel(sock: std::os::fd::RawFd) -> Option<OwnedFd> {
    use std::os::fd::FromRawFd;
    const SET_BACKEND_REQ_FD: u32 = 21;
    let mut hdr = [0u8; 12];
    let mut iov = libc::iovec { iov_base: hdr.as_mut_ptr().cast(), iov_len: hdr.len() };
    // Room for one descriptor's control message.
    let mut cbuf = [0u64; 4];
    // SAFETY: a zeroed msghdr pointing at live local buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: recvmsg into the buffers above; MSG_PEEK leaves the message queued.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 12 {
        return None;
    }
    let code = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
    // Every descriptor the peek delivered is ours to close, whatever the message.
    let mut found = None;
    // SAFETY: walking the control messages the kernel wrote into `cbuf`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if code == SET_BACKEND_REQ_FD && found.is_none() {
                        found = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if let Some(fd) = &found {
        let t = libc::timeval { tv_sec: MSG_TIMEOUT.as_secs() as _, tv_usec: 0 };
        // SAFETY: setsockopt with a timeval on a socket we own.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDTIMEO,
                (&t as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
    }
    found
}

/// Whether the front end on `fd` has closed its end (whatever it sent before is still readable).
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// Bytes of a vhost-user message header.
const HEADER_LEN: usize = 12;

/// Whether the front end's next message can be handled without holding this thread for good:
/// its header is all there (or the connection ended, which the handler sees), after waiting up
/// to [`MSG_TIMEOUT`] for the rest of a header that came cut, and a reply will fit in the
/// socket (the front end reads its replies), after waiting up to [`MSG_TIMEOUT`] for room. The
/// `vhost` crate reads a header, and writes a reply, until all of it is through, retrying on
/// the socket's timeouts: a front end that stopped inside a header, or never read its replies,
/// would hold this thread, and every controller's messages, for as long as it kept the
/// connection open.
fn ready_for_message(fd: RawFd) -> Result<(), &'static str> {
    // Writable: at least three quarters of the send buffer free, room for any reply (4 KiB at
    // most).
    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd.
    if unsafe { libc::poll(&mut p, 1, MSG_TIMEOUT.as_millis() as i32) } == 0 {
        return Err("the front end reads no reply");
    }
    let deadline = Instant::now() + MSG_TIMEOUT;
    loop {
        let mut b = [0u8; HEADER_LEN];
        // SAFETY: peeks at most `b.len()` bytes into `b`.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        let waiting =
            n >= 0 || matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN | libc::EINTR));
        if n == 0 || n as usize == HEADER_LEN || !waiting {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err("a message header cut short");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run() {
    let c = loop {
        match CONTROL.get() {
            Some(c) => break c,
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let mut lives: Vec<Live> = Vec::new();
    loop {
        let cmds: Vec<Cmd> = c.cmds.lock().unwrap().drain(..).collect();
        for cmd in cmds {
            match cmd {
                Cmd::Add(ctrl, listener) => lives.push(Live { ctrl, listener, conn: None, back: None }),
                Cmd::ConfigChanged(id) => {
                    if let Some(l) = lives.iter_mut().find(|l| l.ctrl.info.id == id) {
                        l.config_changed();
                    }
                }
                Cmd::Remove { id, force, done } => {
                    let Some(i) = lives.iter().position(|l| l.ctrl.info.id == id) else {
                        done.send(Ok(()));
                        continue;
                    };
                    if lives[i].conn.is_some() && !force {
                        done.send(Err(format!(
                            "controller {} has a front end connected",
                            lives[i].ctrl.info.dev.ctrlr
                        )));
                        continue;
                    }
                    let mut l = lives.remove(i);
                    l.disconnect("controller deleted");
                    done.send(Ok(()));
                }
            }
        }
        let mut fds = vec![libc::pollfd { fd: c.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        for l in &lives {
            fds.push(libc::pollfd { fd: l.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            let fd = l.conn.as_ref().map_or(-1, |(h, _)| h.as_raw_fd());
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: `fds` is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            let _ = ferrite_reactor::eventfd::drain(c.wake.as_fd());
        }
        for (i, l) in lives.iter_mut().enumerate() {
            // The connection first: these events are its, and `accept` may replace it.
            let r = fds[2 + 2 * i].revents;
            if r & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 && r & libc::POLLIN == 0 {
                l.disconnect("hang-up");
            } else if r != 0 {
                l.serve();
            }
            if fds[1 + 2 * i].revents != 0 {
                l.accept();
            }
        }
    }
}

/// Whether `path` is where controller sockets may be made (for a clear RPC error).
pub fn check_dir(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}
