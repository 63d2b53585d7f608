//! The NBD server against a hand-driven client: malformed and abandoned handshakes, unknown and
//! invalid options, invalid transmission requests (each answered with the right error and
//! cookie, the connection kept when it can resynchronise and closed when it cannot), NBD_CMD_DISC
//! and structured replies. After every case the daemon still serves a fresh client.

mod common;
mod nbd_common;

use common::TempDir;
use ferrite_nbd::proto::*;
use nbd_common::{pattern, NbdDaemon, Raw};
use std::collections::BTreeMap;
use std::time::Duration;

const CLOSE: Duration = Duration::from_secs(5);

/// A daemon on two reactors with "rw" (4 MiB, 512-byte blocks) and "ro" (1 MiB, read-only).
fn setup(tag: &str) -> (TempDir, NbdDaemon) {
    let dir = TempDir::new(tag);
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("Rw", 8192, 512);
    n.malloc("Ro", 2048, 512);
    n.export("Rw", "rw", false, "read-write");
    n.export("Ro", "ro", true, "read-only");
    (dir, n)
}

const RW_SIZE: u64 = 8192 * 512;

#[test]
fn bad_option_magic_and_client_flags_close_the_connection() {
    let (_dir, n) = setup("nbdmagic");
    // An option header with the wrong magic.
    let mut r = Raw::negotiating(n.port);
    let mut hdr = b"IHAVEOPX".to_vec();
    hdr.extend_from_slice(&OPT_LIST.to_be_bytes());
    hdr.extend_from_slice(&0u32.to_be_bytes());
    r.send(&hdr);
    assert!(r.expect_closed(CLOSE).is_empty());
    n.assert_serves("rw");

    // Bad magic after a successful option.
    let mut r = Raw::negotiating(n.port);
    r.send_option(OPT_LIST, &[]);
    while r.option_reply().reply != REP_ACK {}
    r.send(&[0xff; 16]);
    assert!(r.expect_closed(CLOSE).is_empty());

    // Unknown client flags, and a client that is not fixed-newstyle.
    for flags in [0x4u32, C_FIXED_NEWSTYLE | 0x8000_0000, 0, C_NO_ZEROES] {
        let mut r = Raw::connect(n.port);
        r.send(&flags.to_be_bytes());
        assert!(r.expect_closed(CLOSE).is_empty(), "client flags {flags:#x}");
    }

    // An option longer than the server accepts.
    let mut r = Raw::negotiating(n.port);
    let mut hdr = IHAVEOPT.to_be_bytes().to_vec();
    hdr.extend_from_slice(&OPT_GO.to_be_bytes());
    hdr.extend_from_slice(&(MAX_OPTION_LEN + 1).to_be_bytes());
    r.send(&hdr);
    assert!(r.expect_closed(CLOSE).is_empty());

    // NBD_OPT_EXPORT_NAME for an unknown export has no error reply: the server closes.
    let mut r = Raw::negotiating(n.port);
    r.send_option(OPT_EXPORT_NAME, b"nosuch");
    assert!(r.expect_closed(CLOSE).is_empty());
    n.assert_serves("rw");
    n.wait_connections("every bad client gone", |c| c.is_empty());
}

#[test]
fn abandoned_handshakes_leave_the_daemon_serving() {
    let (_dir, n) = setup("nbdhalf");
    for i in 0..10 {
        // Connect and close at once, close after the greeting, after the flags, mid-option.
        let r = Raw::connect_only(n.port);
        drop(r);
        let r = Raw::connect(n.port);
        drop(r);
        let r = Raw::negotiating(n.port);
        drop(r);
        let mut r = Raw::negotiating(n.port);
        let mut partial = IHAVEOPT.to_be_bytes().to_vec();
        partial.extend_from_slice(&OPT_GO.to_be_bytes());
        partial.extend_from_slice(&100u32.to_be_bytes());
        partial.extend_from_slice(&[0, 0, 0, 2, b'r']);
        r.send(&partial[..if i % 2 == 0 { 10 } else { partial.len() }]);
        drop(r);
        // Half a request after GO.
        let (mut r, _) = Raw::open(n.port, "rw", false);
        r.send(&REQUEST_MAGIC.to_be_bytes());
        drop(r);
    }
    n.wait_connections("abandoned connections cleaned up", |c| c.is_empty());
    n.assert_serves("rw");
}

