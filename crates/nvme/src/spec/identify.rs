//! Identify's CNS and CSI values and its smaller data structures: the active namespace ID list,
//! the namespace identification descriptors, and the I/O command set specific structures Linux
//! asks for (NVMe Base Specification 2.0 section 5.17.2, figures 274, 279-283; NVM Command Set
//! Specification 1.0 section 4.1.5, figures 96-101). Identify Controller and Identify Namespace
//! are in [`super::identify_ctrl`] and [`super::identify_ns`].
//!
//! What a Linux 6.x host asks, after Identify Controller (CNS 01h): CNS 06h with CSI 0 (NVM)
//! for the Write Zeroes and DSM limits whenever the subsystem is an I/O subsystem with
//! VS >= 1.2 (an error makes it stop asking); CNS 02h to list namespaces; CNS 03h per
//! namespace (VS >= 1.3); CNS 08h per namespace when VS >= 2.0 or CAP.CRIMS, else CNS 00h;
//! CNS 00h for the block size; and CNS 05h with CSI 0 only when CTRATT.ELBAS is set. SPDK's
//! target answers all of these (and CNS 07h and 1Ch).

use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Controller or Namespace Structure values (CNS; NVMe 2.0 figure 274).
pub mod cns {
    /// Identify Namespace for NSID (NVM command set).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list: active NSIDs greater than NSID.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list for NSID.
    pub const NS_ID_DESCRIPTOR_LIST: u8 = 0x03;
    /// NVM Set list.
    pub const NVM_SET_LIST: u8 = 0x04;
    /// I/O Command Set specific Identify Namespace (CSI in CDW11).
    pub const NS_IOCS: u8 = 0x05;
    /// I/O Command Set specific Identify Controller (CSI in CDW11).
    pub const CTRLR_IOCS: u8 = 0x06;
    /// Active Namespace ID list of one I/O command set.
    pub const ACTIVE_NS_LIST_IOCS: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace.
    pub const NS_IOCS_INDEPENDENT: u8 = 0x08;
    /// Allocated Namespace ID list.
    pub const ALLOCATED_NS_LIST: u8 = 0x10;
    /// Identify Namespace for an allocated NSID.
    pub const NS_ALLOCATED: u8 = 0x11;
    /// Controllers attached to NSID.
    pub const NS_ATTACHED_CTRLR_LIST: u8 = 0x12;
    /// Controllers in the subsystem.
    pub const CTRLR_LIST: u8 = 0x13;
    /// Primary Controller Capabilities.
    pub const PRIMARY_CTRLR_CAP: u8 = 0x14;
    /// Secondary Controller list.
    pub const SECONDARY_CTRLR_LIST: u8 = 0x15;
    /// Namespace Granularity list.
    pub const NS_GRANULARITY_LIST: u8 = 0x16;
    /// UUID list.
    pub const UUID_LIST: u8 = 0x17;
    /// Domain list.
    pub const DOMAIN_LIST: u8 = 0x18;
    /// Endurance Group list.
    pub const ENDURANCE_GROUP_LIST: u8 = 0x19;
    /// Allocated Namespace ID list of one I/O command set.
    pub const ALLOCATED_NS_LIST_IOCS: u8 = 0x1a;
    /// I/O command set specific Identify Namespace for an allocated NSID.
    pub const NS_ALLOCATED_IOCS: u8 = 0x1b;
    /// I/O Command Set data structure (the supported command set combinations).
    pub const IOCS: u8 = 0x1c;
}

/// Command Set Identifier values (CSI; NVMe 2.0 figure 285).
pub mod csi {
    /// NVM Command Set.
    pub const NVM: u8 = 0x00;
    /// Key Value Command Set.
    pub const KV: u8 = 0x01;
    /// Zoned Namespace Command Set.
    pub const ZNS: u8 = 0x02;
}

/// NSID meaning every namespace (broadcast) in Get Log Page, Flush and others.
pub const NSID_ALL: u32 = 0xffff_ffff;

/// A Namespace ID list (CNS 02h, 07h, 10h, 1Ah; NVMe 2.0 figure 279): up to 1024 NSIDs in
/// increasing order, ending at the first zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceList {
    /// The list's entries; unused entries are zero.
    pub ids: [u32; 1024],
}

