//! Log pages a controller returns with Get Log Page, and the offset/length slicing of them
//! (NVMe Base Specification 2.0 section 5.16.1: figures 202 Supported Log Pages, 205 Error
//! Information, 207 SMART / Health, 208 Firmware Slot, 209 Changed Namespace List, 210-211
//! Commands Supported and Effects, 214-216 Asymmetric Namespace Access; SPDK's structs of the
//! same names). The discovery log is in [`super::discovery`].

use super::le::{arr, put, put_u128, put_u16, put_u32, put_u64, u128_at, u16_at, u32_at, u64_at};
use super::status::Status;

/// Log Page Identifiers (LID; NVMe 2.0 figure 202, NVMe-oF 1.1 figure 31).
pub mod lid {
    /// Supported Log Pages.
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const HEALTH_INFORMATION: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS_LIST: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const COMMAND_EFFECTS: u8 = 0x05;
    /// Device Self-test.
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    /// Telemetry Host-Initiated.
    pub const TELEMETRY_HOST: u8 = 0x07;
    /// Telemetry Controller-Initiated.
    pub const TELEMETRY_CTRLR: u8 = 0x08;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0c;
    /// Persistent Event Log.
    pub const PERSISTENT_EVENT: u8 = 0x0d;
    /// Feature Identifiers Supported and Effects.
    pub const FEATURE_IDS_EFFECTS: u8 = 0x12;
    /// NVMe-MI Commands Supported and Effects.
    pub const NVME_MI_COMMANDS_EFFECTS: u8 = 0x13;
    /// Discovery (NVMe-oF; discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
    /// Sanitize Status.
    pub const SANITIZE_STATUS: u8 = 0x81;
}

/// Why a Get Log Page range cannot be served (SPDK answers both with Invalid Field in
/// Command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogRangeError {
    /// The offset is not a multiple of 4.
    Unaligned,
    /// The offset is at or past the end of the page.
    PastEnd,
}

/// Copies the bytes of a log page that a Get Log Page with byte offset `offset` asks for into
/// `out` (the host's buffer of NUMD + 1 dwords), one chunk of the page at a time, without
/// building the whole page. Bytes of `out` no chunk reaches are zero. This is what SPDK's
/// `nvmf_copy_log_page_chunk_ext` does for ANA and discovery pages.
#[derive(Debug)]
pub struct LogCursor<'a> {
    out: &'a mut [u8],
    written: usize,
    skip: u64,
}

impl<'a> LogCursor<'a> {
    /// A cursor that skips `offset` bytes of the page and fills `out`; `out` is zeroed.
    pub fn new(out: &'a mut [u8], offset: u64) -> LogCursor<'a> {
        out.fill(0);
        LogCursor { out, written: 0, skip: offset }
    }

    /// Whether `out` is full: later chunks can be skipped.
    pub fn is_full(&self) -> bool {
        self.written == self.out.len()
    }

    /// Bytes of the page not yet reached (still to be skipped).
    pub fn remaining_skip(&self) -> u64 {
        self.skip
    }

    /// Bytes written into `out` so far.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Skips a chunk of `len` bytes without looking at it when it lies wholly before the
    /// offset; returns whether it did (if not, the caller must [`LogCursor::push`] it).
    pub fn skip(&mut self, len: usize) -> bool {
        if self.skip >= len as u64 {
            self.skip -= len as u64;
            true
        } else {
            false
        }
    }

    /// Appends the next chunk of the page; returns `false` once `out` is full.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        if self.skip(chunk.len()) {
            return !self.is_full();
        }
        let start = self.skip as usize;
        self.skip = 0;
        let n = (chunk.len() - start).min(self.out.len() - self.written);
        self.out[self.written..self.written + n].copy_from_slice(&chunk[start..start + n]);
        self.written += n;
        !self.is_full()
    }
}

/// Serves a Get Log Page range of a page that is whole in memory: checks the offset as SPDK
/// does (dword aligned, before the end of the page), copies what fits into `out` and zeroes
/// the rest; returns the bytes copied.
pub fn read_log(page: &[u8], offset: u64, out: &mut [u8]) -> Result<usize, LogRangeError> {
    if offset & 3 != 0 {
        return Err(LogRangeError::Unaligned);
    }
    if offset >= page.len() as u64 {
        return Err(LogRangeError::PastEnd);
    }
    let mut c = LogCursor::new(out, offset);
    c.push(page);
    Ok(c.written())
}

