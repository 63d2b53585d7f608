//! The Discovery log page (LID 70h) a discovery controller returns: a 1024-byte header and
//! 1024-byte entries, one per subsystem port (NVMe over Fabrics 1.1 section 5.3, figures
//! 32-33; NVMe/TCP Transport Specification 1.0 section 3.3 for the TCP TSAS; SPDK
//! `struct spdk_nvmf_discovery_log_page(_entry)`, Linux `struct nvmf_disc_rsp_page_hdr/entry`).

use super::le::{arr, pad_field, put, put_u16, put_u32, put_u64, trim_field, u16_at, u32_at, u64_at};
use super::log::{LogCursor, LogRangeError};
use super::nqn::{NqnField, NQN_FIELD_LEN};

/// Transport Type values (TRTYPE; NVMe-oF 1.1 figure 33).
pub mod trtype {
    /// RDMA.
    pub const RDMA: u8 = 0x1;
    /// Fibre Channel.
    pub const FC: u8 = 0x2;
    /// TCP.
    pub const TCP: u8 = 0x3;
    /// Intra-host (loopback; reserved for host use).
    pub const INTRA_HOST: u8 = 0xfe;
}

/// Address Family values (ADRFAM).
pub mod adrfam {
    /// IPv4.
    pub const IPV4: u8 = 0x1;
    /// IPv6.
    pub const IPV6: u8 = 0x2;
    /// InfiniBand.
    pub const IB: u8 = 0x3;
    /// Fibre Channel.
    pub const FC: u8 = 0x4;
    /// Intra-host.
    pub const INTRA_HOST: u8 = 0xfe;
}

/// Subsystem Type values (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 0x1;
    /// An NVM subsystem.
    pub const NVME: u8 = 0x2;
    /// The current discovery subsystem (TP 8013).
    pub const DISCOVERY_CURRENT: u8 = 0x3;
}

/// Transport Requirements bits (TREQ).
pub mod treq {
    /// Secure channel requirement (bits 1:0) mask.
    pub const SECURE_CHANNEL_MASK: u8 = 0x3;
    /// Secure channel: not specified.
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0x0;
    /// Secure channel: required (SPDK sets it for TLS listeners).
    pub const SECURE_CHANNEL_REQUIRED: u8 = 0x1;
    /// Secure channel: not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 0x2;
    /// SQ flow control disable supported (bit 2; NVMe-oF 1.1, Linux
    /// `NVMF_TREQ_DISABLE_SQFLOW`; SPDK's struct has it reserved).
    pub const DISABLE_SQFLOW: u8 = 1 << 2;
}

/// Entry Flags bits (EFLAGS; TP 8013/8014).
pub mod eflags {
    /// Duplicate Returned Information.
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery.
    pub const EPCSD: u16 = 1 << 1;
}

/// Security Type of the NVMe/TCP TSAS (SECTYPE, TSAS byte 0; NVMe/TCP 1.0 figure 6).
pub mod tcp_sectype {
    /// No security.
    pub const NONE: u8 = 0x0;
    /// TLS 1.2.
    pub const TLS12: u8 = 0x1;
    /// TLS 1.3 (what SPDK reports for its TLS listeners).
    pub const TLS13: u8 = 0x2;
}

/// Discovery log page header (bytes 1023:0 of the page; SPDK
/// `struct spdk_nvmf_discovery_log_page`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DiscoveryLogHeader {
    /// Generation Counter (GENCTR, bytes 7:0): changes whenever the log does; a host reading
    /// in pieces reads it again at the end and restarts if it moved.
    pub genctr: u64,
    /// Number of Records (NUMREC, bytes 15:8).
    pub numrec: u64,
    /// Record Format (RECFMT, bytes 17:16): 0.
    pub recfmt: u16,
    /// Discovery Log Page Flags (DLPF, byte 18; TP 8013/8014 extended entries; reserved in
    /// Linux's header). Bit 0 extended entries, bit 1 port local, bit 2 all subsystems.
    pub dlpf: u8,
    /// Total Discovery Log Page Length (TDLPL, bytes 23:20) with extended entries.
    pub tdlpl: u32,
}

