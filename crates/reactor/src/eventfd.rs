//! Non-blocking eventfd counter operations: make one, signal it (add 1), drain it (read and
//! reset). A vhost target signals a virtqueue's call eventfd and drains its kick eventfd, which
//! an [`crate::FdWatch`] waits on.
//!
//! Each is one plain `read`/`write` syscall: a signal is per completion batch (the guest's
//! interrupt), a drain per kick, never per I/O.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A new eventfd with a zero counter, non-blocking and close-on-exec.
pub fn new() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with constant flags; a non-negative result is a new descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `fd`'s open file non-blocking (`O_NONBLOCK`; the flag belongs to the open file, so
/// every process sharing it sees it: QEMU's event notifiers have it already).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller keeps open; F_GETFL/F_SETFL take no pointers.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        if flags & libc::O_NONBLOCK == 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Adds 1 to the eventfd's counter, waking whoever waits on it. A counter at its maximum
/// (`EAGAIN` on a non-blocking eventfd) already means "signalled" and counts as success.
pub fn signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = 1u64;
    loop {
        // SAFETY: writes 8 bytes from a local to a descriptor the caller keeps open.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n == 8 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// Reads and resets the eventfd's counter: how many signals arrived since the last drain, 0 if
/// none. The descriptor must be non-blocking ([`set_nonblocking`]; `FdWatch::new` does it),
/// otherwise a drain of a zero counter would block.
pub fn drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = 0u64;
    loop {
        // SAFETY: reads 8 bytes into a local from a descriptor the caller keeps open.
        let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            return Ok(v);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(0),
            _ if n >= 0 => return Err(io::Error::new(io::ErrorKind::InvalidData, "short read from an eventfd")),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn signals_add_up_and_a_drain_resets() {
        let fd = new().unwrap();
        assert_eq!(drain(fd.as_fd()).unwrap(), 0, "nothing yet, and no blocking");
        for _ in 0..3 {
            signal(fd.as_fd()).unwrap();
        }
        assert_eq!(drain(fd.as_fd()).unwrap(), 3);
        assert_eq!(drain(fd.as_fd()).unwrap(), 0);
    }

    #[test]
    fn set_nonblocking_makes_a_blocking_eventfd_drain_without_waiting() {
        // SAFETY: eventfd with constant flags; owned right after the check.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_nonblocking(fd.as_fd()).unwrap();
        assert_eq!(drain(fd.as_fd()).unwrap(), 0);
    }
}
