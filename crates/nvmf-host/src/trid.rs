//! A path to a subsystem: SPDK's transport ID (TCP only) as attach and detach name it.

use serde_json::{json, Value};

/// One network path to a subsystem (SPDK's `spdk_nvme_transport_id` for TCP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trid {
    /// "IPv4" or "IPv6".
    pub adrfam: String,
    /// Address.
    pub traddr: String,
    /// Port.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
}

impl Trid {
    /// The socket address to connect to.
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr, String> {
        let s = if self.adrfam.eq_ignore_ascii_case("ipv6") {
            format!("[{}]:{}", self.traddr, self.trsvcid)
        } else {
            format!("{}:{}", self.traddr, self.trsvcid)
        };
        s.parse().map_err(|e| format!("address {s}: {e}"))
    }

    /// True if both name the same network path (address and port; SPDK's check for a path
    /// given twice).
    pub fn same_path(&self, o: &Trid) -> bool {
        self.traddr == o.traddr && self.trsvcid == o.trsvcid
    }

    /// The trid as SPDK's RPCs show it (`nvme_bdev_dump_trid_json`).
    pub fn json(&self) -> Value {
        json!({"trtype": "TCP", "adrfam": self.adrfam, "traddr": self.traddr, "trsvcid": self.trsvcid,
            "subnqn": self.subnqn})
    }
}

/// What a detach names: fields left out match any path (SPDK's `nvme_path_id_compare`).
#[derive(Debug, Clone, Default)]
pub struct PathFilter {
    /// Address.
    pub traddr: Option<String>,
    /// Port.
    pub trsvcid: Option<String>,
    /// Address family.
    pub adrfam: Option<String>,
    /// Subsystem NQN.
    pub subnqn: Option<String>,
}

impl PathFilter {
    /// True if the filter names no field (the whole controller).
    pub fn is_empty(&self) -> bool {
        self.traddr.is_none() && self.trsvcid.is_none() && self.adrfam.is_none() && self.subnqn.is_none()
    }

    /// True if `t` matches every field given.
    pub fn matches(&self, t: &Trid) -> bool {
        self.traddr.as_ref().is_none_or(|a| *a == t.traddr)
            && self.trsvcid.as_ref().is_none_or(|a| *a == t.trsvcid)
            && self.adrfam.as_ref().is_none_or(|a| a.eq_ignore_ascii_case(&t.adrfam))
            && self.subnqn.as_ref().is_none_or(|a| *a == t.subnqn)
    }
}
