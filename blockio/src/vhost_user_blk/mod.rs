//! The vhost-user-blk transport: a [`BlockFile`] whose storage is a block
//! device served by a vhost-user backend on a Unix socket
//! (`qemu-storage-daemon --export type=vhost-user-blk`, SPDK's vhost
//! target). This process is the vhost-user frontend and the virtio
//! driver: it negotiates the device, shares a memfd with the backend for
//! the rings and the data buffers, and moves requests as virtio-blk
//! chains on split virtqueues, completions arriving on call eventfds.
//!
//! What is taken from where:
//! - the vhost-user messages (and their file descriptors) are the rust-vmm
//!   `vhost` crate's frontend ([`session`]);
//! - the driver side of the rings is this crate's own ([`ring`]), since
//!   `virtio-queue` implements the device side;
//! - the virtio-blk requests and configuration checks are in [`blk`].
//!
//! Data crosses the shared area by one copy each way ([`shared`] says why
//! the callers' buffers cannot be shared). Requests from any thread are
//! pipelined on the device's queues; one worker thread takes completions
//! and reconnects a backend that went away, sending again what it had
//! not completed ([`client`]). Writes complete when the backend reports
//! them done; [`BlockFile::flush`] sends `VIRTIO_BLK_T_FLUSH` where it is
//! offered.

mod blk;
mod client;
mod ring;
mod session;
mod shared;
#[cfg(test)]
mod tests;
mod watchdog;

pub use client::{clients_reconnecting, set_worker_thread_setup, Client};

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use blk::{feature, RequestType, SECTOR_BYTES};
use client::{sectors, CallerBuf, Outcome, Piece};
use session::Want;

use crate::batch::Tracker;
use crate::{Backend, BlockFile, BlockIoError, OpKind};

/// How long a backend may leave a request unanswered, and how long a lost
/// backend is retried, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the setup of a session may take (a handful of messages).
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest piece of data one request carries: a 2 MiB unit is one.
const MAX_PIECE_BYTES: usize = 2 << 20;

/// How to open a vhost-user-blk device.
#[derive(Clone, Debug)]
pub struct VhostUserBlkOptions {
    /// Request queues to use (the backend must have as many).
    pub queues: u16,
    /// How long a request may go unanswered before the backend is taken
    /// as lost, and how long a lost backend is retried before every
    /// request fails.
    pub timeout: Duration,
    /// Bytes of data buffers shared with the backend: the data of the
    /// requests in flight at once.
    pub buffer_bytes: usize,
    /// Open for reading only; without it a read-only device is refused.
    pub read_only: bool,
}

impl Default for VhostUserBlkOptions {
    fn default() -> Self {
        Self {
            queues: 1,
            timeout: DEFAULT_TIMEOUT,
            buffer_bytes: 24 << 20,
            read_only: false,
        }
    }
}

impl BlockFile {
    /// Connects to the vhost-user-blk backend listening on `path`. The
    /// device's block size becomes [`BlockFile::offset_align_bytes`]
    /// (buffers need no alignment: data is copied); its size is fixed, so
    /// it counts as a block device.
    pub fn open_vhost_user_blk(
        path: &Path,
        opts: &VhostUserBlkOptions,
    ) -> Result<Self, BlockIoError> {
        let fail = |reason: String| BlockIoError::VhostUser {
            path: path.to_path_buf(),
            reason,
        };
        if opts.queues == 0 {
            return Err(fail(
                "queues=0: a device needs at least one request queue".into(),
            ));
        }
        let want = Want {
            queues: opts.queues,
            data_bytes: opts.buffer_bytes.max(2 * MAX_PIECE_BYTES),
            read_only: opts.read_only,
            setup_timeout: SETUP_TIMEOUT,
        };
        let client = Client::connect(path, want, opts.timeout, MAX_PIECE_BYTES).map_err(fail)?;
        Ok(BlockFile {
            file: None,
            path: path.to_path_buf(),
            is_block_device: true,
            direct: false,
            offset_align_bytes: client.device().blk_size_bytes as usize,
            mem_align_bytes: 1,
            backend: Backend::VhostUserBlk(client),
        })
    }

    /// The vhost-user-blk client, when this block file is one.
    pub fn vhost_user_blk(&self) -> Option<&Client> {
        match &self.backend {
            Backend::VhostUserBlk(client) => Some(client),
            _ => None,
        }
    }
}

