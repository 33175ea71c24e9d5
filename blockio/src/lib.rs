//! A block backend: one regular file or block device, read and written as
//! (offset, buffer) requests, opened `O_DIRECT` and driven through io_uring
//! in batches.
//!
//! Both the swap file store and the virtio-blk device sit on this, so the API
//! speaks of offsets and buffers only. A batch of requests goes to the kernel
//! in one `io_uring_enter`; the requests of a batch run concurrently and
//! complete in any order, so a caller that needs ordering (a flush after
//! writes) issues a second call.
//!
//! Several threads may use one [`BlockFile`] at once: it owns a small pool of
//! rings and each call takes a free one, so a fault-service read is never
//! queued behind an eviction thread's large write batch. When io_uring cannot
//! be set up (e.g. `kernel.io_uring_disabled`), requests fall back to
//! `pread`/`pwrite`, one at a time per calling thread.
//!
//! A [`BlockFile`] can also be an export of a Network Block Device server
//! ([`BlockFile::open_nbd`], module [`nbd`]): the same batches then travel
//! as NBD requests, pipelined on one connection. Or a vhost-user-blk
//! backend ([`BlockFile::open_vhost_user_blk`], module
//! [`vhost_user_blk`]): virtio-blk requests on rings in memory shared with
//! it.
#![deny(missing_docs)]

mod batch;
mod buffer;
mod error;
pub mod lockfile;
pub mod nbd;
mod open;
pub mod pin;
mod pread;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
mod uring;
pub mod vhost_user_blk;

pub use buffer::AlignedBuf;
pub use error::BlockIoError;
pub use open::fs_free_bytes;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use batch::Tracker;
use uring::RingPool;

/// Which way a request moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// From the file into memory.
    Read,
    /// From memory into the file.
    Write,
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
        })
    }
}

/// One request of a batch, with a borrowed buffer.
#[derive(Debug)]
pub enum BlockOp<'a> {
    /// Fill `buf` from the file at `offset`.
    Read {
        /// Byte offset in the file.
        offset: u64,
        /// Destination; its whole length is read.
        buf: &'a mut [u8],
    },
    /// Write all of `buf` to the file at `offset`.
    Write {
        /// Byte offset in the file.
        offset: u64,
        /// Source; its whole length is written.
        buf: &'a [u8],
    },
}

/// One request of a batch, with a raw buffer, for callers whose memory is not
/// a Rust slice (guest memory reached through volatile slices).
#[derive(Clone, Copy, Debug)]
pub struct RawBlockOp {
    /// Direction.
    pub kind: OpKind,
    /// Byte offset in the file.
    pub offset: u64,
    /// Start of the buffer.
    pub addr: *mut u8,
    /// Length of the buffer; all of it is transferred.
    pub len_bytes: usize,
}

impl BlockOp<'_> {
    fn raw(&mut self) -> RawBlockOp {
        match self {
            BlockOp::Read { offset, buf } => RawBlockOp {
                kind: OpKind::Read,
                offset: *offset,
                addr: buf.as_mut_ptr(),
                len_bytes: buf.len(),
            },
            BlockOp::Write { offset, buf } => RawBlockOp {
                kind: OpKind::Write,
                offset: *offset,
                addr: buf.as_ptr().cast_mut(),
                len_bytes: buf.len(),
            },
        }
    }
}

/// How requests reach the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Engine {
    /// io_uring; if it cannot be set up, `pread`/`pwrite` with a one-line
    /// warning on stderr.
    #[default]
    Auto,
    /// io_uring or fail to open.
    IoUring,
    /// `pread`/`pwrite` only.
    Sync,
}

/// How to open a [`BlockFile`].
#[derive(Clone, Debug)]
pub struct BlockOptions {
    /// Bypass the page cache (`O_DIRECT`). Requests must then be aligned
    /// (see [`BlockFile::offset_align_bytes`], [`BlockFile::mem_align_bytes`]).
    pub direct: bool,
    /// io_uring or `pread`/`pwrite`.
    pub engine: Engine,
    /// Rings in the pool: how many callers can have batches in flight at once
    /// before one waits for a ring.
    pub rings: usize,
    /// Submission-queue entries per ring: requests one ring keeps in flight.
    /// Larger batches are fed through as completions arrive.
    pub ring_entries: u32,
}

impl Default for BlockOptions {
    fn default() -> Self {
        Self {
            direct: true,
            engine: Engine::Auto,
            rings: 4,
            ring_entries: 64,
        }
    }
}

