//! Every command but READ and WRITE (which the session sends to the bdev itself), run as a
//! local task of the session's reactor: the block commands over bdev requests (VERIFY,
//! WRITE AND VERIFY, COMPARE AND WRITE, WRITE SAME, UNMAP, SYNCHRONIZE CACHE, PRE-FETCH, GET
//! LBA STATUS), the data the other commands return, and the commands to an unknown LUN.

use crate::cdb::{self, Command, Rw};
use crate::inquiry;
use crate::lun::{Lun, MAX_WRITE_SAME_BLOCKS};
use crate::sense::{
    asc, Fault, SENSE_DATA_PROTECT, SENSE_ILLEGAL_REQUEST, SENSE_NOT_READY, SENSE_NO_SENSE, SENSE_UNIT_ATTENTION,
};
use crate::session::{fault_response, Inner, LunSlot};
use crate::target::lun_to_bytes;
use crate::task::{Residual, Response, Task};
use ferrite_bdev::{Completed, IoAux, IoBufs, IoChannel, IoFlags, IoRequest, IoStatus, IoType};
use ferrite_reactor::IoBuf;
use std::rc::Rc;

/// What a command answers when it succeeds.
pub(crate) enum Reply {
    /// GOOD, no data-in.
    Good,
    /// GOOD with data-in: the whole data, cut at the allocation length.
    Data(Vec<u8>, u32),
}

/// Runs `cmd` (None: the task's LUN does not exist) and builds its response.
pub(crate) async fn run(s: &Rc<Inner>, mut task: Task, cmd: Option<Command>) -> Response {
    let expected = task.expected_len;
    let Some(ls) = s.lun_slot(task.lun) else { return no_lun(s, &task) };
    let Some(cmd) = cmd else {
        // The LUN appeared between the submission and now: decode it here.
        return match cdb::decode(task.cdb.as_slice()) {
            Ok(c) => Box::pin(run(s, task, Some(c))).await,
            Err(f) => fault_response(f, ls.lun.d_sense(), expected, 0),
        };
    };
    let need = cmd.data_out_len(ls.lun.bdev().block_size());
    match command(s, &ls, &mut task, cmd).await {
        Ok(Reply::Good) => Response { residual: Residual::of(expected, need), ..Default::default() },
        Ok(Reply::Data(d, alloc)) => data_response(d, alloc, expected),
        Err(f) => fault_response(f, ls.lun.d_sense(), expected, need),
    }
}

fn data_response(mut d: Vec<u8>, alloc: u32, expected: u32) -> Response {
    d.truncate(alloc as usize);
    let would = d.len() as u64;
    let n = d.len().min(expected as usize);
    let mut buf = ferrite_reactor::alloc_buf(n);
    buf.copy_from_slice(&d[..n]);
    let mut data = IoBufs::new();
    data.push(buf);
    Response { data, data_len: n as u32, residual: Residual::of(expected, would), ..Default::default() }
}

/// A command to a LUN the target does not have (SPC-4 4.6.20): INQUIRY answers peripheral
/// qualifier 011b, REPORT LUNS the target's list, REQUEST SENSE the reason, the rest CHECK
/// CONDITION with LOGICAL UNIT NOT SUPPORTED.
fn no_lun(s: &Inner, task: &Task) -> Response {
    let expected = task.expected_len;
    let cmd = match cdb::decode(task.cdb.as_slice()) {
        Ok(c) => c,
        Err(f) if f.sense.asc == asc::INVALID_OPCODE.0 => {
            return fault_response(Fault::check(SENSE_ILLEGAL_REQUEST, asc::LUN_NOT_SUPPORTED), false, expected, 0)
        }
        Err(f) => return fault_response(f, false, expected, 0),
    };
    let r = match cmd {
        Command::Inquiry { evpd, page, alloc } => {
            let d = if evpd {
                vec![0x7f, page, 0, 0]
            } else {
                let mut d = vec![0u8; 36];
                d[0] = 0x7f;
                d[2] = 0x06;
                d[3] = 0x12;
                d[4] = 31;
                d
            };
            Ok(Reply::Data(d, alloc))
        }
        Command::ReportLuns { select, alloc } => report_luns(s, select, alloc),
        Command::RequestSense { desc, alloc } => {
            let f = Fault::check(SENSE_ILLEGAL_REQUEST, asc::LUN_NOT_SUPPORTED);
            Ok(Reply::Data(f.encode(desc).as_slice().to_vec(), alloc))
        }
        _ => Err(Fault::check(SENSE_ILLEGAL_REQUEST, asc::LUN_NOT_SUPPORTED)),
    };
    match r {
        Ok(Reply::Data(d, alloc)) => data_response(d, alloc, expected),
        Ok(Reply::Good) => Response { residual: Residual::of(expected, 0), ..Default::default() },
        Err(f) => fault_response(f, false, expected, 0),
    }
}