impl DiscoveryLogHeader {
    /// Size in bytes.
    pub const SIZE: usize = 1024;

    /// Writes the header.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u64(out, 0, self.genctr);
        put_u64(out, 8, self.numrec);
        put_u16(out, 16, self.recfmt);
        out[18] = self.dlpf;
        put_u32(out, 20, self.tdlpl);
    }

    /// Reads a header.
    pub fn decode(b: &[u8; Self::SIZE]) -> DiscoveryLogHeader {
        DiscoveryLogHeader {
            genctr: u64_at(b, 0),
            numrec: u64_at(b, 8),
            recfmt: u16_at(b, 16),
            dlpf: b[18],
            tdlpl: u32_at(b, 20),
        }
    }
}

/// One discovery log page entry (SPDK `struct spdk_nvmf_discovery_log_page_entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DiscoveryLogEntry {
    /// Transport Type (TRTYPE, byte 0); [`trtype`].
    pub trtype: u8,
    /// Address Family (ADRFAM, byte 1); [`adrfam`].
    pub adrfam: u8,
    /// Subsystem Type (SUBTYPE, byte 2); [`subtype`].
    pub subtype: u8,
    /// Transport Requirements (TREQ, byte 3); [`treq`].
    pub treq: u8,
    /// Port ID (PORTID, bytes 5:4).
    pub portid: u16,
    /// Controller ID (CNTLID, bytes 7:6): FFFFh for a dynamic subsystem.
    pub cntlid: u16,
    /// Admin Max SQ Size (ASQSZ, bytes 9:8): at least 32.
    pub asqsz: u16,
    /// Entry Flags (EFLAGS, bytes 11:10); [`eflags`].
    pub eflags: u16,
    /// Transport Service Identifier (TRSVCID, bytes 63:32): the TCP port as ASCII text.
    pub trsvcid: [u8; 32],
    /// Subsystem NQN (SUBNQN, bytes 511:256).
    pub subnqn: NqnField,
    /// Transport Address (TRADDR, bytes 767:512): the IP address as ASCII text.
    pub traddr: [u8; 256],
    /// Transport Specific Address Subtype (TSAS, bytes 1023:768); for TCP byte 0 is
    /// SECTYPE ([`tcp_sectype`]).
    pub tsas: [u8; 256],
}

impl Default for DiscoveryLogEntry {
    fn default() -> Self {
        DiscoveryLogEntry {
            trtype: 0,
            adrfam: 0,
            subtype: 0,
            treq: 0,
            portid: 0,
            cntlid: 0,
            asqsz: 0,
            eflags: 0,
            trsvcid: [0; 32],
            subnqn: NqnField::default(),
            traddr: [0; 256],
            tsas: [0; 256],
        }
    }
}

impl DiscoveryLogEntry {
    /// Size in bytes.
    pub const SIZE: usize = 1024;
    /// Byte offset of TRSVCID.
    pub const OFFSET_TRSVCID: usize = 32;
    /// Byte offset of SUBNQN.
    pub const OFFSET_SUBNQN: usize = 256;
    /// Byte offset of TRADDR.
    pub const OFFSET_TRADDR: usize = 512;
    /// Byte offset of TSAS.
    pub const OFFSET_TSAS: usize = 768;

