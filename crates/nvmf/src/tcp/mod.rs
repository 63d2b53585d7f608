//! The NVMe/TCP transport (NVMe/TCP transport specification, NVMe-oF 1.1).
