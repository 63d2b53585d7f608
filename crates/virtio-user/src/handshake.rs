//! The vhost-user conversation that sets a virtio-blk device up, with the `vhost` crate's
//! [`Frontend`]: connect, negotiate virtio and protocol features, read the device's
//! configuration space, send the memory table, then describe and start each virtqueue.
//!
//! Everything here blocks on the socket: callers run it off the reactors. The whole setup is
//! bounded by a [`Deadline`] ([`SOCKET_TIMEOUT`]), which shuts the socket down when it passes:
//! the vhost crate retries a receive that times out (`SO_RCVTIMEO`) forever, so a socket
//! timeout would not end a wait on a peer that never answers.

use crate::shm::SharedMem;
use ferrite_bdev::BdevError;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VringConfigData};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vmm_sys_util::eventfd::EventFd;

/// How long the whole setup may take: a socket that is not a vhost-user device (or a stuck
/// one) fails the attach instead of hanging it.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Shuts a socket down if the setup has not finished (the deadline dropped) in time.
pub struct Deadline {
    disarm: Option<std::sync::mpsc::Sender<()>>,
    fired: Arc<AtomicBool>,
}

impl Deadline {
    /// Arms the deadline on (a duplicate of) `sock`, with a thread that waits for it.
    pub fn arm(sock: &UnixStream, timeout: Duration) -> std::io::Result<Deadline> {
        let watched = sock.try_clone()?;
        let (disarm, disarmed) = std::sync::mpsc::channel::<()>();
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        std::thread::Builder::new().name("virtio-user-deadline".into()).spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = disarmed.recv_timeout(timeout) {
                f.store(true, Ordering::Release);
                let _ = watched.shutdown(std::net::Shutdown::Both);
            }
        })?;
        Ok(Deadline { disarm: Some(disarm), fired })
    }

    /// True if the deadline passed (and the socket was shut down).
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Explains `e` by the deadline if it passed.
    pub fn explain(&self, e: BdevError) -> BdevError {
        if !self.fired() {
            return e;
        }
        BdevError::Errno(libc::ETIMEDOUT, format!("{e} (no answer within {SOCKET_TIMEOUT:?})"))
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Some(d) = self.disarm.take() {
            let _ = d.send(());
        }
    }
}

/// The virtio features this driver uses, when the device offers them (SPDK's set, with
/// VERSION_1 and WRITE_ZEROES; no indirect descriptors).
pub const WANTED_FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_BLK_F_SIZE_MAX
    | 1 << VIRTIO_BLK_F_SEG_MAX
    | 1 << VIRTIO_BLK_F_BLK_SIZE
    | 1 << VIRTIO_BLK_F_TOPOLOGY
    | 1 << VIRTIO_BLK_F_MQ
    | 1 << VIRTIO_BLK_F_RO
    | 1 << VIRTIO_BLK_F_DISCARD
    | 1 << VIRTIO_BLK_F_WRITE_ZEROES
    | 1 << VIRTIO_BLK_F_FLUSH
    | 1 << VIRTIO_RING_F_EVENT_IDX;

/// The protocol features this driver uses, when offered.
fn wanted_protocol() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::REPLY_ACK
}

/// Bytes of the configuration space read: through `write_zeroes_may_unmap` and its padding
/// (devices with a shorter space than the kernel's header refuse longer reads).
const CONFIG_BYTES: usize = 60;

/// What the device said about itself, from its configuration space and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Negotiated virtio features.
    pub features: u64,
    /// Capacity in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Logical block size (512 without BLK_SIZE).
    pub block_size: u32,
    /// Request queues the device has (1 without MQ).
    pub num_queues: u16,
    /// Largest segment in bytes (SIZE_MAX), if given.
    pub size_max: Option<u32>,
    /// Most segments per request (SEG_MAX), if given.
    pub seg_max: Option<u32>,
    /// Log2 of logical blocks per physical block (TOPOLOGY; 0 otherwise).
    pub physical_block_exp: u8,
    /// Optimal I/O size in logical blocks (TOPOLOGY; 0: none).
    pub opt_io_size: u32,
    /// Most sectors per discard segment (DISCARD).
    pub max_discard_sectors: u32,
    /// Discard alignment in sectors (DISCARD).
    pub discard_sector_alignment: u32,
    /// Most sectors per write-zeroes segment (WRITE_ZEROES).
    pub max_write_zeroes_sectors: u32,
}

impl DeviceConfig {
    /// True if the device offered and this driver accepted virtio feature `bit`.
    pub fn has(&self, bit: u32) -> bool {
        self.features & (1 << bit) != 0
    }
}

/// An attach failure, as an errno and a message naming the socket.
fn fail(errno: i32, path: &str, what: impl std::fmt::Display) -> BdevError {
    BdevError::Errno(errno, format!("vhost-user socket {path}: {what}"))
}

