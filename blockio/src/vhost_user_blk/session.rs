//! One connection to a vhost-user-blk backend, set up from scratch:
//! features negotiated, the configuration read and checked, a fresh shared
//! area registered, and every request queue's ring, kick and call eventfd
//! handed over. A reconnect makes a new session (new memory, new rings):
//! nothing of an old backend's view is reused.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::blk::{feature, BlkConfig, CONFIG_BYTES};
use super::ring::{DriverRing, RingLayout};
use super::shared::{DataPages, SharedArea, DATA_PAGE_BYTES};
use super::watchdog::Watchdog;

/// Entries per request queue: 3 descriptors a request, so 85 requests in
/// flight on a queue; the data area bounds them sooner.
pub(crate) const QUEUE_SIZE: u16 = 256;

/// Bytes per head of the per-request area: header (16), discard range
/// (16), status byte.
pub(crate) const HEAD_AREA_BYTES: usize = 64;

/// The device features this client acks where the backend offers them.
const WANTED_FEATURES: u64 = feature::VERSION_1
    | feature::PROTOCOL_FEATURES
    | feature::SIZE_MAX
    | feature::SEG_MAX
    | feature::RO
    | feature::BLK_SIZE
    | feature::FLUSH
    | feature::MQ
    | feature::DISCARD
    | feature::WRITE_ZEROES;

/// One request queue of a session.
pub(crate) struct Queue {
    /// The driver side of its ring.
    pub(crate) ring: DriverRing,
    /// Written to tell the backend that chains were published.
    pub(crate) kick: EventFd,
    /// Written by the backend when it used chains (a hint: the used index
    /// is what counts).
    pub(crate) call: EventFd,
}

/// A set-up connection.
pub(crate) struct Session {
    /// The protocol endpoint (its socket is watched for hang-ups).
    pub(crate) frontend: Frontend,
    /// The memory the backend shares; callers hold it while they copy
    /// data in and out without the client's lock.
    pub(crate) area: Arc<SharedArea>,
    /// The request queues.
    pub(crate) queues: Vec<Queue>,
    /// Allocation of the data area.
    pub(crate) data: DataPages,
    /// Where the data area starts in the shared area.
    pub(crate) data_offset: usize,
    /// Where queue `q`'s per-head areas start: `heads_offset[q]`.
    pub(crate) heads_offset: Vec<usize>,
    /// The device features acked.
    pub(crate) features: u64,
    /// The device's configuration.
    pub(crate) config: BlkConfig,
}

impl Session {
    /// Offset in the shared area of queue `queue`'s head `head`'s area.
    pub(crate) fn head_area(&self, queue: usize, head: u16) -> usize {
        self.heads_offset[queue] + usize::from(head) * HEAD_AREA_BYTES
    }

    /// The socket's descriptor, watched for a hang-up.
    pub(crate) fn socket_fd(&self) -> i32 {
        self.frontend.as_raw_fd()
    }
}

/// What a connection is asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want {
    /// Request queues.
    pub(crate) queues: u16,
    /// Bytes of data buffers in the shared area.
    pub(crate) data_bytes: usize,
    /// Opened for reading only.
    pub(crate) read_only: bool,
    /// How long the whole setup of a session may take.
    pub(crate) setup_timeout: Duration,
}

fn vhost_err(step: &str) -> impl Fn(vhost::Error) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// Connects to `path` and sets a session up, within `want.setup_timeout`.
pub(crate) fn connect(path: &Path, want: Want, dog: &Watchdog) -> Result<Session, String> {
    let stream = connect_bounded(path, want.setup_timeout).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => " (no socket there: start the backend first, e.g. qemu-storage-daemon --export type=vhost-user-blk,addr.type=unix,addr.path=PATH,...)",
            std::io::ErrorKind::ConnectionRefused => " (nothing listens on it: the backend is not running)",
            _ => "",
        };
        format!("cannot connect to {}: {e}{hint}", path.display())
    })?;
    dog.arm(&stream, want.setup_timeout)
        .map_err(|e| format!("cannot watch the socket: {e}"))?;
    let result = set_up(stream, want);
    if dog.disarm() {
        return Err(format!(
            "the backend did not finish the setup within {} s: it serves one frontend at a time (is another one connected?), or it hung",
            want.setup_timeout.as_secs()
        ));
    }
    result
}

/// A connect that cannot block for long: to a backend that hung with a
/// full listen backlog a blocking connect would wait without end (a
/// non-blocking one fails at once with `EAGAIN`, and is tried again).
fn connect_bounded(path: &Path, bound: Duration) -> std::io::Result<UnixStream> {
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    socket.connect_timeout(&socket2::SockAddr::unix(path)?, bound)?;
    socket.set_nonblocking(false)?;
    Ok(socket.into())
}