/// Error Information log entry (LID 01h, 64 bytes each; NVMe 2.0 figure 205; SPDK
/// `struct spdk_nvme_error_information_entry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ErrorInfoEntry {
    /// Error Count (bytes 7:0): unique, increasing; 0 means the entry is empty.
    pub error_count: u64,
    /// Submission Queue ID (bytes 9:8).
    pub sqid: u16,
    /// Command ID (bytes 11:10).
    pub cid: u16,
    /// Status Field (bytes 13:12 bits 15:1) of the failed command.
    pub status: Status,
    /// Phase Tag (bytes 13:12 bit 0) of the failed command's completion.
    pub phase: bool,
    /// Parameter Error Location (bytes 15:14): bits 7:0 byte, bits 10:8 bit in the command.
    pub error_location: u16,
    /// LBA (bytes 23:16) of the first failing block.
    pub lba: u64,
    /// Namespace (bytes 27:24).
    pub nsid: u32,
    /// Vendor Specific Information Available (byte 28).
    pub vendor_specific: u8,
    /// Transport Type (TRTYPE, byte 29). Linux's `struct nvme_error_slot` has it reserved.
    pub trtype: u8,
    /// Command Specific Information (bytes 39:32).
    pub command_specific: u64,
    /// Transport Type Specific Information (bytes 41:40).
    pub trtype_specific: u16,
}

impl ErrorInfoEntry {
    /// Size in bytes.
    pub const SIZE: usize = 64;

    /// Writes the entry.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u64(out, 0, self.error_count);
        put_u16(out, 8, self.sqid);
        put_u16(out, 10, self.cid);
        put_u16(out, 12, self.status.to_field(self.phase));
        put_u16(out, 14, self.error_location);
        put_u64(out, 16, self.lba);
        put_u32(out, 24, self.nsid);
        out[28] = self.vendor_specific;
        out[29] = self.trtype;
        put_u64(out, 32, self.command_specific);
        put_u16(out, 40, self.trtype_specific);
    }

    /// Reads an entry.
    pub fn decode(b: &[u8; Self::SIZE]) -> ErrorInfoEntry {
        let (status, phase) = Status::from_field(u16_at(b, 12));
        ErrorInfoEntry {
            error_count: u64_at(b, 0),
            sqid: u16_at(b, 8),
            cid: u16_at(b, 10),
            status,
            phase,
            error_location: u16_at(b, 14),
            lba: u64_at(b, 16),
            nsid: u32_at(b, 24),
            vendor_specific: b[28],
            trtype: b[29],
            command_specific: u64_at(b, 32),
            trtype_specific: u16_at(b, 40),
        }
    }
}

/// SMART / Health Information log (LID 02h, 512 bytes; NVMe 2.0 figure 207; SPDK
/// `struct spdk_nvme_health_information_page`, Linux `struct nvme_smart_log`). The 16-byte
/// counters are `u128`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SmartLog {
    /// Critical Warning (byte 0); [`critical_warning`].
    pub critical_warning: u8,
    /// Composite Temperature (bytes 2:1), kelvin.
    pub temperature: u16,
    /// Available Spare (byte 3), percent.
    pub available_spare: u8,
    /// Available Spare Threshold (byte 4), percent.
    pub available_spare_threshold: u8,
    /// Percentage Used (byte 5).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary (byte 6; NVMe 1.4, reserved in SPDK's struct).
    pub endurance_group_critical_warning: u8,
    /// Data Units Read (bytes 47:32), thousands of 512-byte units.
    pub data_units_read: u128,
    /// Data Units Written (bytes 63:48), thousands of 512-byte units.
    pub data_units_written: u128,
    /// Host Read Commands (bytes 79:64).
    pub host_read_commands: u128,
    /// Host Write Commands (bytes 95:80).
    pub host_write_commands: u128,
    /// Controller Busy Time (bytes 111:96), minutes.
    pub controller_busy_time: u128,
    /// Power Cycles (bytes 127:112).
    pub power_cycles: u128,
    /// Power On Hours (bytes 143:128).
    pub power_on_hours: u128,
    /// Unsafe Shutdowns (bytes 159:144).
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors (bytes 175:160).
    pub media_errors: u128,
    /// Number of Error Information Log Entries (bytes 191:176).
    pub num_error_info_log_entries: u128,
    /// Warning Composite Temperature Time (bytes 195:192), minutes.
    pub warning_temp_time: u32,
    /// Critical Composite Temperature Time (bytes 199:196), minutes.
    pub critical_temp_time: u32,
    /// Temperature Sensors 1-8 (bytes 215:200), kelvin.
    pub temp_sensor: [u16; 8],
    /// Thermal Management Temperature 1 and 2 Transition Counts (bytes 223:216; NVMe 1.3,
    /// reserved in SPDK's struct).
    pub thm_transition_count: [u32; 2],
    /// Total Time For Thermal Management Temperature 1 and 2 (bytes 231:224), seconds.
    pub thm_total_time: [u32; 2],
}

