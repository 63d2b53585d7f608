//! Connection initialization: what ICReq and ICResp settle, and how each end derives it.
//!
//! The host sends ICReq (its HPDA, the digests it wants, MAXR2T); the controller answers with
//! ICResp (its CPDA, the digests it enables, which must be among those asked for, and
//! MAXH2CDATA). From then on both ends frame PDUs with the same [`Negotiated`] parameters.

use super::pdu::{offset, IcReq, IcResp, PduError, PduType, Role, MAX_PDA, MIN_MAXH2CDATA, PFV_1_0};

/// The parameters of an initialized connection, the same at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Header digests on CapsuleCmd, CapsuleResp, H2CData, C2HData and R2T.
    pub header_digest: bool,
    /// Data digests on the data of CapsuleCmd, H2CData and C2HData.
    pub data_digest: bool,
    /// HPDA: data in C2H PDUs starts at a multiple of `(hpda + 1) * 4` bytes (0..=31).
    pub hpda: u8,
    /// CPDA: data in H2C PDUs starts at a multiple of `(cpda + 1) * 4` bytes (0..=31).
    pub cpda: u8,
    /// MAXH2CDATA: most data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
}

impl Negotiated {
    /// What holds before initialization: no digests, 4-byte alignment, the smallest
    /// MAXH2CDATA. Only ICReq, ICResp and termination requests may be exchanged then, and
    /// none of them depends on these.
    pub const INITIAL: Negotiated =
        Negotiated { header_digest: false, data_digest: false, hpda: 0, cpda: 0, maxh2cdata: MIN_MAXH2CDATA };

    /// The 0's based PDA for PDUs received by `role` (CPDA at a controller, HPDA at a host),
    /// capped at 31.
    pub fn rx_pda(&self, role: Role) -> u8 {
        match role {
            Role::Controller => self.cpda.min(MAX_PDA),
            Role::Host => self.hpda.min(MAX_PDA),
        }
    }

    /// The 0's based PDA for PDUs sent by `role` (HPDA at a controller, CPDA at a host),
    /// capped at 31.
    pub fn tx_pda(&self, role: Role) -> u8 {
        match role {
            Role::Controller => self.hpda.min(MAX_PDA),
            Role::Host => self.cpda.min(MAX_PDA),
        }
    }
}

/// Alignment in bytes of a 0's based PDA (capped at 31: 128 bytes).
pub fn pda_bytes(pda: u8) -> u32 {
    (u32::from(pda.min(MAX_PDA)) + 1) * 4
}

/// What a controller offers to hosts that connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Enable header digests when the host asks for them.
    pub header_digest: bool,
    /// Enable data digests when the host asks for them.
    pub data_digest: bool,
    /// CPDA to ask hosts for (0..=31).
    pub cpda: u8,
    /// MAXH2CDATA to announce (at least 4096, a multiple of 4).
    pub maxh2cdata: u32,
}

/// A controller's answer to a (decoded and checked) ICReq: the ICResp to send and the
/// parameters both ends use from then on. Digests are enabled where the host asked and the
/// controller allows; CPDA is capped at 31 and MAXH2CDATA raised to at least 4096 and rounded
/// down to a multiple of 4.
pub fn controller_accept(req: &IcReq, cfg: &ControllerConfig) -> (IcResp, Negotiated) {
    let maxh2cdata = cfg.maxh2cdata.max(MIN_MAXH2CDATA) & !3;
    let n = Negotiated {
        header_digest: req.hdgst && cfg.header_digest,
        data_digest: req.ddgst && cfg.data_digest,
        hpda: req.hpda.min(MAX_PDA),
        cpda: cfg.cpda.min(MAX_PDA),
        maxh2cdata,
    };
    let resp = IcResp { pfv: PFV_1_0, cpda: n.cpda, hdgst: n.header_digest, ddgst: n.data_digest, maxh2cdata };
    (resp, n)
}

/// A host's check of the (decoded and checked) ICResp against the ICReq it sent: a digest
/// enabled that was not asked for is an unsupported parameter (FES 06h at DGST). Returns the
/// parameters both ends use from then on.
pub fn host_accept(req: &IcReq, resp: &IcResp) -> Result<Negotiated, PduError> {
    if (resp.hdgst && !req.hdgst) || (resp.ddgst && !req.ddgst) {
        let value = u32::from(resp.hdgst) | (u32::from(resp.ddgst) << 1);
        return Err(PduError::UnsupportedParameter { pdu_type: PduType::IcResp, offset: offset::DGST, value });
    }
    Ok(Negotiated {
        header_digest: resp.hdgst,
        data_digest: resp.ddgst,
        hpda: req.hpda.min(MAX_PDA),
        cpda: resp.cpda.min(MAX_PDA),
        maxh2cdata: resp.maxh2cdata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::pdu::Fes;

    #[test]
    fn both_ends_agree() {
        let req = IcReq { pfv: 0, hpda: 3, hdgst: true, ddgst: false, maxr2t: 0 };
        let cfg = ControllerConfig { header_digest: true, data_digest: true, cpda: 1, maxh2cdata: 131_075 };
        let (resp, at_controller) = controller_accept(&req, &cfg);
        assert_eq!(resp, IcResp { pfv: 0, cpda: 1, hdgst: true, ddgst: false, maxh2cdata: 131_072 });
        assert_eq!(host_accept(&req, &resp), Ok(at_controller));
        assert_eq!(at_controller.rx_pda(Role::Controller), 1);
        assert_eq!(at_controller.tx_pda(Role::Controller), 3);
        assert_eq!(at_controller.rx_pda(Role::Host), 3);
        assert_eq!(pda_bytes(0), 4);
        assert_eq!(pda_bytes(31), 128);
        assert_eq!(pda_bytes(200), 128);
    }

    #[test]
    fn small_maxh2cdata_is_raised() {
        let req = IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 };
        let cfg = ControllerConfig { header_digest: false, data_digest: false, cpda: 0, maxh2cdata: 100 };
        assert_eq!(controller_accept(&req, &cfg).0.maxh2cdata, 4096);
    }

    #[test]
    fn unrequested_digest_is_refused() {
        let req = IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: true, maxr2t: 0 };
        let resp = IcResp { pfv: 0, cpda: 0, hdgst: true, ddgst: true, maxh2cdata: 8192 };
        let e = host_accept(&req, &resp).unwrap_err();
        assert_eq!((e.fes(), e.fei()), (Some(Fes::UnsupportedParameter), 11));
    }
}
