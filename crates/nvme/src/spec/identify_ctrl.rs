//! Identify Controller data (CNS 01h, 4096 bytes; NVMe Base Specification 2.0 figure 275 and
//! NVMe over Fabrics 1.1 figure 28 for bytes 2047:1792; SPDK `struct spdk_nvme_ctrlr_data`,
//! Linux `struct nvme_id_ctrl`, libnvme `struct nvme_id_ctrl`).
//!
//! The struct has every field SPDK's target fills in (`spdk_nvmf_ctrlr_identify_ctrlr`) and a
//! few neighbours; the bytes it does not name are written as zero. Bit-field bytes are kept as
//! integers with their bits in the constant modules below.

use super::le::{arr, pad_field, put, put_u128, put_u16, put_u32, trim_field, u128_at, u16_at, u32_at};
use super::nqn::{NqnField, NQN_FIELD_LEN};

/// A space-padded ASCII field (SN, MN, FR) holding `s` (truncated to `N` bytes).
pub fn ascii_field<const N: usize>(s: &str) -> [u8; N] {
    let mut f = [b' '; N];
    pad_field(&mut f, s.as_bytes(), b' ');
    f
}

/// The text of a space- or NUL-padded field, without its padding.
pub fn field_text(f: &[u8]) -> &[u8] {
    trim_field(f)
}

/// Power State Descriptor (NVMe 2.0 figure 276; SPDK `struct spdk_nvme_power_state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PowerStateDescriptor {
    /// Maximum Power (MP, bytes 1:0), in 0.01 W or 0.0001 W units per MXPS.
    pub mp: u16,
    /// Max Power Scale (MXPS, byte 3 bit 0).
    pub mxps: bool,
    /// Non-Operational State (NOPS, byte 3 bit 1).
    pub nops: bool,
    /// Entry Latency (ENLAT, bytes 7:4), microseconds.
    pub enlat: u32,
    /// Exit Latency (EXLAT, bytes 11:8), microseconds.
    pub exlat: u32,
    /// Relative Read Throughput (RRT, byte 12 bits 4:0).
    pub rrt: u8,
    /// Relative Read Latency (RRL, byte 13 bits 4:0).
    pub rrl: u8,
    /// Relative Write Throughput (RWT, byte 14 bits 4:0).
    pub rwt: u8,
    /// Relative Write Latency (RWL, byte 15 bits 4:0).
    pub rwl: u8,
    /// Idle Power (IDLP, bytes 17:16).
    pub idlp: u16,
    /// Idle Power Scale (IPS, byte 18 bits 7:6).
    pub ips: u8,
    /// Active Power (ACTP, bytes 21:20).
    pub actp: u16,
    /// Active Power Workload (APW, byte 22 bits 2:0).
    pub apw: u8,
    /// Active Power Scale (APS, byte 22 bits 7:6).
    pub aps: u8,
}

impl PowerStateDescriptor {
    /// Size in bytes.
    pub const SIZE: usize = 32;

    /// Writes the descriptor.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u16(out, 0, self.mp);
        out[3] = self.mxps as u8 | (self.nops as u8) << 1;
        put_u32(out, 4, self.enlat);
        put_u32(out, 8, self.exlat);
        out[12] = self.rrt & 0x1f;
        out[13] = self.rrl & 0x1f;
        out[14] = self.rwt & 0x1f;
        out[15] = self.rwl & 0x1f;
        put_u16(out, 16, self.idlp);
        out[18] = (self.ips & 3) << 6;
        put_u16(out, 20, self.actp);
        out[22] = (self.apw & 7) | (self.aps & 3) << 6;
    }

    /// Reads a descriptor.
    pub fn decode(b: &[u8; Self::SIZE]) -> PowerStateDescriptor {
        PowerStateDescriptor {
            mp: u16_at(b, 0),
            mxps: b[3] & 1 != 0,
            nops: b[3] & 2 != 0,
            enlat: u32_at(b, 4),
            exlat: u32_at(b, 8),
            rrt: b[12] & 0x1f,
            rrl: b[13] & 0x1f,
            rwt: b[14] & 0x1f,
            rwl: b[15] & 0x1f,
            idlp: u16_at(b, 16),
            ips: b[18] >> 6,
            actp: u16_at(b, 20),
            apw: b[22] & 7,
            aps: b[22] >> 6,
        }
    }
}

/// CMIC bits (Controller Multi-Path I/O and Namespace Sharing Capabilities, byte 76).
pub mod cmic {
    /// The subsystem may have more than one port.
    pub const MULTI_PORT: u8 = 1 << 0;
    /// The subsystem may have more than one controller.
    pub const MULTI_CTRL: u8 = 1 << 1;
    /// SR-IOV virtual function.
    pub const SRIOV: u8 = 1 << 2;
    /// Asymmetric Namespace Access Reporting supported.
    pub const ANA_REPORTING: u8 = 1 << 3;
}