fn report_luns(s: &Inner, select: u8, alloc: u32) -> Result<Reply, Fault> {
    if alloc < 16 {
        return Err(Fault::invalid_cdb(6, None));
    }
    let ids = match select {
        0x00 | 0x02 => s.target.lun_ids(),
        // Well-known logical units (none), and SPC-5's administrative ones (none).
        0x01 | 0x10 | 0x11 | 0x12 => vec![],
        _ => return Err(Fault::invalid_cdb(2, Some(7))),
    };
    let mut d = ((ids.len() * 8) as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&[0; 4]);
    for id in ids {
        d.extend_from_slice(&lun_to_bytes(id));
    }
    Ok(Reply::Data(d, alloc))
}

fn channel(ls: &LunSlot) -> Result<&IoChannel, Fault> {
    ls.ch.as_ref().ok_or(Fault::of_io(IoStatus::Removed))
}

/// The medium is there (not stopped) and `lba + blocks` within it.
fn check_range(ls: &LunSlot, lba: u64, blocks: u64) -> Result<&IoChannel, Fault> {
    if ls.lun.stopped() {
        return Err(Fault::check(SENSE_NOT_READY, asc::NOT_READY_INIT_REQUIRED));
    }
    let ch = channel(ls)?;
    if lba.checked_add(blocks).is_none_or(|end| end > ch.num_blocks()) {
        return Err(Fault::lba_out_of_range());
    }
    Ok(ch)
}

fn check_writable(lun: &Lun) -> Result<(), Fault> {
    if lun.write_protected() {
        return Err(Fault::check(SENSE_DATA_PROTECT, asc::WRITE_PROTECTED));
    }
    Ok(())
}

/// The data-out as one byte string.
fn gather(bufs: &IoBufs) -> Vec<u8> {
    let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
    for b in bufs {
        v.extend_from_slice(b);
    }
    v
}

fn buf_of(bytes: &[u8]) -> IoBuf {
    let mut b = ferrite_reactor::alloc_buf(bytes.len());
    b.copy_from_slice(bytes);
    b
}

/// Submits `req` on behalf of the session's initiator and waits for it.
async fn io(s: &Inner, ch: &IoChannel, req: IoRequest) -> Result<Completed, Fault> {
    let c = ch.submit_wait(req.for_initiator(Some(s.who_id()))).await;
    if c.status.is_ok() {
        Ok(c)
    } else {
        Err(Fault::of_io(c.status))
    }
}

