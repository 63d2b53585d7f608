//! What SPDK's lvol layer stores in blobs: the lvstore's name and uuid as xattrs of the
//! blobstore's super blob, and each lvol's name and uuid as xattrs of its blob.
//!
//! Values are C strings with their NUL: `uuid` is 37 bytes (36 characters and NUL), `name` is
//! 64 bytes zero-padded when the lvol is created and `strlen + 1` bytes after a rename. The
//! blobstore type of an lvstore is "LVOLSTORE".

use ferrite_blob::format::BlobMd;

/// Xattr holding an lvstore's or lvol's name.
pub const XATTR_NAME: &str = "name";
/// Xattr holding an lvstore's or lvol's uuid, lower-case text.
pub const XATTR_UUID: &str = "uuid";

/// The name and uuid SPDK keeps in a blob's xattrs (the super blob's for an lvstore).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LvolNames {
    /// The `name` xattr as a string, if present and valid UTF-8.
    pub name: Option<String>,
    /// The `uuid` xattr as a string, if present and valid UTF-8.
    pub uuid: Option<String>,
}

impl LvolNames {
    /// Reads the `name` and `uuid` xattrs of a blob.
    pub fn of(md: &BlobMd) -> LvolNames {
        let get = |n: &str| md.xattr(n).and_then(|x| x.value_cstr()).map(str::to_owned);
        LvolNames { name: get(XATTR_NAME), uuid: get(XATTR_UUID) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_blob::format::Xattr;

    #[test]
    fn names() {
        let mut md = BlobMd::new(1);
        let mut name = b"lvol0".to_vec();
        name.resize(64, 0);
        md.xattrs.push(Xattr::new("name", name));
        md.xattrs.push(Xattr::new("uuid", b"0e2b1e5c-8b4d-4b8a-9e32-6f0e6a3c1d2a\0".to_vec()));
        let n = LvolNames::of(&md);
        assert_eq!(n.name.as_deref(), Some("lvol0"));
        assert_eq!(n.uuid.as_deref(), Some("0e2b1e5c-8b4d-4b8a-9e32-6f0e6a3c1d2a"));
        assert_eq!(LvolNames::of(&BlobMd::new(2)), LvolNames::default());
    }
}