    /// An NVMe/TCP entry for subsystem `subnqn` listening at `traddr`:`trsvcid`, as SPDK's
    /// target fills it: dynamic controller, secure channel not required, no TLS. The address
    /// fields are space padded as SPDK does (Linux's target NUL pads; both readers trim).
    pub fn tcp(
        subnqn: NqnField,
        adrfam: u8,
        traddr: &str,
        trsvcid: &str,
        portid: u16,
        asqsz: u16,
    ) -> DiscoveryLogEntry {
        let mut e = DiscoveryLogEntry {
            trtype: trtype::TCP,
            adrfam,
            subtype: subtype::NVME,
            treq: treq::SECURE_CHANNEL_NOT_REQUIRED,
            portid,
            cntlid: 0xffff,
            asqsz,
            subnqn,
            ..DiscoveryLogEntry::default()
        };
        pad_field(&mut e.trsvcid, trsvcid.as_bytes(), b' ');
        pad_field(&mut e.traddr, traddr.as_bytes(), b' ');
        e.tsas[0] = tcp_sectype::NONE;
        e
    }

    /// TRADDR without its padding (spaces or NULs).
    pub fn traddr_text(&self) -> &[u8] {
        trim_field(&self.traddr)
    }

    /// TRSVCID without its padding (spaces or NULs).
    pub fn trsvcid_text(&self) -> &[u8] {
        trim_field(&self.trsvcid)
    }

    /// The NVMe/TCP Security Type (TSAS byte 0).
    pub const fn tcp_sectype(&self) -> u8 {
        self.tsas[0]
    }

    /// Writes the entry.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        out[..4].copy_from_slice(&[self.trtype, self.adrfam, self.subtype, self.treq]);
        put_u16(out, 4, self.portid);
        put_u16(out, 6, self.cntlid);
        put_u16(out, 8, self.asqsz);
        put_u16(out, 10, self.eflags);
        put(out, Self::OFFSET_TRSVCID, &self.trsvcid);
        put(out, Self::OFFSET_SUBNQN, &self.subnqn.0);
        put(out, Self::OFFSET_TRADDR, &self.traddr);
        put(out, Self::OFFSET_TSAS, &self.tsas);
    }

    /// Reads an entry.
    pub fn decode(b: &[u8; Self::SIZE]) -> DiscoveryLogEntry {
        DiscoveryLogEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: u16_at(b, 4),
            cntlid: u16_at(b, 6),
            asqsz: u16_at(b, 8),
            eflags: u16_at(b, 10),
            trsvcid: arr(b, Self::OFFSET_TRSVCID),
            subnqn: NqnField(arr::<NQN_FIELD_LEN>(b, Self::OFFSET_SUBNQN)),
            traddr: arr(b, Self::OFFSET_TRADDR),
            tsas: arr(b, Self::OFFSET_TSAS),
        }
    }
}