#[test]
fn unknown_and_unsupported_options_keep_negotiating() {
    let (_dir, n) = setup("nbdunknown");
    let mut r = Raw::negotiating(n.port);
    for (opt, data, want) in [
        (99u32, &b"some data"[..], REP_ERR_UNSUP),
        (0, &[][..], REP_ERR_UNSUP),
        (0x8000_0000, &[][..], REP_ERR_UNSUP),
        (OPT_STARTTLS, &[][..], REP_ERR_POLICY),
        (OPT_LIST_META_CONTEXT, &[0u8; 8][..], REP_ERR_UNSUP),
        (OPT_SET_META_CONTEXT, &[][..], REP_ERR_UNSUP),
        (OPT_EXTENDED_HEADERS, &[][..], REP_ERR_UNSUP),
        (OPT_LIST, &b"x"[..], REP_ERR_INVALID),
        (OPT_STRUCTURED_REPLY, &b"x"[..], REP_ERR_INVALID),
        (OPT_GO, &[0, 0, 0, 9, b'r'][..], REP_ERR_INVALID),
        (OPT_INFO, &[0, 0, 0, 2, b'r', b'w', 0, 1][..], REP_ERR_INVALID),
    ] {
        r.send_option(opt, data);
        let rep = r.option_reply();
        assert_eq!((rep.option, rep.reply), (opt, want), "option {opt}: {rep:?}");
        assert!(std::str::from_utf8(&rep.data).is_ok(), "error message is text: {rep:?}");
    }
    // NBD_OPT_INFO describes an export without entering transmission, with what was asked.
    let info = r.info_or_go(OPT_INFO, "rw", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]).expect("INFO rw");
    assert_eq!(info.size, RW_SIZE);
    assert_eq!(info.name.as_deref(), Some("rw"));
    assert_eq!(info.description.as_deref(), Some("read-write"));
    assert_eq!((info.min_block, info.max_block), (512, 32 << 20));
    assert_ne!(info.flags & HAS_FLAGS, 0);
    assert_eq!(info.flags & READ_ONLY, 0);
    let info = r.info_or_go(OPT_INFO, "ro", &[]).expect("INFO ro");
    assert_ne!(info.flags & READ_ONLY, 0, "{info:?}");
    // Then GO still works on the same connection.
    let info = r.go("rw", &[]).expect("GO after refused options");
    assert_eq!(info.size, RW_SIZE);
    let data = pattern(1, 4096);
    r.write_ok(1, 0, &data, 0);
    assert_eq!(r.read_ok(2, 0, 4096), data);
    r.disc();
    n.assert_serves("rw");
}

