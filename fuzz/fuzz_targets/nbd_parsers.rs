//! Fuzzes the NBD server's sans-I/O codec. The first byte picks a mode, the rest is its input:
//!
//! - 0: client flags (4 bytes);
//! - 1: an option header (16 bytes);
//! - 2: an option: u16 option number, then its data;
//! - 3: a request header (28 bytes) as sent, then the export's limits;
//! - 4: the same with the request magic forced, so that every input reaches `validate`.
//!
//! Nothing may panic, and what parses must respect the codec's promises: bounded option lengths
//! and names, consistent INFO/GO lengths, and requests that `validate` accepts lying inside the
//! export.

#![no_main]

use ferrite_nbd::handshake::{
    encode_error, encode_info_name, parse_client_flags, parse_option, parse_option_header, OptionRequest,
};
use ferrite_nbd::proto::{
    FLAG_FUA, MAX_NAME_LEN, MAX_OPTION_LEN, OPT_GO, OPT_INFO, REPLY_FLAG_DONE, REP_ERR_INVALID, REQUEST_MAGIC,
};
use ferrite_nbd::transmission::{
    encode_offset_data_header, encode_simple_reply, encode_structured_error, parse_request, validate, Command, Limits,
    REQUEST_LEN,
};
use libfuzzer_sys::fuzz_target;

/// The first `N` bytes of `data`, zero-padded, and the rest.
fn take<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    (b, &data[n..])
}

fn client_flags(data: &[u8]) {
    let (b, _) = take::<4>(data);
    if let Ok(f) = parse_client_flags(&b) {
        assert!(f.fixed_newstyle);
        assert!(u32::from_be_bytes(b) <= 3);
    }
}

fn option_header(data: &[u8]) {
    let (b, _) = take::<16>(data);
    if let Ok((option, len)) = parse_option_header(&b) {
        assert!(len <= MAX_OPTION_LEN);
        assert_eq!(option, u32::from_be_bytes([b[8], b[9], b[10], b[11]]));
        assert_eq!(&b[..8], b"IHAVEOPT");
    }
}

fn option(data: &[u8]) {
    let (b, rest) = take::<2>(data);
    let option = u32::from(u16::from_be_bytes(b));
    let mut out = Vec::new();
    match parse_option(option, rest) {
        Ok(OptionRequest::Info { name, requests } | OptionRequest::Go { name, requests }) => {
            assert!(option == OPT_INFO || option == OPT_GO);
            assert!(name.len() <= MAX_NAME_LEN);
            assert_eq!(4 + name.len() + 2 + 2 * requests.len(), rest.len());
            encode_info_name(&mut out, option, &name);
            assert_eq!(out.len(), 20 + 2 + name.len());
        }
        Ok(OptionRequest::ExportName(name)) => {
            assert!(name.len() <= MAX_NAME_LEN);
            assert_eq!(name.as_bytes(), rest);
        }
        Ok(_) => {}
        Err(e) => {
            assert_eq!(e.reply, REP_ERR_INVALID);
            encode_error(&mut out, option, e.reply, &e.message);
            let len = u32::from_be_bytes([out[16], out[17], out[18], out[19]]) as usize;
            assert_eq!(out.len(), 20 + len);
        }
    }
}

fn request(data: &[u8], force_magic: bool) {
    let (mut raw, rest) = take::<REQUEST_LEN>(data);
    if force_magic {
        raw[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    }
    let Ok(req) = parse_request(&raw) else {
        assert!(!force_magic, "a request with the right magic must parse");
        return;
    };
    let (size, rest) = take::<8>(rest);
    let (block_size, rest) = take::<4>(rest);
    let (max_payload, rest) = take::<4>(rest);
    let (bools, _) = take::<1>(rest);
    let bit = |n: u8| bools[0] & (1 << n) != 0;
    let l = Limits {
        size: u64::from_be_bytes(size),
        block_size: u32::from_be_bytes(block_size),
        max_payload: u32::from_be_bytes(max_payload),
        read_only: bit(0),
        flush: bit(1),
        fua: bit(2),
        trim: bit(3),
        write_zeroes: bit(4),
        structured: bit(5),
    };
    match validate(&req, &l) {
        Ok(()) => {
            let ranged = matches!(
                req.command,
                Command::Read | Command::Write | Command::Trim | Command::WriteZeroes | Command::Cache
            );
            if ranged {
                assert!(req.length > 0);
                let end = req.offset.checked_add(u64::from(req.length));
                assert!(end.is_some_and(|end| end <= l.size), "{req:?} accepted beyond {l:?}");
                if l.block_size > 1 {
                    assert_eq!(req.offset % u64::from(l.block_size), 0);
                    assert_eq!(u64::from(req.length) % u64::from(l.block_size), 0);
                }
            }
            if matches!(req.command, Command::Read | Command::Write) {
                assert!(req.length <= l.max_payload);
            }
            if l.read_only {
                assert!(!matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes));
            }
            if req.flags & FLAG_FUA != 0 && req.command != Command::Disc {
                assert!(l.fua);
            }
            assert!(!matches!(req.command, Command::BlockStatus | Command::Resize | Command::Unknown(_)));
            let mut h = [0u8; 28];
            encode_offset_data_header(&mut h, req.cookie, req.offset, req.length, true);
            assert_eq!(&h[8..16], &req.cookie.to_be_bytes());
            assert_eq!(&h[20..28], &req.offset.to_be_bytes());
            assert_eq!(u16::from_be_bytes([h[4], h[5]]), REPLY_FLAG_DONE);
        }
        Err(error) => {
            assert_ne!(error, 0);
            assert_ne!(req.command, Command::Disc);
            let mut h = [0u8; 16];
            encode_simple_reply(&mut h, error, req.cookie);
            assert_eq!(&h[8..16], &req.cookie.to_be_bytes());
            let mut v = Vec::new();
            encode_structured_error(&mut v, req.cookie, error, "refused");
            assert_eq!(v.len(), 20 + 6 + 7);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 5 {
        0 => client_flags(rest),
        1 => option_header(rest),
        2 => option(rest),
        3 => request(rest, false),
        _ => request(rest, true),
    }
});
