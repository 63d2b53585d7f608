//! Receive streams: multishot receive into the reactor's provided buffer ring, with its ends
//! (empty ring, back-pressure, stop, close, end of stream) and the one-shot fallback.

mod common;

use common::{ident, pair, run, stop, until};
use ferrite_reactor::net::Socket;
use ferrite_reactor::*;
use std::future::Future;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn engine(recv_bufs: RecvBufConfig) -> Engine {
    Engine::start(EngineConfig {
        cores: vec![0],
        mode: ReactorMode::Interrupt,
        ring_entries: 64,
        ring_handlers: 64,
        recv_bufs,
        pin: false,
        ..Default::default()
    })
    .expect("engine starts")
}

fn bufs(count: u16, size: u32) -> RecvBufConfig {
    RecvBufConfig { count, size }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed ^ (i >> 8) as u8).collect()
}

fn stats() -> RecvBufStats {
    recv_buf_stats().expect("the reactor has a receive ring")
}

#[test]
fn many_chunks_arrive_in_order_and_every_buffer_comes_back() {
    let e = engine(bufs(16, 4096));
    let (got, chunks, free, multishot, in_flight) = run(&e, Duration::from_secs(20), || async {
        let (s, mut peer) = pair();
        let data = pattern(1 << 20, 3);
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            for piece in sent.chunks(10_007) {
                peer.write_all(piece).unwrap();
            }
            // `peer` drops here: end of stream.
        });
        let mut stream = s.recv_stream();
        let multishot = stream.is_multishot();
        let mut got = Vec::with_capacity(data.len());
        let mut chunks = 0;
        while let Some(c) = stream.next().await.expect("receive") {
            assert!(c.from_ring() && c.len() <= 4096);
            got.extend_from_slice(&c);
            chunks += 1;
        }
        writer.join().unwrap();
        assert!(got == data, "the bytes arrive whole and in order");
        drop(stream);
        // A cancel sent by back-pressure may still be completing.
        until("nothing in flight", Duration::from_secs(5), || with_ring(|r| r.in_flight()) == 0).await;
        (got.len(), chunks, stats().free, multishot, with_ring(|r| r.in_flight()))
    });
    assert!(multishot);
    assert_eq!(got, 1 << 20);
    assert!(chunks >= 256, "{chunks} chunks of at most 4 KiB for 1 MiB");
    assert_eq!(free, 16, "every chunk gave its buffer back");
    assert_eq!(in_flight, 0, "the receive ended at the end of stream");
    stop(e);
}

#[test]
fn an_empty_ring_ends_the_receive_which_arms_again_when_buffers_come_back() {
    let e = engine(bufs(4, 64));
    let (enobufs, rest_ok) = run(&e, Duration::from_secs(20), || async {
        let (s, mut peer) = pair();
        let data = pattern(64 * 4 + 1000, 9);
        peer.write_all(&data).unwrap();
        let mut stream = s.recv_stream();
        let first = stream.next().await.expect("receive").expect("data");
        // Holding the first chunk, the stream fills the other three buffers, then the kernel
        // finds the ring empty.
        until("the ring ran dry", Duration::from_secs(5), || stats().enobufs >= 1 && !stream.is_armed()).await;
        assert_eq!(stats().free, 0);
        let mut got = first.to_vec();
        let mut held = vec![first];
        while let Some(c) = stream.try_next() {
            got.extend_from_slice(&c);
            held.push(c);
        }
        assert_eq!(held.len(), 4, "four buffers, four chunks");
        let enobufs = stats().enobufs;
        drop(held);
        assert_eq!(stats().free, 4);
        // The data left in the socket arrives once the stream arms again.
        while got.len() < data.len() {
            let c = stream.next().await.expect("receive").expect("data");
            got.extend_from_slice(&c);
        }
        (enobufs, got == data)
    });
    assert!(enobufs >= 1);
    assert!(rest_ok, "no byte lost or reordered across the empty ring");
    stop(e);
}

#[test]
fn a_stream_starved_by_another_is_woken_when_a_buffer_comes_back() {
    let e = engine(bufs(2, 64));
    let ok = run(&e, Duration::from_secs(20), || async {
        let (a, mut pa) = pair();
        let (b, mut pb) = pair();
        let mut sa = a.recv_stream();
        pa.write_all(&[1u8; 128]).unwrap();
        let c1 = sa.next().await.unwrap().unwrap();
        until("stream a holds the whole ring", Duration::from_secs(5), || stats().free == 0).await;
        let c2 = sa.try_next();
        let waiter = spawn_local(async move {
            let mut sb = b.recv_stream();
            let c = sb.next().await.unwrap().unwrap();
            let v = c.to_vec();
            drop(c);
            drop(sb);
            v
        });
        pb.write_all(b"for b").unwrap();
        until("b's receive met the empty ring", Duration::from_secs(5), || stats().enobufs >= 1).await;
        sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "b got data with no buffer free");
        drop((c1, c2));
        waiter.await == b"for b"
    });
    assert!(ok, "the starved stream received its bytes once a buffer came back");
    stop(e);
}

