//! CHAP settings of a discovery session, a portal group or a target node, with SPDK's rule of
//! which combinations mean something (`iscsi_check_chap_params`).

use serde_json::{json, Value};

/// How logins authenticate: none, CHAP one way or mutual, or whatever the initiator offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChapParams {
    /// CHAP is not offered (AuthMethod None only).
    pub disable: bool,
    /// CHAP is required.
    pub require: bool,
    /// The target authenticates itself too (mutual CHAP; requires `require`).
    pub mutual: bool,
    /// The auth group whose secrets CHAP uses (0: none chosen).
    pub group: i32,
}

/// What a [`ChapParams`] means for a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Neither disabled nor required: CHAP if the initiator offers it, else none.
    Auto,
    /// No authentication.
    None,
    /// One-way CHAP.
    Chap,
    /// Mutual CHAP.
    Mutual,
}

impl ChapParams {
    /// Checks the combination as SPDK does: a group is not negative, and the flags are one of
    /// auto (none set), none (`disable`), CHAP (`require`) or mutual (`require` + `mutual`).
    pub fn check(&self) -> Result<(), String> {
        if self.group < 0 {
            return Err(format!("invalid auth group ID ({})", self.group));
        }
        self.mode().map(|_| ()).ok_or_else(|| {
            format!(
                "invalid combination of CHAP params (d={},r={},m={})",
                self.disable as u8, self.require as u8, self.mutual as u8
            )
        })
    }

    /// The mode the flags select, if they are a valid combination.
    pub fn mode(&self) -> Option<AuthMode> {
        match (self.disable, self.require, self.mutual) {
            (false, false, false) => Some(AuthMode::Auto),
            (true, false, false) => Some(AuthMode::None),
            (false, true, false) => Some(AuthMode::Chap),
            (false, true, true) => Some(AuthMode::Mutual),
            _ => None,
        }
    }

    /// The four members as SPDK's JSON writes them.
    pub fn to_json(&self) -> Value {
        json!({"disable_chap": self.disable, "require_chap": self.require, "mutual_chap": self.mutual,
            "chap_group": self.group})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdks_four_combinations_and_no_negative_group() {
        let p = |disable, require, mutual, group| ChapParams { disable, require, mutual, group };
        assert_eq!(p(false, false, false, 0).mode(), Some(AuthMode::Auto));
        assert_eq!(p(true, false, false, 0).mode(), Some(AuthMode::None));
        assert_eq!(p(false, true, false, 1).mode(), Some(AuthMode::Chap));
        assert_eq!(p(false, true, true, 1).mode(), Some(AuthMode::Mutual));
        for bad in [p(true, true, false, 0), p(false, false, true, 0), p(true, false, true, 0), p(true, true, true, 0)]
        {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(p(false, false, false, -1).check().is_err());
    }
}