fn set_up(stream: UnixStream, want: Want) -> Result<Session, String> {
    let mut frontend = Frontend::from_stream(stream, u64::from(want.queues));
    frontend
        .set_owner()
        .map_err(vhost_err("VHOST_USER_SET_OWNER"))?;
    let offered = frontend
        .get_features()
        .map_err(vhost_err("VHOST_USER_GET_FEATURES"))?;
    for (bit, name) in [
        (feature::VERSION_1, "VIRTIO_F_VERSION_1"),
        (feature::PROTOCOL_FEATURES, "VHOST_USER_F_PROTOCOL_FEATURES"),
    ] {
        if offered & bit == 0 {
            return Err(format!(
                "the backend does not offer {name} (features {offered:#x}); a virtio 1.x vhost-user-blk backend is needed"
            ));
        }
    }
    let features = offered & WANTED_FEATURES;
    if features & feature::RO != 0 && !want.read_only {
        return Err("the backend exports the device read-only, and this use writes; export it writable (qemu-storage-daemon --export ...,writable=on)".into());
    }
    let offered_protocol = frontend
        .get_protocol_features()
        .map_err(vhost_err("VHOST_USER_GET_PROTOCOL_FEATURES"))?;
    if !offered_protocol.contains(VhostUserProtocolFeatures::CONFIG) {
        return Err(
            "the backend does not offer VHOST_USER_PROTOCOL_F_CONFIG: its capacity cannot be read"
                .into(),
        );
    }
    let protocol = offered_protocol
        & (VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK);
    frontend
        .set_protocol_features(protocol)
        .map_err(vhost_err("VHOST_USER_SET_PROTOCOL_FEATURES"))?;
    if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
        // Every setting is then acknowledged: a backend that refuses one
        // says so here rather than by dropping requests later.
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    }
    if want.queues > 1 {
        if !protocol.contains(VhostUserProtocolFeatures::MQ) || features & feature::MQ == 0 {
            return Err(format!(
                "{} queues were asked for, and the backend offers one only (no multiqueue)",
                want.queues
            ));
        }
        let backend_queues = frontend
            .get_queue_num()
            .map_err(vhost_err("VHOST_USER_GET_QUEUE_NUM"))?;
        if backend_queues < u64::from(want.queues) {
            return Err(format!(
                "{} queues were asked for, and the backend has {backend_queues} (qemu-storage-daemon: --export ...,num-queues=N)",
                want.queues
            ));
        }
    }
    frontend
        .set_features(features)
        .map_err(vhost_err("VHOST_USER_SET_FEATURES"))?;
    // Offset 0: QEMU's backend copies from the start of its configuration
    // whatever offset is asked for.
    let (_, config_bytes) = frontend
        .get_config(
            0,
            CONFIG_BYTES as u32,
            VhostUserConfigFlags::WRITABLE,
            &[0u8; CONFIG_BYTES],
        )
        .map_err(vhost_err("VHOST_USER_GET_CONFIG"))?;
    let config = BlkConfig::parse(&config_bytes, features)?;
    if config.num_queues < want.queues {
        return Err(format!(
            "{} queues were asked for, and the backend's configuration has {}",
            want.queues, config.num_queues
        ));
    }
    let layout = RingLayout::new(QUEUE_SIZE);
    let queues = usize::from(want.queues);
    let rings_bytes = queues * layout.len_bytes;
    let heads_bytes = (queues * usize::from(QUEUE_SIZE) * HEAD_AREA_BYTES)
        .div_ceil(DATA_PAGE_BYTES)
        * DATA_PAGE_BYTES;
    let data_pages = want.data_bytes.div_ceil(DATA_PAGE_BYTES);
    let data_offset = rings_bytes + heads_bytes;
    let area = SharedArea::new(data_offset + data_pages * DATA_PAGE_BYTES)
        .map_err(|e| format!("cannot make the memory shared with the backend (memfd): {e}"))?;
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: area.len_bytes() as u64,
        userspace_addr: area.base() as u64,
        mmap_offset: 0,
        mmap_handle: area.fd(),
    };
    frontend
        .set_mem_table(&[region])
        .map_err(vhost_err("VHOST_USER_SET_MEM_TABLE"))?;
    // Every ring's size first: some backends (SPDK) need them all early.
    for q in 0..queues {
        frontend
            .set_vring_num(q, QUEUE_SIZE)
            .map_err(vhost_err("VHOST_USER_SET_VRING_NUM"))?;
    }
    let mut made = Vec::with_capacity(queues);
    let mut heads_offset = Vec::with_capacity(queues);
    for q in 0..queues {
        let start = q * layout.len_bytes;
        // SAFETY: the ring's bytes lie inside the area (sized above), are
        // 4 KiB aligned (ring lengths are multiples of 4 KiB), and belong
        // to this ring alone; the area lives as long as the session.
        let ring = unsafe { DriverRing::new(area.at(start), layout) };
        let eventfd =
            || EventFd::new(EFD_NONBLOCK).map_err(|e| format!("cannot make an eventfd: {e}"));
        let (kick, call) = (eventfd()?, eventfd()?);
        let base = area.base() as u64 + start as u64;
        frontend
            .set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QUEUE_SIZE,
                    queue_size: QUEUE_SIZE,
                    flags: 0,
                    desc_table_addr: base + layout.desc as u64,
                    used_ring_addr: base + layout.used as u64,
                    avail_ring_addr: base + layout.avail as u64,
                    log_addr: None,
                },
            )
            .map_err(vhost_err("VHOST_USER_SET_VRING_ADDR"))?;
        frontend
            .set_vring_base(q, 0)
            .map_err(vhost_err("VHOST_USER_SET_VRING_BASE"))?;
        frontend
            .set_vring_call(q, &call)
            .map_err(vhost_err("VHOST_USER_SET_VRING_CALL"))?;
        frontend
            .set_vring_kick(q, &kick)
            .map_err(vhost_err("VHOST_USER_SET_VRING_KICK"))?;
        made.push(Queue { ring, kick, call });
        heads_offset.push(rings_bytes + q * usize::from(QUEUE_SIZE) * HEAD_AREA_BYTES);
    }
    for q in 0..queues {
        frontend
            .set_vring_enable(q, true)
            .map_err(vhost_err("VHOST_USER_SET_VRING_ENABLE"))?;
    }
    Ok(Session {
        frontend,
        area: Arc::new(area),
        queues: made,
        data: DataPages::new(data_pages),
        data_offset,
        heads_offset,
        features,
        config,
    })
}
