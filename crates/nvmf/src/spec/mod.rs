//! The NVMe base specification's and NVMe-oF's data structures, as bytes on the wire.
