//! NVMe Qualified Names and the 256-byte fields that carry them (NVMe Base Specification 2.0,
//! section 4.5 "NVMe Qualified Names"; SPDK `SPDK_NVMF_NQN_MAX_LEN` and `nvmf_nqn_is_valid`,
//! Linux `NVMF_NQN_SIZE` and `NVMF_NQN_FIELD_LEN`).
//!
//! An NQN is a UTF-8 string of at most 223 bytes. On the wire (Connect data, Identify
//! Controller SUBNQN, discovery log entries) it sits in a 256-byte field, NUL-terminated and
//! NUL-padded, so the terminator is at most at byte 223.

use std::fmt;

use super::le::pad_field;

/// Size of an NQN field on the wire.
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN, in bytes, not counting the NUL terminator.
pub const NQN_MAX_LEN: usize = 223;
/// Shortest NQN SPDK accepts: the `nqn.yyyy-mm.` prefix needs this many characters.
pub const NQN_MIN_LEN: usize = 11;
/// The well-known discovery subsystem's NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of an NQN made from a UUID (followed by the 36-character UUID).
pub const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why an NQN or NQN field was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NqnError {
    /// Longer than [`NQN_MAX_LEN`] bytes (or no NUL within the first 224 bytes of a field).
    TooLong,
    /// Shorter than [`NQN_MIN_LEN`] bytes.
    TooShort,
    /// Contains a NUL byte.
    InteriorNul,
    /// Not UTF-8.
    NotUtf8,
    /// Does not start with `nqn.`.
    BadPrefix,
    /// The `yyyy-mm.` date after `nqn.` is malformed.
    BadDate,
    /// No `:` followed by a user part after the reverse domain name.
    NoUserPart,
    /// The reverse domain name breaks RFC 1034 label rules.
    BadDomain,
    /// A `UUID_NQN_PREFIX` NQN whose UUID is not 8-4-4-4-12 hex digits.
    BadUuid,
}

impl fmt::Display for NqnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            NqnError::TooLong => "NQN longer than 223 bytes",
            NqnError::TooShort => "NQN shorter than 11 bytes",
            NqnError::InteriorNul => "NQN contains a NUL byte",
            NqnError::NotUtf8 => "NQN is not UTF-8",
            NqnError::BadPrefix => "NQN does not start with \"nqn.\"",
            NqnError::BadDate => "NQN date is not yyyy-mm.",
            NqnError::NoUserPart => "NQN has no \":\" and user part after the domain",
            NqnError::BadDomain => "NQN reverse domain name is malformed",
            NqnError::BadUuid => "NQN UUID is malformed",
        };
        f.write_str(s)
    }
}

impl std::error::Error for NqnError {}

/// A 256-byte NQN field as it travels. Any bytes can be held (decoding never fails);
/// [`NqnField::as_str`] checks the termination and encoding when the name is needed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NqnField(pub [u8; NQN_FIELD_LEN]);

impl Default for NqnField {
    fn default() -> Self {
        NqnField([0; NQN_FIELD_LEN])
    }
}

impl NqnField {
    /// A field holding `nqn`, NUL-padded. Checks only what the field needs (length and no NUL
    /// inside); [`validate`] checks the name's format.
    pub fn new(nqn: &str) -> Result<NqnField, NqnError> {
        if nqn.len() > NQN_MAX_LEN {
            return Err(NqnError::TooLong);
        }
        if nqn.as_bytes().contains(&0) {
            return Err(NqnError::InteriorNul);
        }
        let mut f = NqnField::default();
        pad_field(&mut f.0, nqn.as_bytes(), 0);
        Ok(f)
    }

    /// The name: the bytes before the NUL, which must come within the first 224 bytes (what
    /// SPDK's target checks of HOSTNQN), as UTF-8.
    pub fn as_str(&self) -> Result<&str, NqnError> {
        let len = self.0[..=NQN_MAX_LEN].iter().position(|&c| c == 0).ok_or(NqnError::TooLong)?;
        std::str::from_utf8(&self.0[..len]).map_err(|_| NqnError::NotUtf8)
    }

    /// The name, validated with [`validate`].
    pub fn to_valid_str(&self) -> Result<&str, NqnError> {
        let s = self.as_str()?;
        validate(s)?;
        Ok(s)
    }
}

impl fmt::Debug for NqnField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Ok(s) => write!(f, "NqnField({s:?})"),
            Err(e) => write!(f, "NqnField(<{e}>)"),
        }
    }
}

/// Checks an NQN's format as SPDK's target does (`nvmf_nqn_is_valid`): 11 to 223 bytes, and
/// either [`DISCOVERY_NQN`], or [`UUID_NQN_PREFIX`] and a UUID, or
/// `nqn.yyyy-mm.reverse.domain:user part` where the domain's labels start with a letter, hold
/// letters, digits and `-`, end with a letter or digit and are at most 63 characters.
pub fn validate(nqn: &str) -> Result<(), NqnError> {
    let b = nqn.as_bytes();
    if b.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong);
    }
    if b.len() < NQN_MIN_LEN {
        return Err(NqnError::TooShort);
    }
    if b.contains(&0) {
        return Err(NqnError::InteriorNul);
    }
    if nqn == DISCOVERY_NQN {
        return Ok(());
    }
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        return if is_uuid(uuid) { Ok(()) } else { Err(NqnError::BadUuid) };
    }
    if !nqn.starts_with("nqn.") {
        return Err(NqnError::BadPrefix);
    }
    let date_ok = b.len() > 11
        && b[4..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'-'
        && b[9..11].iter().all(u8::is_ascii_digit)
        && b[11] == b'.';
    if !date_ok {
        return Err(NqnError::BadDate);
    }
    let colon = match nqn.find(':') {
        Some(i) if i + 1 < b.len() => i,
        _ => return Err(NqnError::NoUserPart),
    };
    if colon < 12 {
        return Err(NqnError::BadDomain);
    }
    for label in nqn[12..colon].split('.') {
        let l = label.as_bytes();
        let ok = l.len() <= 63
            && l.first().is_some_and(u8::is_ascii_alphabetic)
            && l.last().is_some_and(u8::is_ascii_alphanumeric)
            && l.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-');
        if !ok {
            return Err(NqnError::BadDomain);
        }
    }
    Ok(())
}