/// OAES bits (Optional Asynchronous Events Supported, bytes 95:92).
pub mod oaes {
    /// Namespace Attribute Notices.
    pub const NS_ATTRIBUTE: u32 = 1 << 8;
    /// Firmware Activation Notices.
    pub const FW_ACTIVATION: u32 = 1 << 9;
    /// Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE: u32 = 1 << 11;
    /// Predictable Latency Event Aggregate Log Change Notices.
    pub const PLEA_CHANGE: u32 = 1 << 12;
    /// LBA Status Information Notices.
    pub const LBA_STATUS_INFO: u32 = 1 << 13;
    /// Endurance Group Event Aggregate Log Page Change Notices.
    pub const EGEA_CHANGE: u32 = 1 << 14;
    /// Normal NVM Subsystem Shutdown event.
    pub const NORMAL_SUBSYSTEM_SHUTDOWN: u32 = 1 << 15;
    /// Zone Descriptor Changed Notices (Zoned Namespace command set).
    pub const ZONE_DESCRIPTOR_CHANGE: u32 = 1 << 27;
    /// Discovery Log Page Change Notification (NVMe-oF; discovery controllers).
    pub const DISCOVERY_LOG_CHANGE: u32 = 1 << 31;
}

/// CTRATT bits (Controller Attributes, bytes 99:96).
pub mod ctratt {
    /// 128-bit Host Identifier supported (required over fabrics).
    pub const HOST_ID_128: u32 = 1 << 0;
    /// Non-Operational Power State Permissive Mode.
    pub const NOPSPM: u32 = 1 << 1;
    /// NVM Sets.
    pub const NVM_SETS: u32 = 1 << 2;
    /// Read Recovery Levels.
    pub const READ_RECOVERY_LEVELS: u32 = 1 << 3;
    /// Endurance Groups.
    pub const ENDURANCE_GROUPS: u32 = 1 << 4;
    /// Predictable Latency Mode.
    pub const PREDICTABLE_LATENCY: u32 = 1 << 5;
    /// Traffic Based Keep Alive: any command resets the keep alive timer.
    pub const TBKAS: u32 = 1 << 6;
    /// Namespace Granularity.
    pub const NAMESPACE_GRANULARITY: u32 = 1 << 7;
    /// UUID List.
    pub const UUID_LIST: u32 = 1 << 9;
    /// Extended LBA Formats Supported (Linux then reads identify CNS 05h for PI formats).
    pub const ELBAS: u32 = 1 << 15;
    /// Flexible Data Placement.
    pub const FDPS: u32 = 1 << 19;
}

/// OACS bits (Optional Admin Command Support, bytes 257:256).
pub mod oacs {
    /// Security Send and Receive.
    pub const SECURITY: u16 = 1 << 0;
    /// Format NVM.
    pub const FORMAT_NVM: u16 = 1 << 1;
    /// Firmware Commit and Image Download.
    pub const FIRMWARE: u16 = 1 << 2;
    /// Namespace Management.
    pub const NS_MANAGEMENT: u16 = 1 << 3;
    /// Device Self-test.
    pub const DEVICE_SELF_TEST: u16 = 1 << 4;
    /// Directives.
    pub const DIRECTIVES: u16 = 1 << 5;
    /// NVMe-MI Send and Receive.
    pub const NVME_MI: u16 = 1 << 6;
    /// Virtualization Management.
    pub const VIRTUALIZATION: u16 = 1 << 7;
    /// Doorbell Buffer Config.
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
    /// Get LBA Status.
    pub const GET_LBA_STATUS: u16 = 1 << 9;
    /// Command and Feature Lockdown.
    pub const LOCKDOWN: u16 = 1 << 10;
}

/// FRMW fields (Firmware Updates, byte 260).
pub mod frmw {
    /// First firmware slot is read only.
    pub const SLOT1_RO: u8 = 1 << 0;
    /// Number of firmware slots (bits 3:1): `n << NUM_SLOTS_SHIFT`.
    pub const NUM_SLOTS_SHIFT: u8 = 1;
    /// Firmware activation without reset.
    pub const ACTIVATION_WITHOUT_RESET: u8 = 1 << 4;
}

/// LPA bits (Log Page Attributes, byte 261).
pub mod lpa {
    /// SMART / Health log per namespace.
    pub const SMART_PER_NAMESPACE: u8 = 1 << 0;
    /// Commands Supported and Effects log page.
    pub const COMMAND_EFFECTS: u8 = 1 << 1;
    /// Extended data for Get Log Page (NUMDU, offsets).
    pub const EXTENDED_DATA: u8 = 1 << 2;
    /// Telemetry.
    pub const TELEMETRY: u8 = 1 << 3;
    /// Persistent Event log.
    pub const PERSISTENT_EVENT: u8 = 1 << 4;
    /// Supported Log Pages, Features Supported, NVMe-MI commands logs (SPDK `mlps`).
    pub const MISC_LOG_PAGES: u8 = 1 << 5;
}

