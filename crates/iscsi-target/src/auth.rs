//! Auth groups' secrets with SPDK's rules (`iscsi_auth_group_add_secret`): user and secret
//! given, an `muser` only with an `msecret` (an `msecret` alone is dropped, as SPDK ignores
//! it), each at most 255 bytes, one secret per user.

use crate::limits::MAX_CHAP_LEN;
use crate::model::{AuthGroup, Refused, Secret};

/// The secret to add, checked (lengths and the muser/msecret pairing).
pub fn secret(user: &str, secret: &str, muser: Option<&str>, msecret: Option<&str>) -> Result<Secret, Refused> {
    if muser.is_some() && msecret.is_none() {
        return Err(Refused::invalid("msecret must be specified with muser"));
    }
    let long = |what: &str, s: &str| {
        (s.len() > MAX_CHAP_LEN).then(|| Refused::invalid(format!("{what} longer than {MAX_CHAP_LEN} characters")))
    };
    if let Some(e) = long("CHAP user", user).or_else(|| long("CHAP secret", secret)) {
        return Err(e);
    }
    if let (Some(mu), Some(ms)) = (muser, msecret) {
        if let Some(e) = long("Mutual CHAP user", mu).or_else(|| long("Mutual CHAP secret", ms)) {
            return Err(e);
        }
    }
    Ok(Secret {
        user: user.into(),
        secret: secret.into(),
        muser: muser.map(Into::into),
        msecret: muser.and(msecret).map(Into::into),
    })
}

/// Adds `s` to `group` unless its user has a secret there already (EEXIST).
pub fn add(group: &mut AuthGroup, s: Secret) -> Result<(), Refused> {
    if group.secrets.iter().any(|x| x.user == s.user) {
        return Err(Refused::new(libc::EEXIST, format!("user {} has a secret already", s.user)));
    }
    group.secrets.push(s);
    Ok(())
}

/// Removes `user`'s secret from `group` (ENODEV if it has none, SPDK's code).
pub fn remove(group: &mut AuthGroup, user: &str) -> Result<(), Refused> {
    let at = group
        .secrets
        .iter()
        .position(|x| x.user == user)
        .ok_or_else(|| Refused::new(libc::ENODEV, format!("no secret for user {user}")))?;
    group.secrets.remove(at);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_follow_spdks_rules() {
        assert!(secret("u", "s", Some("m"), None).is_err());
        let s = secret("u", "s", None, Some("m")).unwrap();
        assert_eq!(s.msecret, None, "an msecret without muser is dropped");
        assert!(secret(&"u".repeat(256), "s", None, None).is_err());
        assert!(secret(&"u".repeat(255), &"s".repeat(256), None, None).is_err());
        assert!(secret("", "", None, None).is_ok());
        let mut g = AuthGroup { tag: 1, secrets: vec![] };
        add(&mut g, secret("a", "b", None, None).unwrap()).unwrap();
        assert_eq!(add(&mut g, secret("a", "c", None, None).unwrap()).unwrap_err().errno, libc::EEXIST);
        assert_eq!(remove(&mut g, "zz").unwrap_err().errno, libc::ENODEV);
        remove(&mut g, "a").unwrap();
        assert!(g.secrets.is_empty());
    }
}