async fn command(s: &Rc<Inner>, ls: &LunSlot, task: &mut Task, cmd: Command) -> Result<Reply, Fault> {
    let lun = &ls.lun;
    match cmd {
        Command::TestUnitReady => {
            if lun.stopped() {
                return Err(Fault::check(SENSE_NOT_READY, asc::NOT_READY_INIT_REQUIRED));
            }
            channel(ls)?;
            Ok(Reply::Good)
        }
        Command::RequestSense { desc, alloc } => {
            let f = match ls.ua.take() {
                Some(code) => Fault::check(SENSE_UNIT_ATTENTION, code),
                None if lun.stopped() => Fault::check(SENSE_NOT_READY, asc::NOT_READY_INIT_REQUIRED),
                None => Fault::check(SENSE_NO_SENSE, asc::NO_ADDITIONAL_SENSE),
            };
            Ok(Reply::Data(f.encode(desc).as_slice().to_vec(), alloc))
        }
        Command::Inquiry { evpd: false, alloc, .. } => {
            let tpgs = !s.target.ports().is_empty();
            Ok(Reply::Data(inquiry::standard(lun.identity(), tpgs), alloc))
        }
        Command::Inquiry { page, alloc, .. } => {
            let d = inquiry::vpd_page(page, lun.identity(), &s.port, s.target.name(), &lun.block_facts())?;
            Ok(Reply::Data(d, alloc))
        }
        Command::ModeSense { ten, dbd, llbaa, pc, page, subpage, alloc } => {
            let m = lun.mode.lock().unwrap_or_else(|p| p.into_inner());
            Ok(Reply::Data(m.sense(&lun.geometry(), ten, dbd, llbaa, pc, page, subpage)?, alloc))
        }
        Command::ModeSelect { ten, len, .. } => {
            if len == 0 {
                return Ok(Reply::Good);
            }
            let data = gather(&task.data_out);
            let mut m = lun.mode.lock().unwrap_or_else(|p| p.into_inner());
            if m.select(&lun.geometry(), ten, &data)? {
                lun.publish_mode(&m);
                drop(m);
                lun.establish_all(asc::MODE_PARAMETERS_CHANGED, Some(s.id));
            }
            Ok(Reply::Good)
        }
        Command::Reserve { .. } => crate::pr::reserve_spc2(s, lun).map(|()| Reply::Good),
        Command::Release { .. } => crate::pr::release_spc2(s, lun).map(|()| Reply::Good),
        Command::StartStopUnit { power_condition, start, .. } => {
            channel(ls)?;
            if power_condition != 0 {
                // No power conditions to move between: nothing changes.
                return Ok(Reply::Good);
            }
            if start {
                lun.set_stopped(false);
            } else {
                if !lun.stopped() && lun.bdev().supports(IoType::Flush) && !lun.write_protected() {
                    io(s, channel(ls)?, IoRequest::no_payload(IoType::Flush, 0, 0)).await?;
                }
                lun.set_stopped(true);
            }
            Ok(Reply::Good)
        }
        Command::ReadCapacity10 => {
            let ch = channel(ls)?;
            Ok(Reply::Data(inquiry::capacity10(ch.num_blocks(), ch.block_size()), 8))
        }
        Command::ReadCapacity16 { alloc } => {
            let ch = channel(ls)?;
            Ok(Reply::Data(inquiry::capacity16(ch.num_blocks(), ch.block_size(), &lun.block_facts()), alloc))
        }
        Command::GetLbaStatus { lba, alloc } => get_lba_status(s, ls, lba, alloc).await,
        Command::Verify { rw, bytchk } => verify(s, ls, task, rw, bytchk).await,
        Command::WriteVerify { rw, bytchk } => write_verify(s, ls, task, rw, bytchk).await,
        Command::CompareAndWrite(rw) => compare_and_write(s, ls, task, rw).await,
        Command::WriteSame { rw, unmap, anchor, ndob } => write_same(s, ls, task, rw, unmap, anchor, ndob).await,
        Command::Unmap { anchor, len } => unmap(s, ls, task, anchor, len).await,
        Command::SyncCache { lba, blocks } => {
            let ch = check_range(ls, lba, u64::from(blocks))?;
            if lun.bdev().supports(IoType::Flush) && !lun.write_protected() {
                io(s, ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await?;
            }
            Ok(Reply::Good)
        }
        Command::PreFetch { lba, blocks } => {
            // No cache to fill: GOOD (SBC-3 5.9: not all of the blocks fit in the cache).
            check_range(ls, lba, u64::from(blocks))?;
            Ok(Reply::Good)
        }
        Command::ReportLuns { select, alloc } => report_luns(s, select, alloc),
        Command::ReportTargetPortGroups { extended, alloc } => Ok(Reply::Data(rtpg(s, extended), alloc)),
        Command::ReportOpcodes { rctd, options, opcode, sa, alloc } => {
            Ok(Reply::Data(crate::opcodes::report(lun, rctd, options, opcode, sa)?, alloc))
        }
        Command::ReportTmfs { repd, alloc } => {
            // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, TARGET RESET
            // (the transport's loop over the logical units).
            let mut d = vec![0xda, 0, 0, 0];
            if repd {
                d[3] = 0x0c;
                d.resize(16, 0);
            }
            Ok(Reply::Data(d, alloc))
        }
        Command::PrIn { sa, alloc } => crate::pr::pr_in(s, lun, sa).map(|d| Reply::Data(d, alloc)),
        Command::PrOut { sa, scope, rtype, len } => {
            crate::pr::pr_out(s, lun, task.lun, sa, scope, rtype, len, &gather(&task.data_out))
                .await
                .map(|()| Reply::Good)
        }
        Command::Read(_) | Command::Write(_) => unreachable!("the session runs READ and WRITE"),
    }
}

/// REPORT TARGET PORT GROUPS: every group of the target's ports, active/optimized.
fn rtpg(s: &Inner, extended: bool) -> Vec<u8> {
    let ports = s.target.ports();
    let mut groups: Vec<u16> = ports.iter().map(|p| p.group).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut d = vec![0u8; 4];
    if extended {
        d.extend_from_slice(&[0x10, 0, 0, 0]);
    }
    for g in groups {
        let members: Vec<u16> = ports.iter().filter(|p| p.group == g).map(|p| p.rel_id).collect();
        d.extend_from_slice(&[0x80, 0x01]);
        d.extend_from_slice(&g.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, members.len() as u8]);
        for m in members {
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&m.to_be_bytes());
        }
    }
    let n = (d.len() - 4) as u32;
    d[..4].copy_from_slice(&n.to_be_bytes());
    d
}