/// ANACAP bits (Asymmetric Namespace Access Capabilities, byte 343).
pub mod anacap {
    /// Reports ANA Optimized.
    pub const OPTIMIZED: u8 = 1 << 0;
    /// Reports ANA Non-Optimized.
    pub const NON_OPTIMIZED: u8 = 1 << 1;
    /// Reports ANA Inaccessible.
    pub const INACCESSIBLE: u8 = 1 << 2;
    /// Reports ANA Persistent Loss.
    pub const PERSISTENT_LOSS: u8 = 1 << 3;
    /// Reports ANA Change.
    pub const CHANGE: u8 = 1 << 4;
    /// ANAGRPID does not change while the namespace is attached.
    pub const NO_CHANGE_ANAGRPID: u8 = 1 << 6;
    /// Non-zero ANAGRPID supported in Namespace Management.
    pub const NON_ZERO_ANAGRPID: u8 = 1 << 7;
}

/// ONCS bits (Optional NVM Command Support, bytes 521:520).
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Save field in Set Features and Select field in Get Features.
    pub const SAVE_SELECT: u16 = 1 << 4;
    /// Reservations.
    pub const RESERVATIONS: u16 = 1 << 5;
    /// Timestamp feature.
    pub const TIMESTAMP: u16 = 1 << 6;
    /// Verify.
    pub const VERIFY: u16 = 1 << 7;
    /// Copy.
    pub const COPY: u16 = 1 << 8;
}

/// FUSES bits (Fused Operation Support, bytes 523:522).
pub mod fuses {
    /// Compare and Write.
    pub const COMPARE_AND_WRITE: u16 = 1 << 0;
}

/// VWC fields (Volatile Write Cache, byte 525).
pub mod vwc {
    /// A volatile write cache is present.
    pub const PRESENT: u8 = 1 << 0;
    /// Flush Behavior (bits 2:1): 10b, Flush with NSID FFFFFFFFh is not supported (what SPDK
    /// reports).
    pub const FLUSH_BROADCAST_NOT_SUPPORTED: u8 = 2 << 1;
    /// Flush Behavior 11b: Flush with NSID FFFFFFFFh is supported.
    pub const FLUSH_BROADCAST_SUPPORTED: u8 = 3 << 1;
}

/// SGLS fields (SGL Support, bytes 539:536).
pub mod sgls {
    /// SGLs supported, no alignment requirement (bits 1:0 = 01b).
    pub const SUPPORTED: u32 = 0x1;
    /// SGLs supported with dword alignment (bits 1:0 = 10b).
    pub const SUPPORTED_DWORD_ALIGNED: u32 = 0x2;
    /// Keyed SGL Data Block descriptor supported.
    pub const KEYED: u32 = 1 << 2;
    /// SGL Bit Bucket descriptor supported.
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// Byte aligned contiguous physical buffer of metadata supported.
    pub const METADATA_POINTER: u32 = 1 << 17;
    /// SGL length larger than the data supported.
    pub const OVERSIZED: u32 = 1 << 18;
    /// MPTR containing an SGL descriptor supported.
    pub const METADATA_ADDRESS: u32 = 1 << 19;
    /// Address field as an offset supported (needed for in-capsule data).
    pub const OFFSET: u32 = 1 << 20;
    /// Transport SGL Data Block descriptor supported.
    pub const TRANSPORT: u32 = 1 << 21;
}

/// CNTRLTYPE values (Controller Type, byte 111).
pub mod cntrltype {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
    /// Administrative controller.
    pub const ADMINISTRATIVE: u8 = 3;
}

/// FCATT bits (Fabrics Controller Attributes, byte 1802; SPDK `ctrattr`).
pub mod fcatt {
    /// Static controller model (clear: dynamic, which SPDK uses).
    pub const STATIC_MODEL: u8 = 1 << 0;
}

/// OFCS bits (Optional Fabric Commands Support, bytes 1805:1804; NVMe-oF 1.1). Linux's
/// `nvme.h` has these bytes reserved; SPDK and libnvme name them.
pub mod ofcs {
    /// Disconnect and deletion of individual I/O queues supported.
    pub const DISCONNECT: u16 = 1 << 0;
}

/// DCTYPE values (Discovery Controller Type, byte 1806; TP 8010). In Linux and libnvme, not in
/// SPDK.
pub mod dctype {
    /// Not reported (I/O and administrative controllers).
    pub const NOT_REPORTED: u8 = 0;
    /// Direct Discovery Controller.
    pub const DDC: u8 = 1;
    /// Central Discovery Controller.
    pub const CDC: u8 = 2;
}

/// SQES or CQES byte: required (`min`) and maximum entry size as powers of two.
pub const fn entry_sizes(min: u8, max: u8) -> u8 {
    (min & 0xf) | (max & 0xf) << 4
}

