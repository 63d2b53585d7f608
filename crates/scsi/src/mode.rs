//! Mode pages of a logical unit (shared by every I_T nexus: MLUS) and MODE SENSE / MODE
//! SELECT (SPC-4 6.11-6.14, 7.5; SBC-3 6.4): read-write error recovery (01h), caching (08h),
//! control (0Ah) and its extension (0Ah/01h), informational exceptions control (1Ch), with
//! current, changeable and default values. Nothing can be saved: MODE SENSE of saved values
//! answers SAVING PARAMETERS NOT SUPPORTED and MODE SELECT with SP is refused (decoder).
//!
//! Changeable: WCE (when the bdev has a volatile cache), D_SENSE, SWP, and the informational
//! exceptions page's DEXCPT, MRIE, interval timer and report count.

use crate::sense::{asc, Fault, SENSE_ILLEGAL_REQUEST};

/// A page: code, subpage, current bytes, default bytes, changeable mask (all of the page's
/// length, header included).
#[derive(Debug, Clone)]
struct Page {
    code: u8,
    subpage: u8,
    current: Vec<u8>,
    default: Vec<u8>,
    changeable: Vec<u8>,
}

/// The mode pages of one logical unit.
#[derive(Debug, Clone)]
pub struct ModePages {
    pages: Vec<Page>,
}

/// Device facts the pages and the block descriptor show.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Logical blocks.
    pub num_blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// The bdev has a volatile write cache (WCE is on by default and changeable).
    pub write_cache: bool,
    /// The logical unit refuses writes whatever SWP says (a read-only bdev).
    pub read_only: bool,
}

fn page(code: u8, subpage: u8, len: usize, init: &[(usize, u8)], changeable: &[(usize, u8)]) -> Page {
    let mut p = vec![0u8; len];
    if subpage == 0 {
        p[0] = code;
        p[1] = (len - 2) as u8;
    } else {
        p[0] = code | 0x40;
        p[1] = subpage;
        p[2..4].copy_from_slice(&((len - 4) as u16).to_be_bytes());
    }
    let mut mask = vec![0u8; len];
    for &(i, v) in init {
        p[i] = v;
    }
    for &(i, v) in changeable {
        mask[i] = v;
    }
    Page { code, subpage, current: p.clone(), default: p, changeable: mask }
}

/// Caching page byte 2: WCE.
const WCE: u8 = 0x04;
/// Control page byte 2: D_SENSE.
const D_SENSE: u8 = 0x04;
/// Control page byte 4: SWP.
const SWP: u8 = 0x08;

impl ModePages {
    /// The pages of a logical unit with `geo`, at their defaults.
    pub fn new(geo: &Geometry) -> ModePages {
        let wce = if geo.write_cache { WCE } else { 0 };
        let pages = vec![
            page(0x01, 0, 12, &[], &[]),
            page(0x08, 0, 20, &[(2, wce)], &[(2, wce)]),
            // Control: QUEUE ALGORITHM MODIFIER 1 (unrestricted reordering), GLTSD (no log
            // parameters saved), busy timeout unlimited.
            page(0x0a, 0, 12, &[(2, 0x02), (3, 0x10), (8, 0xff), (9, 0xff)], &[(2, D_SENSE), (4, SWP)]),
            page(0x0a, 0x01, 32, &[], &[]),
            // Informational exceptions: DEXCPT (none are reported).
            page(
                0x1c,
                0,
                12,
                &[(2, 0x08)],
                &[
                    (2, 0x08),
                    (3, 0x0f),
                    (4, 0xff),
                    (5, 0xff),
                    (6, 0xff),
                    (7, 0xff),
                    (8, 0xff),
                    (9, 0xff),
                    (10, 0xff),
                    (11, 0xff),
                ],
            ),
        ];
        ModePages { pages }
    }

    /// Every page back to its default (power on, logical unit reset: nothing is saved).
    pub fn reset(&mut self) {
        for p in &mut self.pages {
            p.current.clone_from(&p.default);
        }
    }

    fn get(&self, code: u8, subpage: u8) -> &Page {
        self.pages.iter().find(|p| p.code == code && p.subpage == subpage).expect("a page of the table")
    }

    /// D_SENSE: sense data in descriptor format.
    pub fn d_sense(&self) -> bool {
        self.get(0x0a, 0).current[2] & D_SENSE != 0
    }

    /// SWP: the medium is write protected by software.
    pub fn swp(&self) -> bool {
        self.get(0x0a, 0).current[4] & SWP != 0
    }

