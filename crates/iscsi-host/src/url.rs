//! libiscsi's URL of a LUN, as `bdev_iscsi_create` takes it:
//! `iscsi://[user[%password]@]host[:port]/target-iqn/lun[?arg=value&...]`.
//!
//! The host is a name, an IPv4 address or an IPv6 address in brackets; the port defaults to
//! 3260. As in libiscsi, `%` separates the CHAP user from its secret (nothing is
//! percent-decoded), and the query may name the target's CHAP credentials for mutual CHAP
//! (`target_user`, `target_password`) and the digest wanted (`header_digest`, `data_digest`:
//! `none`, `crc32c`, `crc32c-none`, `none-crc32c`).

use ferrite_iscsi::negotiate::DigestPolicy;

/// The default iSCSI port.
pub const DEFAULT_PORT: u16 = 3260;
/// The largest LUN number a single-level LUN field holds (flat space addressing).
pub const MAX_LUN: u16 = 16383;

/// A parsed URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// CHAP name (before `%` or `@`).
    pub user: Option<String>,
    /// CHAP secret (after `%`).
    pub password: Option<String>,
    /// Host: a name or an address (without the brackets of an IPv6 one).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Target name.
    pub target: String,
    /// LUN number.
    pub lun: u16,
    /// The target's CHAP name, for mutual CHAP.
    pub target_user: Option<String>,
    /// The target's CHAP secret, for mutual CHAP.
    pub target_password: Option<String>,
    /// HeaderDigest wanted (default: None preferred, CRC32C accepted).
    pub header_digest: Option<DigestPolicy>,
    /// DataDigest wanted (default: None preferred, CRC32C accepted).
    pub data_digest: Option<DigestPolicy>,
}

impl std::fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets stay out of logs.
        f.debug_struct("IscsiUrl")
            .field("user", &self.user)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("target", &self.target)
            .field("lun", &self.lun)
            .finish_non_exhaustive()
    }
}

fn digest(v: &str) -> Option<DigestPolicy> {
    Some(match v.to_ascii_lowercase().as_str() {
        "none" => DigestPolicy::Off,
        "crc32c" => DigestPolicy::Required,
        "crc32c-none" | "crc32c,none" => DigestPolicy::Preferred,
        "none-crc32c" | "none,crc32c" => DigestPolicy::Allowed,
        _ => return None,
    })
}

impl IscsiUrl {
    /// Parses `url`; the error says what is wrong.
    pub fn parse(url: &str) -> Result<IscsiUrl, String> {
        let rest = url.strip_prefix("iscsi://").ok_or_else(|| format!("URL {url:?} does not start with iscsi://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        // The credentials end at the last '@' before the path (a secret may hold '@').
        let path_at = rest.find('/').ok_or("the URL has no target name (iscsi://host[:port]/target/lun)")?;
        let (auth, rest) = match rest[..path_at].rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once('%') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(a.to_string()), None),
            },
        };
        if user.as_deref() == Some("") {
            return Err("the CHAP user before '@' is empty".into());
        }
        let (portal, path) = rest.split_once('/').ok_or("the URL has no target name")?;
        let (host, port) = split_portal(portal)?;
        let (target, lun) = path.rsplit_once('/').ok_or("the URL has no LUN (iscsi://host/target/lun)")?;
        if target.is_empty() {
            return Err("the target name is empty".into());
        }
        if target.contains('/') {
            return Err(format!("target name {target:?} holds a '/'"));
        }
        let lun: u16 = lun
            .parse()
            .ok()
            .filter(|&l| l <= MAX_LUN)
            .ok_or_else(|| format!("LUN {lun:?} is not a number from 0 to {MAX_LUN}"))?;
        let mut u = IscsiUrl {
            user,
            password,
            host,
            port,
            target: target.to_string(),
            lun,
            target_user: None,
            target_password: None,
            header_digest: None,
            data_digest: None,
        };
        for arg in query.into_iter().flat_map(|q| q.split('&')).filter(|a| !a.is_empty()) {
            let (k, v) = arg.split_once('=').unwrap_or((arg, ""));
            match k {
                "target_user" => u.target_user = Some(v.to_string()),
                "target_password" => u.target_password = Some(v.to_string()),
                "header_digest" => u.header_digest = Some(digest(v).ok_or(format!("header_digest {v:?}"))?),
                "data_digest" => u.data_digest = Some(digest(v).ok_or(format!("data_digest {v:?}"))?),
                _ => return Err(format!("unknown URL argument {k:?}")),
            }
        }
        if u.target_user.is_some() != u.target_password.is_some() {
            return Err("mutual CHAP needs both target_user and target_password".into());
        }
        if u.target_user.is_some() && u.password.is_none() {
            return Err("mutual CHAP needs the initiator's user%password too".into());
        }
        Ok(u)
    }

    /// The LUN field of SCSI PDUs for this LUN (SAM's single-level LUN: peripheral device
    /// addressing below 256, flat space above, as libiscsi writes it).
    pub fn lun_field(&self) -> u64 {
        lun_field(self.lun)
    }
}