/// Identify Controller data. Byte offsets are in each field's doc and in the unit tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdentifyController {
    /// PCI Vendor ID (VID, bytes 1:0).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (SSVID, bytes 3:2).
    pub ssvid: u16,
    /// Serial Number (SN, bytes 23:4), ASCII, space padded; see [`ascii_field`].
    pub sn: [u8; 20],
    /// Model Number (MN, bytes 63:24), ASCII, space padded.
    pub mn: [u8; 40],
    /// Firmware Revision (FR, bytes 71:64), ASCII, space padded.
    pub fr: [u8; 8],
    /// Recommended Arbitration Burst (RAB, byte 72).
    pub rab: u8,
    /// IEEE OUI Identifier (IEEE, bytes 75:73), least significant byte first.
    pub ieee: [u8; 3],
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities (CMIC, byte 76); [`cmic`].
    pub cmic: u8,
    /// Maximum Data Transfer Size (MDTS, byte 77): 2 ^ MDTS minimum pages (CAP.MPSMIN); 0 for
    /// no limit.
    pub mdts: u8,
    /// Controller ID (CNTLID, bytes 79:78); over fabrics the one Connect returned.
    pub cntlid: u16,
    /// Version (VER, bytes 83:80), as in the VS register.
    pub ver: u32,
    /// RTD3 Resume Latency (RTD3R, bytes 87:84), microseconds.
    pub rtd3r: u32,
    /// RTD3 Entry Latency (RTD3E, bytes 91:88), microseconds.
    pub rtd3e: u32,
    /// Optional Asynchronous Events Supported (OAES, bytes 95:92); [`oaes`].
    pub oaes: u32,
    /// Controller Attributes (CTRATT, bytes 99:96); [`ctratt`].
    pub ctratt: u32,
    /// Read Recovery Levels Supported (RRLS, bytes 101:100).
    pub rrls: u16,
    /// Controller Type (CNTRLTYPE, byte 111); [`cntrltype`].
    pub cntrltype: u8,
    /// FRU Globally Unique Identifier (FGUID, bytes 127:112).
    pub fguid: [u8; 16],
    /// Command Retry Delay Times 1-3 (CRDT1-3, bytes 133:128), 100 ms units.
    pub crdt: [u16; 3],
    /// Optional Admin Command Support (OACS, bytes 257:256); [`oacs`].
    pub oacs: u16,
    /// Abort Command Limit (ACL, byte 258), 0-based.
    pub acl: u8,
    /// Asynchronous Event Request Limit (AERL, byte 259), 0-based.
    pub aerl: u8,
    /// Firmware Updates (FRMW, byte 260); [`frmw`].
    pub frmw: u8,
    /// Log Page Attributes (LPA, byte 261); [`lpa`].
    pub lpa: u8,
    /// Error Log Page Entries (ELPE, byte 262), 0-based.
    pub elpe: u8,
    /// Number of Power States Support (NPSS, byte 263), 0-based.
    pub npss: u8,
    /// Admin Vendor Specific Command Configuration (AVSCC, byte 264).
    pub avscc: u8,
    /// Autonomous Power State Transition Attributes (APSTA, byte 265).
    pub apsta: u8,
    /// Warning Composite Temperature Threshold (WCTEMP, bytes 267:266), kelvin.
    pub wctemp: u16,
    /// Critical Composite Temperature Threshold (CCTEMP, bytes 269:268), kelvin.
    pub cctemp: u16,
    /// Maximum Time for Firmware Activation (MTFA, bytes 271:270).
    pub mtfa: u16,
    /// Host Memory Buffer Preferred Size (HMPRE, bytes 275:272).
    pub hmpre: u32,
    /// Host Memory Buffer Minimum Size (HMMIN, bytes 279:276).
    pub hmmin: u32,
    /// Total NVM Capacity (TNVMCAP, bytes 295:280), bytes.
    pub tnvmcap: u128,
    /// Unallocated NVM Capacity (UNVMCAP, bytes 311:296), bytes.
    pub unvmcap: u128,
    /// Replay Protected Memory Block Support (RPMBS, bytes 315:312).
    pub rpmbs: u32,
    /// Extended Device Self-test Time (EDSTT, bytes 317:316).
    pub edstt: u16,
    /// Device Self-test Options (DSTO, byte 318).
    pub dsto: u8,
    /// Firmware Update Granularity (FWUG, byte 319).
    pub fwug: u8,
    /// Keep Alive Support (KAS, bytes 321:320): timer granularity in 100 ms units; 0 means no
    /// Keep Alive (Linux refuses a fabrics I/O controller with KAS 0).
    pub kas: u16,
    /// Host Controlled Thermal Management Attributes (HCTMA, bytes 323:322).
    pub hctma: u16,
    /// Minimum Thermal Management Temperature (MNTMT, bytes 325:324).
    pub mntmt: u16,
    /// Maximum Thermal Management Temperature (MXTMT, bytes 327:326).
    pub mxtmt: u16,
    /// Sanitize Capabilities (SANICAP, bytes 331:328).
    pub sanicap: u32,
    /// ANA Transition Time (ANATT, byte 342), seconds.
    pub anatt: u8,
    /// Asymmetric Namespace Access Capabilities (ANACAP, byte 343); [`anacap`].
    pub anacap: u8,
    /// ANA Group Identifier Maximum (ANAGRPMAX, bytes 347:344).
    pub anagrpmax: u32,
    /// Number of ANA Group Identifiers (NANAGRPID, bytes 351:348).
    pub nanagrpid: u32,
    /// Persistent Event Log Size (PELS, bytes 355:352).
    pub pels: u32,
    /// Submission Queue Entry Size (SQES, byte 512); see [`entry_sizes`]. 66h for 64 bytes.
    pub sqes: u8,
    /// Completion Queue Entry Size (CQES, byte 513). 44h for 16 bytes.
    pub cqes: u8,
    /// Maximum Outstanding Commands (MAXCMD, bytes 515:514); required over fabrics.
    pub maxcmd: u16,
    /// Number of Namespaces (NN, bytes 519:516): the largest valid NSID.
    pub nn: u32,
    /// Optional NVM Command Support (ONCS, bytes 521:520); [`oncs`].
    pub oncs: u16,
    /// Fused Operation Support (FUSES, bytes 523:522); [`fuses`].
    pub fuses: u16,
    /// Format NVM Attributes (FNA, byte 524).
    pub fna: u8,
    /// Volatile Write Cache (VWC, byte 525); [`vwc`].
    pub vwc: u8,
    /// Atomic Write Unit Normal (AWUN, bytes 527:526), 0-based blocks.
    pub awun: u16,
    /// Atomic Write Unit Power Fail (AWUPF, bytes 529:528), 0-based blocks.
    pub awupf: u16,
    /// I/O Command Set Vendor Specific Command Configuration (NVSCC, byte 530).
    pub nvscc: u8,
    /// Namespace Write Protection Capabilities (NWPC, byte 531).
    pub nwpc: u8,
    /// Atomic Compare & Write Unit (ACWU, bytes 533:532), 0-based blocks.
    pub acwu: u16,
    /// Optional Copy Formats Supported (OCFS, bytes 535:534); reserved in Linux's `nvme.h`.
    pub ocfs: u16,
    /// SGL Support (SGLS, bytes 539:536); [`sgls`]. Fabrics controllers must support SGLs.
    pub sgls: u32,
    /// Maximum Number of Allowed Namespaces (MNAN, bytes 543:540).
    pub mnan: u32,
    /// NVM Subsystem NVMe Qualified Name (SUBNQN, bytes 1023:768).
    pub subnqn: NqnField,
    /// I/O Queue Command Capsule Supported Size (IOCCSZ, bytes 1795:1792), 16-byte units: the
    /// SQE plus the in-capsule data the controller accepts (Linux requires at least 4).
    pub ioccsz: u32,
    /// I/O Queue Response Capsule Supported Size (IORCSZ, bytes 1799:1796), 16-byte units
    /// (Linux requires at least 1).
    pub iorcsz: u32,
    /// In Capsule Data Offset (ICDOFF, bytes 1801:1800), 16-byte units after the SQE.
    pub icdoff: u16,
    /// Fabrics Controller Attributes (FCATT, byte 1802); [`fcatt`].
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors (MSDBD, byte 1803); 0 for no limit.
    pub msdbd: u8,
    /// Optional Fabric Commands Support (OFCS, bytes 1805:1804); [`ofcs`].
    pub ofcs: u16,
    /// Discovery Controller Type (DCTYPE, byte 1806); [`dctype`].
    pub dctype: u8,
    /// Power State Descriptors 0-31 (bytes 3071:2048); NPSS says how many are valid.
    pub psd: [PowerStateDescriptor; 32],
}