/// Serves a Get Log Page range of the discovery log made of `header` and `entries`, without
/// building the page: checks the offset as SPDK does (dword aligned, before the end), encodes
/// only the parts that overlap the range into `out` and zeroes the rest; returns the bytes
/// copied. `header.numrec` is written as given.
pub fn read_discovery_log(
    header: &DiscoveryLogHeader,
    entries: &[DiscoveryLogEntry],
    offset: u64,
    out: &mut [u8],
) -> Result<usize, LogRangeError> {
    if offset & 3 != 0 {
        return Err(LogRangeError::Unaligned);
    }
    let size = (DiscoveryLogHeader::SIZE + DiscoveryLogEntry::SIZE * entries.len()) as u64;
    if offset >= size {
        return Err(LogRangeError::PastEnd);
    }
    let mut c = LogCursor::new(out, offset);
    let mut b = [0u8; 1024];
    if !c.skip(DiscoveryLogHeader::SIZE) {
        header.encode(&mut b);
        c.push(&b);
    }
    for e in entries {
        if c.is_full() {
            break;
        }
        if !c.skip(DiscoveryLogEntry::SIZE) {
            e.encode(&mut b);
            c.push(&b);
        }
    }
    Ok(c.written())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(i: u16) -> DiscoveryLogEntry {
        DiscoveryLogEntry::tcp(
            NqnField::new(&format!("nqn.2016-06.io.spdk:cnode{i}")).unwrap(),
            adrfam::IPV4,
            "127.0.0.1",
            "4420",
            i,
            128,
        )
    }

    #[test]
    fn header_matches_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvmf_discovery_log_page) == 1024); offsetof:
        // numrec 8, recfmt 16, dlpf 18, tdlpl 20, entries 1024.
        let h = DiscoveryLogHeader { genctr: 0x0807_0605_0403_0201, numrec: 2, recfmt: 0, dlpf: 1, tdlpl: 0x1234 };
        let mut b = [0u8; 1024];
        h.encode(&mut b);
        assert_eq!(&b[..24], &[1, 2, 3, 4, 5, 6, 7, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x34, 0x12, 0, 0]);
        assert_eq!(DiscoveryLogHeader::decode(&b), h);
    }

    #[test]
    fn entry_matches_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvmf_discovery_log_page_entry) == 1024);
        // offsetof: adrfam 1, subtype 2, treq 3, portid 4, cntlid 6, asqsz 8, eflags 10,
        // trsvcid 32, subnqn 256, traddr 512, tsas 768.
        let mut e = entry(1);
        e.eflags = eflags::EPCSD;
        e.tsas[0] = tcp_sectype::TLS13;
        let mut b = [0u8; 1024];
        e.encode(&mut b);
        assert_eq!(&b[..12], &[3, 1, 2, 2, 1, 0, 0xff, 0xff, 128, 0, 2, 0]);
        assert_eq!(&b[32..38], b"4420  ");
        assert_eq!(&b[256..282], b"nqn.2016-06.io.spdk:cnode1");
        assert_eq!(&b[512..522], b"127.0.0.1 ");
        assert_eq!(b[768], 2);
        assert_eq!(DiscoveryLogEntry::decode(&b), e);
        assert_eq!(e.traddr_text(), b"127.0.0.1");
        assert_eq!(e.trsvcid_text(), b"4420");
        // Linux's target NUL pads; the same accessors trim that too.
        b[516..768].fill(0);
        assert_eq!(DiscoveryLogEntry::decode(&b).traddr_text(), b"127.");
    }

    #[test]
    fn reads_any_range() {
        let h = DiscoveryLogHeader { genctr: 9, numrec: 3, ..Default::default() };
        let entries = [entry(1), entry(2), entry(3)];
        let mut full = vec![0u8; 4096];
        assert_eq!(read_discovery_log(&h, &entries, 0, &mut full), Ok(4096));
        for off in (0..4096).step_by(508) {
            for len in [4usize, 1024, 1500, 5000] {
                let mut part = vec![0xaau8; len];
                let n = read_discovery_log(&h, &entries, off as u64, &mut part).unwrap();
                assert_eq!(&part[..n], &full[off..(off + len).min(4096)]);
                assert!(part[n..].iter().all(|&x| x == 0));
            }
        }
        let mut out = [0u8; 8];
        assert_eq!(read_discovery_log(&h, &entries, 4096, &mut out), Err(LogRangeError::PastEnd));
        assert_eq!(read_discovery_log(&h, &entries, 6, &mut out), Err(LogRangeError::Unaligned));
        // The header alone (no entries) is a valid page.
        assert_eq!(read_discovery_log(&h, &[], 1020, &mut out), Ok(4));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 1024>(any::<u8>())) {
            let e = DiscoveryLogEntry::decode(&b);
            let mut out = [0u8; 1024];
            e.encode(&mut out);
            // Every byte of an entry is kept except the reserved ones.
            prop_assert_eq!(DiscoveryLogEntry::decode(&out), e);
            prop_assert_eq!(&out[256..], &b[256..]);
            let h = DiscoveryLogHeader::decode(&b);
            h.encode(&mut out);
            prop_assert_eq!(DiscoveryLogHeader::decode(&out), h);
            let _ = e.subnqn.as_str();
        }
    }
}
