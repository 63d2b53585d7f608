//! One bdev's reservation registry enforced by the bdev layer for initiators of two kinds of
//! target: an NVMe host holds the reservation, a SCSI initiator port (name and ISID) submits
//! stamped requests as a SCSI target would (there is none yet, so the test drives the layer).
//! Every write path reads back and compares; unstamped requests are never checked.

mod common;

use common::*;
use ferrite_bdev::translate::{nvme_of, scsi_of, NvmeStatus};
use ferrite_bdev::{Bdev, IoChannel, IoRequest, IoStatus, IoType};
use ferrite_bdev::{Initiator, InitiatorId, ResvType};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::ReactorMode;

const NAME: &str = "resv_two_targets";
const BS: usize = 512;
const KEY_NVME: u64 = 0x4e4e;
const KEY_SCSI: u64 = 0x5353;

fn nvme_host() -> Initiator {
    Initiator::Nvme { hostid: [0x4e; 16], hostnqn: "nqn.2014-08.org.nvmexpress:uuid:resv-test".into() }
}

fn scsi_port(isid: u8) -> Initiator {
    Initiator::Scsi { name: "iqn.2016-06.io.ferrite:resv-test".into(), isid: [0x80, 0, 0, 0, 0, isid] }
}

/// Blocks 0..8 as the bdev holds them (an unstamped read).
async fn blocks(ch: &IoChannel) -> Vec<u8> {
    io_ok(ch, IoRequest::read_zcopy(0, 8)).await
}

/// A stamped write of `data` to blocks 0..8: its status, and what the blocks hold afterwards.
async fn write_as(ch: &IoChannel, who: Option<InitiatorId>, data: &[u8]) -> (IoStatus, Vec<u8>) {
    let c = io(ch, IoRequest::write(0, 8, buf_from(data)).for_initiator(who)).await;
    (c.status, blocks(ch).await)
}

/// A stamped read of blocks 0..8: its status and data.
async fn read_as(ch: &IoChannel, who: Option<InitiatorId>) -> (IoStatus, Vec<u8>) {
    let c = io(ch, IoRequest::read_zcopy(0, 8).for_initiator(who)).await;
    let data = if c.status.is_ok() { payload(&c) } else { Vec::new() };
    (c.status, data)
}

fn assert_conflict(s: IoStatus, what: &str) {
    assert_eq!(s, IoStatus::RESERVATION_CONFLICT, "{what}");
    assert_eq!(nvme_of(s), NvmeStatus { sct: 0, sc: 0x83, dnr: true }, "{what}: NVMe Reservation Conflict, DNR");
    let sense = scsi_of(s);
    assert_eq!((sense.status, sense.key, sense.asc, sense.ascq), (0x18, 0, 0, 0), "{what}: SCSI RESERVATION CONFLICT");
}

#[test]
fn a_scsi_initiator_meets_an_nvme_hosts_reservation_in_the_bdev_layer() {
    let e = engine(1, ReactorMode::Interrupt);
    let bdev = malloc::create(MallocOpts {
        name: Some(NAME.into()),
        num_blocks: 64,
        block_size: BS as u32,
        uuid: None,
        ..Default::default()
    })
    .expect("malloc create");
    run(&e, 0, move || async move {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let r = desc.bdev().reservations();
        let (nvme, scsi, other) = (nvme_host(), scsi_port(1), scsi_port(2));
        let holds = (nvme.intern(), scsi.intern(), other.intern());
        let (n, s, o) = (Some(holds.0.id()), Some(holds.1.id()), Some(holds.2.id()));
        let first = pattern(1, 8 * BS);
        let (st, now) = write_as(&ch, s, &first).await;
        assert_eq!((st, &now), (IoStatus::Success, &first), "no reservation: the SCSI initiator writes");

        // The NVMe host holds Write Exclusive.
        r.register(&nvme, KEY_NVME).unwrap();
        r.acquire(&nvme, KEY_NVME, ResvType::WriteExclusive).unwrap();
        let (st, now) = write_as(&ch, s, &pattern(2, 8 * BS)).await;
        assert_conflict(st, "the SCSI initiator's write under Write Exclusive");
        assert_eq!(now, first, "the refused write changed nothing");
        for (what, t) in [("write zeroes", IoType::WriteZeroes), ("unmap", IoType::Unmap)] {
            let c = io(&ch, IoRequest::no_payload(t, 0, 8).for_initiator(s)).await;
            assert_conflict(c.status, what);
        }
        let c = io(&ch, IoRequest::no_payload(IoType::Flush, 0, 0).for_initiator(s)).await;
        assert_conflict(c.status, "flush");
        let caw = IoRequest::compare_and_write(0, 8, buf_from(&first), buf_from(&pattern(3, 8 * BS)));
        assert_conflict(io(&ch, caw.for_initiator(s)).await.status, "compare-and-write");
        assert_eq!(blocks(&ch).await, first, "no refused request changed the blocks");
        assert_eq!(read_as(&ch, s).await, (IoStatus::Success, first.clone()), "the SCSI initiator reads");
        let c = io(&ch, IoRequest::compare(0, 8, buf_from(&first)).for_initiator(s)).await;
        assert_eq!(c.status, IoStatus::Success, "a compare reads");

        let second = pattern(4, 8 * BS);
        let (st, now) = write_as(&ch, n, &second).await;
        assert_eq!((st, &now), (IoStatus::Success, &second), "the holder writes");
        let third = pattern(5, 8 * BS);
        let (st, now) = write_as(&ch, None, &third).await;
        assert_eq!((st, &now), (IoStatus::Success, &third), "an unstamped write is not checked");

        // The SCSI initiator registers; the holder changes the type to registrants only.
        r.register(&scsi, KEY_SCSI).unwrap();
        let (st, _) = write_as(&ch, s, &pattern(6, 8 * BS)).await;
        assert_conflict(st, "a registrant's write under Write Exclusive");
        r.preempt(&nvme, KEY_NVME, KEY_NVME, ResvType::WriteExclusiveRegOnly).unwrap();
        let fourth = pattern(7, 8 * BS);
        let (st, now) = write_as(&ch, s, &fourth).await;
        assert_eq!((st, &now), (IoStatus::Success, &fourth), "a registrant writes under registrants only");
        let (st, now) = write_as(&ch, o, &pattern(8, 8 * BS)).await;
        assert_conflict(st, "another ISID of the same initiator is another, unregistered port");
        assert_eq!(now, fourth);
        let fifth = pattern(9, 8 * BS);
        let (st, now) = write_as(&ch, None, &fifth).await;
        assert_eq!((st, &now), (IoStatus::Success, &fifth), "unstamped, under registrants only");

        // The NVMe holder releases: everyone writes.
        r.release(&nvme, KEY_NVME, ResvType::WriteExclusiveRegOnly.code()).unwrap();
        for (i, who) in [s, o, n, None].into_iter().enumerate() {
            let data = pattern(10 + i as u64, 8 * BS);
            let (st, now) = write_as(&ch, who, &data).await;
            assert_eq!((st, &now), (IoStatus::Success, &data), "after the release, initiator {i}");
        }
        drop(ch);
        drop(desc);
    });
    drop(bdev);
    ferrite_bdev::unregister(NAME, Some("malloc")).unwrap();
    shutdown(e);
}