impl Client {
    /// The device's capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.device().capacity_bytes
    }

    /// Whether the device takes flushes.
    pub fn can_flush(&self) -> bool {
        self.has(feature::FLUSH)
    }

    /// Whether the device makes ranges read as zeros on request.
    pub fn can_write_zeroes(&self) -> bool {
        self.device().max_write_zeroes_sectors > 0
    }

    /// Requests the backend completed so far.
    pub fn completed_requests(&self) -> u64 {
        self.completed()
    }

    /// Times the backend was reconnected.
    pub fn reconnects(&self) -> u64 {
        self.sessions() - 1
    }

    fn path_buf(&self) -> PathBuf {
        self.path().to_path_buf()
    }

    /// Moves a batch's pending requests as pieces of at most the largest
    /// piece, all placed before any completion is awaited.
    ///
    /// # Safety
    ///
    /// As for [`BlockFile::submit_raw`].
    pub(crate) unsafe fn run_batch(&self, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
        let max = self.device().max_piece_bytes;
        let mut pieces = Vec::new();
        let mut owners = Vec::new();
        for i in pending {
            let op = tracker.ops[i];
            if op
                .offset
                .checked_add(op.len_bytes as u64)
                .is_none_or(|end| end > self.capacity_bytes())
            {
                tracker.fail(
                    i,
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("past the device's end ({} bytes)", self.capacity_bytes()),
                    ),
                );
                continue;
            }
            let mut done = 0;
            while done < op.len_bytes {
                let len = (op.len_bytes - done).min(max);
                pieces.push(Piece {
                    kind: match op.kind {
                        OpKind::Read => RequestType::In,
                        OpKind::Write => RequestType::Out,
                    },
                    sector: sectors(op.offset + done as u64),
                    // wrapping_add: inside the caller's buffer.
                    buf: CallerBuf(op.addr.wrapping_add(done)),
                    len_bytes: len,
                    range_sectors: 0,
                });
                owners.push(i);
                done += len;
            }
        }
        // SAFETY: the pieces lie inside the callers' buffers, which the
        // contract keeps valid (and writable, unaliased for reads) for
        // this whole call.
        let outcomes = unsafe { self.run(&pieces) };
        let mut first_error: std::collections::HashMap<usize, Outcome> = Default::default();
        for (&i, outcome) in owners.iter().zip(outcomes) {
            if !matches!(outcome, Outcome::Done { .. }) {
                first_error.entry(i).or_insert(outcome);
            }
        }
        owners.dedup();
        for i in owners {
            match first_error.remove(&i) {
                None => {
                    let len = tracker.ops[i].len_bytes as i64;
                    tracker.complete(i, len);
                }
                Some(Outcome::Failed { errno, message }) => {
                    tracker.fail(
                        i,
                        io::Error::new(io::Error::from_raw_os_error(errno).kind(), message),
                    );
                }
                Some(Outcome::Dead { message }) => {
                    tracker.fail(i, io::Error::new(io::ErrorKind::NotConnected, message));
                }
                Some(Outcome::Done { .. }) => unreachable!("only failures are noted"),
            }
        }
    }

    /// Requests without data (flush, discard, write zeroes), as a block
    /// error on failure.
    fn control(&self, what: &'static str, pieces: &[Piece]) -> Result<(), BlockIoError> {
        // SAFETY: these requests carry no caller buffer.
        for outcome in unsafe { self.run(pieces) } {
            let source = match outcome {
                Outcome::Done { .. } => continue,
                Outcome::Failed { errno, message } => {
                    io::Error::new(io::Error::from_raw_os_error(errno).kind(), message)
                }
                Outcome::Dead { message } => io::Error::new(io::ErrorKind::NotConnected, message),
            };
            return Err(BlockIoError::Control {
                what,
                path: self.path_buf(),
                source,
            });
        }
        Ok(())
    }

    pub(crate) fn flush(&self) -> Result<(), BlockIoError> {
        if !self.can_flush() {
            // Nothing to ask for: the device offers no flush, so its
            // completions are all the durability there is.
            return Ok(());
        }
        self.control(
            "VIRTIO_BLK_T_FLUSH",
            &[Piece {
                kind: RequestType::Flush,
                sector: 0,
                buf: CallerBuf(std::ptr::null_mut()),
                len_bytes: 0,
                range_sectors: 0,
            }],
        )
    }

    /// `len_bytes` from `offset` as ranges of at most `max_sectors`.
    fn ranges(
        &self,
        kind: RequestType,
        max_sectors: u32,
        offset: u64,
        len_bytes: u64,
    ) -> Result<Vec<Piece>, BlockIoError> {
        let align = u64::from(self.device().blk_size_bytes).max(SECTOR_BYTES);
        let end = offset.checked_add(len_bytes);
        if max_sectors == 0
            || offset % align != 0
            || len_bytes % align != 0
            || end.is_none_or(|end| end > self.capacity_bytes())
        {
            let reason = if max_sectors == 0 {
                "the device does not offer it".to_string()
            } else {
                format!(
                    "{len_bytes} bytes at {offset} are not whole blocks of {align} bytes within the device's {} bytes",
                    self.capacity_bytes()
                )
            };
            return Err(BlockIoError::Control {
                what: kind.name(),
                path: self.path_buf(),
                source: io::Error::new(io::ErrorKind::Unsupported, reason),
            });
        }
        let mut pieces = Vec::new();
        let mut sector = sectors(offset);
        let mut left = sectors(len_bytes);
        while left > 0 {
            let n = left.min(u64::from(max_sectors));
            pieces.push(Piece {
                kind,
                sector,
                buf: CallerBuf(std::ptr::null_mut()),
                len_bytes: 0,
                range_sectors: n as u32,
            });
            sector += n;
            left -= n;
        }
        Ok(pieces)
    }

    /// Makes the range read as zeros (`VIRTIO_BLK_T_WRITE_ZEROES`).
    pub(crate) fn write_zeroes(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        let max = self.device().max_write_zeroes_sectors;
        let pieces = self.ranges(RequestType::WriteZeroes, max, offset, len_bytes)?;
        self.control("VIRTIO_BLK_T_WRITE_ZEROES", &pieces)
    }

    /// Gives the range back (`VIRTIO_BLK_T_DISCARD`).
    pub(crate) fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        let max = self.device().max_discard_sectors;
        let pieces = self.ranges(RequestType::Discard, max, offset, len_bytes)?;
        self.control("VIRTIO_BLK_T_DISCARD", &pieces)
    }
}
