//! Binding a unix socket at a path safely: private from the first instant, never deleting
//! anything at the path except a stale socket (one nobody listens on). Used by the JSON-RPC
//! server and by the NBD server's unix listeners.

use std::ffi::CString;
use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pending connections the kernel queues before `accept` (it caps this at net.core.somaxconn).
pub const BACKLOG: i32 = 1024;

/// A bound, listening socket file and the identity of the inode it created (so that only that
/// file is ever removed).
pub struct BoundSocket {
    /// The listener.
    pub listener: UnixListener,
    /// The socket file it created.
    pub file: SocketFile,
}

/// The identity (device, inode) of a socket file a bind created.
#[derive(Debug, Clone, Copy)]
pub struct SocketFile {
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Removes the socket file at `path` if it is still the one the bind created (not whatever
    /// took the path since).
    pub fn remove(&self, path: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.dev() == self.dev && m.ino() == self.ino {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl BoundSocket {
    /// Removes the socket file if it is still the one this bind created.
    pub fn remove(&self, path: &Path) {
        self.file.remove(path)
    }
}

/// Clears `path` for a new socket: nothing there, or a stale socket (removed). Refuses a live
/// socket (`AddrInUse`) and anything that is not a socket (a regular file, a directory, a
/// symlink), which is never deleted.
pub fn clear_stale(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket; refusing to replace it", path.display()),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::new(ErrorKind::AddrInUse, format!("{} is in use by another process", path.display()))),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            log::info!("removing stale socket {}", path.display());
            std::fs::remove_file(path)
        }
        Err(e) => Err(Error::new(e.kind(), format!("{} is a socket that cannot be checked: {e}", path.display()))),
    }
}

/// Checks, before anything is started, that a socket can be bound at `path`: short enough for
/// a unix socket address (the socket is bound at a short temporary name and renamed, so the
/// kernel would not catch a final path that clients cannot connect to), in an existing
/// directory, and nothing but a stale socket there (which is removed; see [`clear_stale`]).
pub fn check_bindable(path: &Path) -> Result<()> {
    if path.as_os_str().len() >= SUN_PATH_LEN {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("cannot bind {}: a unix socket path must be shorter than {SUN_PATH_LEN} bytes", path.display()),
        ));
    }
    let parent = parent_dir(path);
    if !parent.is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("cannot bind {}: {} is not a directory", path.display(), parent.display()),
        ));
    }
    clear_stale(path)
}

/// The directory `path` is in (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Binds a listening unix socket at `path` with permissions `mode` from its first instant: it
/// is bound inside a fresh 0700 directory next to `path`, given `mode`, then renamed into place
/// (without replacing anything that appeared meanwhile). The process umask plays no part.
pub fn bind(path: &Path, mode: u32) -> Result<BoundSocket> {
    check_bindable(path)?;
    let parent = parent_dir(path);
    let private =
        make_private_dir(&parent).map_err(|e| Error::new(e.kind(), format!("cannot bind {}: {e}", path.display())))?;
    let tmp = private.join("s");
    let res = (|| {
        let listener = bind_listen(&tmp)?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        rename_noreplace(&tmp, path)?;
        let m = std::fs::symlink_metadata(path)?;
        Ok(BoundSocket { listener, file: SocketFile { dev: m.dev(), ino: m.ino() } })
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&private);
    res.map_err(|e: Error| Error::new(e.kind(), format!("cannot bind {}: {e}", path.display())))
}

/// Size of `sockaddr_un.sun_path` on Linux (a path fits with its terminating NUL).
const SUN_PATH_LEN: usize = 108;

/// Creates `<parent>/.ferrite-<pid>-<n>` with mode 0700 (umask can only narrow it).
fn make_private_dir(parent: &Path) -> Result<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..100 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!(".ferrite-{}-{n}", std::process::id()));
        let c = cstr(&dir)?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
            return Ok(dir);
        }
        let e = Error::last_os_error();
        if e.kind() != ErrorKind::AlreadyExists {
            return Err(Error::new(
                e.kind(),
                format!("cannot create a private directory in {}: {e}", parent.display()),
            ));
        }
    }
    Err(Error::other(format!("cannot create a private directory in {}", parent.display())))
}

/// socket + bind + listen with [`BACKLOG`].
fn bind_listen(path: &Path) -> Result<UnixListener> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; we copy at most sun_path.len() - 1 bytes into it.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if bytes.len() >= addr.sun_path.len() {
            return Err(Error::new(ErrorKind::InvalidInput, "socket path is too long"));
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::bind(fd.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(Error::last_os_error());
        }
        if libc::listen(fd.as_raw_fd(), BACKLOG) != 0 {
            return Err(Error::last_os_error());
        }
        Ok(UnixListener::from(fd))
    }
}

/// Renames `from` to `to` unless `to` exists (renameat2 RENAME_NOREPLACE; a hard link where the
/// filesystem does not support that).
fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid NUL-terminated paths relative to the current directory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(e);
    }
    // SAFETY: as above; link fails if `to` exists.
    if unsafe { libc::link(f.as_ptr(), t.as_ptr()) } != 0 {
        return Err(Error::last_os_error());
    }
    Ok(())
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::new(ErrorKind::InvalidInput, "path contains a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ferrite-sockfile-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn refuses_a_path_clients_could_not_connect_to() {
        let long = std::env::temp_dir().join("x".repeat(120));
        let e = bind(&long, 0o600).err().expect("a 120-byte name is refused");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(!long.exists());
    }

    #[test]
    fn binds_private_and_refuses_what_is_not_a_stale_socket() {
        let d = tmp("a");
        let p = d.join("s.sock");
        let b = bind(&p, 0o600).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "private directory left behind");
        // Live: refused.
        assert_eq!(bind(&p, 0o600).err().unwrap().kind(), ErrorKind::AddrInUse);
        drop(b);
        // Stale: replaced.
        let b2 = bind(&p, 0o600).unwrap();
        b2.remove(&p);
        assert!(!p.exists());
        // A regular file, a directory, a symlink: refused and untouched.
        std::fs::write(&p, b"keep").unwrap();
        assert!(bind(&p, 0o600).err().unwrap().to_string().contains("not a socket"));
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(bind(&p, 0o600).is_err());
        assert!(p.is_dir());
        std::fs::remove_dir(&p).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &p).unwrap();
        assert!(bind(&p, 0o600).is_err());
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn remove_leaves_a_replacement_alone() {
        let d = tmp("b");
        let p = d.join("s.sock");
        let b = bind(&p, 0o600).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        b.remove(&p);
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        let _ = std::fs::remove_dir_all(&d);
    }
}
