//! The configuration the engine consumes, as immutable snapshots: portal groups, initiator
//! groups, auth groups and target nodes (with their LUNs and portal group maps). The registry
//! ([`crate::state`]) holds each behind an `Arc` and replaces it on change, so a snapshot taken
//! at login stays coherent while RPCs change the configuration.

use crate::chap::ChapParams;
use crate::netmask;
use ferrite_bdev::BdevDesc;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Why a change of the configuration was refused: an errno (SPDK's code where it answers with
/// one) and what is wrong, for the log and the RPC answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The errno SPDK's function returns (EINVAL, EEXIST, ENOENT, ...).
    pub errno: i32,
    /// What is wrong.
    pub why: String,
}

impl Refused {
    /// A refusal with `errno`.
    pub fn new(errno: i32, why: impl Into<String>) -> Refused {
        Refused { errno, why: why.into() }
    }

    /// EINVAL.
    pub fn invalid(why: impl Into<String>) -> Refused {
        Refused::new(libc::EINVAL, why)
    }
}

/// One listening address of a portal group, as configured (`host` may be a wildcard,
/// `0.0.0.0` or `[::]`; `port` is SPDK's text, read as C's `strtol` with base 0 reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portal {
    /// Numeric IPv4 or IPv6 address (IPv6 with or without brackets), or a wildcard.
    pub host: String,
    /// The port as given (decimal, `0x` hexadecimal or `0` octal).
    pub port: String,
}

impl Portal {
    /// The address to listen on, if host and port parse.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let host = self.host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&self.host);
        let ip: IpAddr = host.parse().ok()?;
        Some(SocketAddr::new(ip, crate::portal::port_number(&self.port)?))
    }

    /// True if the host is a wildcard: SendTargets then names the address the initiator
    /// connected to instead (SPDK: `conn->target_addr`).
    pub fn is_wildcard(&self) -> bool {
        self.host.eq_ignore_ascii_case("0.0.0.0") || self.host.eq_ignore_ascii_case("[::]")
    }
}

/// A portal group: a target portal group tag and the portals it listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalGroup {
    /// The tag (TPGT, 0-65535).
    pub tag: i32,
    /// Where it listens.
    pub portals: Vec<Portal>,
    /// Not listed by SendTargets (reached by login redirection only).
    pub private: bool,
    /// `iscsi_portal_group_set_auth`'s settings (initially the discovery auth). SPDK records
    /// them but its logins use the discovery auth or the target node's, never these.
    pub chap: ChapParams,
    /// Accepting connections (false while created with `wait` and not yet started).
    pub started: bool,
}

/// An initiator group: who may log in (names, `ANY`, `!name` denials) and from where
/// (netmasks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorGroup {
    /// The tag.
    pub tag: i32,
    /// Initiator names, `ANY`, or either with `!` before it (a denial), in order.
    pub initiators: Vec<String>,
    /// Netmasks (`ANY`, IPv4 `a.b.c.d[/bits]`, IPv6 `[addr][/bits]`), in order.
    pub netmasks: Vec<String>,
}

impl InitiatorGroup {
    /// What the group says of initiator `iqn` (SPDK's `iscsi_init_grp_allow_iscsi_name`): the
    /// first entry that names it (or `ANY`) decides, `!` denying; `None` if no entry does.
    pub fn name_verdict(&self, iqn: &str) -> Option<bool> {
        self.initiators.iter().find_map(|n| {
            if let Some(denied) = n.strip_prefix('!') {
                if denied.eq_ignore_ascii_case("ANY") || denied.eq_ignore_ascii_case(iqn) {
                    return Some(false);
                }
            }
            (n.eq_ignore_ascii_case("ANY") || n.eq_ignore_ascii_case(iqn)).then_some(true)
        })
    }

    /// True if one of the netmasks admits `addr`.
    pub fn allows_addr(&self, addr: IpAddr) -> bool {
        self.netmasks.iter().any(|m| netmask::allows(m, addr))
    }
}

