use super::codes::scsi::*;
use super::*;

/// SPDK's lib/bdev/scsi_nvme.c (v26.05) as raw numbers: (SCT, SC, status, key, ASC, ASCQ).
/// Typed in from the C source, apart from the table, so that a wrong constant shows.
const SPDK: &[(u8, u8, u8, u8, u8, u8)] = &[
    (0, 0x00, 0x00, 0x00, 0x00, 0x00),
    (0, 0x01, 0x02, 0x05, 0x20, 0x00),
    (0, 0x02, 0x02, 0x05, 0x24, 0x00),
    (0, 0x04, 0x02, 0x03, 0x00, 0x00),
    (0, 0x81, 0x02, 0x03, 0x00, 0x00),
    (0, 0x05, 0x40, 0x0b, 0x0b, 0x08),
    (0, 0x06, 0x02, 0x04, 0x44, 0x00),
    (0, 0x07, 0x40, 0x0b, 0x00, 0x00),
    (0, 0x08, 0x40, 0x0b, 0x00, 0x00),
    (0, 0x09, 0x40, 0x0b, 0x00, 0x00),
    (0, 0x0a, 0x40, 0x0b, 0x00, 0x00),
    (0, 0x0b, 0x02, 0x05, 0x20, 0x09),
    (0, 0x80, 0x02, 0x05, 0x21, 0x00),
    (0, 0x82, 0x02, 0x02, 0x04, 0x00),
    (0, 0x83, 0x18, 0x00, 0x00, 0x00),
    (0, 0x03, 0x02, 0x05, 0x00, 0x00),
    (0, 0x0c, 0x02, 0x05, 0x00, 0x00),
    (0, 0x0d, 0x02, 0x05, 0x00, 0x00),
    (0, 0x0e, 0x02, 0x05, 0x00, 0x00),
    (0, 0x0f, 0x02, 0x05, 0x00, 0x00),
    (0, 0x10, 0x02, 0x05, 0x00, 0x00),
    (0, 0x11, 0x02, 0x05, 0x00, 0x00),
    (0, 0x12, 0x02, 0x05, 0x00, 0x00),
    (0, 0x13, 0x02, 0x05, 0x00, 0x00),
    (0, 0x14, 0x02, 0x05, 0x00, 0x00),
    (0, 0x16, 0x02, 0x05, 0x00, 0x00),
    (0, 0x18, 0x02, 0x05, 0x00, 0x00),
    (0, 0x19, 0x02, 0x05, 0x00, 0x00),
    (0, 0x1a, 0x02, 0x05, 0x00, 0x00),
    (0, 0x84, 0x02, 0x05, 0x00, 0x00),
    (1, 0x00, 0x02, 0x05, 0x00, 0x00),
    (1, 0x03, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0a, 0x02, 0x05, 0x31, 0x01),
    (1, 0x80, 0x02, 0x05, 0x24, 0x00),
    (1, 0x82, 0x02, 0x07, 0x27, 0x00),
    (1, 0x01, 0x02, 0x05, 0x00, 0x00),
    (1, 0x02, 0x02, 0x05, 0x00, 0x00),
    (1, 0x05, 0x02, 0x05, 0x00, 0x00),
    (1, 0x06, 0x02, 0x05, 0x00, 0x00),
    (1, 0x07, 0x02, 0x05, 0x00, 0x00),
    (1, 0x08, 0x02, 0x05, 0x00, 0x00),
    (1, 0x09, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0b, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0c, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0d, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0e, 0x02, 0x05, 0x00, 0x00),
    (1, 0x0f, 0x02, 0x05, 0x00, 0x00),
    (1, 0x10, 0x02, 0x05, 0x00, 0x00),
    (1, 0x11, 0x02, 0x05, 0x00, 0x00),
    (1, 0x12, 0x02, 0x05, 0x00, 0x00),
    (1, 0x13, 0x02, 0x05, 0x00, 0x00),
    (1, 0x14, 0x02, 0x05, 0x00, 0x00),
    (1, 0x15, 0x02, 0x05, 0x00, 0x00),
    (1, 0x16, 0x02, 0x05, 0x00, 0x00),
    (1, 0x18, 0x02, 0x05, 0x00, 0x00),
    (1, 0x19, 0x02, 0x05, 0x00, 0x00),
    (1, 0x1a, 0x02, 0x05, 0x00, 0x00),
    (1, 0x1b, 0x02, 0x05, 0x00, 0x00),
    (1, 0x1c, 0x02, 0x05, 0x00, 0x00),
    (1, 0x81, 0x02, 0x05, 0x00, 0x00),
    (2, 0x80, 0x02, 0x03, 0x03, 0x00),
    (2, 0x81, 0x02, 0x03, 0x11, 0x00),
    (2, 0x82, 0x02, 0x03, 0x10, 0x01),
    (2, 0x83, 0x02, 0x03, 0x10, 0x02),
    (2, 0x84, 0x02, 0x03, 0x10, 0x03),
    (2, 0x85, 0x02, 0x0e, 0x1d, 0x00),
    (2, 0x86, 0x02, 0x07, 0x20, 0x02),
    (2, 0x87, 0x02, 0x05, 0x00, 0x00),
];

