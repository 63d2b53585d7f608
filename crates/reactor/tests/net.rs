//! Sockets on the reactor: thousands of pending operations, cancellation when a socket goes,
//! deadlines (linked timeouts), asynchronous connect and descriptor passing.

mod common;

use common::{ident, pair, run, still, stop, until};
use ferrite_reactor::net::Socket;
use ferrite_reactor::*;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

fn engine(ring_entries: u32, ring_handlers: usize) -> Engine {
    Engine::start(EngineConfig {
        cores: vec![0],
        mode: ReactorMode::Interrupt,
        ring_entries,
        ring_handlers,
        pin: false,
        ..Default::default()
    })
    .expect("engine starts")
}

#[test]
fn more_pending_receives_than_the_initial_handler_table_all_complete() {
    // A ring of 8 entries whose handler table starts at 4: 600 idle receives (like 600 idle
    // connections) must not stop a busy socket beside them, and each gets its own data.
    let e = engine(8, 4);
    const N: usize = 600;
    let (peers_tx, peers_rx) = std::sync::mpsc::channel::<Vec<UnixStream>>();
    let (cap_tx, cap_rx) = std::sync::mpsc::channel::<usize>();
    let (tx, rx) = std::sync::mpsc::channel();
    e.send(0, move || {
        let mut peers = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..N {
            let (s, p) = pair();
            peers.push(p);
            tasks.push(spawn_local(async move {
                let (res, buf) = s.recv(alloc_buf(8), 0).await;
                let n = res.expect("receive");
                assert_eq!(&buf[..n], &(i as u64).to_le_bytes()[..n], "receive {i} got another's bytes");
                n
            }));
        }
        spawn_local(async move {
            until("all receives pending", Duration::from_secs(2), || with_ring(|r| r.in_flight()) >= N).await;
            // Busy traffic beside the idle receives.
            let (s, mut p) = pair();
            for round in 0..50u8 {
                p.write_all(&[round; 100]).unwrap();
                let (res, buf) = s.recv_exact(alloc_buf(100), 0).await;
                res.expect("busy receive");
                assert!(buf.iter().all(|&b| b == round));
            }
            cap_tx.send(with_ring(|r| r.handler_capacity())).unwrap();
            peers_tx.send(peers).unwrap();
            let mut total = 0;
            for t in tasks {
                total += t.await;
            }
            let _ = tx.send(total);
        })
        .detach();
    });
    let cap = cap_rx.recv_timeout(Duration::from_secs(10)).expect("a busy socket stalled beside idle receives");
    assert!(cap >= N, "handler table of {cap} entries for {N} pending receives");
    let mut peers = peers_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    for (i, p) in peers.iter_mut().enumerate() {
        p.write_all(&(i as u64).to_le_bytes()).unwrap();
    }
    let total = rx.recv_timeout(Duration::from_secs(10)).expect("every receive completes");
    assert_eq!(total, N * 8);
    stop(e);
}

#[test]
fn dropping_a_socket_cancels_its_receive_and_closes_the_descriptor_after_the_completion() {
    let e = engine(64, 64);
    let (fd, open_right_after, reused, open_later, peer_eof) = run(&e, Duration::from_secs(10), || async {
        let (s, mut peer) = pair();
        let fd = s.raw_fd();
        let id = ident(fd);
        let task = spawn_local(async move {
            let _ = s.recv(alloc_buf(64), 0).await;
        });
        until("the receive is pending", Duration::from_secs(2), || with_ring(|r| r.in_flight()) == 1).await;
        // Dropping the task drops the future and the socket with the receive in flight.
        drop(task);
        let open_right_after = still(fd, id);
        // The number must not be handed out again while the receive may still act on it.
        // SAFETY: dup of stdin's number is a plain descriptor-table operation.
        let other = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, fd) };
        let reused = other == fd;
        // SAFETY: `other` is ours.
        unsafe { libc::close(other) };
        until("the cancel completed", Duration::from_secs(2), || with_ring(|r| r.in_flight()) == 0).await;
        let open_later = still(fd, id);
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = [0u8; 1];
        let peer_eof = matches!(peer.read(&mut b), Ok(0));
        (fd, open_right_after, reused, open_later, peer_eof)
    });
    assert!(open_right_after, "descriptor {fd} closed while a receive was in flight on it");
    assert!(!reused, "descriptor number {fd} reused under a pending receive");
    assert!(!open_later, "descriptor {fd} left open after its operations completed");
    assert!(peer_eof, "the peer did not see the socket close");
    stop(e);
}

