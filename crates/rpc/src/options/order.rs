//! The order `save_config` writes option methods in: SPDK's, within each subsystem (SPDK's
//! modules write their options in their registration order, which a saved config keeps).

/// Every option method, in SPDK v26.05's `save_config` order within its subsystem. A new option
/// method is added here where SPDK writes it; registering one that is not here fails.
pub const SPDK_ORDER: &[&str] = &[
    "framework_set_scheduler",
    "scheduler_set_options",
    "sock_set_default_impl",
    "sock_impl_set_options",
    "iobuf_set_options",
    "keyring_linux_set_options",
    "fsdev_set_opts",
    "accel_set_options",
    "bdev_set_options",
    "bdev_raid_set_options",
    "bdev_iscsi_set_options",
    "bdev_nvme_set_options",
    "bdev_nvme_set_hotplug",
    "nvmf_set_config",
    "nvmf_set_max_subsystems",
    "nvmf_set_crdt",
    "iscsi_set_options",
];
