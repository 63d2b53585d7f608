//! Login Response status classes and details (RFC 7143 section 11.13.5).

use std::fmt;

/// A Login Response's Status-Class and Status-Detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    /// Status-Class: 0 success, 1 redirection, 2 initiator error, 3 target error.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

const fn st(class: u8, detail: u8) -> LoginStatus {
    LoginStatus { class, detail }
}

impl LoginStatus {
    /// 0x0000 Success.
    pub const SUCCESS: LoginStatus = st(0, 0);
    /// 0x0101 Target moved temporarily (TargetAddress says where).
    pub const TARGET_MOVED_TEMPORARILY: LoginStatus = st(1, 1);
    /// 0x0102 Target moved permanently.
    pub const TARGET_MOVED_PERMANENTLY: LoginStatus = st(1, 2);
    /// 0x0200 Initiator error (a malformed or out-of-sequence request).
    pub const INITIATOR_ERROR: LoginStatus = st(2, 0);
    /// 0x0201 Authentication failure.
    pub const AUTHENTICATION_FAILURE: LoginStatus = st(2, 1);
    /// 0x0202 Authorization failure (this initiator may not use this target).
    pub const AUTHORIZATION_FAILURE: LoginStatus = st(2, 2);
    /// 0x0203 Not found (no such target).
    pub const NOT_FOUND: LoginStatus = st(2, 3);
    /// 0x0204 Target removed.
    pub const TARGET_REMOVED: LoginStatus = st(2, 4);
    /// 0x0205 Unsupported version.
    pub const UNSUPPORTED_VERSION: LoginStatus = st(2, 5);
    /// 0x0206 Too many connections.
    pub const TOO_MANY_CONNECTIONS: LoginStatus = st(2, 6);
    /// 0x0207 Missing parameter (InitiatorName, or TargetName for a normal session).
    pub const MISSING_PARAMETER: LoginStatus = st(2, 7);
    /// 0x0208 Can't include in session.
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = st(2, 8);
    /// 0x0209 Session type not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = st(2, 9);
    /// 0x020a Session does not exist (the TSIH of a joining connection).
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = st(2, 10);
    /// 0x020b Invalid request during login.
    pub const INVALID_DURING_LOGIN: LoginStatus = st(2, 11);
    /// 0x0300 Target error.
    pub const TARGET_ERROR: LoginStatus = st(3, 0);
    /// 0x0301 Service unavailable.
    pub const SERVICE_UNAVAILABLE: LoginStatus = st(3, 1);
    /// 0x0302 Out of resources.
    pub const OUT_OF_RESOURCES: LoginStatus = st(3, 2);

    /// Class and detail as one number (0x0201 for an authentication failure).
    pub fn to_u16(self) -> u16 {
        u16::from(self.class) << 8 | u16::from(self.detail)
    }

    /// Whether the login goes on.
    pub fn is_success(self) -> bool {
        self.class == 0
    }

    /// Whether the target sends the initiator elsewhere (TargetAddress in the data).
    pub fn is_redirect(self) -> bool {
        self.class == 1
    }
}

impl fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.to_u16() {
            0x0000 => "success",
            0x0101 => "target moved temporarily",
            0x0102 => "target moved permanently",
            0x0200 => "initiator error",
            0x0201 => "authentication failure",
            0x0202 => "authorization failure",
            0x0203 => "target not found",
            0x0204 => "target removed",
            0x0205 => "unsupported version",
            0x0206 => "too many connections",
            0x0207 => "missing parameter",
            0x0208 => "can't include in session",
            0x0209 => "session type not supported",
            0x020a => "session does not exist",
            0x020b => "invalid during login",
            0x0300 => "target error",
            0x0301 => "service unavailable",
            0x0302 => "out of resources",
            _ => "unknown login status",
        };
        write!(f, "{name} ({:#06x})", self.to_u16())
    }
}