/// A file or block device opened for block I/O.
pub struct BlockFile {
    /// The local file; `None` for an NBD export.
    file: Option<File>,
    path: PathBuf,
    is_block_device: bool,
    direct: bool,
    offset_align_bytes: usize,
    mem_align_bytes: usize,
    backend: Backend,
}

/// How a [`BlockFile`]'s requests reach their storage: the transport.
///
/// Every transport gets the same inputs from [`BlockFile::submit_raw`]: the
/// requests that passed the alignment check, and a [`Tracker`] that splits
/// them into pieces, continues short transfers and records one result per
/// request. A transport only moves the pieces and reports each one's
/// outcome (bytes or -errno) to [`Tracker::complete`], so ordering, error
/// mapping and short-read detection stay the same whichever one runs.
///
/// The network transport is [`nbd::NbdClient`]: its arm sends each
/// request as `NBD_CMD_READ`/`NBD_CMD_WRITE` pieces, all of a batch before
/// any reply is awaited, and reports each request's outcome to the
/// tracker; [`BlockFile::flush`], [`BlockFile::discard`],
/// [`BlockFile::trim`] and [`BlockFile::len_bytes`] have arms for
/// `NBD_CMD_FLUSH`, `NBD_CMD_WRITE_ZEROES`, `NBD_CMD_TRIM` and the size
/// from the handshake. Its constructor is [`BlockFile::open_nbd`]
/// (`nbd/mod.rs`); a local variant's file is `BlockFile::file`.
enum Backend {
    /// io_uring: a pool of rings (`uring.rs`).
    Uring(RingPool),
    /// `pread`/`pwrite` on the calling thread (`pread.rs`).
    Sync,
    /// An NBD export (`nbd/`).
    Nbd(nbd::NbdClient),
    /// A vhost-user-blk backend (`vhost_user_blk/`).
    VhostUserBlk(vhost_user_blk::Client),
}

impl Backend {
    /// Moves the `pending` requests of `tracker` through this transport and
    /// returns when every one has finished.
    ///
    /// # Safety
    ///
    /// As for [`BlockFile::submit_raw`].
    unsafe fn run(&self, fd: RawFd, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
        match self {
            // SAFETY: the caller's contract covers the buffers for the
            // whole call and run() does not return before the kernel is
            // done with them.
            Backend::Uring(pool) => unsafe { pool.run(fd, tracker, pending) },
            // SAFETY: as above.
            Backend::Sync => unsafe { pread::run_sync(fd, tracker, pending) },
            // SAFETY: as above; the client does not return before every
            // request has its reply (or has been given up on).
            Backend::Nbd(client) => unsafe { client.run_batch(tracker, pending) },
            // SAFETY: as above; the client does not return before every
            // request has completed (or has been given up on), and a read's
            // data is copied into its buffer before that.
            Backend::VhostUserBlk(client) => unsafe { client.run_batch(tracker, pending) },
        }
    }
}

impl std::fmt::Debug for BlockFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockFile")
            .field("path", &self.path)
            .field("engine", &self.engine_name())
            .field("direct", &self.direct)
            .finish()
    }
}