fn sense(r: &(u8, u8, u8, u8, u8, u8)) -> Sense {
    Sense { status: r.2, key: r.3, asc: r.4, ascq: r.5 }
}

#[test]
fn every_spdk_row_translates_as_spdk_does() {
    for r in SPDK {
        assert_eq!(nvme_to_scsi(r.0, r.1), sense(r), "NVMe sct {:#x} sc {:#x}", r.0, r.1);
    }
    assert_eq!(table::NVME_TO_SCSI.len(), SPDK.len(), "one table row per SPDK row");
}

#[test]
fn what_spdk_does_not_list_is_an_illegal_request() {
    let other = Sense::check(SENSE_ILLEGAL_REQUEST, 0, 0);
    for (sct, sc) in [(0, 0x1b), (0, 0xff), (1, 0x7f), (2, 0x88), (3, 0x02), (7, 0x00), (5, 0x01)] {
        assert_eq!(nvme_to_scsi(sct, sc), other, "sct {sct:#x} sc {sc:#x}");
    }
}

#[test]
fn a_sense_goes_back_to_the_nvme_status_it_came_from() {
    for r in SPDK {
        let s = sense(r);
        if s == Sense::check(SENSE_ILLEGAL_REQUEST, 0, 0) {
            continue; // SPDK's catch-all: no way back to one status (Invalid Field, below)
        }
        let back = scsi_to_nvme(s);
        match table::REVERSE_CHOICES.iter().find(|(c, _, _)| *c == s) {
            Some((_, sct, sc)) => assert_eq!((back.sct, back.sc), (*sct, *sc), "{s:?} is shared: the choice"),
            None => assert_eq!((back.sct, back.sc), (r.0, r.1), "{s:?} round trip"),
        }
        // And forward again: the same sense, where SPDK's table lists the status chosen.
        if table::NVME_TO_SCSI.iter().any(|(t, c, _)| (*t, *c) == (back.sct, back.sc)) {
            assert_eq!(nvme_to_scsi(back.sct, back.sc), s, "{s:?} back and forth");
        }
    }
}

#[test]
fn senses_spdk_never_produces_go_back_by_key() {
    let n = |key, asc, ascq| {
        let b = scsi_to_nvme(Sense::check(key, asc, ascq));
        (b.sct, b.sc, b.dnr)
    };
    assert_eq!(n(SENSE_ILLEGAL_REQUEST, 0, 0), (0, 0x02, true));
    assert_eq!(n(SENSE_ILLEGAL_REQUEST, 0x26, 0), (0, 0x02, true));
    assert_eq!(n(SENSE_ILLEGAL_REQUEST, ASC_LOGICAL_UNIT_NOT_SUPPORTED, 0), (0, 0x0b, true));
    assert_eq!(n(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, ASCQ_SPACE_ALLOCATION_FAILED_WRITE_PROTECT), (0, 0x81, true));
    assert_eq!(n(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, 0x04), (0, 0x20, true));
    assert_eq!(n(SENSE_NOT_READY, 0x3a, 0), (0, 0x82, false));
    assert_eq!(n(SENSE_MEDIUM_ERROR, ASC_UNRECOVERED_READ_ERROR, 0x04), (2, 0x81, false));
    assert_eq!(n(SENSE_MEDIUM_ERROR, 0x0c, 0), (0, 0x04, false));
    assert_eq!(n(SENSE_HARDWARE_ERROR, 0, 0), (0, 0x06, false));
    assert_eq!(n(SENSE_UNIT_ATTENTION, 0x29, 0), (0, 0x06, false), "no match: internal, retryable");
    assert_eq!(n(SENSE_ABORTED_COMMAND, 0x47, 0), (0, 0x07, false));
    let st = |status| {
        let b = scsi_to_nvme(Sense { status, key: 0, asc: 0, ascq: 0 });
        (b.sct, b.sc, b.dnr)
    };
    assert_eq!(st(STATUS_GOOD), (0, 0, false));
    assert_eq!(st(STATUS_BUSY), (0, 0x21, false));
    assert_eq!(st(STATUS_TASK_SET_FULL), (0, 0x21, false));
    assert_eq!(st(STATUS_RESERVATION_CONFLICT), (0, 0x83, true));
    assert_eq!(st(STATUS_ACA_ACTIVE), (0, 0x06, false));
}