#[test]
fn go_for_an_unknown_export_and_list_and_abort() {
    let (_dir, n) = setup("nbdlist");
    let mut r = Raw::negotiating(n.port);
    for name in ["nosuch", "", "RW", "rw "] {
        let err = r.go(name, &[]).expect_err("GO for an unknown export");
        assert_eq!((err.option, err.reply), (OPT_GO, REP_ERR_UNKNOWN), "{name:?}: {err:?}");
        let err = r.info_or_go(OPT_INFO, name, &[]).expect_err("INFO for an unknown export");
        assert_eq!((err.option, err.reply), (OPT_INFO, REP_ERR_UNKNOWN), "{name:?}: {err:?}");
    }

    // NBD_OPT_LIST: one NBD_REP_SERVER per export (name, then description), then ACK.
    r.send_option(OPT_LIST, &[]);
    let mut listed = BTreeMap::new();
    loop {
        let rep = r.option_reply();
        assert_eq!(rep.option, OPT_LIST, "{rep:?}");
        if rep.reply == REP_ACK {
            assert!(rep.data.is_empty());
            break;
        }
        assert_eq!(rep.reply, REP_SERVER, "{rep:?}");
        let len = u32::from_be_bytes(rep.data[..4].try_into().unwrap()) as usize;
        let name = String::from_utf8(rep.data[4..4 + len].to_vec()).unwrap();
        let desc = String::from_utf8(rep.data[4 + len..].to_vec()).unwrap();
        listed.insert(name, desc);
    }
    let want: BTreeMap<String, String> =
        [("ro", "read-only"), ("rw", "read-write")].iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(listed, want);

    // The negotiation goes on: GO works after all that.
    let info = r.go("ro", &[INFO_NAME]).expect("GO ro");
    assert_eq!(info.size, 2048 * 512);
    assert_eq!(info.name.as_deref(), Some("ro"));
    assert_eq!(r.read_ok(1, 0, 512), vec![0u8; 512]);
    r.disc();

    // NBD_OPT_ABORT: ACK, then the server closes.
    let mut r = Raw::negotiating(n.port);
    r.send_option(OPT_ABORT, &[]);
    let rep = r.option_reply();
    assert_eq!((rep.option, rep.reply), (OPT_ABORT, REP_ACK), "{rep:?}");
    assert!(r.expect_closed(CLOSE).is_empty());
    n.assert_serves("ro");
}

#[test]
fn export_name_option_with_and_without_zeroes() {
    let (_dir, n) = setup("nbdexpname");
    for no_zeroes in [true, false] {
        let mut r = Raw::connect(n.port);
        let flags = if no_zeroes { C_FIXED_NEWSTYLE | C_NO_ZEROES } else { C_FIXED_NEWSTYLE };
        r.send(&flags.to_be_bytes());
        r.send_option(OPT_EXPORT_NAME, b"rw");
        let reply = r.read_n(if no_zeroes { 10 } else { 134 });
        assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), RW_SIZE);
        let tflags = u16::from_be_bytes([reply[8], reply[9]]);
        assert_eq!(tflags & (HAS_FLAGS | SEND_FLUSH | SEND_FUA | READ_ONLY), HAS_FLAGS | SEND_FLUSH | SEND_FUA);
        assert!(reply[10..].iter().all(|&b| b == 0));
        let data = pattern(no_zeroes as u64, 1024);
        r.write_ok(1, 512, &data, FLAG_FUA);
        assert_eq!(r.read_ok(2, 512, 1024), data);
        r.disc();
        assert!(r.expect_closed(CLOSE).is_empty());
    }
    n.assert_serves("rw");
}

/// A request: flags, type, cookie, offset, length, payload.
type Req = (u16, u16, u64, u64, u32, Vec<u8>);

/// An invalid request: what it is, flags, type, offset, length, payload, expected error.
type Case = (&'static str, u16, u16, u64, u32, Vec<u8>, u32);

/// Sends every request in `reqs` (flags, type, cookie, offset, length, payload) in one write and
/// returns the simple replies' errors by cookie (read data is consumed for successful reads).
fn pipeline(r: &mut Raw, reqs: &[Req]) -> BTreeMap<u64, u32> {
    let mut by_cookie = BTreeMap::new();
    for (_, t, c, _, l, _) in reqs {
        by_cookie.insert(*c, (*t, *l));
    }
    let mut bytes = Vec::new();
    for (f, t, c, o, l, p) in reqs {
        bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&f.to_be_bytes());
        bytes.extend_from_slice(&t.to_be_bytes());
        bytes.extend_from_slice(&c.to_be_bytes());
        bytes.extend_from_slice(&o.to_be_bytes());
        bytes.extend_from_slice(&l.to_be_bytes());
        bytes.extend_from_slice(p);
    }
    r.send(&bytes);
    let mut out = BTreeMap::new();
    for _ in reqs.iter().filter(|q| q.1 != CMD_DISC) {
        let (err, cookie) = r.simple_reply();
        let (t, l) = by_cookie.get(&cookie).copied().unwrap_or_else(|| panic!("reply with unknown cookie {cookie}"));
        if err == 0 && t == CMD_READ {
            let _ = r.read_n(l as usize);
        }
        assert!(out.insert(cookie, err).is_none(), "two replies for cookie {cookie}");
    }
    out
}