impl Default for NamespaceList {
    fn default() -> Self {
        NamespaceList { ids: [0; 1024] }
    }
}

impl NamespaceList {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Number of entries.
    pub const ENTRIES: usize = 1024;

    /// The answer to CNS 02h with NSID `after`: the IDs in `active` greater than `after`, in
    /// increasing order, at most 1024 of them (`active` need not be sorted; zeros and
    /// duplicates are skipped). SPDK refuses `after` of FFFFFFFEh and FFFFFFFFh with Invalid
    /// Namespace or Format before getting here.
    pub fn after(active: impl IntoIterator<Item = u32>, after: u32) -> NamespaceList {
        let mut ids = [0u32; Self::ENTRIES];
        let mut count = 0;
        for id in active.into_iter().filter(|&id| id > after) {
            if ids[..count].contains(&id) {
                continue;
            }
            if count < Self::ENTRIES {
                ids[count] = id;
                count += 1;
            } else if let Some(max) = ids.iter_mut().max() {
                // Full: keep the 1024 smallest.
                if id < *max {
                    *max = id;
                }
            }
        }
        ids[..count].sort_unstable();
        NamespaceList { ids }
    }

    /// The NSIDs before the first zero entry.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied().take_while(|&id| id != 0)
    }

    /// Writes the list.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        for (i, id) in self.ids.iter().enumerate() {
            put_u32(out, 4 * i, *id);
        }
    }

    /// Reads a list.
    pub fn decode(b: &[u8; Self::SIZE]) -> NamespaceList {
        let mut ids = [0; 1024];
        for (i, id) in ids.iter_mut().enumerate() {
            *id = u32_at(b, 4 * i);
        }
        NamespaceList { ids }
    }
}

/// Namespace Identifier Type values (NIDT; NVMe 2.0 figure 281).
pub mod nidt {
    /// IEEE Extended Unique Identifier, 8 bytes.
    pub const EUI64: u8 = 0x01;
    /// Namespace Globally Unique Identifier, 16 bytes.
    pub const NGUID: u8 = 0x02;
    /// Namespace UUID, 16 bytes.
    pub const UUID: u8 = 0x03;
    /// Command Set Identifier, 1 byte.
    pub const CSI: u8 = 0x04;
}

/// One Namespace Identification Descriptor (CNS 03h; NVMe 2.0 figures 280-281): a 4-byte
/// header (NIDT, NIDL, 2 reserved) followed by NIDL bytes of identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NsIdDescriptor {
    /// IEEE EUI-64 (type 1, length 8).
    Eui64([u8; 8]),
    /// NGUID (type 2, length 16).
    Nguid([u8; 16]),
    /// UUID (type 3, length 16).
    Uuid([u8; 16]),
    /// Command Set Identifier (type 4, length 1).
    Csi(u8),
    /// A descriptor of another type, skipped by its length.
    Unknown {
        /// Namespace Identifier Type.
        nidt: u8,
        /// Namespace Identifier Length.
        nidl: u8,
    },
    /// A known type with the wrong length, or a descriptor running past the buffer: the list
    /// cannot be read further (Linux stops there too).
    Malformed {
        /// Namespace Identifier Type.
        nidt: u8,
        /// Namespace Identifier Length.
        nidl: u8,
    },
}

impl NsIdDescriptor {
    /// Size of the descriptor header.
    pub const HEADER_SIZE: usize = 4;

    /// The descriptor's type and identifier bytes (`None` for `Unknown` and `Malformed`).
    fn parts(&self) -> Option<(u8, &[u8])> {
        match self {
            NsIdDescriptor::Eui64(v) => Some((nidt::EUI64, v)),
            NsIdDescriptor::Nguid(v) => Some((nidt::NGUID, v)),
            NsIdDescriptor::Uuid(v) => Some((nidt::UUID, v)),
            NsIdDescriptor::Csi(v) => Some((nidt::CSI, std::slice::from_ref(v))),
            _ => None,
        }
    }

