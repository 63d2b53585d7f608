//! SPDK v26.05's limits of the iSCSI target's configuration (lib/iscsi/iscsi.h, conn.h,
//! include/spdk/scsi.h), which its RPCs enforce and Ferrite's do too.

/// Longest target node name, after the node base is prefixed (`MAX_TARGET_NAME`); also the
/// longest alias.
pub const MAX_TARGET_NAME: usize = 223;
/// Longest initiator name in an initiator group (`MAX_INITIATOR_NAME`).
pub const MAX_INITIATOR_NAME: usize = 223;
/// Longest netmask in an initiator group (`MAX_INITIATOR_ADDR`).
pub const MAX_NETMASK_LEN: usize = 64;
/// Most initiator names in one initiator group (`MAX_INITIATOR`).
pub const MAX_INITIATORS: usize = 256;
/// Most netmasks in one initiator group (`MAX_NETMASK`).
pub const MAX_NETMASKS: usize = 256;
/// Longest portal host (`MAX_PORTAL_ADDR`).
pub const MAX_PORTAL_ADDR: usize = 256;
/// Longest portal port string (`MAX_PORTAL_PORT`).
pub const MAX_PORTAL_PORT: usize = 32;
/// Most portals one `iscsi_create_portal_group` call takes (the schema's `iscsi_portals`).
pub const MAX_PORTALS: usize = 1024;
/// Most portal groups a target node maps (`SPDK_SCSI_DEV_MAX_PORTS`: one SCSI port each).
pub const MAX_PG_MAPS: usize = 4;
/// Most pg-ig pairs one call takes (the schema's `iscsi_pg_ig_maps`).
pub const MAX_PG_IG_MAPS_PER_CALL: usize = 256;
/// LUN ids are below this (`SPDK_SCSI_DEV_MAX_LUN`).
pub const MAX_LUN: u32 = 256;
/// Most LUNs one `iscsi_create_target_node` call takes (the schema's `scsi_luns`).
pub const MAX_LUNS_PER_CALL: usize = 64;
/// Most secrets one `iscsi_create_auth_group` call takes (the schema's `iscsi_auth_secrets`).
pub const MAX_SECRETS_PER_CALL: usize = 64;
/// Longest CHAP user name or secret (`ISCSI_CHAP_MAX_USER_LEN`, `_SECRET_LEN`).
pub const MAX_CHAP_LEN: usize = 255;
/// Largest `nop_in_interval` (`MAX_NOPININTERVAL`).
pub const MAX_NOP_IN_INTERVAL: i32 = 60;
/// Smallest `first_burst_length` (`SPDK_ISCSI_MIN_FIRST_BURST_LENGTH`).
pub const MIN_FIRST_BURST_LENGTH: u32 = 512;
/// Largest `first_burst_length`: SPDK's MaxBurstLength (64 KiB data segments times 16).
pub const MAX_BURST_LENGTH: u32 = 65536 * 16;
/// Largest `max_queue_depth` (SPDK's `iscsi_opts_verify`).
pub const MAX_QUEUE_DEPTH: u32 = 256;