#[test]
fn invalid_requests_get_errors_with_their_cookies() {
    let (_dir, n) = setup("nbdinvalid");
    let (mut r, info) = Raw::open(n.port, "rw", false);
    assert_eq!(info.size, RW_SIZE);
    assert_eq!(info.flags & SEND_DF, 0, "DF without structured replies");
    let data = pattern(9, 4096);
    r.write_ok(1, 4096, &data, 0);

    // One request at a time: (flags, type, offset, length, payload) -> error.
    let cases: Vec<Case> = vec![
        ("read at the end", 0, CMD_READ, RW_SIZE, 512, vec![], EINVAL),
        ("read across the end", 0, CMD_READ, RW_SIZE - 512, 1024, vec![], EINVAL),
        ("read far beyond the end", 0, CMD_READ, u64::MAX - 511, 512, vec![], EINVAL),
        ("read of length 0", 0, CMD_READ, 0, 0, vec![], EINVAL),
        ("misaligned read offset", 0, CMD_READ, 100, 512, vec![], EINVAL),
        ("misaligned read length", 0, CMD_READ, 0, 100, vec![], EINVAL),
        ("read above the maximum payload", 0, CMD_READ, 0, (32 << 20) + 512, vec![], EINVAL),
        ("unknown command 99", 0, 99, 0, 512, vec![], EINVAL),
        ("block status (not offered)", 0, CMD_BLOCK_STATUS, 0, 512, vec![], EINVAL),
        ("resize (not offered)", 0, CMD_RESIZE, 0, 512, vec![], EINVAL),
        ("unknown flag bits", 0x80, CMD_READ, 0, 512, vec![], EINVAL),
        ("flag bit 15", 0x8000, CMD_READ, 0, 512, vec![], EINVAL),
        ("DF without structured replies", FLAG_DF, CMD_READ, 0, 512, vec![], EINVAL),
        ("NO_HOLE on a write", FLAG_NO_HOLE, CMD_WRITE, 0, 512, vec![0xee; 512], EINVAL),
        ("write at the end", 0, CMD_WRITE, RW_SIZE, 512, vec![0xee; 512], ENOSPC),
        ("misaligned write", 0, CMD_WRITE, 100, 512, vec![0xee; 512], EINVAL),
        ("write of length 0", 0, CMD_WRITE, 0, 0, vec![], EINVAL),
        ("trim across the end", 0, CMD_TRIM, RW_SIZE - 512, 1024, vec![], EINVAL),
        ("write-zeroes beyond the end", 0, CMD_WRITE_ZEROES, RW_SIZE, 512, vec![], ENOSPC),
        ("misaligned write-zeroes", 0, CMD_WRITE_ZEROES, 4096, 100, vec![], EINVAL),
    ];
    for (i, (what, flags, t, off, len, payload, want)) in cases.iter().enumerate() {
        let cookie = 0x1000 + i as u64;
        r.request(*flags, *t, cookie, *off, *len, payload);
        let (err, c) = r.simple_reply();
        assert_eq!((err, c), (*want, cookie), "{what}");
        // The connection is still in sync: a valid read returns the data written earlier.
        assert_eq!(r.read_ok(0x2000 + i as u64, 4096, 4096), data, "after {what}");
    }
    // The refused writes changed nothing.
    assert_eq!(r.read_ok(3, 0, 4096), vec![0u8; 4096]);

    // The same, pipelined in one send with valid requests in between.
    let mut reqs: Vec<Req> = Vec::new();
    for (i, (_, flags, t, off, len, payload, _)) in cases.iter().enumerate() {
        reqs.push((*flags, *t, 0x3000 + i as u64, *off, *len, payload.clone()));
        reqs.push((0, CMD_READ, 0x4000 + i as u64, 4096, 4096, vec![]));
    }
    reqs.push((0, CMD_FLUSH, 0x5000, 0, 0, vec![]));
    reqs.push((FLAG_FUA, CMD_WRITE, 0x5001, 8192, 512, vec![0x5a; 512]));
    let got = pipeline(&mut r, &reqs);
    for (i, (what, .., want)) in cases.iter().enumerate() {
        assert_eq!(got[&(0x3000 + i as u64)], *want, "pipelined {what}");
        assert_eq!(got[&(0x4000 + i as u64)], 0, "pipelined read after {what}");
    }
    assert_eq!((got[&0x5000], got[&0x5001]), (0, 0));
    assert_eq!(r.read_ok(4, 8192, 512), vec![0x5a; 512]);
    r.disc();
    assert!(r.expect_closed(CLOSE).is_empty());
    n.assert_serves("rw");
}

