//! SIGTERM still stops the daemon after its RPC socket file was deleted (the accept thread used
//! to be woken only by connecting to that path).

mod common;

use common::{Daemon, TempDir};
use std::time::Duration;

#[test]
fn sigterm_after_the_socket_file_is_deleted() {
    let dir = TempDir::new("sockgone");
    let mut d = Daemon::start(&dir, &[]);
    std::fs::remove_file(&d.sock).unwrap();
    d.proc.sigterm();
    let status = d.proc.expect_exit(Duration::from_secs(5), "daemon after SIGTERM with its socket deleted");
    assert!(status.success(), "{status:?}");
}