#[test]
fn close_waits_for_operations_whose_futures_were_dropped() {
    let e = engine(64, 64);
    let (before, after, res) = run(&e, Duration::from_secs(10), || async {
        let (s, _peer) = pair();
        let fd = s.raw_fd();
        let id = ident(fd);
        // Start a receive and drop its future at once: the operation stays with the ring.
        {
            let mut f = Box::pin(s.recv(alloc_buf(16), 0));
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        let before = with_ring(|r| r.in_flight());
        s.close().await;
        (before, with_ring(|r| r.in_flight()), still(fd, id))
    });
    assert_eq!(before, 1, "the dropped receive should still be in flight");
    assert_eq!(after, 0, "close returned with an operation in flight");
    assert!(!res, "close returned before the descriptor was closed");
    stop(e);
}

#[test]
fn receive_and_send_deadlines_time_out_without_losing_data() {
    let e = engine(64, 64);
    let (waited, recv_err, got, send_err, send_waited) = run(&e, Duration::from_secs(10), || async {
        let (s, mut peer) = pair();
        let t = Instant::now();
        let (res, _) = s.recv_by(alloc_buf(16), 0, Instant::now() + Duration::from_millis(100)).await;
        let waited = t.elapsed();
        let recv_err = res.err().map(|e| e.kind());
        // Nothing was consumed: the next receive gets all the peer's bytes.
        peer.write_all(b"after").unwrap();
        let (res, buf) = s.recv_exact_by(alloc_buf(5), 0, Instant::now() + Duration::from_secs(2)).await;
        res.expect("receive before its deadline");
        let got = buf.to_vec();
        // A peer that reads nothing: sending 16 MiB cannot finish.
        let t = Instant::now();
        let send = s.send_all_by(vec![7u8; 16 << 20], Instant::now() + Duration::from_millis(100)).await;
        let send_waited = t.elapsed();
        (waited, recv_err, got, send.err().map(|e| e.kind()), send_waited)
    });
    assert_eq!(recv_err, Some(std::io::ErrorKind::TimedOut));
    assert!(waited >= Duration::from_millis(95) && waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(got, b"after");
    assert_eq!(send_err, Some(std::io::ErrorKind::TimedOut));
    assert!(send_waited < Duration::from_secs(2), "{send_waited:?}");
    stop(e);
}

#[test]
fn connect_reaches_a_tcp_listener_and_reports_refusal() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut b = [0u8; 11];
        c.read_exact(&mut b).unwrap();
        c.write_all(&b).unwrap();
    });
    // A port with no listener: bind one, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let e = engine(64, 64);
    let (echoed, refused) = run(&e, Duration::from_secs(10), move || async move {
        let s = Socket::connect(addr).await.expect("connect");
        s.send_all(b"hello world".to_vec()).await.unwrap();
        let (res, buf) = s.recv_exact(alloc_buf(11), 0).await;
        res.unwrap();
        let refused = Socket::connect(closed).await.err().map(|e| e.kind());
        (buf.to_vec(), refused)
    });
    echo.join().unwrap();
    assert_eq!(echoed, b"hello world");
    assert_eq!(refused, Some(std::io::ErrorKind::ConnectionRefused));
    stop(e);
}

#[test]
fn connect_unix_reaches_a_unix_listener() {
    let dir = std::env::temp_dir().join(format!("ferrite-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("u.sock");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.write_all(b"unix!").unwrap();
    });
    let e = engine(64, 64);
    let p = path.clone();
    let got = run(&e, Duration::from_secs(10), move || async move {
        let s = Socket::connect_unix(&p).await.expect("connect_unix");
        let (res, buf) = s.recv_exact(alloc_buf(5), 0).await;
        res.unwrap();
        buf.to_vec()
    });
    t.join().unwrap();
    assert_eq!(got, b"unix!");
    stop(e);
    let _ = std::fs::remove_dir_all(dir);
}

/// Sends `data` with `fds` attached as SCM_RIGHTS.
fn send_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) {
    // SAFETY: the header points at the data and a control buffer sized with CMSG_SPACE; the
    // CMSG macros write inside it.
    unsafe {
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
        let space = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        let mut control = vec![0u64; space.div_ceil(8)];
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr() as *mut _;
        hdr.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&hdr);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, fds.len());
        assert_eq!(libc::sendmsg(s.as_raw_fd(), &hdr, 0), data.len() as isize);
    }
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and ours.
    unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) }
}

#[test]
fn recv_with_fds_receives_working_descriptors() {
    let (a, b) = UnixStream::pair().unwrap();
    let (mut r1, w1) = pipe();
    let (mut r2, w2) = pipe();
    send_fds(&b, b"two fds", &[w1.as_raw_fd(), w2.as_raw_fd()]);
    drop((w1, w2));
    // Then three descriptors where only one is accepted.
    let (_r3, w3) = pipe();
    send_fds(&b, b"x", &[w3.as_raw_fd(), w3.as_raw_fd(), w3.as_raw_fd()]);
    let e = engine(64, 64);
    let a: OwnedFd = a.into();
    let (data, n_fds, cloexec, too_many) = run(&e, Duration::from_secs(10), move || async move {
        let s = Socket::new(a);
        let (res, buf) = s.recv_with_fds(alloc_buf(7), 0, 4).await;
        let (n, fds) = res.expect("recvmsg");
        // SAFETY: F_GETFD only queries the descriptor.
        let cloexec = fds.iter().all(|f| unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC != 0);
        for (i, f) in fds.iter().enumerate() {
            let mut file = std::fs::File::from(f.try_clone().unwrap());
            file.write_all(format!("through fd {i}").as_bytes()).unwrap();
        }
        let (res2, _) = s.recv_with_fds(alloc_buf(1), 0, 1).await;
        (buf[..n].to_vec(), fds.len(), cloexec, res2.err().map(|e| e.kind()))
    });
    assert_eq!(data, b"two fds");
    assert_eq!(n_fds, 2);
    assert!(cloexec, "received descriptors must be close-on-exec");
    let mut s = String::new();
    r1.read_to_string(&mut s).unwrap();
    assert_eq!(s, "through fd 0");
    s.clear();
    r2.read_to_string(&mut s).unwrap();
    assert_eq!(s, "through fd 1");
    assert_eq!(too_many, Some(std::io::ErrorKind::InvalidData));
    stop(e);
}