#[test]
fn the_layers_own_statuses_as_scsi_names_them() {
    use libc::{EIO, ENOSPC, EROFS};
    let c = |s| {
        let x = scsi_of(s);
        (x.status, x.key, x.asc, x.ascq)
    };
    assert_eq!(c(IoStatus::Success), (0, 0, 0, 0));
    assert_eq!(c(IoStatus::OutOfRange), (2, SENSE_ILLEGAL_REQUEST, 0x21, 0));
    assert_eq!(c(IoStatus::Unsupported), (2, SENSE_ILLEGAL_REQUEST, 0x20, 0));
    assert_eq!(c(IoStatus::Misaligned), (2, SENSE_ILLEGAL_REQUEST, 0x24, 0));
    assert_eq!(c(IoStatus::Removed), (2, SENSE_ILLEGAL_REQUEST, 0x25, 0));
    assert_eq!(c(IoStatus::MISCOMPARE), (2, SENSE_MISCOMPARE, 0x1d, 0));
    assert_eq!(c(IoStatus::Failed(ENOSPC)), (2, SENSE_DATA_PROTECT, 0x27, 0x07));
    assert_eq!(c(IoStatus::Failed(EROFS)), (2, SENSE_DATA_PROTECT, 0x27, 0));
    for s in [IoStatus::Failed(EIO), IoStatus::Aborted, IoStatus::TimedOut, IoStatus::NoMem] {
        assert_eq!(c(s), (2, SENSE_ABORTED_COMMAND, 0, 0), "{s:?}: SPDK's default");
    }
    assert_eq!(c(IoStatus::nvme(0, 0x80)), (2, SENSE_ILLEGAL_REQUEST, 0x21, 0), "through SPDK's table");
    assert_eq!(c(IoStatus::Scsi { status: 2, key: 6, asc: 0x29, ascq: 1 }), (2, 6, 0x29, 1), "unchanged");
}

#[test]
fn the_layers_own_statuses_as_nvme_names_them() {
    let n = |s| {
        let x = nvme_of(s);
        (x.sct, x.sc, x.dnr)
    };
    assert_eq!(n(IoStatus::Success), (0, 0, false));
    assert_eq!(n(IoStatus::OutOfRange), (0, 0x80, true));
    assert_eq!(n(IoStatus::Failed(libc::ENOSPC)), (0, 0x81, true));
    assert_eq!(n(IoStatus::Failed(libc::EROFS)), (0, 0x20, true));
    assert_eq!(n(IoStatus::Failed(libc::EIO)), (0, 0x06, false));
    assert_eq!(n(IoStatus::Nvme { sct: 2, sc: 0x81, dnr: true, more: true }), (2, 0x81, true));
    assert_eq!(n(IoStatus::nvme(0, 0x81)), (0, 0x81, false), "the device's DNR, not a guess");
}

/// A bdev status that went out through one protocol and came back through the other keeps its
/// meaning, for every status the layer makes.
#[test]
fn layer_statuses_survive_scsi_and_back() {
    for s in [
        IoStatus::OutOfRange,
        IoStatus::Unsupported,
        IoStatus::MISCOMPARE,
        IoStatus::Failed(libc::ENOSPC),
        IoStatus::Failed(libc::EROFS),
    ] {
        let x = scsi_of(s);
        let back = scsi_to_nvme(x);
        assert_eq!(back, nvme_of(s), "{s:?} via {x:?}");
    }
}