impl Default for IdentifyController {
    fn default() -> Self {
        IdentifyController {
            vid: 0,
            ssvid: 0,
            sn: [b' '; 20],
            mn: [b' '; 40],
            fr: [b' '; 8],
            rab: 0,
            ieee: [0; 3],
            cmic: 0,
            mdts: 0,
            cntlid: 0,
            ver: 0,
            rtd3r: 0,
            rtd3e: 0,
            oaes: 0,
            ctratt: 0,
            rrls: 0,
            cntrltype: 0,
            fguid: [0; 16],
            crdt: [0; 3],
            oacs: 0,
            acl: 0,
            aerl: 0,
            frmw: 0,
            lpa: 0,
            elpe: 0,
            npss: 0,
            avscc: 0,
            apsta: 0,
            wctemp: 0,
            cctemp: 0,
            mtfa: 0,
            hmpre: 0,
            hmmin: 0,
            tnvmcap: 0,
            unvmcap: 0,
            rpmbs: 0,
            edstt: 0,
            dsto: 0,
            fwug: 0,
            kas: 0,
            hctma: 0,
            mntmt: 0,
            mxtmt: 0,
            sanicap: 0,
            anatt: 0,
            anacap: 0,
            anagrpmax: 0,
            nanagrpid: 0,
            pels: 0,
            sqes: 0,
            cqes: 0,
            maxcmd: 0,
            nn: 0,
            oncs: 0,
            fuses: 0,
            fna: 0,
            vwc: 0,
            awun: 0,
            awupf: 0,
            nvscc: 0,
            nwpc: 0,
            acwu: 0,
            ocfs: 0,
            sgls: 0,
            mnan: 0,
            subnqn: NqnField::default(),
            ioccsz: 0,
            iorcsz: 0,
            icdoff: 0,
            fcatt: 0,
            msdbd: 0,
            ofcs: 0,
            dctype: 0,
            psd: [PowerStateDescriptor::default(); 32],
        }
    }
}