#[test]
fn writes_to_a_read_only_export_are_eperm_and_consume_their_payload() {
    let (_dir, n) = setup("nbdro");
    let (mut w, _) = Raw::open(n.port, "rw", false);
    let (mut r, info) = Raw::open(n.port, "ro", false);
    assert_ne!(info.flags & READ_ONLY, 0);
    assert_eq!(info.flags & (SEND_TRIM | SEND_WRITE_ZEROES), 0, "{:#x}", info.flags);
    drop(w.read_ok(1, 0, 512));
    // The payload looks like a request: if the server did not consume it, it would parse it.
    let mut fake = Vec::new();
    for _ in 0..(4096 / 28) {
        fake.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        fake.extend_from_slice(&[0, 0, 0, 0]);
        fake.extend_from_slice(&0xbadu64.to_be_bytes());
        fake.extend_from_slice(&[0; 12]);
    }
    fake.resize(4096, 0);
    for (flags, cookie) in [(0, 10u64), (FLAG_FUA, 11)] {
        r.request(flags, CMD_WRITE, cookie, 0, 4096, &fake);
        assert_eq!(r.simple_reply(), (EPERM, cookie));
        assert_eq!(r.read_ok(cookie + 100, 0, 4096), vec![0u8; 4096], "read after a refused write");
    }
    // Trim and write-zeroes are not offered on it; flush is.
    r.request(0, CMD_TRIM, 20, 0, 512, &[]);
    assert_eq!(r.simple_reply(), (EINVAL, 20));
    r.request(0, CMD_WRITE_ZEROES, 21, 0, 512, &[]);
    assert_eq!(r.simple_reply(), (EINVAL, 21));
    r.request(0, CMD_FLUSH, 22, 0, 0, &[]);
    assert_eq!(r.simple_reply(), (0, 22));
    r.request(0, CMD_CACHE, 23, 0, 4096, &[]);
    assert_eq!(r.simple_reply(), (0, 23));
    assert_eq!(r.read_ok(24, 1 << 19, 4096), vec![0u8; 4096]);
    r.disc();
    w.disc();
    n.assert_serves("ro");
}