#[test]
fn a_reader_that_falls_behind_stops_its_receive_and_leaves_the_rest_in_the_socket() {
    // 200 chunks' worth of data, a ring of 256 buffers: a reader that reads nothing must not
    // take more than a first burst of the ring (the kernel delivers a batch per wakeup before
    // the reactor sees it; the stream then stops its receive).
    let e = engine(bufs(256, 64));
    let (queued, free, all) = run(&e, Duration::from_secs(20), || async {
        let (s, mut peer) = pair();
        let data = pattern(64 * 200, 1);
        peer.write_all(&data).unwrap();
        let mut stream = s.recv_stream();
        let first = stream.next().await.unwrap().unwrap();
        until("back-pressure stopped the receive", Duration::from_secs(5), || !stream.is_armed()).await;
        sleep(Duration::from_millis(20)).await;
        let mut got = first.to_vec();
        drop(first);
        let mut queued = 0;
        while let Some(c) = stream.try_next() {
            got.extend_from_slice(&c);
            queued += 1;
        }
        let free = stats().free;
        while got.len() < data.len() {
            got.extend_from_slice(&stream.next().await.unwrap().unwrap());
        }
        (queued, free, got == data)
    });
    eprintln!("{queued} chunks queued when the receive stopped");
    assert!(queued < 199, "{queued} chunks queued: the receive did not stop");
    assert_eq!(free, 256, "the stopped stream's chunks were all read and given back");
    assert!(all);
    stop(e);
}

#[test]
fn stop_hands_the_rest_of_the_stream_to_a_plain_receive() {
    for count in [16, 0] {
        let e = engine(bufs(count, 256));
        let ok = run(&e, Duration::from_secs(20), move || async move {
            let (s, mut peer) = pair();
            let data = pattern(10_000, 5);
            let mut stream = s.recv_stream();
            assert_eq!(stream.is_multishot(), count > 0);
            peer.write_all(&data[..300]).unwrap();
            let mut got = stream.next().await.unwrap().unwrap().to_vec();
            stream.stop().await;
            assert!(!stream.is_armed());
            while let Some(c) = stream.try_next() {
                got.extend_from_slice(&c);
            }
            peer.write_all(&data[300..]).unwrap();
            let (res, buf) = s.recv_exact(alloc_buf(data.len() - got.len()), 0).await;
            res.expect("plain receive after stop");
            got.extend_from_slice(&buf);
            // And the stream arms again afterwards.
            peer.write_all(b"again").unwrap();
            let again = stream.next().await.unwrap().unwrap().to_vec();
            got == data && again == b"again"
        });
        assert!(ok, "bytes split between the stream and a plain receive stay in order (ring of {count})");
        stop(e);
    }
}

#[test]
fn next_single_takes_one_buffer_and_leaves_the_rest_in_the_socket() {
    let e = engine(bufs(16, 64));
    let (first, armed, queued, rest_ok, free) = run(&e, Duration::from_secs(10), || async {
        let (s, mut peer) = pair();
        let data = pattern(640, 4);
        let mut stream = s.recv_stream();
        // Armed while idle, it holds no buffer; then the data comes.
        let waiting = {
            let mut f = Box::pin(stream.next_single());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(f.as_mut().poll(&mut cx).is_pending());
            drop(f);
            stats().free
        };
        assert_eq!(waiting, 16);
        peer.write_all(&data).unwrap();
        let c = stream.next_single().await.unwrap().unwrap();
        let first = c.len();
        sleep(Duration::from_millis(10)).await;
        let (armed, queued) = (stream.is_armed(), stream.try_next().is_some());
        let mut got = c.to_vec();
        drop(c);
        let (res, buf) = s.recv_exact(alloc_buf(data.len() - got.len()), 0).await;
        res.unwrap();
        got.extend_from_slice(&buf);
        (first, armed, queued, got == data, stats().free)
    });
    assert_eq!(first, 64, "one buffer's worth");
    assert!(!armed && !queued, "a single receive takes one chunk and stays disarmed");
    assert!(rest_ok, "the rest stayed in the socket, in order");
    assert_eq!(free, 16);
    stop(e);
}

#[test]
fn dropping_a_socket_with_its_receive_armed_cancels_it_and_closes_the_descriptor_after() {
    let e = engine(bufs(8, 256));
    let (open_right_after, open_later, in_flight, free) = run(&e, Duration::from_secs(10), || async {
        let (s, _peer) = pair();
        let fd = s.raw_fd();
        let id = ident(fd);
        let task = spawn_local(async move {
            let mut stream = s.recv_stream();
            let _ = stream.next().await;
        });
        until("the receive is armed", Duration::from_secs(5), || with_ring(|r| r.in_flight()) == 1).await;
        drop(task);
        let open_right_after = ident(fd) == id;
        until("the receive ended", Duration::from_secs(5), || with_ring(|r| r.in_flight()) == 0).await;
        (open_right_after, id.is_some() && ident(fd) == id, with_ring(|r| r.in_flight()), stats().free)
    });
    assert!(open_right_after, "descriptor closed while the multishot receive was armed");
    assert!(!open_later, "descriptor left open after the receive ended");
    assert_eq!((in_flight, free), (0, 8));
    stop(e);
}