    /// Writes `descs` one after another into `out` (a 4096-byte Identify buffer), zero-filling
    /// the rest so the list ends with a zero NIDL. Descriptors that do not fit, and `Unknown`
    /// or `Malformed` ones, are left out; returns how many were written.
    pub fn write_list(descs: &[NsIdDescriptor], out: &mut [u8]) -> usize {
        out.fill(0);
        let mut pos = 0;
        let mut n = 0;
        for (t, id) in descs.iter().filter_map(NsIdDescriptor::parts) {
            let end = pos + Self::HEADER_SIZE + id.len();
            // Leave room for a terminating zero header, as SPDK does.
            if end >= out.len() {
                break;
            }
            out[pos] = t;
            out[pos + 1] = id.len() as u8;
            out[pos + Self::HEADER_SIZE..end].copy_from_slice(id);
            pos = end;
            n += 1;
        }
        n
    }

    /// Reads the descriptors in `buf` up to a zero NIDL, the end of the buffer, or the first
    /// malformed one (which is yielded last).
    pub fn read_list(buf: &[u8]) -> NsIdDescriptorIter<'_> {
        NsIdDescriptorIter { buf, done: false }
    }
}

/// Iterator over a namespace identification descriptor list; see [`NsIdDescriptor::read_list`].
#[derive(Clone, Debug)]
pub struct NsIdDescriptorIter<'a> {
    buf: &'a [u8],
    done: bool,
}

impl Iterator for NsIdDescriptorIter<'_> {
    type Item = NsIdDescriptor;

    fn next(&mut self) -> Option<NsIdDescriptor> {
        if self.done {
            return None;
        }
        let (&[t, l, _, _], rest) = self.buf.split_first_chunk::<4>()?;
        if l == 0 {
            self.done = true;
            return None;
        }
        let Some((id, rest)) = rest.split_at_checked(l as usize) else {
            self.done = true;
            return Some(NsIdDescriptor::Malformed { nidt: t, nidl: l });
        };
        self.buf = rest;
        let d = match (t, id.len()) {
            (nidt::EUI64, 8) => id.try_into().map(NsIdDescriptor::Eui64).ok(),
            (nidt::NGUID, 16) => id.try_into().map(NsIdDescriptor::Nguid).ok(),
            (nidt::UUID, 16) => id.try_into().map(NsIdDescriptor::Uuid).ok(),
            (nidt::CSI, 1) => Some(NsIdDescriptor::Csi(id[0])),
            (nidt::EUI64..=nidt::CSI, _) => None,
            _ => Some(NsIdDescriptor::Unknown { nidt: t, nidl: l }),
        };
        Some(d.unwrap_or_else(|| {
            self.done = true;
            NsIdDescriptor::Malformed { nidt: t, nidl: l }
        }))
    }
}

/// I/O Command Set specific Identify Controller for the NVM command set (CNS 06h, CSI 00h;
/// NVM Command Set 1.0 figure 100; SPDK `struct spdk_nvme_nvm_ctrlr_data`, Linux
/// `struct nvme_id_ctrl_nvm`). Linux reads WZSL, DMRL and DMRSL from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NvmIdentifyController {
    /// Verify Size Limit (VSL, byte 0): 2 ^ VSL minimum pages; 0 for no limit.
    pub vsl: u8,
    /// Write Zeroes Size Limit (WZSL, byte 1): 2 ^ WZSL minimum pages; 0 for no limit.
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit (WUSL, byte 2).
    pub wusl: u8,
    /// Dataset Management Ranges Limit (DMRL, byte 3): ranges per command; 0 for no limit.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit (DMRSL, bytes 7:4): blocks per range.
    pub dmrsl: u32,
    /// Dataset Management Size Limit (DMSL, bytes 15:8): blocks per command.
    pub dmsl: u64,
}

impl NvmIdentifyController {
    /// Size in bytes.
    pub const SIZE: usize = 4096;

    /// Writes the data.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        out[..4].copy_from_slice(&[self.vsl, self.wzsl, self.wusl, self.dmrl]);
        put_u32(out, 4, self.dmrsl);
        put_u64(out, 8, self.dmsl);
    }

    /// Reads the data.
    pub fn decode(b: &[u8; Self::SIZE]) -> NvmIdentifyController {
        NvmIdentifyController { vsl: b[0], wzsl: b[1], wusl: b[2], dmrl: b[3], dmrsl: u32_at(b, 4), dmsl: u64_at(b, 8) }
    }
}