impl IdentifyController {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Byte offset of SUBNQN.
    pub const OFFSET_SUBNQN: usize = 768;
    /// Byte offset of the fabrics-specific fields (IOCCSZ).
    pub const OFFSET_FABRICS: usize = 1792;
    /// Byte offset of power state descriptor 0.
    pub const OFFSET_PSD: usize = 2048;

    /// Writes the data; bytes without a field here are zero.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u16(out, 0, self.vid);
        put_u16(out, 2, self.ssvid);
        put(out, 4, &self.sn);
        put(out, 24, &self.mn);
        put(out, 64, &self.fr);
        out[72] = self.rab;
        put(out, 73, &self.ieee);
        out[76] = self.cmic;
        out[77] = self.mdts;
        put_u16(out, 78, self.cntlid);
        put_u32(out, 80, self.ver);
        put_u32(out, 84, self.rtd3r);
        put_u32(out, 88, self.rtd3e);
        put_u32(out, 92, self.oaes);
        put_u32(out, 96, self.ctratt);
        put_u16(out, 100, self.rrls);
        out[111] = self.cntrltype;
        put(out, 112, &self.fguid);
        for (i, v) in self.crdt.iter().enumerate() {
            put_u16(out, 128 + 2 * i, *v);
        }
        put_u16(out, 256, self.oacs);
        out[258] = self.acl;
        out[259] = self.aerl;
        out[260] = self.frmw;
        out[261] = self.lpa;
        out[262] = self.elpe;
        out[263] = self.npss;
        out[264] = self.avscc;
        out[265] = self.apsta;
        put_u16(out, 266, self.wctemp);
        put_u16(out, 268, self.cctemp);
        put_u16(out, 270, self.mtfa);
        put_u32(out, 272, self.hmpre);
        put_u32(out, 276, self.hmmin);
        put_u128(out, 280, self.tnvmcap);
        put_u128(out, 296, self.unvmcap);
        put_u32(out, 312, self.rpmbs);
        put_u16(out, 316, self.edstt);
        out[318] = self.dsto;
        out[319] = self.fwug;
        put_u16(out, 320, self.kas);
        put_u16(out, 322, self.hctma);
        put_u16(out, 324, self.mntmt);
        put_u16(out, 326, self.mxtmt);
        put_u32(out, 328, self.sanicap);
        out[342] = self.anatt;
        out[343] = self.anacap;
        put_u32(out, 344, self.anagrpmax);
        put_u32(out, 348, self.nanagrpid);
        put_u32(out, 352, self.pels);
        out[512] = self.sqes;
        out[513] = self.cqes;
        put_u16(out, 514, self.maxcmd);
        put_u32(out, 516, self.nn);
        put_u16(out, 520, self.oncs);
        put_u16(out, 522, self.fuses);
        out[524] = self.fna;
        out[525] = self.vwc;
        put_u16(out, 526, self.awun);
        put_u16(out, 528, self.awupf);
        out[530] = self.nvscc;
        out[531] = self.nwpc;
        put_u16(out, 532, self.acwu);
        put_u16(out, 534, self.ocfs);
        put_u32(out, 536, self.sgls);
        put_u32(out, 540, self.mnan);
        put(out, Self::OFFSET_SUBNQN, &self.subnqn.0);
        put_u32(out, 1792, self.ioccsz);
        put_u32(out, 1796, self.iorcsz);
        put_u16(out, 1800, self.icdoff);
        out[1802] = self.fcatt;
        out[1803] = self.msdbd;
        put_u16(out, 1804, self.ofcs);
        out[1806] = self.dctype;
        for (i, p) in self.psd.iter().enumerate() {
            let mut b = [0; PowerStateDescriptor::SIZE];
            p.encode(&mut b);
            put(out, Self::OFFSET_PSD + PowerStateDescriptor::SIZE * i, &b);
        }
    }

    /// The data's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads the data; every byte pattern is accepted.
    pub fn decode(b: &[u8; Self::SIZE]) -> IdentifyController {
        let mut psd = [PowerStateDescriptor::default(); 32];
        for (i, p) in psd.iter_mut().enumerate() {
            *p = PowerStateDescriptor::decode(&arr(b, Self::OFFSET_PSD + PowerStateDescriptor::SIZE * i));
        }
        IdentifyController {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            sn: arr(b, 4),
            mn: arr(b, 24),
            fr: arr(b, 64),
            rab: b[72],
            ieee: arr(b, 73),
            cmic: b[76],
            mdts: b[77],
            cntlid: u16_at(b, 78),
            ver: u32_at(b, 80),
            rtd3r: u32_at(b, 84),
            rtd3e: u32_at(b, 88),
            oaes: u32_at(b, 92),
            ctratt: u32_at(b, 96),
            rrls: u16_at(b, 100),
            cntrltype: b[111],
            fguid: arr(b, 112),
            crdt: [u16_at(b, 128), u16_at(b, 130), u16_at(b, 132)],
            oacs: u16_at(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            npss: b[263],
            avscc: b[264],
            apsta: b[265],
            wctemp: u16_at(b, 266),
            cctemp: u16_at(b, 268),
            mtfa: u16_at(b, 270),
            hmpre: u32_at(b, 272),
            hmmin: u32_at(b, 276),
            tnvmcap: u128_at(b, 280),
            unvmcap: u128_at(b, 296),
            rpmbs: u32_at(b, 312),
            edstt: u16_at(b, 316),
            dsto: b[318],
            fwug: b[319],
            kas: u16_at(b, 320),
            hctma: u16_at(b, 322),
            mntmt: u16_at(b, 324),
            mxtmt: u16_at(b, 326),
            sanicap: u32_at(b, 328),
            anatt: b[342],
            anacap: b[343],
            anagrpmax: u32_at(b, 344),
            nanagrpid: u32_at(b, 348),
            pels: u32_at(b, 352),
            sqes: b[512],
            cqes: b[513],
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            oncs: u16_at(b, 520),
            fuses: u16_at(b, 522),
            fna: b[524],
            vwc: b[525],
            awun: u16_at(b, 526),
            awupf: u16_at(b, 528),
            nvscc: b[530],
            nwpc: b[531],
            acwu: u16_at(b, 532),
            ocfs: u16_at(b, 534),
            sgls: u32_at(b, 536),
            mnan: u32_at(b, 540),
            subnqn: NqnField(arr::<NQN_FIELD_LEN>(b, Self::OFFSET_SUBNQN)),
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            icdoff: u16_at(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
            ofcs: u16_at(b, 1804),
            dctype: b[1806],
            psd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Sets every field to a distinct value derived from its offset, so the test below can
    /// check each offset separately.
    fn marked() -> IdentifyController {
        let mut c = IdentifyController {
            vid: 0x0100,
            ssvid: 0x0302,
            sn: ascii_field("SPDK00000000000001"),
            mn: ascii_field("SPDK bdev Controller"),
            fr: ascii_field("26.05"),
            rab: 72,
            ieee: [0xe4, 0xd2, 0x5c],
            cmic: cmic::MULTI_PORT | cmic::MULTI_CTRL | cmic::ANA_REPORTING,
            mdts: 77,
            cntlid: 78,
            ver: 0x0002_0000,
            rtd3r: 84,
            rtd3e: 88,
            oaes: oaes::NS_ATTRIBUTE | oaes::ANA_CHANGE,
            ctratt: ctratt::HOST_ID_128,
            rrls: 100,
            cntrltype: cntrltype::IO,
            fguid: [112; 16],
            crdt: [128, 130, 132],
            oacs: 256,
            acl: 3,
            aerl: 3,
            frmw: frmw::SLOT1_RO | 1 << frmw::NUM_SLOTS_SHIFT,
            lpa: lpa::COMMAND_EFFECTS | lpa::EXTENDED_DATA | lpa::MISC_LOG_PAGES,
            elpe: 127,
            npss: 0,
            avscc: 64,
            apsta: 65,
            wctemp: 0x0157,
            cctemp: 0x0175,
            mtfa: 270,
            hmpre: 272,
            hmmin: 276,
            tnvmcap: 280 << 64 | 1,
            unvmcap: 296 << 64 | 2,
            rpmbs: 312,
            edstt: 316,
            dsto: 218,
            fwug: 219,
            kas: 10,
            hctma: 322,
            mntmt: 324,
            mxtmt: 326,
            sanicap: 328,
            anatt: 10,
            anacap: anacap::OPTIMIZED | anacap::NON_OPTIMIZED | anacap::INACCESSIBLE,
            anagrpmax: 344,
            nanagrpid: 348,
            pels: 352,
            sqes: entry_sizes(6, 6),
            cqes: entry_sizes(4, 4),
            maxcmd: 128,
            nn: 516,
            oncs: oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS,
            fuses: fuses::COMPARE_AND_WRITE,
            fna: 224,
            vwc: vwc::PRESENT | vwc::FLUSH_BROADCAST_NOT_SUPPORTED,
            awun: 526,
            awupf: 528,
            nvscc: 1,
            nwpc: 2,
            acwu: 532,
            ocfs: 1,
            sgls: sgls::SUPPORTED | sgls::KEYED | sgls::OFFSET,
            mnan: 540,
            subnqn: NqnField::new("nqn.2016-06.io.spdk:cnode1").unwrap(),
            ioccsz: 260,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 16,
            ofcs: ofcs::DISCONNECT,
            dctype: dctype::NOT_REPORTED,
            psd: [PowerStateDescriptor::default(); 32],
        };
        c.psd[0] = PowerStateDescriptor { mp: 2500, enlat: 16, exlat: 4, ..Default::default() };
        c
    }

    #[test]
    fn offsets_match_spdk_struct_spdk_nvme_ctrlr_data() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_ctrlr_data) == 4096). The offsets are
        // offsetof() in SPDK's packed struct (and Linux's struct nvme_id_ctrl).
        let c = marked();
        let b = c.to_bytes();
        let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u16at(0), 0x0100); // vid
        assert_eq!(u16at(2), 0x0302); // ssvid
        assert_eq!(&b[4..22], b"SPDK00000000000001"); // sn
        assert_eq!(&b[22..24], b"  ");
        assert_eq!(&b[24..44], b"SPDK bdev Controller"); // mn
        assert_eq!(&b[64..72], b"26.05   "); // fr
        assert_eq!(b[72], 72); // rab
        assert_eq!(&b[73..76], &[0xe4, 0xd2, 0x5c]); // ieee
        assert_eq!(b[76], 0x0b); // cmic
        assert_eq!(b[77], 77); // mdts
        assert_eq!(u16at(78), 78); // cntlid
        assert_eq!(u32at(80), 0x0002_0000); // ver
        assert_eq!((u32at(84), u32at(88)), (84, 88)); // rtd3r, rtd3e
        assert_eq!(u32at(92), 0x0900); // oaes
        assert_eq!(u32at(96), 1); // ctratt
        assert_eq!(u16at(100), 100); // rrls
        assert_eq!(b[111], 1); // cntrltype
        assert_eq!(&b[112..128], &[112; 16]); // fguid
        assert_eq!((u16at(128), u16at(130), u16at(132)), (128, 130, 132)); // crdt
        assert_eq!(u16at(256), 256); // oacs
        assert_eq!(&b[258..266], &[3, 3, 0x03, 0x26, 127, 0, 64, 65]); // acl..apsta
        assert_eq!((u16at(266), u16at(268), u16at(270)), (0x157, 0x175, 270)); // wctemp..mtfa
        assert_eq!((u32at(272), u32at(276)), (272, 276)); // hmpre, hmmin
        assert_eq!(&b[280..296], &(280u128 << 64 | 1).to_le_bytes()); // tnvmcap
        assert_eq!(&b[296..312], &(296u128 << 64 | 2).to_le_bytes()); // unvmcap
        assert_eq!(u32at(312), 312); // rpmbs
        assert_eq!((u16at(316), b[318], b[319]), (316, 218, 219)); // edstt, dsto, fwug
        assert_eq!(u16at(320), 10); // kas
        assert_eq!((u16at(322), u16at(324), u16at(326)), (322, 324, 326)); // hctma..mxtmt
        assert_eq!(u32at(328), 328); // sanicap
        assert_eq!((b[342], b[343]), (10, 0x07)); // anatt, anacap
        assert_eq!((u32at(344), u32at(348), u32at(352)), (344, 348, 352)); // anagrpmax..pels
        assert_eq!((b[512], b[513]), (0x66, 0x44)); // sqes, cqes
        assert_eq!(u16at(514), 128); // maxcmd
        assert_eq!(u32at(516), 516); // nn
        assert_eq!((u16at(520), u16at(522)), (0x2c, 1)); // oncs, fuses
        assert_eq!((b[524], b[525]), (224, 0x05)); // fna, vwc
        assert_eq!((u16at(526), u16at(528)), (526, 528)); // awun, awupf
        assert_eq!((b[530], b[531], u16at(532), u16at(534)), (1, 2, 532, 1)); // nvscc..ocfs
        assert_eq!(u32at(536), 0x0010_0005); // sgls
        assert_eq!(u32at(540), 540); // mnan
        assert_eq!(&b[768..794], b"nqn.2016-06.io.spdk:cnode1"); // subnqn
        assert_eq!((u32at(1792), u32at(1796), u16at(1800)), (260, 1, 0)); // ioccsz..icdoff
        assert_eq!((b[1802], b[1803], u16at(1804), b[1806]), (0, 16, 1, 0)); // fcatt..dctype
                                                                             // psd[0] at 2048: mp 0, enlat 4, exlat 8.
        assert_eq!((u16at(2048), u32at(2052), u32at(2056)), (2500, 16, 4));
        // Bytes with no field stay zero.
        assert!(b[101..111].iter().all(|&x| x == 0));
        assert!(b[1807..2048].iter().all(|&x| x == 0));
        assert!(b[3072..].iter().all(|&x| x == 0));
        assert_eq!(IdentifyController::decode(&b), c);
        assert_eq!(field_text(&c.mn), b"SPDK bdev Controller");
    }

    #[test]
    fn power_state_bits_match_spdk() {
        // SPDK: mps bit 24, nops bit 25, ips bits 151:150, apw bits 178:176, aps bits 183:182.
        let p = PowerStateDescriptor { mxps: true, nops: true, ips: 3, apw: 7, aps: 3, ..Default::default() };
        let mut b = [0; 32];
        p.encode(&mut b);
        assert_eq!((b[3], b[18], b[22]), (0x03, 0xc0, 0xc7));
        assert_eq!(PowerStateDescriptor::decode(&b), p);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 4096>(any::<u8>())) {
            // Decoding accepts anything, and re-encoding keeps every field it read.
            let c = IdentifyController::decode(&b);
            prop_assert_eq!(IdentifyController::decode(&c.to_bytes()), c);
        }

        #[test]
        fn psd_round_trip(b in any::<[u8; 32]>()) {
            let p = PowerStateDescriptor::decode(&b);
            let mut e = [0; 32];
            p.encode(&mut e);
            prop_assert_eq!(PowerStateDescriptor::decode(&e), p);
        }
    }
}