    /// WCE: the volatile write cache is on (off: writes are made durable one by one).
    pub fn wce(&self) -> bool {
        self.get(0x08, 0).current[2] & WCE != 0
    }

    /// MODE SENSE's parameter data: header, block descriptor unless `dbd`, and the pages
    /// asked for with page control `pc`.
    #[allow(clippy::too_many_arguments)]
    pub fn sense(
        &self,
        geo: &Geometry,
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        code: u8,
        subpage: u8,
    ) -> Result<Vec<u8>, Fault> {
        if pc == 3 {
            return Err(Fault::check(SENSE_ILLEGAL_REQUEST, asc::SAVING_PARAMETERS_NOT_SUPPORTED));
        }
        let want = |p: &Page| match (code, subpage) {
            (0x3f, 0x00) => p.subpage == 0,
            (0x3f, 0xff) => true,
            (c, 0xff) => p.code == c,
            (c, s) => p.code == c && p.subpage == s,
        };
        let chosen: Vec<&Page> = self.pages.iter().filter(|p| want(p)).collect();
        if chosen.is_empty() {
            let (byte, bit) = if self.pages.iter().any(|p| p.code == code) || code == 0x3f { (3, 7) } else { (2, 5) };
            return Err(Fault::invalid_cdb(byte, Some(bit)));
        }
        let mut out = if ten { vec![0u8; 8] } else { vec![0u8; 4] };
        // Device-specific parameter: WP, DPOFUA.
        let wp = if geo.read_only || self.swp() { 0x80 } else { 0 };
        out[if ten { 3 } else { 2 }] = wp | 0x10;
        if !dbd {
            if llbaa {
                out[4] = 1;
                out.extend_from_slice(&geo.num_blocks.to_be_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&geo.block_size.to_be_bytes());
            } else {
                let n = u32::try_from(geo.num_blocks).unwrap_or(u32::MAX);
                out.extend_from_slice(&n.to_be_bytes());
                out.push(0);
                out.extend_from_slice(&geo.block_size.to_be_bytes()[1..]);
            }
            let bdl = out.len() - if ten { 8 } else { 4 };
            if ten {
                out[6..8].copy_from_slice(&(bdl as u16).to_be_bytes());
            } else {
                out[3] = bdl as u8;
            }
        }
        for p in chosen {
            let start = out.len();
            match pc {
                0 => out.extend_from_slice(&p.current),
                1 => {
                    out.extend_from_slice(&p.changeable);
                    // The page code and length are reported as in the other values.
                    let h = if p.subpage == 0 { 2 } else { 4 };
                    out[start..start + h].copy_from_slice(&p.current[..h]);
                }
                _ => out.extend_from_slice(&p.default),
            }
        }
        if ten {
            let n = (out.len() - 2) as u16;
            out[0..2].copy_from_slice(&n.to_be_bytes());
        } else {
            out[0] = (out.len() - 1).min(255) as u8;
        }
        Ok(out)
    }