/// Critical Warning bits of [`SmartLog`] (also the low byte of the Asynchronous Event
/// Configuration feature).
pub mod critical_warning {
    /// Available spare below threshold.
    pub const AVAILABLE_SPARE: u8 = 1 << 0;
    /// Temperature outside thresholds.
    pub const TEMPERATURE: u8 = 1 << 1;
    /// NVM subsystem reliability degraded.
    pub const RELIABILITY: u8 = 1 << 2;
    /// Media placed in read only mode.
    pub const READ_ONLY: u8 = 1 << 3;
    /// Volatile memory backup failed.
    pub const VOLATILE_MEMORY_BACKUP: u8 = 1 << 4;
    /// Persistent memory region read only or unreliable.
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

impl SmartLog {
    /// Size in bytes.
    pub const SIZE: usize = 512;

    /// Writes the page.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        out[0] = self.critical_warning;
        put_u16(out, 1, self.temperature);
        out[3] = self.available_spare;
        out[4] = self.available_spare_threshold;
        out[5] = self.percentage_used;
        out[6] = self.endurance_group_critical_warning;
        let counters = self.counters();
        for (i, v) in counters.iter().enumerate() {
            put_u128(out, 32 + 16 * i, *v);
        }
        put_u32(out, 192, self.warning_temp_time);
        put_u32(out, 196, self.critical_temp_time);
        for (i, t) in self.temp_sensor.iter().enumerate() {
            put_u16(out, 200 + 2 * i, *t);
        }
        put_u32(out, 216, self.thm_transition_count[0]);
        put_u32(out, 220, self.thm_transition_count[1]);
        put_u32(out, 224, self.thm_total_time[0]);
        put_u32(out, 228, self.thm_total_time[1]);
    }

    fn counters(&self) -> [u128; 10] {
        [
            self.data_units_read,
            self.data_units_written,
            self.host_read_commands,
            self.host_write_commands,
            self.controller_busy_time,
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.num_error_info_log_entries,
        ]
    }

    /// Reads the page.
    pub fn decode(b: &[u8; Self::SIZE]) -> SmartLog {
        let c = |i: usize| u128_at(b, 32 + 16 * i);
        let mut temp_sensor = [0; 8];
        for (i, t) in temp_sensor.iter_mut().enumerate() {
            *t = u16_at(b, 200 + 2 * i);
        }
        SmartLog {
            critical_warning: b[0],
            temperature: u16_at(b, 1),
            available_spare: b[3],
            available_spare_threshold: b[4],
            percentage_used: b[5],
            endurance_group_critical_warning: b[6],
            data_units_read: c(0),
            data_units_written: c(1),
            host_read_commands: c(2),
            host_write_commands: c(3),
            controller_busy_time: c(4),
            power_cycles: c(5),
            power_on_hours: c(6),
            unsafe_shutdowns: c(7),
            media_errors: c(8),
            num_error_info_log_entries: c(9),
            warning_temp_time: u32_at(b, 192),
            critical_temp_time: u32_at(b, 196),
            temp_sensor,
            thm_transition_count: [u32_at(b, 216), u32_at(b, 220)],
            thm_total_time: [u32_at(b, 224), u32_at(b, 228)],
        }
    }
}

/// Firmware Slot Information log (LID 03h, 512 bytes; NVMe 2.0 figure 208; SPDK
/// `struct spdk_nvme_firmware_page`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info (AFI, byte 0): bits 2:0 active slot, bits 6:4 slot activated at
    /// the next reset (0: none).
    pub afi: u8,
    /// Firmware Revision for slots 1-7 (bytes 63:8), ASCII, space padded; see
    /// [`super::identify_ctrl::ascii_field`].
    pub frs: [[u8; 8]; 7],
}

impl FirmwareSlotLog {
    /// Size in bytes.
    pub const SIZE: usize = 512;

    /// The AFI byte for active slot `active` and next-reset slot `next` (0 for none).
    pub const fn afi(active: u8, next: u8) -> u8 {
        (active & 7) | (next & 7) << 4
    }