/// GET LBA STATUS: one descriptor from `lba`: deallocated up to the next data, or mapped up to
/// the next hole, where the bdev can tell (seek hole and data); mapped to the end otherwise.
async fn get_lba_status(s: &Inner, ls: &LunSlot, lba: u64, alloc: u32) -> Result<Reply, Fault> {
    let ch = channel(ls)?;
    let end = ch.num_blocks();
    if lba >= end {
        return Err(Fault::lba_out_of_range());
    }
    let bdev = ls.lun.bdev();
    let (count, status) = if bdev.supports(IoType::SeekHole) && bdev.supports(IoType::SeekData) {
        let hole = io(s, ch, IoRequest::no_payload(IoType::SeekHole, lba, 1)).await?.result.min(end);
        if hole == lba {
            let data = io(s, ch, IoRequest::no_payload(IoType::SeekData, lba, 1)).await?.result.min(end);
            (data.max(lba + 1) - lba, 1u8)
        } else {
            (hole - lba, 0)
        }
    } else {
        (end - lba, 0)
    };
    let mut d = vec![0u8; 24];
    d[0..4].copy_from_slice(&20u32.to_be_bytes());
    d[8..16].copy_from_slice(&lba.to_be_bytes());
    d[16..20].copy_from_slice(&(count.min(u64::from(u32::MAX)) as u32).to_be_bytes());
    d[20] = status;
    Ok(Reply::Data(d, alloc))
}

/// The checks of a command on `rw`'s blocks: range, transfer length (a READ/WRITE-sized one
/// unless `limit` says otherwise).
fn check_blocks<'a>(ls: &'a LunSlot, task: &Task, rw: Rw, limit: u64) -> Result<&'a IoChannel, Fault> {
    let ch = check_range(ls, rw.lba, u64::from(rw.blocks))?;
    if u64::from(rw.blocks) > limit {
        let at = match task.cdb.as_slice().len() {
            10 => 7,
            12 => 6,
            _ => 10,
        };
        return Err(Fault::invalid_cdb(at, None));
    }
    Ok(ch)
}

async fn verify(s: &Inner, ls: &LunSlot, task: &mut Task, rw: Rw, bytchk: u8) -> Result<Reply, Fault> {
    let ch = check_blocks(ls, task, rw, u64::from(ls.lun.max_transfer_blocks()))?;
    if rw.blocks == 0 {
        return Ok(Reply::Good);
    }
    let n = u64::from(rw.blocks);
    let bs = ch.block_size() as usize;
    let req = match bytchk {
        0 => IoRequest::read_zcopy(rw.lba, n),
        1 => {
            let mut r = IoRequest::new(IoType::Compare, rw.lba, n);
            r.bufs = std::mem::take(&mut task.data_out);
            r
        }
        _ => {
            let one = gather(&task.data_out);
            let mut all = ferrite_reactor::alloc_buf(bs * rw.blocks as usize);
            for c in all.chunks_mut(bs) {
                c.copy_from_slice(&one[..bs]);
            }
            IoRequest::compare(rw.lba, n, all)
        }
    };
    io(s, ch, req).await?;
    Ok(Reply::Good)
}

async fn write_verify(s: &Inner, ls: &LunSlot, task: &mut Task, rw: Rw, bytchk: bool) -> Result<Reply, Fault> {
    check_writable(&ls.lun)?;
    let ch = check_blocks(ls, task, rw, u64::from(ls.lun.max_transfer_blocks()))?;
    if rw.blocks == 0 {
        return Ok(Reply::Good);
    }
    let n = u64::from(rw.blocks);
    let mut w = IoRequest::new(IoType::Write, rw.lba, n).with_flags(IoFlags::FUA);
    w.bufs = std::mem::take(&mut task.data_out);
    let mut written = io(s, ch, w).await?;
    // Verify: compare what is on the medium with what was sent (BYTCHK), or read it back.
    let r = if bytchk {
        let mut c = IoRequest::new(IoType::Compare, rw.lba, n);
        c.bufs = written.take_req().bufs;
        c
    } else {
        IoRequest::read_zcopy(rw.lba, n)
    };
    io(s, ch, r).await?;
    Ok(Reply::Good)
}