    /// MODE SELECT's parameter list: header, an optional block descriptor that must describe
    /// the logical unit as it is, and pages whose bytes differ from the current ones only in
    /// changeable bits. Returns true if a current value changed (the other I_T nexuses get
    /// MODE PARAMETERS CHANGED). Nothing changes unless the whole list is valid.
    pub fn select(&mut self, geo: &Geometry, ten: bool, data: &[u8]) -> Result<bool, Fault> {
        let hlen = if ten { 8 } else { 4 };
        if data.len() < hlen {
            return Err(Fault::param_list_length());
        }
        // Mode data length is reserved in MODE SELECT; medium type must be 0.
        let (mdl_ok, medium) = if ten { (data[0] == 0 && data[1] == 0, 2) } else { (data[0] == 0, 1) };
        if !mdl_ok {
            return Err(Fault::invalid_param(0, None));
        }
        if data[medium] != 0 {
            return Err(Fault::invalid_param(medium as u16, None));
        }
        let bdl = if ten { usize::from(u16::from_be_bytes([data[6], data[7]])) } else { usize::from(data[3]) };
        let long = ten && data[4] & 1 != 0;
        let want_bdl = if long { 16 } else { 8 };
        if bdl != 0 && bdl != want_bdl {
            return Err(Fault::invalid_param(if ten { 6 } else { 3 }, None));
        }
        if data.len() < hlen + bdl {
            return Err(Fault::param_list_length());
        }
        if bdl != 0 {
            let d = &data[hlen..hlen + bdl];
            let (blocks, len, at_len) = if long {
                (
                    u64::from_be_bytes(d[0..8].try_into().expect("8 bytes")),
                    u32::from_be_bytes(d[12..16].try_into().expect("4 bytes")),
                    12,
                )
            } else {
                (
                    u64::from(u32::from_be_bytes(d[0..4].try_into().expect("4 bytes"))),
                    u32::from_be_bytes([0, d[5], d[6], d[7]]),
                    5,
                )
            };
            let n = if long { geo.num_blocks } else { geo.num_blocks.min(u64::from(u32::MAX)) };
            if blocks != 0 && blocks != n {
                return Err(Fault::invalid_param(hlen as u16, None));
            }
            if len != geo.block_size {
                return Err(Fault::invalid_param((hlen + at_len) as u16, None));
            }
        }
        let mut next = self.pages.clone();
        let mut at = hlen + bdl;
        while at < data.len() {
            let rest = &data[at..];
            let spf = rest[0] & 0x40 != 0;
            if rest[0] & 0x80 != 0 {
                // PS is reserved in MODE SELECT.
                return Err(Fault::invalid_param(at as u16, Some(7)));
            }
            let (code, subpage, plen) = if spf {
                if rest.len() < 4 {
                    return Err(Fault::param_list_length());
                }
                (rest[0] & 0x3f, rest[1], 4 + usize::from(u16::from_be_bytes([rest[2], rest[3]])))
            } else {
                if rest.len() < 2 {
                    return Err(Fault::param_list_length());
                }
                (rest[0] & 0x3f, 0, 2 + usize::from(rest[1]))
            };
            let Some(p) = next.iter_mut().find(|p| p.code == code && p.subpage == subpage) else {
                return Err(Fault::invalid_param(at as u16, Some(5)));
            };
            if plen != p.current.len() {
                return Err(Fault::invalid_param((at + 1) as u16, None));
            }
            if rest.len() < plen {
                return Err(Fault::param_list_length());
            }
            let h = if spf { 4 } else { 2 };
            for (i, (&new, (&cur, &ch))) in rest.iter().zip(p.current.iter().zip(&p.changeable)).enumerate().skip(h) {
                let diff = (new ^ cur) & !ch;
                if diff != 0 {
                    return Err(Fault::invalid_param((at + i) as u16, Some(7 - diff.leading_zeros() as u8)));
                }
            }
            if code == 0x1c && rest[3] & 0x0f > 6 {
                // MRIE: 0-6 are defined.
                return Err(Fault::invalid_param((at + 3) as u16, Some(3)));
            }
            p.current[h..plen].copy_from_slice(&rest[h..plen]);
            at += plen;
        }
        let changed = next.iter().zip(&self.pages).any(|(a, b)| a.current != b.current);
        self.pages = next;
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: Geometry = Geometry { num_blocks: 1000, block_size: 512, write_cache: true, read_only: false };

    #[test]
    fn all_pages_and_one_page() {
        let m = ModePages::new(&GEO);
        let all = m.sense(&GEO, false, false, false, 0, 0x3f, 0).unwrap();
        assert_eq!(usize::from(all[0]) + 1, all.len());
        assert_eq!(all[3], 8, "a short block descriptor");
        assert_eq!(&all[4..8], &1000u32.to_be_bytes());
        assert_eq!(all.len(), 4 + 8 + 12 + 20 + 12 + 12, "subpages only with FFh");
        let ctl = m.sense(&GEO, true, true, false, 0, 0x0a, 0).unwrap();
        assert_eq!(ctl.len(), 8 + 12);
        assert_eq!(ctl[8], 0x0a);
        let both = m.sense(&GEO, false, true, false, 0, 0x0a, 0xff).unwrap();
        assert_eq!(both.len(), 4 + 12 + 32);
        assert!(m.sense(&GEO, false, true, false, 0, 0x05, 0).is_err());
        assert_eq!(m.sense(&GEO, false, true, false, 3, 0x0a, 0).unwrap_err().sense.asc, 0x39);
    }

    #[test]
    fn select_changes_only_changeable_bits() {
        let mut m = ModePages::new(&GEO);
        let mut list = vec![0u8; 4];
        let mut ctl = m.get(0x0a, 0).current.clone();
        ctl[2] |= D_SENSE;
        list.extend_from_slice(&ctl);
        assert_eq!(m.select(&GEO, false, &list), Ok(true));
        assert!(m.d_sense());
        assert_eq!(m.select(&GEO, false, &list), Ok(false), "no change the second time");
        list[4 + 3] ^= 0x80;
        let f = m.select(&GEO, false, &list).unwrap_err();
        assert_eq!(f.field.map(|p| (p.byte, p.bit)), Some((7, Some(7))));
        m.reset();
        assert!(!m.d_sense());
    }
}