#[test]
fn dropped_listener_cancels_its_accept() {
    let e = engine(64, 64);
    let (open_after, pending_after) = run(&e, Duration::from_secs(10), || async {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listener = Rc::new(net::Listener::new(l.into()));
        let fd = listener.raw_fd();
        let id = ident(fd);
        let l2 = listener.clone();
        let task = spawn_local(async move {
            let _ = l2.accept().await;
        });
        until("the accept is pending", Duration::from_secs(2), || with_ring(|r| r.in_flight()) == 1).await;
        drop(task);
        drop(listener);
        until("the accept was cancelled", Duration::from_secs(2), || with_ring(|r| r.in_flight()) == 0).await;
        (still(fd, id), with_ring(|r| r.in_flight()))
    });
    assert!(!open_after, "listening descriptor left open");
    assert_eq!(pending_after, 0);
    stop(e);
}

#[test]
fn try_recv_takes_what_is_there_and_never_waits() {
    let e = engine(64, 64);
    let got = run(&e, Duration::from_secs(5), move || async move {
        let (s, mut p) = pair();
        let mut dst = [0u8; 16];
        // Nothing sent yet: WouldBlock at once, not a wait.
        let empty = s.try_recv(&mut dst).expect_err("nothing to receive").kind();
        p.write_all(b"0123456789").unwrap();
        let n = s.try_recv(&mut dst).expect("bytes");
        let first = dst[..n].to_vec();
        // Then a ring receive gets the bytes after them, in order.
        p.write_all(b"abc").unwrap();
        let (res, buf) = s.recv_exact(alloc_buf(3), 0).await;
        res.expect("ring receive");
        drop(p);
        let eof = s.try_recv(&mut dst).expect("end of stream");
        (empty, first, buf.to_vec(), eof)
    });
    assert_eq!(got.0, std::io::ErrorKind::WouldBlock);
    assert_eq!(got.1, b"0123456789");
    assert_eq!(got.2, b"abc");
    assert_eq!(got.3, 0, "0 at end of stream");
    stop(e);
}

#[test]
fn a_small_send_the_socket_takes_only_in_part_arrives_whole_and_in_order() {
    // Three parts (sent first with a plain sendmsg) of 3 MiB in all, to a peer that reads
    // slowly: the socket takes part, the ring sends the rest, and the bytes arrive in order.
    let e = engine(64, 64);
    let parts: Vec<Vec<u8>> =
        (0..3u8).map(|p| (0..1 << 20).map(|i: u32| (i as u8) ^ p.wrapping_mul(91)).collect()).collect();
    let want: Vec<u8> = parts.concat();
    let (ours, mut peer) = UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        while got.len() < 3 << 20 {
            let n = peer.read(&mut b).unwrap();
            assert!(n > 0, "peer closed early");
            got.extend_from_slice(&b[..n]);
        }
        got
    });
    let sent = run(&e, Duration::from_secs(10), move || async move {
        let s = Socket::new(ours.into());
        let ptrs: Vec<(*const u8, usize)> = parts.iter().map(|p| (p.as_ptr(), p.len())).collect();
        let cache = net::SendCache::default();
        // SAFETY: the parts point into `parts`' heap buffers, which the send owns until done.
        let (res, _parts) = unsafe { s.send_parts(&cache, &ptrs, parts).await };
        res.map_err(|e| e.kind())
    });
    assert_eq!(sent, Ok(()));
    let got = reader.join().unwrap();
    assert!(got == want, "bytes differ");
    stop(e);
}

#[test]
fn a_small_send_to_a_peer_that_left_fails_without_a_signal() {
    let e = engine(64, 64);
    let res = run(&e, Duration::from_secs(10), || async {
        let (s, peer) = pair();
        drop(peer);
        s.send_all(b"nobody reads this".to_vec()).await.map_err(|e| e.kind())
    });
    // EPIPE from the plain sendmsg itself (MSG_NOSIGNAL: the test process is still here).
    assert_eq!(res, Err(std::io::ErrorKind::BrokenPipe));
    stop(e);
}