/// CHAP credentials: the initiator's name and secret, and the target's for mutual CHAP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The name the initiator authenticates as.
    pub user: String,
    /// Its secret.
    pub secret: String,
    /// The name the target answers with in mutual CHAP.
    pub muser: Option<String>,
    /// The target's secret in mutual CHAP.
    pub msecret: Option<String>,
}

/// An auth group: CHAP secrets by user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthGroup {
    /// The tag (`chap_group` of a node, a portal group or the discovery auth names it).
    pub tag: i32,
    /// The secrets, in the order added.
    pub secrets: Vec<Secret>,
}

/// Where logins to a target node through one portal group are sent instead
/// (`iscsi_target_node_set_redirect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// Numeric IP address.
    pub host: String,
    /// Numeric port.
    pub port: String,
}

/// A portal group a target node is reached through, and the initiator groups admitted there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgMap {
    /// The portal group's tag.
    pub pg_tag: i32,
    /// The initiator groups' tags, in the order mapped (never empty).
    pub ig_tags: Vec<i32>,
    /// The login redirection through this portal group, if set.
    pub redirect: Option<Redirect>,
}

/// A logical unit: an id and the bdev behind it, held open (writable) as SPDK's LUN holds its
/// bdev. The engine takes channels from [`Lun::desc`] (or opens the bdev itself).
pub struct Lun {
    /// LUN id (0-255).
    pub id: u32,
    /// The bdev's own name (an lvol's UUID-based name rather than the alias it was named by, as
    /// SPDK saves it).
    pub bdev_name: String,
    desc: BdevDesc,
}

impl Lun {
    /// A LUN over an open descriptor.
    pub(crate) fn new(id: u32, bdev_name: String, desc: BdevDesc) -> Lun {
        Lun { id, bdev_name, desc }
    }

    /// The open descriptor of the LUN's bdev.
    pub fn desc(&self) -> &BdevDesc {
        &self.desc
    }
}

impl std::fmt::Debug for Lun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lun").field("id", &self.id).field("bdev_name", &self.bdev_name).finish()
    }
}

/// A target node: its name, LUNs, where it is reached and by whom, and its login settings.
#[derive(Debug, Clone)]
pub struct TargetNode {
    /// Unique for the life of the process: a node deleted and created again gets a new id.
    pub id: u64,
    /// Full iSCSI name (node base prefixed).
    pub name: String,
    /// TargetAlias, if any.
    pub alias: Option<String>,
    /// Portal groups it is reached through (at most 4), in the order mapped.
    pub pg_maps: Vec<PgMap>,
    /// LUNs, by ascending id.
    pub luns: Vec<Arc<Lun>>,
    /// Commands outstanding per connection (clamped to `max_queue_depth`).
    pub queue_depth: u32,
    /// CHAP settings of its logins.
    pub chap: ChapParams,
    /// HeaderDigest CRC32C required.
    pub header_digest: bool,
    /// DataDigest CRC32C required.
    pub data_digest: bool,
}

impl TargetNode {
    /// The map of portal group `tag`, if the node is reached through it.
    pub fn pg_map(&self, tag: i32) -> Option<&PgMap> {
        self.pg_maps.iter().find(|m| m.pg_tag == tag)
    }

    /// The LUN with id `id`.
    pub fn lun(&self, id: u32) -> Option<&Arc<Lun>> {
        self.luns.iter().find(|l| l.id == id)
    }

    /// The lowest LUN id not in use, if one is below 256 (SPDK's `scsi_dev_find_free_lun`).
    pub(crate) fn free_lun_id(&self) -> Option<u32> {
        let mut id = 0;
        for l in &self.luns {
            if l.id > id {
                break;
            }
            id = l.id + 1;
        }
        (id < crate::limits::MAX_LUN).then_some(id)
    }

    /// Inserts `lun` in id order (its id must be free).
    pub(crate) fn insert_lun(&mut self, lun: Arc<Lun>) {
        debug_assert!(self.lun(lun.id).is_none(), "LUN {} taken", lun.id);
        let at = self.luns.partition_point(|l| l.id < lun.id);
        self.luns.insert(at, lun);
        debug_assert!(self.luns.windows(2).all(|w| w[0].id < w[1].id));
    }
}