#[test]
fn bad_request_magic_and_garbage_close_the_connection() {
    let (_dir, n) = setup("nbdgarbage");
    // A request with a bad magic after a valid one.
    let (mut r, _) = Raw::open(n.port, "rw", false);
    assert_eq!(r.read_ok(1, 0, 512), vec![0u8; 512]);
    let mut bad = (REQUEST_MAGIC + 1).to_be_bytes().to_vec();
    bad.extend_from_slice(&[0u8; 24]);
    r.send(&bad);
    assert!(r.expect_closed(CLOSE).is_empty());

    // The simple reply magic is not a request magic.
    let (mut r, _) = Raw::open(n.port, "rw", true);
    let mut bad = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    bad.extend_from_slice(&[0u8; 24]);
    r.send(&bad);
    assert!(r.expect_closed(CLOSE).is_empty());

    // Text after the handshake.
    let (mut r, _) = Raw::open(n.port, "ro", false);
    r.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(r.expect_closed(CLOSE).is_empty());

    // Random bytes, a lot of them.
    let (mut r, _) = Raw::open(n.port, "rw", false);
    let _ = std::io::Write::write_all(&mut r.s, &pattern(77, 256 << 10));
    assert!(r.expect_closed(CLOSE).is_empty());

    // A write larger than the maximum payload cannot be skipped: the server closes.
    let (mut r, _) = Raw::open(n.port, "rw", false);
    r.request(0, CMD_WRITE, 5, 0, (32 << 20) + 512, &[]);
    let _ = std::io::Write::write_all(&mut r.s, &[0u8; 65536]);
    assert!(r.expect_closed(CLOSE).is_empty());

    n.wait_connections("closed connections cleaned up", |c| c.is_empty());
    n.assert_serves("rw");
}

#[test]
fn disc_closes_after_replying_to_earlier_requests() {
    let (_dir, n) = setup("nbddisc");
    let (mut r, _) = Raw::open(n.port, "rw", false);
    let a = pattern(21, 65536);
    r.write_ok(1, 0, &a, 0);
    let b = pattern(22, 65536);
    // Writes, reads (of data written before), a flush and an invalid request, then DISC, all in
    // one send: every request before DISC gets its reply, then the server closes.
    let mut bytes = Vec::new();
    let mut push = |f: u16, t: u16, c: u64, o: u64, l: u32, p: &[u8]| {
        bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&f.to_be_bytes());
        bytes.extend_from_slice(&t.to_be_bytes());
        bytes.extend_from_slice(&c.to_be_bytes());
        bytes.extend_from_slice(&o.to_be_bytes());
        bytes.extend_from_slice(&l.to_be_bytes());
        bytes.extend_from_slice(p);
    };
    push(0, CMD_WRITE, 10, 1 << 20, 65536, &b);
    for i in 0..8u64 {
        push(0, CMD_READ, 20 + i, i * 8192, 8192, &[]);
    }
    push(FLAG_FUA, CMD_WRITE, 11, 2 << 20, 65536, &b);
    push(0, CMD_FLUSH, 12, 0, 0, &[]);
    push(0, 99, 13, 0, 512, &[]);
    push(0, CMD_DISC, 14, 0, 0, &[]);
    // Anything after DISC is ignored.
    push(0, CMD_READ, 15, 0, 512, &[]);
    r.send(&bytes);
    let mut got = BTreeMap::new();
    for _ in 0..12 {
        let (err, cookie) = r.simple_reply();
        if (20..28).contains(&cookie) && err == 0 {
            let i = (cookie - 20) as usize;
            assert_eq!(r.read_n(8192), a[i * 8192..(i + 1) * 8192], "read {cookie}");
        }
        assert!(got.insert(cookie, err).is_none(), "two replies for {cookie}");
    }
    let want: BTreeMap<u64, u32> =
        [(10, 0), (11, 0), (12, 0), (13, EINVAL)].into_iter().chain((20..28).map(|c| (c, 0))).collect();
    assert_eq!(got, want);
    assert!(r.expect_closed(CLOSE).is_empty(), "bytes after the replies to the requests before DISC");

    // The writes before DISC were done.
    let (mut r, _) = Raw::open(n.port, "rw", false);
    assert_eq!(r.read_ok(1, 1 << 20, 65536), b);
    assert_eq!(r.read_ok(2, 2 << 20, 65536), b);
    r.disc();
    n.assert_serves("rw");
}