/// The 8-byte LUN field (big-endian, as the PDU codec holds it) of LUN number `lun`.
pub fn lun_field(lun: u16) -> u64 {
    let first = if lun < 256 { [0, lun as u8] } else { [0x40 | (lun >> 8) as u8, lun as u8] };
    u64::from(u16::from_be_bytes(first)) << 48
}

fn split_portal(portal: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = portal.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("an IPv6 address without its ']'")?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?)),
        }
    } else {
        match portal.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (portal, None),
        }
    };
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse().ok().filter(|&p| p != 0).ok_or_else(|| format!("port {p:?} is not a TCP port"))?,
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_url() {
        let u = IscsiUrl::parse("iscsi://127.0.0.1:3261/iqn.2016-06.io.spdk:disk1/0").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.target.as_str(), u.lun),
            ("127.0.0.1", 3261, "iqn.2016-06.io.spdk:disk1", 0)
        );
        assert_eq!((u.user, u.password), (None, None));
        let u = IscsiUrl::parse("iscsi://storage.example/iqn.x:y/7").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.lun), ("storage.example", DEFAULT_PORT, 7));
    }

    #[test]
    fn chap_credentials_and_mutual_chap() {
        let u = IscsiUrl::parse("iscsi://alice%s3cr%t@h:1/t/1").unwrap();
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("s3cr%t"), "only the first % separates");
        assert!(!format!("{u:?}").contains("s3cr"), "Debug shows no secret");
        let u = IscsiUrl::parse("iscsi://bob%p@ss@h/t/2?target_user=tgt&target_password=tp").unwrap();
        assert_eq!((u.password.as_deref(), u.host.as_str()), (Some("p@ss"), "h"), "the last @ ends the credentials");
        assert_eq!((u.target_user.as_deref(), u.target_password.as_deref()), (Some("tgt"), Some("tp")));
        let u = IscsiUrl::parse("iscsi://carol@h/t/0").unwrap();
        assert_eq!((u.user.as_deref(), u.password.as_deref()), (Some("carol"), None));
        assert!(IscsiUrl::parse("iscsi://@h/t/0").is_err());
        assert!(IscsiUrl::parse("iscsi://h/t/0?target_user=x").is_err(), "half the target's credentials");
        assert!(IscsiUrl::parse("iscsi://h/t/0?target_user=x&target_password=y").is_err(), "mutual without own");
    }

    #[test]
    fn ipv6_ports_luns_and_arguments() {
        let u = IscsiUrl::parse("iscsi://[::1]:3262/iqn.a:b/300?header_digest=crc32c").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.lun), ("::1", 3262, 300));
        assert_eq!(u.header_digest, Some(DigestPolicy::Required));
        assert_eq!(IscsiUrl::parse("iscsi://[fe80::2]/t/0").unwrap().port, DEFAULT_PORT);
        for bad in [
            "http://h/t/0",
            "iscsi://h",
            "iscsi://h/t",
            "iscsi://h//0",
            "iscsi://h/t/x",
            "iscsi://h/t/16384",
            "iscsi://h:0/t/0",
            "iscsi://h:port/t/0",
            "iscsi://:3260/t/0",
            "iscsi://[::1/t/0",
            "iscsi://h/a/b/0",
            "iscsi://h/t/0?frob=1",
            "iscsi://h/t/0?data_digest=md5",
        ] {
            assert!(IscsiUrl::parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn lun_fields_follow_sam_addressing() {
        assert_eq!(lun_field(0), 0);
        assert_eq!(lun_field(1).to_be_bytes(), [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lun_field(255).to_be_bytes()[..2], [0, 255]);
        assert_eq!(lun_field(256).to_be_bytes()[..2], [0x41, 0], "flat space from 256");
        assert_eq!(lun_field(MAX_LUN).to_be_bytes()[..2], [0x7f, 0xff]);
    }
}