    /// Writes the page.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        out[0] = self.afi;
        for (i, r) in self.frs.iter().enumerate() {
            put(out, 8 + 8 * i, r);
        }
    }

    /// Reads the page.
    pub fn decode(b: &[u8; Self::SIZE]) -> FirmwareSlotLog {
        let mut frs = [[0; 8]; 7];
        for (i, r) in frs.iter_mut().enumerate() {
            *r = arr(b, 8 + 8 * i);
        }
        FirmwareSlotLog { afi: b[0], frs }
    }
}

/// Changed Namespace List log (LID 04h, 4096 bytes; NVMe 2.0 figure 209): up to 1024 NSIDs
/// whose Identify Namespace data changed since the page was last read, ending at the first
/// zero; more than 1024 changes are reported as FFFFFFFFh in entry 0 and zeros after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChangedNamespaceList {
    /// The list's entries.
    pub ids: [u32; 1024],
    len: usize,
}

impl Default for ChangedNamespaceList {
    fn default() -> Self {
        ChangedNamespaceList { ids: [0; 1024], len: 0 }
    }
}

impl ChangedNamespaceList {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Number of entries.
    pub const ENTRIES: usize = 1024;
    /// Entry 0 when more namespaces changed than the list holds.
    pub const OVERFLOW: u32 = 0xffff_ffff;

    /// Records that `nsid` changed, once; on the 1025th distinct NSID the list becomes the
    /// overflow marker (as SPDK's `nvmf_ctrlr_ns_changed` does).
    pub fn push(&mut self, nsid: u32) {
        if nsid == 0 || self.ids[0] == Self::OVERFLOW || self.ids[..self.len].contains(&nsid) {
            return;
        }
        if self.len == Self::ENTRIES {
            self.ids = [0; 1024];
            self.ids[0] = Self::OVERFLOW;
            self.len = 1;
        } else {
            self.ids[self.len] = nsid;
            self.len += 1;
        }
    }

    /// The NSIDs before the first zero entry.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied().take_while(|&id| id != 0)
    }

    /// Writes the page.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        for (i, id) in self.ids.iter().enumerate() {
            put_u32(out, 4 * i, *id);
        }
    }

    /// Reads a page.
    pub fn decode(b: &[u8; Self::SIZE]) -> ChangedNamespaceList {
        let mut ids = [0; 1024];
        for (i, id) in ids.iter_mut().enumerate() {
            *id = u32_at(b, 4 * i);
        }
        let len = ids.iter().take_while(|&&id| id != 0).count();
        ChangedNamespaceList { ids, len }
    }
}

/// Bits of a Commands Supported and Effects entry (NVMe 2.0 figure 211; SPDK
/// `struct spdk_nvme_cmds_and_effect_entry`, Linux `NVME_CMD_EFFECTS_*`).
pub mod effects {
    /// Command Supported (CSUPP).
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change (LBCC).
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change (NCC).
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change (NIC).
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change (CCC).
    pub const CCC: u32 = 1 << 4;
    /// Command Submission and Execution (CSE, bits 18:16) mask.
    pub const CSE_MASK: u32 = 0x7 << 16;
    /// CSE 001b: submit only when no other command is outstanding to the same namespace.
    pub const CSE_SINGLE_NS: u32 = 1 << 16;
    /// CSE 010b: submit only when no other command is outstanding to any namespace.
    pub const CSE_SINGLE_CMD: u32 = 2 << 16;
    /// UUID Selection Supported (USS, bit 19).
    pub const USS: u32 = 1 << 19;
    /// Command Scope: namespace (NSCPE, bit 20).
    pub const SCOPE_NAMESPACE: u32 = 1 << 20;
    /// Command Scope: controller (CSCPE, bit 21).
    pub const SCOPE_CONTROLLER: u32 = 1 << 21;
    /// Command Scope: NVM set (bit 22).
    pub const SCOPE_NVM_SET: u32 = 1 << 22;
    /// Command Scope: endurance group (bit 23).
    pub const SCOPE_ENDURANCE_GROUP: u32 = 1 << 23;
    /// Command Scope: domain (bit 24).
    pub const SCOPE_DOMAIN: u32 = 1 << 24;
    /// Command Scope: NVM subsystem (bit 25).
    pub const SCOPE_SUBSYSTEM: u32 = 1 << 25;
}

/// Commands Supported and Effects log (LID 05h, 4096 bytes; NVMe 2.0 figure 210): one dword of
/// [`effects`] bits per admin opcode (bytes 1023:0) and per I/O opcode (bytes 2047:1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CommandEffectsLog {
    /// Admin Command Supported entries, indexed by opcode.
    pub acs: [u32; 256],
    /// I/O Command Supported entries, indexed by opcode.
    pub iocs: [u32; 256],
}