fn proto<'a>(path: &'a str, step: &'a str) -> impl Fn(vhost::Error) -> BdevError + 'a {
    move |e| fail(libc::EIO, path, format!("{step} failed (is it a vhost-user-blk device?): {e}"))
}

/// Connects to the device's socket and sets the frontend up: owner, features, protocol
/// features, configuration. Returns the frontend, what the device is, and the deadline of the
/// setup (armed; the caller drops it once the queues are started too).
pub fn connect(path: &str, vq_count: u16) -> Result<(Frontend, DeviceConfig, Deadline), BdevError> {
    let sock = UnixStream::connect(path)
        .map_err(|e| fail(e.raw_os_error().unwrap_or(libc::EIO), path, format_args!("cannot connect: {e}")))?;
    let deadline = Deadline::arm(&sock, SOCKET_TIMEOUT)
        .map_err(|e| fail(libc::EIO, path, format_args!("cannot arm the setup deadline: {e}")))?;
    match negotiate(Frontend::from_stream(sock, u64::from(vq_count)), path) {
        Ok((fe, config)) => Ok((fe, config, deadline)),
        Err(e) => Err(deadline.explain(e)),
    }
}

fn negotiate(mut fe: Frontend, path: &str) -> Result<(Frontend, DeviceConfig), BdevError> {
    fe.set_owner().map_err(proto(path, "SET_OWNER"))?;
    let offered = fe.get_features().map_err(proto(path, "GET_FEATURES"))?;
    let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if offered & protocol_bit == 0 {
        return Err(fail(libc::ENOTSUP, path, "the device offers no vhost-user protocol features (CONFIG is needed)"));
    }
    let offered_protocol = fe.get_protocol_features().map_err(proto(path, "GET_PROTOCOL_FEATURES"))?;
    let protocol = offered_protocol & wanted_protocol();
    if !protocol.contains(VhostUserProtocolFeatures::CONFIG) {
        return Err(fail(libc::ENOTSUP, path, "the device does not offer VHOST_USER_PROTOCOL_F_CONFIG"));
    }
    fe.set_protocol_features(protocol).map_err(proto(path, "SET_PROTOCOL_FEATURES"))?;
    if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
        // Every later message that has no reply of its own is acknowledged: a refused memory
        // table or ring fails the attach here instead of hanging its first I/O.
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    }
    let features = offered & WANTED_FEATURES;
    let mut queues_by_protocol = None;
    if protocol.contains(VhostUserProtocolFeatures::MQ) {
        queues_by_protocol = Some(fe.get_queue_num().map_err(proto(path, "GET_QUEUE_NUM"))?);
    }
    let space = [0u8; CONFIG_BYTES];
    let (_, bytes) = fe
        .get_config(0, CONFIG_BYTES as u32, VhostUserConfigFlags::empty(), &space)
        .map_err(proto(path, "GET_CONFIG"))?;
    let config = parse_config(features, &bytes, queues_by_protocol).map_err(|m| fail(libc::EINVAL, path, m))?;
    fe.set_features(features | protocol_bit).map_err(proto(path, "SET_FEATURES"))?;
    Ok((fe, config))
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the configuration space `b` of a device with `features` (and, with the MQ protocol
/// feature, the queue count it answered): refuses one this driver cannot use.
pub fn parse_config(features: u64, b: &[u8], queues_by_protocol: Option<u64>) -> Result<DeviceConfig, String> {
    if b.len() < CONFIG_BYTES {
        return Err(format!("the configuration space is {} bytes, {CONFIG_BYTES} are needed", b.len()));
    }
    let has = |bit: u32| features & (1 << bit) != 0;
    let block_size = if has(VIRTIO_BLK_F_BLK_SIZE) { le32(b, 20) } else { 512 };
    if block_size == 0 || !block_size.is_multiple_of(512) {
        return Err(format!("invalid block size {block_size} (must be a multiple of 512)"));
    }
    let capacity_sectors = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    if capacity_sectors * 512 / u64::from(block_size) == 0 {
        return Err(format!("the device holds {capacity_sectors} sectors, less than one block of {block_size} bytes"));
    }
    let num_queues = if has(VIRTIO_BLK_F_MQ) { u16::from_le_bytes([b[34], b[35]]) } else { 1 };
    let num_queues = match queues_by_protocol {
        Some(q) => num_queues.min(u16::try_from(q).unwrap_or(u16::MAX)),
        None => num_queues,
    };
    if num_queues == 0 {
        return Err("the device has 0 request queues".into());
    }
    let seg_max = has(VIRTIO_BLK_F_SEG_MAX).then(|| le32(b, 12));
    if seg_max == Some(0) {
        return Err("the device's SEG_MAX is 0".into());
    }
    let topology = has(VIRTIO_BLK_F_TOPOLOGY);
    let discard = has(VIRTIO_BLK_F_DISCARD);
    let write_zeroes = has(VIRTIO_BLK_F_WRITE_ZEROES);
    Ok(DeviceConfig {
        features,
        capacity_sectors,
        block_size,
        num_queues,
        size_max: has(VIRTIO_BLK_F_SIZE_MAX).then(|| le32(b, 8)).filter(|&s| s != 0),
        seg_max,
        physical_block_exp: if topology { b[24].min(16) } else { 0 },
        opt_io_size: if topology { le32(b, 28) } else { 0 },
        max_discard_sectors: if discard { le32(b, 36) } else { 0 },
        discard_sector_alignment: if discard { le32(b, 44) } else { 0 },
        max_write_zeroes_sectors: if write_zeroes { le32(b, 48) } else { 0 },
    })
}

/// One virtqueue as the device is told about it.
pub struct QueueSetup<'a> {
    /// Entries.
    pub size: u16,
    /// Descriptor table, available ring and used ring (in the shared region).
    pub rings: (*const u8, *const u8, *const u8),
    /// The eventfd this driver writes to kick the device.
    pub kick: &'a EventFd,
    /// The eventfd the device signals completions on.
    pub call: &'a EventFd,
}

