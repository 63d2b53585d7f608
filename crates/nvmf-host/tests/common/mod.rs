//! What the host's tests against a fake controller share.

use ferrite_nvmf_host::qpair::ConnectParams;
use std::net::SocketAddr;
use std::time::Duration;

/// Connect parameters for queue `qid` of the fake controller at `addr` (digests off, SQ flow
/// control on, no keep-alive, a 10 s timeout); an admin queue asks for any controller ID.
pub fn fake_params(addr: SocketAddr, qid: u16) -> ConnectParams {
    ConnectParams {
        addr,
        subnqn: "nqn.2016-06.io.ferrite:fake".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
        hostid: [1; 16],
        qid,
        entries: 32,
        cntlid: if qid == 0 { 0xffff } else { 1 },
        kato_ms: 0,
        hdgst: false,
        ddgst: false,
        disable_sqflow: false,
        timeout: Duration::from_secs(10),
    }
}