impl Default for CommandEffectsLog {
    fn default() -> Self {
        CommandEffectsLog { acs: [0; 256], iocs: [0; 256] }
    }
}

impl CommandEffectsLog {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Byte offset of the I/O command entries.
    pub const OFFSET_IOCS: usize = 1024;

    /// Writes the page.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        for i in 0..256 {
            put_u32(out, 4 * i, self.acs[i]);
            put_u32(out, Self::OFFSET_IOCS + 4 * i, self.iocs[i]);
        }
    }

    /// Reads the page.
    pub fn decode(b: &[u8; Self::SIZE]) -> CommandEffectsLog {
        let mut l = CommandEffectsLog::default();
        for i in 0..256 {
            l.acs[i] = u32_at(b, 4 * i);
            l.iocs[i] = u32_at(b, Self::OFFSET_IOCS + 4 * i);
        }
        l
    }
}

/// Supported Log Pages log (LID 00h, 1024 bytes; NVMe 2.0 figure 203): one dword per LID, bit 0
/// LID Supported, bit 1 Index Offset Supported, bits 31:16 LID specific.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SupportedLogPages {
    /// Entries, indexed by LID.
    pub lids: [u32; 256],
}

impl Default for SupportedLogPages {
    fn default() -> Self {
        SupportedLogPages { lids: [0; 256] }
    }
}

impl SupportedLogPages {
    /// Size in bytes.
    pub const SIZE: usize = 1024;
    /// LID Supported.
    pub const LSUPP: u32 = 1 << 0;
    /// Index Offset Supported.
    pub const IOS: u32 = 1 << 1;

    /// Writes the page.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        for (i, v) in self.lids.iter().enumerate() {
            put_u32(out, 4 * i, *v);
        }
    }

    /// Reads the page.
    pub fn decode(b: &[u8; Self::SIZE]) -> SupportedLogPages {
        let mut lids = [0; 256];
        for (i, v) in lids.iter_mut().enumerate() {
            *v = u32_at(b, 4 * i);
        }
        SupportedLogPages { lids }
    }
}

/// ANA states (NVMe 2.0 figure 216).
pub mod ana_state {
    /// Optimized.
    pub const OPTIMIZED: u8 = 0x1;
    /// Non-Optimized.
    pub const NON_OPTIMIZED: u8 = 0x2;
    /// Inaccessible.
    pub const INACCESSIBLE: u8 = 0x3;
    /// Persistent Loss.
    pub const PERSISTENT_LOSS: u8 = 0x4;
    /// Change.
    pub const CHANGE: u8 = 0xf;
}

/// LSP bit of an ANA Get Log Page: Return Groups Only (descriptors without NSIDs).
pub const ANA_LSP_RGO: u8 = 1 << 0;

/// Asymmetric Namespace Access log header (LID 0Ch; NVMe 2.0 figure 214; SPDK
/// `struct spdk_nvme_ana_page`), followed by `ngrps` [`AnaGroupDescriptor`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AnaLogHeader {
    /// Change Count (bytes 7:0).
    pub chgcnt: u64,
    /// Number of ANA Group Descriptors (bytes 9:8).
    pub ngrps: u16,
}

impl AnaLogHeader {
    /// Size in bytes.
    pub const SIZE: usize = 16;

    /// Writes the header.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u64(out, 0, self.chgcnt);
        put_u16(out, 8, self.ngrps);
    }

    /// Reads a header.
    pub fn decode(b: &[u8; Self::SIZE]) -> AnaLogHeader {
        AnaLogHeader { chgcnt: u64_at(b, 0), ngrps: u16_at(b, 8) }
    }
}

/// One ANA Group Descriptor's fixed part (NVMe 2.0 figure 215; SPDK
/// `struct spdk_nvme_ana_group_descriptor`), followed on the wire by `nnsids` 4-byte NSIDs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AnaGroupDescriptor {
    /// ANA Group ID (bytes 3:0).
    pub grpid: u32,
    /// Number of NSID Values (bytes 7:4); 0 when RGO was set.
    pub nnsids: u32,
    /// Change Count (bytes 15:8).
    pub chgcnt: u64,
    /// ANA State (byte 16 bits 3:0); [`ana_state`].
    pub state: u8,
}

impl AnaGroupDescriptor {
    /// Size of the fixed part in bytes.
    pub const SIZE: usize = 32;