/// Sends the memory table, then describes, wires and enables each queue (index = position).
pub fn start_queues(
    fe: &mut Frontend,
    path: &str,
    shm: &SharedMem,
    queues: &[QueueSetup<'_>],
) -> Result<(), BdevError> {
    fe.set_mem_table(&[shm.region()]).map_err(proto(path, "SET_MEM_TABLE"))?;
    for (i, q) in queues.iter().enumerate() {
        let addr = |p: *const u8| shm.device_addr(p);
        let rings = VringConfigData {
            queue_max_size: q.size,
            queue_size: q.size,
            flags: 0,
            desc_table_addr: addr(q.rings.0),
            avail_ring_addr: addr(q.rings.1),
            used_ring_addr: addr(q.rings.2),
            log_addr: None,
        };
        // SPDK's order: call first, kick last (a device may start the ring on its kick).
        fe.set_vring_call(i, q.call).map_err(proto(path, "SET_VRING_CALL"))?;
        fe.set_vring_num(i, q.size).map_err(proto(path, "SET_VRING_NUM"))?;
        fe.set_vring_base(i, 0).map_err(proto(path, "SET_VRING_BASE"))?;
        fe.set_vring_addr(i, &rings).map_err(proto(path, "SET_VRING_ADDR"))?;
        fe.set_vring_kick(i, q.kick).map_err(proto(path, "SET_VRING_KICK"))?;
        // With protocol features negotiated, rings start disabled.
        fe.set_vring_enable(i, true).map_err(proto(path, "SET_VRING_ENABLE"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(capacity: u64, blk_size: u32, num_queues: u16) -> Vec<u8> {
        let mut b = vec![0u8; CONFIG_BYTES];
        b[0..8].copy_from_slice(&capacity.to_le_bytes());
        b[20..24].copy_from_slice(&blk_size.to_le_bytes());
        b[34..36].copy_from_slice(&num_queues.to_le_bytes());
        b
    }

    #[test]
    fn config_fields_are_read_at_their_offsets() {
        let mut b = space(1 << 20, 4096, 4);
        b[8..12].copy_from_slice(&65536u32.to_le_bytes());
        b[12..16].copy_from_slice(&126u32.to_le_bytes());
        b[36..40].copy_from_slice(&8192u32.to_le_bytes());
        let f = 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_MQ
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_DISCARD;
        let c = parse_config(f, &b, Some(2)).unwrap();
        assert_eq!((c.capacity_sectors, c.block_size), (1 << 20, 4096));
        assert_eq!(c.num_queues, 2, "the smaller of GET_QUEUE_NUM and the config's count");
        assert_eq!((c.size_max, c.seg_max, c.max_discard_sectors), (Some(65536), Some(126), 8192));
    }

    #[test]
    fn features_not_negotiated_leave_their_fields_unread() {
        let c = parse_config(0, &space(100, 4096, 0), None).unwrap();
        assert_eq!((c.block_size, c.num_queues, c.size_max), (512, 1, None));
    }

    #[test]
    fn unusable_devices_are_refused() {
        let mq = 1 << VIRTIO_BLK_F_MQ | 1 << VIRTIO_BLK_F_BLK_SIZE;
        assert!(parse_config(mq, &space(100, 512, 0), None).unwrap_err().contains("0 request queues"));
        assert!(parse_config(mq, &space(100, 1000, 1), None).unwrap_err().contains("block size"));
        assert!(parse_config(mq, &space(4, 4096, 1), None).unwrap_err().contains("less than one block"));
    }
}