impl BlockFile {
    /// The name given at open, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `"io_uring"`, `"pread/pwrite"`, `"nbd"` or `"vhost-user-blk"`.
    pub fn engine_name(&self) -> &'static str {
        match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Sync => "pread/pwrite",
            Backend::Nbd(_) => "nbd",
            Backend::VhostUserBlk(_) => "vhost-user-blk",
        }
    }

    /// Whether the file is a block device (fixed size; no holes to punch
    /// but discard still works). An NBD export or a vhost-user-blk device
    /// counts as one.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// Whether `O_DIRECT` is on.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Offsets and lengths must be multiples of this (1 without `O_DIRECT`).
    pub fn offset_align_bytes(&self) -> usize {
        self.offset_align_bytes
    }

    /// Buffer addresses must be multiples of this (1 without `O_DIRECT`).
    pub fn mem_align_bytes(&self) -> usize {
        self.mem_align_bytes
    }

    /// The file descriptor, e.g. for `fallocate` by the caller; -1 for an
    /// NBD export or a vhost-user-blk device, which have no local file.
    pub fn as_raw_fd(&self) -> RawFd {
        self.file.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// The local file, or the error for an operation an NBD export lacks.
    fn local_file(&self, what: &'static str) -> Result<&File, BlockIoError> {
        self.file.as_ref().ok_or_else(|| BlockIoError::Control {
            what,
            path: self.path.clone(),
            source: io::Error::new(
                io::ErrorKind::Unsupported,
                format!("not possible on a {} device", self.engine_name()),
            ),
        })
    }

    /// Runs a batch: all requests go to the kernel together and the call
    /// returns when every one has finished. One result per request, in order.
    /// Short transfers are continued; a read that reaches end of file first is
    /// [`BlockIoError::ShortRead`].
    pub fn submit(&self, ops: &mut [BlockOp<'_>]) -> Vec<Result<(), BlockIoError>> {
        let raw: Vec<RawBlockOp> = ops.iter_mut().map(BlockOp::raw).collect();
        // SAFETY: every RawBlockOp was made from a slice borrowed (mutably for
        // reads) by `ops` for the whole call, so each buffer is valid for its
        // length and, for reads, not aliased.
        unsafe { self.submit_raw(&raw) }
    }

    /// [`Self::submit`] on raw buffers.
    ///
    /// # Safety
    ///
    /// For the whole call, each op's `addr..addr+len_bytes` must be valid
    /// memory: readable for writes, writable for reads, and not accessed by
    /// anything else while a read fills it.
    pub unsafe fn submit_raw(&self, ops: &[RawBlockOp]) -> Vec<Result<(), BlockIoError>> {
        let mut results: Vec<Option<Result<(), BlockIoError>>> = Vec::with_capacity(ops.len());
        let mut pending = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match self.check_alignment(op) {
                Err(e) => results.push(Some(Err(e))),
                Ok(()) if op.len_bytes == 0 => results.push(Some(Ok(()))),
                Ok(()) => {
                    results.push(None);
                    pending.push(i);
                }
            }
        }
        if !pending.is_empty() {
            let mut tracker = Tracker {
                file: self,
                ops,
                done_bytes: vec![0; ops.len()],
                results: &mut results,
            };
            // SAFETY: the caller's contract covers the buffers for the whole
            // call, and the backend does not return before it is done with
            // them.
            unsafe { self.backend.run(self.as_raw_fd(), &mut tracker, pending) }
        }
        results
            .into_iter()
            .map(|r| r.expect("every request finished"))
            .collect()
    }

    /// Reads all of `buf` from `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockIoError> {
        let mut ops = [BlockOp::Read { offset, buf }];
        self.submit(&mut ops).pop().expect("one result per request")
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), BlockIoError> {
        let mut ops = [BlockOp::Write { offset, buf }];
        self.submit(&mut ops).pop().expect("one result per request")
    }

    /// Makes completed writes durable (`fdatasync`, `NBD_CMD_FLUSH` or
    /// `VIRTIO_BLK_T_FLUSH`).
    pub fn flush(&self) -> Result<(), BlockIoError> {
        match &self.backend {
            Backend::Nbd(client) => return client.flush(),
            Backend::VhostUserBlk(client) => return client.flush(),
            _ => {}
        }
        self.local_file("fdatasync")?
            .sync_data()
            .map_err(|source| BlockIoError::Control {
                what: "fdatasync",
                path: self.path.clone(),
                source,
            })
    }

    /// Gives `len_bytes` from `offset` back to the storage (punches a hole in
    /// a file, discards on a device; `NBD_CMD_WRITE_ZEROES`, which may
    /// punch, on an NBD export; `VIRTIO_BLK_T_WRITE_ZEROES` on a
    /// vhost-user-blk device); the range then reads as zeros.
    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        match &self.backend {
            Backend::Nbd(client) => return client.write_zeroes(offset, len_bytes),
            Backend::VhostUserBlk(client) => return client.write_zeroes(offset, len_bytes),
            _ => {}
        }
        let control_err = |source| BlockIoError::Control {
            what: "fallocate(PUNCH_HOLE)",
            path: self.path.clone(),
            source,
        };
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len_bytes)) else {
            return Err(control_err(io::Error::from_raw_os_error(libc::EINVAL)));
        };
        loop {
            // SAFETY: fallocate on an fd we own; it does not touch our memory.
            let rc = unsafe {
                libc::fallocate64(
                    self.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    len,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(control_err(err));
            }
        }
    }

    /// Tells the storage that `len_bytes` from `offset` are no longer
    /// needed: `NBD_CMD_TRIM` on an NBD export, `VIRTIO_BLK_T_DISCARD` on a
    /// vhost-user-blk device (what the range reads as afterwards is the
    /// server's choice), [`Self::discard`] on a local file.
    pub fn trim(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        match &self.backend {
            Backend::Nbd(client) => client.trim(offset, len_bytes),
            Backend::VhostUserBlk(client) => client.discard(offset, len_bytes),
            _ => self.discard(offset, len_bytes),
        }
    }

    fn check_alignment(&self, op: &RawBlockOp) -> Result<(), BlockIoError> {
        let off_ok = is_aligned(op.offset, self.offset_align_bytes)
            && is_aligned(op.len_bytes as u64, self.offset_align_bytes);
        let mem_ok = is_aligned(op.addr as u64, self.mem_align_bytes);
        if off_ok && mem_ok {
            Ok(())
        } else {
            Err(BlockIoError::Misaligned {
                path: self.path.clone(),
                kind: op.kind,
                offset: op.offset,
                len_bytes: op.len_bytes,
                addr: op.addr as usize,
                offset_align_bytes: self.offset_align_bytes,
                mem_align_bytes: self.mem_align_bytes,
            })
        }
    }
}

