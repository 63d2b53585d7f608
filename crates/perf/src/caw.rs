//! The `compare_and_write` workload: each I/O unit of a job's span has a version the job
//! knows; a compare-and-write compares the unit with its current version and writes the next.
//! Only the first 8 bytes of a unit's data differ between versions (unit and version), so
//! that preparing a request costs two stores and not a pattern fill of two buffers; the layer
//! still compares and writes every byte.

use ferrite_bdev::{IoAux, IoBufs, IoRequest, IoStatus, IoType};

/// Most units a job versions (4 MiB of versions).
pub(crate) const MAX_UNITS: u64 = 1 << 20;

/// The versions of a job's units (0: not known yet; the unit's next I/O is a plain write of
/// version 1).
pub(crate) struct Units {
    versions: Vec<u32>,
}

/// What a completed request of the workload counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A compare-and-write that succeeded: one I/O.
    Done,
    /// A unit's first write, or a failure counted elsewhere: no I/O.
    NotCounted,
    /// A compare-and-write whose unit did not hold the version the job wrote: a data mismatch.
    Miscompare,
}

fn stamp(buf: &mut [u8], unit: u64, version: u32) {
    buf[..8].copy_from_slice(&(unit << 32 | version as u64).to_le_bytes());
}

impl Units {
    /// Versions for `n` units, none known.
    pub(crate) fn new(n: u64) -> Self {
        Self { versions: vec![0; n.min(MAX_UNITS) as usize] }
    }

    /// Turns `req` (holding the slot's data buffer) into the next request for `unit`: a plain
    /// write of version 1 if its version is not known, else a compare-and-write from its
    /// version to the next, with the slot's compare buffer (`cmp`) as its compare data.
    pub(crate) fn prepare(&self, unit: u64, req: &mut IoRequest, cmp: &mut Option<Box<IoBufs>>) {
        let v = self.versions[unit as usize];
        stamp(&mut req.bufs[0], unit, v + 1);
        if v == 0 {
            req.io_type = IoType::Write;
            return;
        }
        let mut c = cmp.take().expect("the slot's compare buffer is home between requests");
        stamp(&mut c[0], unit, v);
        req.aux = IoAux::Compare(c);
        req.io_type = IoType::CompareAndWrite;
    }

    /// Takes the compare buffer back into `cmp` and notes the new version of `unit`.
    pub(crate) fn completed(
        &mut self,
        unit: u64,
        req: &mut IoRequest,
        status: IoStatus,
        cmp: &mut Option<Box<IoBufs>>,
    ) -> Outcome {
        if let IoAux::Compare(c) = std::mem::replace(&mut req.aux, IoAux::None) {
            *cmp = Some(c);
        }
        let v = &mut self.versions[unit as usize];
        match (req.io_type, status) {
            (IoType::CompareAndWrite, IoStatus::Success) => {
                *v += 1;
                Outcome::Done
            }
            (_, IoStatus::Success) => {
                *v = 1;
                Outcome::NotCounted
            }
            (IoType::CompareAndWrite, IoStatus::Miscompare { .. }) => {
                *v = 0;
                Outcome::Miscompare
            }
            _ => {
                // What the unit holds is not known: it is written afresh next.
                *v = 0;
                Outcome::NotCounted
            }
        }
    }
}

/// A slot's compare buffer: as long as the data buffer and filled as it is (every slot's
/// buffers hold the same bytes past the stamp, so any slot can take any unit).
pub(crate) fn compare_buffer(data: &[u8]) -> Box<IoBufs> {
    let mut b = ferrite_reactor::alloc_buf(data.len());
    b.copy_from_slice(data);
    let mut v = IoBufs::new();
    v.push(b);
    Box::new(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_reactor::IoBuf;

    #[test]
    fn a_unit_is_written_once_then_compared_and_written_version_by_version() {
        let mut units = Units::new(4);
        let data = IoBuf::heap(512);
        let mut cmp = Some(compare_buffer(&data));
        let mut req = IoRequest::write(0, 1, data);
        units.prepare(2, &mut req, &mut cmp);
        assert_eq!(req.io_type, IoType::Write, "first touch: a plain write");
        assert_eq!(units.completed(2, &mut req, IoStatus::Success, &mut cmp), Outcome::NotCounted);
        units.prepare(2, &mut req, &mut cmp);
        assert_eq!(req.io_type, IoType::CompareAndWrite);
        assert!(cmp.is_none(), "the compare buffer travels with the request");
        let IoAux::Compare(c) = &req.aux else { panic!("compare data") };
        assert_eq!(c[0][..8], (2u64 << 32 | 1).to_le_bytes(), "compares version 1");
        assert_eq!(req.bufs[0][..8], (2u64 << 32 | 2).to_le_bytes(), "writes version 2");
        assert_eq!(units.completed(2, &mut req, IoStatus::Success, &mut cmp), Outcome::Done);
        assert!(cmp.is_some(), "back home");
        units.prepare(2, &mut req, &mut cmp);
        assert_eq!(units.completed(2, &mut req, IoStatus::MISCOMPARE, &mut cmp), Outcome::Miscompare);
        units.prepare(2, &mut req, &mut cmp);
        assert_eq!(req.io_type, IoType::Write, "after a miscompare the unit is written afresh");
    }

    #[test]
    fn workloads_are_given_to_cores_in_turn() {
        let w: crate::Workloads = "compare_and_write,randwrite".parse().unwrap();
        assert_eq!(w.of_core(0), crate::Workload::CompareAndWrite);
        assert_eq!(w.of_core(1), crate::Workload::RandWrite);
        assert_eq!(w.of_core(2), crate::Workload::CompareAndWrite);
        assert!("write,bogus".parse::<crate::Workloads>().is_err());
    }
}