    /// Writes the fixed part.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u32(out, 0, self.grpid);
        put_u32(out, 4, self.nnsids);
        put_u64(out, 8, self.chgcnt);
        out[16] = self.state & 0xf;
    }

    /// Reads the fixed part.
    pub fn decode(b: &[u8; Self::SIZE]) -> AnaGroupDescriptor {
        AnaGroupDescriptor { grpid: u32_at(b, 0), nnsids: u32_at(b, 4), chgcnt: u64_at(b, 8), state: b[16] & 0xf }
    }

    /// Appends this descriptor and its `nsids` to a log cursor (use `nnsids` = `nsids.len()`);
    /// returns `false` once the host's buffer is full.
    pub fn push_to(&self, cursor: &mut LogCursor<'_>, nsids: &[u32]) -> bool {
        let mut b = [0; Self::SIZE];
        if !cursor.skip(Self::SIZE) {
            self.encode(&mut b);
            if !cursor.push(&b) {
                return false;
            }
        }
        for id in nsids {
            if !cursor.push(&id.to_le_bytes()) {
                return false;
            }
        }
        true
    }
}

/// Reads an ANA log page: the header and then each group with its NSIDs. Stops early, without
/// panicking, when the buffer ends before what the header or a descriptor announces.
pub fn read_ana_log(page: &[u8]) -> Option<(AnaLogHeader, AnaGroupIter<'_>)> {
    let (h, rest) = page.split_first_chunk::<{ AnaLogHeader::SIZE }>()?;
    let header = AnaLogHeader::decode(h);
    Some((header, AnaGroupIter { buf: rest, left: header.ngrps }))
}

/// Iterator over the groups of an ANA log page; see [`read_ana_log`].
#[derive(Clone, Debug)]
pub struct AnaGroupIter<'a> {
    buf: &'a [u8],
    left: u16,
}

impl<'a> Iterator for AnaGroupIter<'a> {
    /// A group's descriptor and its NSIDs' bytes (4 per NSID, little-endian).
    type Item = (AnaGroupDescriptor, AnaNsids<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (d, rest) = self.buf.split_first_chunk::<{ AnaGroupDescriptor::SIZE }>()?;
        let d = AnaGroupDescriptor::decode(d);
        let len = (d.nnsids as usize).checked_mul(4)?;
        let Some((ids, rest)) = rest.split_at_checked(len) else {
            self.left = 0;
            return None;
        };
        self.buf = rest;
        Some((d, AnaNsids(ids)))
    }
}

/// The NSIDs of one ANA group, as bytes from the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnaNsids<'a>(&'a [u8]);

