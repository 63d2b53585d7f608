//! Fuzzes the SCSI CDB decoder (`ferrite_scsi::cdb::decode`), a pure function from any bytes to
//! a command or the fault that refuses them. Nothing may panic, and what decodes must keep the
//! decoder's promises: the opcode's row exists, no bit outside the row's CDB usage data is set,
//! the data-out length is what the fields say, and a fault's sense data encodes in both
//! formats with the key, ASC and ASCQ it carries.

#![no_main]

use ferrite_scsi::cdb::{decode, has_service_actions, lookup, Command};
use ferrite_scsi::sense::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(cmd) => {
            let sa = if has_service_actions(data[0]) { u16::from(data[1] & 0x1f) } else { 0 };
            let row = lookup(data[0], sa).expect("a decoded command has its row");
            for (i, (&b, &m)) in data.iter().zip(row.usage).enumerate().skip(1) {
                assert_eq!(b & !m, 0, "byte {i} has a bit outside the usage data");
            }
            for bs in [512u32, 4096] {
                let n = cmd.data_out_len(bs);
                match cmd {
                    Command::Write(rw) | Command::WriteVerify { rw, .. } => assert_eq!(n, u64::from(rw.blocks) * u64::from(bs)),
                    Command::CompareAndWrite(rw) => assert_eq!(n, 2 * u64::from(rw.blocks) * u64::from(bs)),
                    Command::Read(_) | Command::Inquiry { .. } | Command::TestUnitReady => assert_eq!(n, 0),
                    _ => {}
                }
            }
        }
        Err(f) => {
            for descriptor in [false, true] {
                let s = f.encode(descriptor);
                if f.has_sense() {
                    assert_eq!(parse(s.as_slice()), Some((f.sense.key, f.sense.asc, f.sense.ascq)));
                } else {
                    assert!(s.is_empty());
                }
            }
        }
    }
});
