//! REPORT SUPPORTED OPERATION CODES (SPC-4 6.35), from the decoder's table ([`crate::cdb::OPS`]):
//! every command the logical unit serves, or one with its CDB usage data, with command
//! timeouts descriptors on request (timeouts not specified: zero).

use crate::cdb::{has_service_actions, lookup, op, OpInfo, OPS};
use crate::lun::Lun;
use crate::sense::Fault;

/// True if `lun` serves the command of row `o` (UNMAP only on bdevs that unmap).
fn served(lun: &Lun, o: &OpInfo) -> bool {
    o.opcode != op::UNMAP || lun.block_facts().unmap
}

const TIMEOUTS: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The parameter data for reporting options `options` (0: all; 1: `opcode` without service
/// actions; 2: `opcode` and `sa`; 3: `opcode`, and `sa` if it has them).
pub fn report(lun: &Lun, rctd: bool, options: u8, opcode: u8, sa: u16) -> Result<Vec<u8>, Fault> {
    if options == 0 {
        let mut d = vec![0u8; 4];
        for o in OPS.iter().filter(|o| served(lun, o)) {
            d.push(o.opcode);
            d.push(0);
            d.extend_from_slice(&o.sa.unwrap_or(0).to_be_bytes());
            d.push(0);
            d.push(if rctd { 0x02 } else { 0 } | u8::from(o.sa.is_some()));
            d.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
            if rctd {
                d.extend_from_slice(&TIMEOUTS);
            }
        }
        let n = (d.len() - 4) as u32;
        d[..4].copy_from_slice(&n.to_be_bytes());
        return Ok(d);
    }
    let with_sa = has_service_actions(opcode);
    match options {
        1 if with_sa => return Err(Fault::invalid_cdb(2, Some(2))),
        2 if !with_sa => return Err(Fault::invalid_cdb(2, Some(2))),
        _ => {}
    }
    let row =
        lookup(opcode, if with_sa { sa } else { 0 }).filter(|o| served(lun, o) && (with_sa || sa == 0 || options == 3));
    let mut d = vec![0u8; 4];
    match row {
        Some(o) => {
            d[1] = 0x03 | if rctd { 0x80 } else { 0 };
            d[2..4].copy_from_slice(&(o.usage.len() as u16).to_be_bytes());
            d.extend_from_slice(o.usage);
            if rctd {
                d.extend_from_slice(&TIMEOUTS);
            }
        }
        None => d[1] = 0x01,
    }
    Ok(d)
}