#[test]
fn structured_replies_for_reads_and_errors() {
    let (_dir, n) = setup("nbdstruct");
    let mut r = Raw::negotiating(n.port);
    r.send_option(OPT_STRUCTURED_REPLY, &[]);
    let rep = r.option_reply();
    assert_eq!((rep.option, rep.reply), (OPT_STRUCTURED_REPLY, REP_ACK), "{rep:?}");
    // Asking twice is refused, and harmless.
    r.send_option(OPT_STRUCTURED_REPLY, &[]);
    let rep = r.option_reply();
    assert_eq!((rep.option, rep.reply), (OPT_STRUCTURED_REPLY, REP_ERR_INVALID), "{rep:?}");
    let info = r.go("rw", &[]).expect("GO");
    assert_ne!(info.flags & SEND_DF, 0, "DF with structured replies: {:#x}", info.flags);

    // Writes get simple replies; reads one OFFSET_DATA chunk with DONE.
    let data = pattern(31, 12288);
    r.write_ok(1, 8192, &data, 0);
    for (cookie, off, len, flags) in [(2u64, 8192u64, 12288u32, 0u16), (3, 12288, 4096, FLAG_DF), (4, 0, 512, 0)] {
        r.request(flags, CMD_READ, cookie, off, len, &[]);
        let c = r.chunk();
        assert_eq!((c.flags, c.kind, c.cookie), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie), "{c:?}");
        assert_eq!(c.payload.len(), 8 + len as usize);
        assert_eq!(u64::from_be_bytes(c.payload[..8].try_into().unwrap()), off);
        let want: Vec<u8> = (off..off + u64::from(len))
            .map(|i| if (8192..8192 + 12288).contains(&i) { data[(i - 8192) as usize] } else { 0 })
            .collect();
        assert_eq!(&c.payload[8..], &want[..], "read {cookie}");
    }

    // Invalid reads get one ERROR chunk with DONE, the error and the cookie.
    for (cookie, off, len, flags) in [
        (10u64, RW_SIZE, 512u32, 0u16),
        (11, RW_SIZE - 512, 4096, 0),
        (12, 0, 0, 0),
        (13, 3, 512, 0),
        (14, 0, 512, 0x40),
    ] {
        r.request(flags, CMD_READ, cookie, off, len, &[]);
        let c = r.chunk();
        assert_eq!((c.flags, c.kind, c.cookie), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie), "{c:?}");
        assert!(c.payload.len() >= 6, "{c:?}");
        assert_eq!(u32::from_be_bytes(c.payload[..4].try_into().unwrap()), EINVAL, "{c:?}");
        let msg_len = u16::from_be_bytes([c.payload[4], c.payload[5]]) as usize;
        assert_eq!(c.payload.len(), 6 + msg_len, "{c:?}");
    }
    // Non-read errors are simple replies.
    r.request(0, CMD_WRITE, 20, RW_SIZE, 512, &[0u8; 512]);
    assert_eq!(r.simple_reply(), (ENOSPC, 20));
    r.request(0, 99, 21, 0, 512, &[]);
    assert_eq!(r.simple_reply(), (EINVAL, 21));
    // And the connection is still in sync.
    r.request(0, CMD_READ, 22, 8192, 512, &[]);
    let c = r.chunk();
    assert_eq!((c.kind, c.cookie), (REPLY_TYPE_OFFSET_DATA, 22));
    assert_eq!(&c.payload[8..], &data[..512]);
    r.disc();
    assert!(r.expect_closed(CLOSE).is_empty());

    // A read-only export's refused write, with structured replies.
    let (mut r, _) = Raw::open(n.port, "ro", true);
    r.request(0, CMD_WRITE, 30, 0, 512, &[1u8; 512]);
    assert_eq!(r.simple_reply(), (EPERM, 30));
    r.request(0, CMD_READ, 31, 0, 512, &[]);
    let c = r.chunk();
    assert_eq!((c.kind, c.cookie, &c.payload[8..]), (REPLY_TYPE_OFFSET_DATA, 31, &[0u8; 512][..]));
    r.disc();
    n.assert_serves("rw");
}