/// Whether `s` is a UUID in its 8-4-4-4-12 hexadecimal text form.
fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn field_is_nul_terminated_and_padded() {
        let f = NqnField::new("nqn.2016-06.io.spdk:cnode1").unwrap();
        assert_eq!(&f.0[..26], b"nqn.2016-06.io.spdk:cnode1");
        assert!(f.0[26..].iter().all(|&c| c == 0));
        assert_eq!(f.as_str(), Ok("nqn.2016-06.io.spdk:cnode1"));
        assert_eq!(f.to_valid_str(), Ok("nqn.2016-06.io.spdk:cnode1"));
        assert_eq!(NqnField::default().as_str(), Ok(""));
        assert_eq!(format!("{f:?}"), "NqnField(\"nqn.2016-06.io.spdk:cnode1\")");
    }

    #[test]
    fn field_limits() {
        let max = "a".repeat(223);
        let f = NqnField::new(&max).unwrap();
        assert_eq!(f.0[223], 0);
        assert_eq!(f.as_str(), Ok(max.as_str()));
        assert_eq!(NqnField::new(&"a".repeat(224)), Err(NqnError::TooLong));
        assert_eq!(NqnField::new("a\0b"), Err(NqnError::InteriorNul));
        // The terminator must come by byte 223, even though the field is 256 bytes.
        let mut raw = [b'a'; 256];
        raw[250] = 0;
        assert_eq!(NqnField(raw).as_str(), Err(NqnError::TooLong));
        raw[223] = 0;
        assert_eq!(NqnField(raw).as_str().map(str::len), Ok(223));
        raw[0] = 0xff;
        assert_eq!(NqnField(raw).as_str(), Err(NqnError::NotUtf8));
        assert_eq!(format!("{:?}", NqnField(raw)), "NqnField(<NQN is not UTF-8>)");
    }

    #[test]
    fn format_rules() {
        assert_eq!(validate(DISCOVERY_NQN), Ok(()));
        assert_eq!(validate("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"), Ok(()));
        assert_eq!(
            validate("nqn.2014-08.org.nvmexpress:uuid:1111111-2222-3333-4444-555555555555"),
            Err(NqnError::BadUuid)
        );
        assert_eq!(
            validate("nqn.2014-08.org.nvmexpress:uuid:g1111111-2222-3333-4444-55555555555"),
            Err(NqnError::BadUuid)
        );
        assert_eq!(validate("nqn.2016-06.io.spdk:cnode1"), Ok(()));
        assert_eq!(validate("nqn.2016-06.io.spdk:ünïcode"), Ok(()));
        assert_eq!(validate("nqn.2016-06.io"), Err(NqnError::NoUserPart));
        assert_eq!(validate("nqn.2016-06.io.spdk:"), Err(NqnError::NoUserPart));
        assert_eq!(validate("nqx.2016-06.io.spdk:a"), Err(NqnError::BadPrefix));
        assert_eq!(validate("nqn.2016-6.io.spdk:a"), Err(NqnError::BadDate));
        assert_eq!(validate("nqn.16-06"), Err(NqnError::TooShort));
        assert_eq!(validate("nqn.2016-06.1o.spdk:a"), Err(NqnError::BadDomain));
        assert_eq!(validate("nqn.2016-06.io-.spdk:a"), Err(NqnError::BadDomain));
        assert_eq!(validate("nqn.2016-06.i_o.spdk:a"), Err(NqnError::BadDomain));
        assert_eq!(validate(&format!("nqn.2016-06.{}.io:a", "a".repeat(64))), Err(NqnError::BadDomain));
        assert_eq!(validate(&format!("nqn.2016-06.{}.io:a", "a".repeat(63))), Ok(()));
        assert_eq!(validate(&format!("nqn.2016-06.io.spdk:{}", "a".repeat(204))), Err(NqnError::TooLong));
    }

    proptest! {
        #[test]
        fn field_round_trip(s in "[a-z0-9.:-]{0,223}") {
            let f = NqnField::new(&s).unwrap();
            prop_assert_eq!(f.as_str(), Ok(s.as_str()));
        }

        #[test]
        fn any_field_bytes(b in proptest::array::uniform::<_, 256>(any::<u8>())) {
            // Never panics; accepted names survive a re-encode.
            if let Ok(s) = NqnField(b).as_str() {
                let f = NqnField::new(s).unwrap();
                prop_assert_eq!(f.as_str(), Ok(s));
                let _ = validate(s);
            }
        }
    }
}