async fn compare_and_write(s: &Inner, ls: &LunSlot, task: &Task, rw: Rw) -> Result<Reply, Fault> {
    let ch = check_blocks(ls, task, rw, u64::from(crate::lun::MAX_COMPARE_WRITE_BLOCKS))?;
    check_writable(&ls.lun)?;
    if rw.blocks == 0 {
        return Ok(Reply::Good);
    }
    let n = u64::from(rw.blocks);
    let half = n as usize * ch.block_size() as usize;
    let all = gather(&task.data_out);
    let mut req = IoRequest::new(IoType::CompareAndWrite, rw.lba, n).with_buf(buf_of(&all[half..]));
    req.aux = IoAux::Compare(Box::new(smallvec::smallvec![buf_of(&all[..half])]));
    if rw.fua {
        req.flags = IoFlags::FUA;
    }
    io(s, ch, req).await?;
    Ok(Reply::Good)
}

async fn write_same(
    s: &Inner,
    ls: &LunSlot,
    task: &Task,
    rw: Rw,
    unmap: bool,
    anchor: bool,
    ndob: bool,
) -> Result<Reply, Fault> {
    check_writable(&ls.lun)?;
    let ch = check_blocks(ls, task, rw, MAX_WRITE_SAME_BLOCKS)?;
    let bdev = ls.lun.bdev();
    let bs = ch.block_size() as usize;
    let pattern = if ndob { vec![0u8; bs] } else { gather(&task.data_out) };
    let zero = pattern.iter().all(|&b| b == 0);
    let n = u64::from(rw.blocks);
    let facts = ls.lun.block_facts();
    if unmap && !facts.unmap {
        // LBPWS and LBPWS10 are 0: WRITE SAME does not unmap here (SBC-3 5.43).
        return Err(Fault::invalid_cdb(1, Some(3)));
    }
    if unmap && zero && !anchor {
        io(s, ch, IoRequest::no_payload(IoType::Unmap, rw.lba, n)).await?;
        return Ok(Reply::Good);
    }
    if zero && bdev.supports(IoType::WriteZeroes) {
        io(s, ch, IoRequest::no_payload(IoType::WriteZeroes, rw.lba, n)).await?;
        return Ok(Reply::Good);
    }
    // The pattern, a chunk of blocks at a time (1 MiB).
    let per = ((1usize << 20) / bs).max(1) as u64;
    let mut buf = ferrite_reactor::alloc_buf(bs * per.min(n) as usize);
    for c in buf.chunks_mut(bs) {
        c.copy_from_slice(&pattern[..bs]);
    }
    let mut at = rw.lba;
    while at < rw.lba + n {
        let k = per.min(rw.lba + n - at);
        buf.set_len(k as usize * bs);
        let mut done = io(s, ch, IoRequest::write(at, k, buf)).await?;
        buf = done.take_req().bufs.into_iter().next().expect("the write's buffer comes back");
        at += k;
    }
    Ok(Reply::Good)
}

async fn unmap(s: &Inner, ls: &LunSlot, task: &Task, anchor: bool, len: u32) -> Result<Reply, Fault> {
    let facts = ls.lun.block_facts();
    if !facts.unmap {
        return Err(Fault::invalid_opcode());
    }
    check_writable(&ls.lun)?;
    if len == 0 {
        return Ok(Reply::Good);
    }
    if len < 8 {
        return Err(Fault::param_list_length());
    }
    let ch = check_range(ls, 0, 0)?;
    let data = gather(&task.data_out);
    let bdl = usize::from(u16::from_be_bytes([data[2], data[3]])).min(data.len() - 8) / 16 * 16;
    let count = bdl / 16;
    if count as u32 > facts.max_unmap_descriptors {
        return Err(Fault::invalid_param(2, None));
    }
    let mut ranges = Vec::with_capacity(count);
    let mut total = 0u64;
    for i in 0..count {
        let d = &data[8 + 16 * i..24 + 16 * i];
        let lba = u64::from_be_bytes(d[0..8].try_into().expect("8 bytes"));
        let n = u64::from(u32::from_be_bytes(d[8..12].try_into().expect("4 bytes")));
        if lba.checked_add(n).is_none_or(|end| end > ch.num_blocks()) {
            return Err(Fault::lba_out_of_range());
        }
        total += n;
        if n > 0 {
            ranges.push((lba, n));
        }
    }
    if total > u64::from(facts.max_unmap_lba) {
        return Err(Fault::invalid_param(8, None));
    }
    let kind = if anchor { IoType::WriteZeroes } else { IoType::Unmap };
    for (lba, n) in ranges {
        io(s, ch, IoRequest::no_payload(kind, lba, n)).await?;
    }
    Ok(Reply::Good)
}