/// Whether `value` is a multiple of `align_bytes` (`u64::is_multiple_of`
/// needs Rust 1.87; the workspace supports 1.85).
pub fn is_aligned(value: u64, align_bytes: usize) -> bool {
    value.checked_rem(align_bytes as u64) == Some(0)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::test_dir;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    pub(crate) const UNIT: usize = 64 * 1024;

    pub(crate) fn temp_file(engine: Engine) -> BlockFile {
        let opts = BlockOptions {
            engine,
            ..BlockOptions::default()
        };
        BlockFile::temporary_in(&test_dir(), &opts).expect("temporary block file")
    }

    pub(crate) fn pattern(seed: u64, len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::new(len, 4096);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        buf
    }

    fn batch_round_trip(engine: Engine) {
        let f = temp_file(engine);
        let count = 200; // more than one ring's 64 entries
        let bufs: Vec<AlignedBuf> = (0..count).map(|i| pattern(i as u64, UNIT)).collect();
        let mut ops: Vec<BlockOp> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| BlockOp::Write {
                offset: (i * UNIT) as u64,
                buf: b,
            })
            .collect();
        for r in f.submit(&mut ops) {
            r.expect("write");
        }
        let mut back: Vec<AlignedBuf> = (0..count).map(|_| AlignedBuf::new(UNIT, 4096)).collect();
        let mut ops: Vec<BlockOp> = back
            .iter_mut()
            .enumerate()
            .map(|(i, b)| BlockOp::Read {
                offset: (i * UNIT) as u64,
                buf: b,
            })
            .collect();
        for r in f.submit(&mut ops) {
            r.expect("read");
        }
        for i in 0..count {
            assert!(back[i][..] == bufs[i][..], "request {i} differs");
        }
        assert_eq!(f.len_bytes().unwrap(), (count * UNIT) as u64);
    }

    #[test]
    fn batch_round_trip_io_uring() {
        let f = temp_file(Engine::IoUring);
        assert_eq!(f.engine_name(), "io_uring");
        batch_round_trip(Engine::IoUring);
    }

    #[test]
    fn batch_round_trip_pread_pwrite() {
        let f = temp_file(Engine::Sync);
        assert_eq!(f.engine_name(), "pread/pwrite");
        batch_round_trip(Engine::Sync);
    }

    fn short_read(engine: Engine) {
        let f = temp_file(engine);
        f.write_at(0, &pattern(1, UNIT)).unwrap();
        let mut buf = AlignedBuf::new(2 * UNIT, 4096);
        match f.read_at(0, &mut buf) {
            Err(BlockIoError::ShortRead {
                got_bytes,
                want_bytes,
                ..
            }) => {
                assert_eq!(got_bytes, UNIT);
                assert_eq!(want_bytes, 2 * UNIT);
            }
            other => panic!("expected a short read, got {other:?}"),
        }
        // A file whose end is not aligned: O_DIRECT returns the odd tail.
        let path = format!("/proc/self/fd/{}", f.as_raw_fd());
        let plain = OpenOptions::new().write(true).open(path).unwrap();
        plain.set_len(UNIT as u64 + 100).unwrap();
        let mut buf = AlignedBuf::new(2 * UNIT, 4096);
        match f.read_at(0, &mut buf) {
            Err(BlockIoError::ShortRead { got_bytes, .. }) => assert_eq!(got_bytes, UNIT + 100),
            other => panic!("expected a short read, got {other:?}"),
        }
    }

    #[test]
    fn short_read_io_uring() {
        short_read(Engine::IoUring);
    }

    #[test]
    fn short_read_pread() {
        short_read(Engine::Sync);
    }

    #[test]
    fn misaligned_requests_are_refused_not_submitted() {
        let f = temp_file(Engine::IoUring);
        let buf = AlignedBuf::new(2 * UNIT, 4096);
        let err = f.write_at(0, &buf[1..UNIT + 1]).unwrap_err();
        assert!(matches!(err, BlockIoError::Misaligned { .. }), "{err}");
        let err = f.write_at(100, &buf[..UNIT]).unwrap_err();
        assert!(matches!(err, BlockIoError::Misaligned { .. }), "{err}");
        // The aligned neighbour in the same batch still goes through.
        let mut ops = [
            BlockOp::Write {
                offset: 1,
                buf: &buf[..UNIT],
            },
            BlockOp::Write {
                offset: 0,
                buf: &buf[..UNIT],
            },
        ];
        let res = f.submit(&mut ops);
        assert!(res[0].is_err());
        assert!(res[1].is_ok());
    }

    #[test]
    fn buffered_mode_takes_any_alignment() {
        let opts = BlockOptions {
            direct: false,
            ..BlockOptions::default()
        };
        let f = BlockFile::temporary_in(&test_dir(), &opts).unwrap();
        assert_eq!(f.offset_align_bytes(), 1);
        let data = b"sector-sized requests need not be page aligned";
        f.write_at(3, data).unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_at(3, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
    }

    fn error_results_are_mapped(engine: Engine) {
        // A read-only descriptor: writes fail with EBADF in the CQE.
        let dir = test_dir();
        let path = dir.join(format!(".blockio-ro-{}-{:?}", std::process::id(), engine));
        std::fs::write(&path, vec![0u8; UNIT]).unwrap();
        let ro = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let opts = BlockOptions {
            engine,
            ..BlockOptions::default()
        };
        let f = BlockFile::from_file(ro, path.clone(), &opts).unwrap();
        let err = f.write_at(0, &pattern(3, UNIT)).unwrap_err();
        match &err {
            BlockIoError::Io { source, kind, .. } => {
                assert_eq!(*kind, OpKind::Write);
                assert_eq!(source.raw_os_error(), Some(libc::EBADF));
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        let io: io::Error = err.into();
        assert_eq!(io.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn cqe_errno_becomes_io_error() {
        error_results_are_mapped(Engine::IoUring);
        error_results_are_mapped(Engine::Sync);
    }

    #[test]
    fn reads_proceed_while_another_thread_writes_batches() {
        let f = Arc::new(temp_file(Engine::IoUring));
        let slots = 32;
        for i in 0..slots {
            f.write_at((i * UNIT) as u64, &pattern(i as u64, UNIT))
                .unwrap();
        }
        let writer = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let bufs: Vec<AlignedBuf> = (0..64).map(|i| pattern(1000 + i, UNIT)).collect();
                for round in 0..5 {
                    let mut ops: Vec<BlockOp> = bufs
                        .iter()
                        .enumerate()
                        .map(|(i, b)| BlockOp::Write {
                            offset: ((slots + round * 64 + i) * UNIT) as u64,
                            buf: b,
                        })
                        .collect();
                    for r in f.submit(&mut ops) {
                        r.unwrap();
                    }
                }
            })
        };
        let readers: Vec<_> = (0..3)
            .map(|t| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    let mut buf = AlignedBuf::new(UNIT, 4096);
                    for k in 0..100 {
                        let i = (k * 7 + t) % slots;
                        f.read_at((i * UNIT) as u64, &mut buf).unwrap();
                        assert!(buf[..] == pattern(i as u64, UNIT)[..]);
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
    }

    #[test]
    fn flush_and_discard() {
        let f = temp_file(Engine::IoUring);
        f.write_at(0, &pattern(5, 2 * UNIT)).unwrap();
        f.flush().unwrap();
        f.discard(0, UNIT as u64).unwrap();
        let mut buf = AlignedBuf::new(2 * UNIT, 4096);
        f.read_at(0, &mut buf).unwrap();
        assert!(buf[..UNIT].iter().all(|&b| b == 0));
        assert!(buf[UNIT..] == pattern(5, 2 * UNIT)[UNIT..]);
    }

    #[test]
    fn pwrite_behind_the_back_is_seen_by_direct_reads() {
        let path = test_dir().join(format!(".blockio-coherent-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let f = BlockFile::create_new(&path, &BlockOptions::default()).unwrap();
        f.write_at(0, &pattern(9, UNIT)).unwrap();
        let plain = OpenOptions::new().write(true).open(&path).unwrap();
        plain.write_all_at(b"XYZ", 10).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut buf = AlignedBuf::new(UNIT, 4096);
        f.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf[10..13], b"XYZ");
    }
}