#[test]
fn close_waits_for_a_dropped_stream_s_receive() {
    let e = engine(bufs(8, 256));
    let (before, after) = run(&e, Duration::from_secs(10), || async {
        let (s, _peer) = pair();
        {
            let mut stream = s.recv_stream();
            let mut f = Box::pin(stream.next());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        let before = with_ring(|r| r.in_flight());
        s.close().await;
        (before, with_ring(|r| r.in_flight()))
    });
    assert!(before >= 1, "the dropped stream's receive (and its cancel) are in flight");
    assert_eq!(after, 0, "close returned with the receive in flight");
    stop(e);
}

#[test]
fn the_peer_closing_ends_the_stream_after_its_last_bytes() {
    for count in [8, 0] {
        let e = engine(bufs(count, 256));
        let (got, end, after) = run(&e, Duration::from_secs(10), || async {
            let (s, mut peer) = pair();
            let mut stream = s.recv_stream();
            peer.write_all(b"last words").unwrap();
            drop(peer);
            let mut got = Vec::new();
            let end = loop {
                match stream.next().await {
                    Ok(Some(c)) => got.extend_from_slice(&c),
                    Ok(None) => break true,
                    Err(e) => panic!("{e}"),
                }
            };
            let after = stream.next().await.map(|c| c.is_none()).unwrap_or(false);
            (got, end, after)
        });
        assert_eq!(got, b"last words");
        assert!(end && after, "end of stream, and it stays ended (ring of {count})");
        stop(e);
    }
}

#[test]
fn a_reset_connection_ends_the_stream_with_its_error() {
    let e = engine(bufs(8, 256));
    let err = run(&e, Duration::from_secs(10), || async {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mine, _) = l.accept().unwrap();
        let s = Socket::new(mine.into());
        let pending = spawn_local(async move {
            let mut stream = s.recv_stream();
            let r = stream.next().await.map(|c| c.map(|c| c.len()));
            r.err().and_then(|e| e.raw_os_error())
        });
        sleep(Duration::from_millis(20)).await;
        // SO_LINGER 0: close sends a reset.
        let lin = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt reads the linger struct we own.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::setsockopt(
                peer.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &lin as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as u32,
            );
        }
        drop(peer);
        pending.await
    });
    assert_eq!(err, Some(libc::ECONNRESET));
    stop(e);
}

#[test]
fn a_thousand_idle_streams_hold_no_buffer_and_all_receive_through_a_small_ring() {
    const N: usize = 1000;
    let e = engine(bufs(16, 64));
    let (peers_tx, peers_rx) = std::sync::mpsc::channel::<Vec<UnixStream>>();
    let (idle_tx, idle_rx) = std::sync::mpsc::channel::<(usize, u32)>();
    let (tx, rx) = std::sync::mpsc::channel();
    e.send(0, move || {
        let mut peers = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..N {
            let (s, p) = pair();
            peers.push(p);
            tasks.push(spawn_local(async move {
                let mut stream = s.recv_stream();
                let want = pattern(100, i as u8);
                let mut got = Vec::new();
                while got.len() < want.len() {
                    got.extend_from_slice(&stream.next().await.expect("receive").expect("data"));
                }
                got == want
            }));
        }
        spawn_local(async move {
            until("every stream armed", Duration::from_secs(5), || with_ring(|r| r.in_flight()) >= N).await;
            idle_tx.send((with_ring(|r| r.in_flight()), stats().free)).unwrap();
            peers_tx.send(peers).unwrap();
            let mut ok = 0;
            for t in tasks {
                ok += t.await as usize;
            }
            let _ = tx.send((ok, stats()));
        })
        .detach();
    });
    let (in_flight, free) = idle_rx.recv_timeout(Duration::from_secs(20)).expect("streams armed");
    assert!(in_flight >= N);
    assert_eq!(free, 16, "idle streams hold no buffer");
    let mut peers = peers_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    for (i, p) in peers.iter_mut().enumerate() {
        p.write_all(&pattern(100, i as u8)).unwrap();
    }
    let (ok, s) = rx.recv_timeout(Duration::from_secs(30)).expect("every stream received its bytes");
    eprintln!("{N} streams through a ring of 16: {} chunks, {} empty-ring ends", s.chunks, s.enobufs);
    assert_eq!(ok, N);
    assert_eq!(s.free, 16);
    drop(peers);
    stop(e);
}