/// Extended LBA Format (NVM Command Set 1.0 figure 102).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExtendedLbaFormat {
    /// Storage Tag Size (STS, bits 6:0).
    pub sts: u8,
    /// Protection Information Format (PIF, bits 8:7): 0 16-bit guard, 1 32-bit, 2 64-bit.
    pub pif: u8,
}

impl ExtendedLbaFormat {
    /// The format's dword.
    pub const fn to_u32(&self) -> u32 {
        (self.sts & 0x7f) as u32 | ((self.pif & 3) as u32) << 7
    }

    /// The fields of a format dword.
    pub const fn from_u32(v: u32) -> ExtendedLbaFormat {
        ExtendedLbaFormat { sts: (v & 0x7f) as u8, pif: ((v >> 7) & 3) as u8 }
    }
}

/// I/O Command Set specific Identify Namespace for the NVM command set (CNS 05h, CSI 00h; NVM
/// Command Set 1.0 figure 101; SPDK `struct spdk_nvme_nvm_ns_data`, Linux
/// `struct nvme_id_ns_nvm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NvmIdentifyNamespace {
    /// Logical Block Storage Tag Mask (LBSTM, bytes 7:0).
    pub lbstm: u64,
    /// Protection Information Capabilities (PIC, byte 8).
    pub pic: u8,
    /// Extended LBA Formats 0-63 (bytes 267:12), matching the LBA formats of CNS 00h.
    pub elbaf: [ExtendedLbaFormat; 64],
}

impl Default for NvmIdentifyNamespace {
    fn default() -> Self {
        NvmIdentifyNamespace { lbstm: 0, pic: 0, elbaf: [ExtendedLbaFormat::default(); 64] }
    }
}

impl NvmIdentifyNamespace {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Byte offset of extended LBA format 0.
    pub const OFFSET_ELBAF: usize = 12;

    /// Writes the data.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u64(out, 0, self.lbstm);
        out[8] = self.pic;
        for (i, f) in self.elbaf.iter().enumerate() {
            put_u32(out, Self::OFFSET_ELBAF + 4 * i, f.to_u32());
        }
    }

    /// Reads the data.
    pub fn decode(b: &[u8; Self::SIZE]) -> NvmIdentifyNamespace {
        let mut elbaf = [ExtendedLbaFormat::default(); 64];
        for (i, f) in elbaf.iter_mut().enumerate() {
            *f = ExtendedLbaFormat::from_u32(u32_at(b, Self::OFFSET_ELBAF + 4 * i));
        }
        NvmIdentifyNamespace { lbstm: u64_at(b, 0), pic: b[8], elbaf }
    }
}

/// I/O Command Set Independent Identify Namespace (CNS 08h; NVMe 2.0 figure 283; SPDK
/// `struct spdk_nvme_ns_iocs_independent_data`, Linux `struct nvme_id_ns_cs_indep`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IoCsIndependentNamespace {
    /// Common Namespace Features (NSFEAT, byte 0); [`cs_indep_nsfeat`].
    pub nsfeat: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities (NMIC, byte 1).
    pub nmic: u8,
    /// Reservation Capabilities (RESCAP, byte 2).
    pub rescap: u8,
    /// Format Progress Indicator (FPI, byte 3).
    pub fpi: u8,
    /// ANA Group Identifier (ANAGRPID, bytes 7:4).
    pub anagrpid: u32,
    /// Namespace Attributes (NSATTR, byte 8): bit 0 write protected.
    pub nsattr: u8,
    /// NVM Set Identifier (NVMSETID, bytes 11:10).
    pub nvmsetid: u16,
    /// Endurance Group Identifier (ENDGID, bytes 13:12).
    pub endgid: u16,
    /// Namespace Status (NSTAT, byte 14): bit 0 Namespace Ready. Linux treats a namespace whose
    /// NRDY is clear as not ready, so a target must set it (SPDK does).
    pub nstat: u8,
}