impl AnaNsids<'_> {
    /// The NSIDs.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::super::status::{generic, Status};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn error_entry_offsets_match_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_error_information_entry) == 64); offsetof:
        // sqid 8, cid 10, status 12, error_location 14, lba 16, nsid 24, vendor_specific 28,
        // trtype 29, command_specific 32, trtype_specific 40.
        let e = ErrorInfoEntry {
            error_count: 0x0807_0605_0403_0201,
            sqid: 0x0a09,
            cid: 0x0c0b,
            status: Status::generic(generic::INVALID_FIELD).with_dnr(),
            phase: true,
            error_location: 0x100f,
            lba: 0x1817_1615_1413_1211,
            nsid: 0x1c1b_1a19,
            vendor_specific: 0x1d,
            trtype: 3,
            command_specific: 0x2726_2524_2322_2120,
            trtype_specific: 0x2928,
        };
        let mut b = [0u8; 64];
        e.encode(&mut b);
        assert_eq!(&b[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(u16::from_le_bytes([b[12], b[13]]), 0x8005);
        assert_eq!(
            &b[14..30],
            &[0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 3]
        );
        assert_eq!(&b[32..42], &[0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29]);
        assert_eq!(ErrorInfoEntry::decode(&b), e);
    }

    #[test]
    fn smart_offsets_match_spdk_and_linux() {
        // SPDK health page: temperature 1, available_spare 3, threshold 4, percentage_used 5,
        // data_units_read 32 ... num_error_info_log_entries 176, warning_temp_time 192,
        // critical_temp_time 196, temp_sensor 200. Linux: thm_temp1_trans_count 216 ... 228.
        let s = SmartLog {
            critical_warning: critical_warning::TEMPERATURE,
            temperature: 0x0123,
            available_spare: 100,
            available_spare_threshold: 10,
            percentage_used: 5,
            endurance_group_critical_warning: 6,
            data_units_read: 1,
            data_units_written: 2,
            host_read_commands: 3,
            host_write_commands: 4,
            controller_busy_time: 5,
            power_cycles: 6,
            power_on_hours: 7,
            unsafe_shutdowns: 8,
            media_errors: 9,
            num_error_info_log_entries: u128::MAX,
            warning_temp_time: 192,
            critical_temp_time: 196,
            temp_sensor: [200, 202, 204, 206, 208, 210, 212, 214],
            thm_transition_count: [216, 220],
            thm_total_time: [224, 228],
        };
        let mut b = [0u8; 512];
        s.encode(&mut b);
        assert_eq!(&b[..7], &[2, 0x23, 0x01, 100, 10, 5, 6]);
        for i in 0..9 {
            assert_eq!(b[32 + 16 * i], i as u8 + 1);
        }
        assert_eq!(&b[176..192], &[0xff; 16]);
        for o in [192, 196, 216, 220, 224, 228] {
            assert_eq!(u32::from_le_bytes(b[o..o + 4].try_into().unwrap()), o as u32);
        }
        for i in 0..8 {
            assert_eq!(u16::from_le_bytes([b[200 + 2 * i], b[201 + 2 * i]]), 200 + 2 * i as u16);
        }
        assert!(b[232..].iter().all(|&x| x == 0));
        assert_eq!(SmartLog::decode(&b), s);
    }

    #[test]
    fn firmware_slot_matches_spdk() {
        // SPDK firmware page: afi (active_slot:3, rsvd:1, next_reset_slot:3), revision at 8.
        let f = FirmwareSlotLog { afi: FirmwareSlotLog::afi(1, 0), frs: [*b"26.05   "; 7] };
        let mut b = [0u8; 512];
        f.encode(&mut b);
        assert_eq!(b[0], 1);
        assert_eq!(&b[8..16], b"26.05   ");
        assert_eq!(FirmwareSlotLog::afi(2, 3), 0x32);
        assert_eq!(FirmwareSlotLog::decode(&b), f);
    }

    #[test]
    fn changed_ns_list_overflows_like_spdk() {
        let mut l = ChangedNamespaceList::default();
        l.push(5);
        l.push(5);
        l.push(2);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![5, 2]);
        for id in 1..=1024 {
            l.push(id + 10);
        }
        assert_eq!(l.ids[0], ChangedNamespaceList::OVERFLOW);
        assert!(l.ids[1..].iter().all(|&x| x == 0));
        let mut b = [0u8; 4096];
        l.encode(&mut b);
        assert_eq!(&b[..8], &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(ChangedNamespaceList::decode(&b), l);
    }

    #[test]
    fn effects_layout_matches_spdk() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_cmds_and_effect_log_page) == 4096);
        // io_cmds_supported at 1024; entry bits: cse 18:16 (byte 2 = 07h), uss 19, nscpe 20.
        let mut l = CommandEffectsLog::default();
        l.acs[0x06] = effects::CSUPP | effects::SCOPE_NAMESPACE | effects::SCOPE_CONTROLLER;
        l.iocs[0x01] = effects::CSUPP | effects::LBCC | effects::SCOPE_NAMESPACE;
        l.iocs[0xff] = effects::CSE_MASK | effects::USS;
        let mut b = [0u8; 4096];
        l.encode(&mut b);
        assert_eq!(&b[24..28], &[1, 0, 0x30, 0]);
        assert_eq!(&b[1028..1032], &[3, 0, 0x10, 0]);
        assert_eq!(&b[2044..2048], &[0, 0, 0x0f, 0]);
        assert_eq!(CommandEffectsLog::decode(&b), l);
        let mut s = SupportedLogPages::default();
        s.lids[0x70] = SupportedLogPages::LSUPP;
        let mut b = [0u8; 1024];
        s.encode(&mut b);
        assert_eq!(b[0x70 * 4], 1);
        assert_eq!(SupportedLogPages::decode(&b), s);
    }

    /// An ANA page with two groups, built through a cursor from `offset` into `out`.
    fn ana_page(out: &mut [u8], offset: u64) -> usize {
        let mut c = LogCursor::new(out, offset);
        let mut h = [0; 16];
        AnaLogHeader { chgcnt: 7, ngrps: 2 }.encode(&mut h);
        if !c.skip(16) {
            c.push(&h);
        }
        let g1 = AnaGroupDescriptor { grpid: 1, nnsids: 2, chgcnt: 7, state: ana_state::OPTIMIZED };
        let g2 = AnaGroupDescriptor { grpid: 2, nnsids: 1, chgcnt: 7, state: ana_state::INACCESSIBLE };
        let _ = g1.push_to(&mut c, &[1, 3]) && g2.push_to(&mut c, &[2]);
        c.written()
    }

    #[test]
    fn ana_page_matches_spdk_layout_and_slices() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_ana_page) == 16) and
        // sizeof(struct spdk_nvme_ana_group_descriptor) == 32: num_ana_group_desc 8;
        // num_of_nsid 4, change_count 8, ana_state 16, nsid[] 32.
        let mut full = [0u8; 100];
        assert_eq!(ana_page(&mut full, 0), 16 + 32 + 8 + 32 + 4);
        assert_eq!(&full[..10], &[7, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
        assert_eq!(&full[16..24], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(full[32], 1);
        assert_eq!(&full[48..56], &[1, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!((full[56], full[72]), (2, 3));
        assert_eq!(&full[88..92], &[2, 0, 0, 0]);
        let (h, groups) = read_ana_log(&full).unwrap();
        assert_eq!(h, AnaLogHeader { chgcnt: 7, ngrps: 2 });
        let groups: Vec<_> = groups.map(|(d, ids)| (d.grpid, d.state, ids.iter().collect::<Vec<_>>())).collect();
        assert_eq!(groups, vec![(1, 1, vec![1, 3]), (2, 3, vec![2])]);
        // Every offset and length gives the same bytes as slicing the whole page.
        for off in (0..92).step_by(4) {
            for len in [4, 8, 20, 36, 100] {
                let mut part = vec![0xaau8; len];
                let n = ana_page(&mut part, off as u64);
                let want = &full[off..(off + len).min(92)];
                assert_eq!(&part[..n], want, "offset {off} len {len}");
                assert!(part[n..].iter().all(|&x| x == 0));
            }
        }
        // A truncated page stops without panicking.
        let (_, groups) = read_ana_log(&full[..60]).unwrap();
        assert_eq!(groups.count(), 1);
        assert!(read_ana_log(&full[..10]).is_none());
    }

    #[test]
    fn read_log_checks_offsets_like_spdk() {
        let page: Vec<u8> = (0..64).collect();
        let mut out = [0xaau8; 16];
        assert_eq!(read_log(&page, 60, &mut out), Ok(4));
        assert_eq!(&out[..5], &[60, 61, 62, 63, 0]);
        assert_eq!(read_log(&page, 2, &mut out), Err(LogRangeError::Unaligned));
        assert_eq!(read_log(&page, 64, &mut out), Err(LogRangeError::PastEnd));
        assert_eq!(read_log(&page, 0, &mut out), Ok(16));
        assert_eq!(out[15], 15);
    }

    proptest! {
        #[test]
        fn fixed_pages_decode_any(b in proptest::array::uniform::<_, 512>(any::<u8>())) {
            let e = ErrorInfoEntry::decode(b[..64].try_into().unwrap());
            let mut eb = [0u8; 64];
            e.encode(&mut eb);
            prop_assert_eq!(ErrorInfoEntry::decode(&eb), e);
            let s = SmartLog::decode(&b);
            let mut sb = [0u8; 512];
            s.encode(&mut sb);
            prop_assert_eq!(SmartLog::decode(&sb), s);
            let f = FirmwareSlotLog::decode(&b);
            f.encode(&mut sb);
            prop_assert_eq!(FirmwareSlotLog::decode(&sb), f);
            let d = AnaGroupDescriptor::decode(b[..32].try_into().unwrap());
            let mut db = [0u8; 32];
            d.encode(&mut db);
            prop_assert_eq!(AnaGroupDescriptor::decode(&db), d);
        }

        #[test]
        fn ana_reader_any_bytes(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Some((_, groups)) = read_ana_log(&b) {
                for (_, ids) in groups {
                    let _ = ids.iter().count();
                }
            }
        }

        #[test]
        fn cursor_equals_slicing(page in proptest::collection::vec(any::<u8>(), 1..300),
                                 chunk in 1usize..40, off in 0u64..320, len in 0usize..64) {
            let mut out = vec![0xaau8; len];
            let mut c = LogCursor::new(&mut out, off);
            for piece in page.chunks(chunk) {
                if !c.push(piece) {
                    break;
                }
            }
            let n = c.written();
            let start = (off as usize).min(page.len());
            let want = &page[start..(start + len).min(page.len())];
            prop_assert_eq!(&out[..n], want);
            prop_assert!(out[n..].iter().all(|&x| x == 0));
        }
    }
}