/// NSFEAT bits of [`IoCsIndependentNamespace`] (differ from the NVM Identify Namespace's).
pub mod cs_indep_nsfeat {
    /// NGUID and EUI64 are never reused.
    pub const UID_REUSE: u8 = 1 << 3;
    /// Rotational media (Linux `NVME_NS_ROTATIONAL`).
    pub const ROTATIONAL: u8 = 1 << 4;
    /// No volatile write cache for this namespace (Linux `NVME_NS_VWC_NOT_PRESENT`).
    pub const VWC_NOT_PRESENT: u8 = 1 << 5;
}

/// NSTAT bit: the namespace is ready.
pub const NSTAT_READY: u8 = 1 << 0;

impl IoCsIndependentNamespace {
    /// Size in bytes.
    pub const SIZE: usize = 4096;

    /// Writes the data.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        out[..4].copy_from_slice(&[self.nsfeat, self.nmic, self.rescap, self.fpi]);
        put_u32(out, 4, self.anagrpid);
        out[8] = self.nsattr;
        put_u16(out, 10, self.nvmsetid);
        put_u16(out, 12, self.endgid);
        out[14] = self.nstat;
    }

    /// Reads the data.
    pub fn decode(b: &[u8; Self::SIZE]) -> IoCsIndependentNamespace {
        IoCsIndependentNamespace {
            nsfeat: b[0],
            nmic: b[1],
            rescap: b[2],
            fpi: b[3],
            anagrpid: u32_at(b, 4),
            nsattr: b[8],
            nvmsetid: u16_at(b, 10),
            endgid: u16_at(b, 12),
            nstat: b[14],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn namespace_list() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_ns_list) == 4096): uint32_t ns_list[1024].
        let l = NamespaceList::after([7, 3, 1, 3, 0, 9], 1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![3, 7, 9]);
        let mut b = [0xffu8; 4096];
        l.encode(&mut b);
        assert_eq!(&b[..16], &[3, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(NamespaceList::decode(&b), l);
        let many = NamespaceList::after((1..=5000).rev(), 0);
        assert_eq!(many.iter().count(), 1024);
        assert_eq!((many.ids[0], many.ids[1023]), (1, 1024));
        assert_eq!(NamespaceList::after([1, 2], 2).iter().count(), 0);
    }

    #[test]
    fn descriptors_match_spdk_layout() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_ns_id_desc) == 4): nidt, nidl, 2 reserved,
        // then nid. SPDK writes EUI64, NGUID, UUID, CSI in that order, skipping zero ones.
        let descs = [
            NsIdDescriptor::Eui64([1; 8]),
            NsIdDescriptor::Nguid([2; 16]),
            NsIdDescriptor::Uuid([3; 16]),
            NsIdDescriptor::Csi(csi::NVM),
        ];
        let mut b = [0xaau8; 4096];
        assert_eq!(NsIdDescriptor::write_list(&descs, &mut b), 4);
        assert_eq!(&b[..12], &[1, 8, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(&b[12..16], &[2, 16, 0, 0]);
        assert_eq!(&b[32..36], &[3, 16, 0, 0]);
        assert_eq!(&b[52..57], &[4, 1, 0, 0, 0]);
        assert!(b[57..].iter().all(|&x| x == 0));
        assert_eq!(NsIdDescriptor::read_list(&b).collect::<Vec<_>>(), descs.to_vec());
    }

    #[test]
    fn descriptor_list_edges() {
        // Unknown types are skipped by length; a wrong length for a known type stops the list.
        let b = [9, 2, 0, 0, 0xaa, 0xbb, 4, 1, 0, 0, 2, 1, 4, 0, 0, 1, 2, 3, 4, 1, 8, 0, 0];
        let got: Vec<_> = NsIdDescriptor::read_list(&b).collect();
        assert_eq!(
            got,
            vec![
                NsIdDescriptor::Unknown { nidt: 9, nidl: 2 },
                NsIdDescriptor::Csi(2),
                NsIdDescriptor::Malformed { nidt: 1, nidl: 4 },
            ]
        );
        let got: Vec<_> = NsIdDescriptor::read_list(&[2, 16, 0, 0, 1, 2]).collect();
        assert_eq!(got, vec![NsIdDescriptor::Malformed { nidt: 2, nidl: 16 }]);
        assert_eq!(NsIdDescriptor::read_list(&[1, 8]).count(), 0);
        let mut small = [0u8; 10];
        assert_eq!(NsIdDescriptor::write_list(&[NsIdDescriptor::Eui64([1; 8])], &mut small), 0);
    }

    #[test]
    fn iocs_structures_match_spdk() {
        // spdk_nvme_nvm_ctrlr_data: vsl 0, wzsl 1, wusl 2, dmrl 3, dmrsl 4, dmsl 8.
        let c = NvmIdentifyController { vsl: 1, wzsl: 2, wusl: 3, dmrl: 4, dmrsl: 0x0807_0605, dmsl: 9 };
        let mut b = [0u8; 4096];
        c.encode(&mut b);
        assert_eq!(&b[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(NvmIdentifyController::decode(&b), c);
        // spdk_nvme_nvm_ns_data: lbstm 0, pic 8, elbaf 12 (sts:7, pif:2).
        let mut n = NvmIdentifyNamespace { lbstm: 0x0102, pic: 7, ..Default::default() };
        n.elbaf[0] = ExtendedLbaFormat { sts: 0x7f, pif: 2 };
        n.elbaf[63] = ExtendedLbaFormat { sts: 1, pif: 1 };
        n.encode(&mut b);
        assert_eq!(&b[..13], &[2, 1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0x7f]);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 0x17f);
        assert_eq!(u32::from_le_bytes(b[264..268].try_into().unwrap()), 0x81);
        assert_eq!(NvmIdentifyNamespace::decode(&b), n);
        // spdk_nvme_ns_iocs_independent_data: nsfeat 0, nmic 1, rescap 2, fpi 3, anagrpid 4,
        // nsattr 8, nvmsetid 10, endgid 12, nstat 14.
        let i = IoCsIndependentNamespace {
            nsfeat: cs_indep_nsfeat::VWC_NOT_PRESENT,
            nmic: 1,
            rescap: 2,
            fpi: 3,
            anagrpid: 4,
            nsattr: 1,
            nvmsetid: 10,
            endgid: 12,
            nstat: NSTAT_READY,
        };
        i.encode(&mut b);
        assert_eq!(&b[..15], &[0x20, 1, 2, 3, 4, 0, 0, 0, 1, 0, 10, 0, 12, 0, 1]);
        assert_eq!(IoCsIndependentNamespace::decode(&b), i);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 4096>(any::<u8>())) {
            let l = NamespaceList::decode(&b);
            let mut e = [0u8; 4096];
            l.encode(&mut e);
            prop_assert_eq!(e, b);
            let c = NvmIdentifyController::decode(&b);
            c.encode(&mut e);
            prop_assert_eq!(NvmIdentifyController::decode(&e), c);
            let n = NvmIdentifyNamespace::decode(&b);
            n.encode(&mut e);
            prop_assert_eq!(NvmIdentifyNamespace::decode(&e), n);
            let i = IoCsIndependentNamespace::decode(&b);
            i.encode(&mut e);
            prop_assert_eq!(IoCsIndependentNamespace::decode(&e), i);
            // Descriptor lists: never panic, and the well-formed ones re-encode identically.
            let descs: Vec<_> = NsIdDescriptor::read_list(&b).collect();
            let good: Vec<_> = descs.iter().copied()
                .filter(|d| !matches!(d, NsIdDescriptor::Unknown { .. } | NsIdDescriptor::Malformed { .. }))
                .collect();
            NsIdDescriptor::write_list(&good, &mut e);
            let again: Vec<_> = NsIdDescriptor::read_list(&e).collect();
            prop_assert_eq!(again, good);
        }

        #[test]
        fn descriptor_round_trip(eui in any::<[u8; 8]>(), g in any::<[u8; 16]>(), c in any::<u8>()) {
            let descs = [NsIdDescriptor::Csi(c), NsIdDescriptor::Uuid(g), NsIdDescriptor::Eui64(eui)];
            let mut b = [0u8; 4096];
            NsIdDescriptor::write_list(&descs, &mut b);
            prop_assert_eq!(NsIdDescriptor::read_list(&b).collect::<Vec<_>>(), descs.to_vec());
        }
    }
}
