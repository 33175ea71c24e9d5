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

use std::alloc::{self, Layout};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use io_uring::{opcode, types, IoUring};

/// The largest piece one SQE or syscall moves; longer requests are issued in
/// pieces, because an SQE length is 32 bits and a syscall caps at ~2 GiB.
const MAX_PIECE_BYTES: usize = 1 << 30;

/// Alignment assumed for `O_DIRECT` when the kernel does not report one
/// (statx `STATX_DIOALIGN` is missing before Linux 6.1): a page satisfies
/// every common filesystem and device.
const DEFAULT_DIRECT_ALIGN_BYTES: usize = 4096;

/// How many times a failing `io_uring_enter` is retried before giving up.
/// Giving up means aborting: see [`RingPool::run`] for why.
const ENTER_RETRY_LIMIT: u32 = 1000;

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

/// Why opening or using a [`BlockFile`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BlockIoError {
    /// The file could not be opened or created.
    #[error("cannot open {}: {source}; check that the path exists, is a file or block device, and is writable", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The filesystem refuses `O_DIRECT` (tmpfs before Linux 6.6, ramfs, some FUSE).
    #[error("the filesystem holding {} refuses O_DIRECT (is it tmpfs or ramfs?); put the file in a directory on a disk filesystem such as ext4 or xfs, e.g. under /var/tmp", path.display())]
    DirectIoUnsupported {
        /// The file.
        path: PathBuf,
    },
    /// io_uring was required ([`Engine::IoUring`]) but could not be set up.
    #[error("cannot set up io_uring for {}: {source}; check sysctl kernel.io_uring_disabled and RLIMIT_MEMLOCK, or use the pread/pwrite engine", path.display())]
    RingSetup {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A request breaks the `O_DIRECT` alignment rules.
    #[error("{kind} of {len_bytes} bytes at offset {offset} with buffer at {addr:#x} is not aligned for O_DIRECT on {}: offsets and lengths must be multiples of {offset_align_bytes} bytes and buffers aligned to {mem_align_bytes}; use an aligned buffer (blockio::AlignedBuf) or open without direct I/O", path.display())]
    Misaligned {
        /// The file.
        path: PathBuf,
        /// Direction.
        kind: OpKind,
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len_bytes: usize,
        /// Buffer address.
        addr: usize,
        /// Required offset and length alignment.
        offset_align_bytes: usize,
        /// Required buffer alignment.
        mem_align_bytes: usize,
    },
    /// The read or write failed.
    #[error("{kind} of {len_bytes} bytes at offset {offset} in {} failed: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Direction (or the operation that failed).
        kind: OpKind,
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len_bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A read hit the end of the file before filling the buffer.
    #[error("short read at offset {offset} in {}: got {got_bytes} of {want_bytes} bytes before end of file; the file was truncated or the offset is past its end", path.display())]
    ShortRead {
        /// The file.
        path: PathBuf,
        /// Byte offset requested.
        offset: u64,
        /// Bytes read before end of file.
        got_bytes: usize,
        /// Bytes requested.
        want_bytes: usize,
    },
    /// A flush, discard or size query failed.
    #[error("{what} on {} failed: {source}", path.display())]
    Control {
        /// The operation, e.g. `fdatasync`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl From<BlockIoError> for io::Error {
    /// Keeps the OS error (so callers can still test for `ENOSPC`) where
    /// there is one, and wraps the whole message otherwise.
    fn from(err: BlockIoError) -> io::Error {
        match err {
            BlockIoError::Open { source, .. }
            | BlockIoError::RingSetup { source, .. }
            | BlockIoError::Io { source, .. }
            | BlockIoError::Control { source, .. } => source,
            BlockIoError::ShortRead { .. } => io::Error::new(io::ErrorKind::UnexpectedEof, err),
            BlockIoError::Misaligned { .. } | BlockIoError::DirectIoUnsupported { .. } => {
                io::Error::new(io::ErrorKind::InvalidInput, err)
            }
        }
    }
}

/// Bytes an unprivileged writer may still allocate on the filesystem
/// holding `file` (`f_bavail * f_frsize` from `fstatvfs`).
pub fn fs_free_bytes(file: &File) -> io::Result<u64> {
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs writes only into `st`, which outlives the call.
    if unsafe { libc::fstatvfs64(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A zeroed heap buffer with a chosen alignment, for `O_DIRECT` transfers
/// (a `Vec<u8>` is only byte aligned).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
    /// The allocation's layout; its size is at least 1 because zero-sized
    /// allocations are not allowed.
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like a Box<[u8]>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` bytes whose start is a multiple of
    /// `align_bytes` (a power of two). Panics if the layout is invalid or on
    /// allocation failure, like `Vec`.
    pub fn new(len_bytes: usize, align_bytes: usize) -> Self {
        let layout = Layout::from_size_align(len_bytes.max(1), align_bytes)
            .expect("AlignedBuf: alignment must be a power of two and the size must fit");
        // SAFETY: the layout has a non-zero size (max(1) above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self {
            ptr,
            len_bytes,
            layout,
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to an owned allocation of layout.size() >=
        // len_bytes initialised (zeroed) bytes that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len_bytes", &self.len_bytes)
            .field("align_bytes", &self.layout.align())
            .finish()
    }
}

/// A file or block device opened for block I/O.
pub struct BlockFile {
    file: File,
    path: PathBuf,
    is_block_device: bool,
    direct: bool,
    offset_align_bytes: usize,
    mem_align_bytes: usize,
    backend: Backend,
}

enum Backend {
    Uring(RingPool),
    Sync,
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
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| BlockIoError::Open {
                path: path.to_owned(),
                source,
            })?;
        Self::from_file(file, path.to_owned(), opts)
    }

    /// Creates `path`, which must not exist (`O_CREAT | O_EXCL`), mode 0600
    /// because what goes in is private. An existing file is never opened
    /// here, so nothing anyone had is lost; see [`crate::store::FileStore`]
    /// for how a store reuses one.
    pub fn create_new(path: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| BlockIoError::Open {
                path: path.to_owned(),
                source,
            })?;
        Self::from_file(file, path.to_owned(), opts)
    }

    /// Creates an unnamed file in directory `dir` (`O_TMPFILE`; where the
    /// filesystem lacks it, a uniquely named file that is unlinked at once),
    /// mode 0600. The space goes back to the filesystem when it is dropped.
    pub fn temporary_in(dir: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        let tmpfile = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir);
        let file = match tmpfile {
            Ok(file) => file,
            // Filesystems without O_TMPFILE say EOPNOTSUPP (old kernels EISDIR).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
                ) =>
            {
                Self::create_and_unlink(dir)?
            }
            Err(source) => {
                return Err(BlockIoError::Open {
                    path: dir.to_owned(),
                    source,
                })
            }
        };
        Self::from_file(file, dir.to_owned(), opts)
    }

    fn create_and_unlink(dir: &Path) -> Result<File, BlockIoError> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            ".hugevmm-tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| BlockIoError::Open {
                path: path.clone(),
                source,
            })?;
        std::fs::remove_file(&path).map_err(|source| BlockIoError::Open { path, source })?;
        Ok(file)
    }

    /// Wraps an already open file. `name` is used in messages only. With
    /// `opts.direct`, `O_DIRECT` is switched on here, which is where a
    /// filesystem that cannot do it says so.
    pub fn from_file(file: File, name: PathBuf, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        Self::from_file_with_rings(file, name, opts, RingPool::new)
    }

    /// [`Self::from_file`] with the ring setup injectable, so that the
    /// fallback when io_uring is unavailable can be tested without changing
    /// the host's sysctl.
    fn from_file_with_rings(
        file: File,
        name: PathBuf,
        opts: &BlockOptions,
        setup_rings: impl FnOnce(&BlockOptions) -> io::Result<RingPool>,
    ) -> Result<Self, BlockIoError> {
        let meta = file.metadata().map_err(|source| BlockIoError::Control {
            what: "fstat",
            path: name.clone(),
            source,
        })?;
        let is_block_device = meta.file_type().is_block_device();
        let (offset_align_bytes, mem_align_bytes) = if opts.direct {
            set_direct(&file, &name)?;
            direct_alignment(&file, is_block_device)
        } else {
            (1, 1)
        };
        let backend = match opts.engine {
            Engine::Sync => Backend::Sync,
            Engine::IoUring => {
                Backend::Uring(setup_rings(opts).map_err(|source| BlockIoError::RingSetup {
                    path: name.clone(),
                    source,
                })?)
            }
            Engine::Auto => match setup_rings(opts) {
                Ok(pool) => Backend::Uring(pool),
                Err(e) => {
                    log::warn!(
                        "warning: io_uring unavailable ({e}); {} uses pread/pwrite, one request at a time per thread",
                        name.display()
                    );
                    Backend::Sync
                }
            },
        };
        Ok(Self {
            file,
            path: name,
            is_block_device,
            direct: opts.direct,
            offset_align_bytes,
            mem_align_bytes,
            backend,
        })
    }

    /// The name given at open, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `"io_uring"` or `"pread/pwrite"`.
    pub fn engine_name(&self) -> &'static str {
        match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Sync => "pread/pwrite",
        }
    }

    /// Whether the file is a block device (fixed size; no holes to punch
    /// but discard still works).
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

    /// Current size of the file or device in bytes.
    pub fn len_bytes(&self) -> Result<u64, BlockIoError> {
        // lseek(SEEK_END) is what gives a block device's size; metadata says 0.
        // SAFETY: lseek on an fd we own; it does not touch memory.
        let end = unsafe { libc::lseek(self.file.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(BlockIoError::Control {
                what: "lseek(SEEK_END)",
                path: self.path.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(end as u64)
    }

    /// The file descriptor, e.g. for `fallocate` by the caller.
    pub fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Bytes an unprivileged writer may still allocate on the filesystem
    /// holding the file (`fstatvfs`: `f_bavail * f_frsize`), for messages
    /// about a full filesystem.
    pub fn fs_free_bytes(&self) -> io::Result<u64> {
        fs_free_bytes(&self.file)
    }

    /// Allocates blocks for `[0, len_bytes)` (`fallocate` mode 0), so that
    /// later writes there cannot fail for want of space. Existing content
    /// is kept and the file grows to `len_bytes` if it is shorter.
    pub fn reserve(&self, len_bytes: u64) -> Result<(), BlockIoError> {
        let len = i64::try_from(len_bytes).unwrap_or(i64::MAX);
        loop {
            // SAFETY: fallocate on a descriptor we own; it touches no memory.
            let rc = unsafe { libc::fallocate64(self.file.as_raw_fd(), 0, 0, len) };
            if rc == 0 {
                return Ok(());
            }
            let source = io::Error::last_os_error();
            if source.raw_os_error() != Some(libc::EINTR) {
                return Err(BlockIoError::Control {
                    what: "fallocate",
                    path: self.path.clone(),
                    source,
                });
            }
        }
    }

    /// Cuts or extends the file to `len_bytes` (`ftruncate`).
    pub fn set_len(&self, len_bytes: u64) -> Result<(), BlockIoError> {
        self.file
            .set_len(len_bytes)
            .map_err(|source| BlockIoError::Control {
                what: "ftruncate",
                path: self.path.clone(),
                source,
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
            match &self.backend {
                // SAFETY: the caller's contract covers the buffers for the
                // whole call and run() does not return before the kernel is
                // done with them.
                Backend::Uring(pool) => unsafe {
                    pool.run(self.file.as_raw_fd(), &mut tracker, pending)
                },
                // SAFETY: as above.
                Backend::Sync => unsafe { run_sync(self.file.as_raw_fd(), &mut tracker, pending) },
            }
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

    /// Makes completed writes durable (`fdatasync`).
    pub fn flush(&self) -> Result<(), BlockIoError> {
        self.file
            .sync_data()
            .map_err(|source| BlockIoError::Control {
                what: "fdatasync",
                path: self.path.clone(),
                source,
            })
    }

    /// Gives `len_bytes` from `offset` back to the storage (punches a hole in
    /// a file, discards on a device); the range then reads as zeros.
    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
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
                    self.file.as_raw_fd(),
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
pub(crate) fn is_aligned(value: u64, align_bytes: usize) -> bool {
    value.checked_rem(align_bytes as u64) == Some(0)
}

/// Switches `O_DIRECT` on. `fcntl(F_SETFL)` checks the filesystem's support,
/// so EINVAL here means exactly "no direct I/O on this filesystem", unlike
/// EINVAL from `open`, which has other causes.
fn set_direct(file: &File, name: &Path) -> Result<(), BlockIoError> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on an fd we own reads no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(BlockIoError::Control {
            what: "fcntl(F_GETFL)",
            path: name.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: F_SETFL on an fd we own reads no memory of ours.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) {
            return Err(BlockIoError::DirectIoUnsupported {
                path: name.to_owned(),
            });
        }
        return Err(BlockIoError::Control {
            what: "fcntl(F_SETFL, O_DIRECT)",
            path: name.to_owned(),
            source: err,
        });
    }
    Ok(())
}

/// (offset/length alignment, memory alignment) for `O_DIRECT`: what statx
/// reports, else the device's logical sector size, else a page.
fn direct_alignment(file: &File, is_block_device: bool) -> (usize, usize) {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: statx writes at most one struct statx into stx, which is that
    // size; the empty path with AT_EMPTY_PATH refers to the fd itself.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if rc == 0 {
        // SAFETY: statx succeeded, and the struct was zeroed before, so every
        // field is initialised either way.
        let stx = unsafe { stx.assume_init() };
        if stx.stx_mask & libc::STATX_DIOALIGN != 0
            && stx.stx_dio_offset_align > 0
            && stx.stx_dio_mem_align > 0
        {
            return (
                stx.stx_dio_offset_align as usize,
                stx.stx_dio_mem_align as usize,
            );
        }
    }
    if is_block_device {
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which points
        // to a live c_int.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut sector) };
        if rc == 0 && sector > 0 {
            return (sector as usize, sector as usize);
        }
    }
    (DEFAULT_DIRECT_ALIGN_BYTES, DEFAULT_DIRECT_ALIGN_BYTES)
}

/// Progress of one batch, shared by both engines: bytes done per request and
/// the final results.
struct Tracker<'a> {
    file: &'a BlockFile,
    ops: &'a [RawBlockOp],
    done_bytes: Vec<usize>,
    results: &'a mut Vec<Option<Result<(), BlockIoError>>>,
}

/// What to do with a request after one piece of it completed.
enum Next {
    Finished,
    Again,
}

impl Tracker<'_> {
    /// The next piece of request `i`: (file offset, buffer address, length).
    fn piece(&self, i: usize) -> (u64, *mut u8, usize) {
        let op = &self.ops[i];
        let done = self.done_bytes[i];
        let len = (op.len_bytes - done).min(MAX_PIECE_BYTES);
        // wrapping_add: the address stays inside the caller's buffer, and
        // the pointer is only handed to the kernel.
        (op.offset + done as u64, op.addr.wrapping_add(done), len)
    }

    /// Accounts for a piece of request `i` that returned `res` (bytes, or
    /// -errno as the kernel reports it).
    fn complete(&mut self, i: usize, res: i64) -> Next {
        let op = self.ops[i];
        if res < 0 {
            let errno = (-res) as i32;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return Next::Again;
            }
            self.fail(i, io::Error::from_raw_os_error(errno));
            return Next::Finished;
        }
        let got = res as usize;
        self.done_bytes[i] += got;
        let done = self.done_bytes[i];
        if done >= op.len_bytes {
            self.results[i] = Some(Ok(()));
            return Next::Finished;
        }
        match op.kind {
            OpKind::Write if got == 0 => {
                self.fail(
                    i,
                    io::Error::new(io::ErrorKind::WriteZero, "write made no progress"),
                );
                Next::Finished
            }
            OpKind::Write => Next::Again,
            // Zero bytes is end of file. Under O_DIRECT a count that leaves
            // the next offset unaligned also stops at end of file, and
            // continuing from there would only fail with EINVAL.
            OpKind::Read if got == 0 || !is_aligned(done as u64, self.file.offset_align_bytes) => {
                self.results[i] = Some(Err(BlockIoError::ShortRead {
                    path: self.file.path.clone(),
                    offset: op.offset,
                    got_bytes: done,
                    want_bytes: op.len_bytes,
                }));
                Next::Finished
            }
            OpKind::Read => Next::Again,
        }
    }

    fn fail(&mut self, i: usize, source: io::Error) {
        let op = self.ops[i];
        self.results[i] = Some(Err(BlockIoError::Io {
            path: self.file.path.clone(),
            kind: op.kind,
            offset: op.offset,
            len_bytes: op.len_bytes,
            source,
        }));
    }
}

/// The `pread`/`pwrite` engine.
///
/// # Safety
///
/// As for [`BlockFile::submit_raw`].
unsafe fn run_sync(fd: RawFd, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
    for i in pending {
        loop {
            let (offset, addr, len) = tracker.piece(i);
            let res = match tracker.ops[i].kind {
                // SAFETY: addr..addr+len lies in the caller's buffer, which the
                // contract makes valid and writable for this call.
                OpKind::Read => unsafe { libc::pread64(fd, addr.cast(), len, offset as i64) },
                // SAFETY: addr..addr+len lies in the caller's buffer, valid and
                // readable for this call.
                OpKind::Write => unsafe { libc::pwrite64(fd, addr.cast(), len, offset as i64) },
            };
            let res = if res < 0 {
                -(io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO) as i64)
            } else {
                res as i64
            };
            if let Next::Finished = tracker.complete(i, res) {
                break;
            }
        }
    }
}

/// Rings shared by the threads using one file.
struct RingPool {
    rings: Box<[Mutex<IoUring>]>,
    next: AtomicUsize,
}

/// Aborts the process if dropped while armed: unwinding out of a batch while
/// the kernel still owns its buffers would let it write into freed memory.
struct InFlightGuard {
    armed: bool,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.armed {
            log::error!("fatal: unwinding with block I/O in flight; aborting to keep the kernel from writing into freed memory");
            std::process::abort();
        }
    }
}

impl RingPool {
    fn new(opts: &BlockOptions) -> io::Result<Self> {
        let rings = (0..opts.rings.max(1))
            .map(|_| IoUring::new(opts.ring_entries.max(1)).map(Mutex::new))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self {
            rings: rings.into_boxed_slice(),
            next: AtomicUsize::new(0),
        })
    }

    /// A free ring if there is one, else waits for one; round robin so that
    /// waiters spread over the rings.
    fn acquire(&self) -> MutexGuard<'_, IoUring> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.rings.len();
        for k in 0..n {
            match self.rings[(start + k) % n].try_lock() {
                Ok(guard) => return guard,
                // A ring is only left after its batch drained (see
                // InFlightGuard), so a poisoned one is still consistent.
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        self.rings[start % n]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds the pending requests through one ring and waits for all of them.
    ///
    /// It never returns while the kernel holds a request: if
    /// `io_uring_enter` keeps failing it aborts instead, since the buffers
    /// belong to the caller and may be freed as soon as this returns.
    ///
    /// # Safety
    ///
    /// As for [`BlockFile::submit_raw`].
    unsafe fn run(&self, fd: RawFd, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
        let mut ring = self.acquire();
        let mut queue: VecDeque<usize> = pending.into();
        let mut in_flight = 0usize;
        let mut guard = InFlightGuard { armed: false };
        let mut failures = 0u32;
        // At most one SQ's worth in flight: the CQ (twice the SQ) then can
        // never overflow, whatever the batch size.
        let max_in_flight = ring.params().sq_entries() as usize;
        loop {
            {
                let mut sq = ring.submission();
                while let Some(&i) = queue.front() {
                    if sq.is_full() || in_flight >= max_in_flight {
                        break;
                    }
                    let (offset, addr, len) = tracker.piece(i);
                    let len32 = len as u32; // piece() caps len at MAX_PIECE_BYTES
                    let entry = match tracker.ops[i].kind {
                        OpKind::Read => opcode::Read::new(types::Fd(fd), addr, len32)
                            .offset(offset)
                            .build(),
                        OpKind::Write => {
                            opcode::Write::new(types::Fd(fd), addr.cast_const(), len32)
                                .offset(offset)
                                .build()
                        }
                    }
                    .user_data(i as u64);
                    // SAFETY: the entry's buffer is the caller's, valid until
                    // this function returns, and it does not return before
                    // this entry's completion is reaped (in_flight below).
                    if unsafe { sq.push(&entry) }.is_err() {
                        break;
                    }
                    guard.armed = true;
                    queue.pop_front();
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                break;
            }
            // Wait for everything when nothing is left to feed in; otherwise
            // for one completion, so its slot is refilled at once.
            let want = if queue.is_empty() { in_flight } else { 1 };
            match ring.submit_and_wait(want) {
                Ok(_) => failures = 0,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // The kernel is short of resources or the CQ is
                    // backed up: reap what is there and try again.
                    Some(libc::EAGAIN) | Some(libc::EBUSY) => std::thread::yield_now(),
                    _ => {
                        failures += 1;
                        if failures > ENTER_RETRY_LIMIT {
                            log::error!("fatal: io_uring_enter keeps failing ({e}) with {in_flight} requests in flight on {}; aborting, as their buffers cannot be released safely", tracker.file.path.display());
                            std::process::abort();
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                },
            }
            let completed: Vec<(usize, i64)> = ring
                .completion()
                .map(|cqe| (cqe.user_data() as usize, i64::from(cqe.result())))
                .collect();
            for (i, res) in completed {
                in_flight -= 1;
                if let Next::Again = tracker.complete(i, res) {
                    queue.push_back(i);
                }
            }
        }
        guard.armed = false;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    const UNIT: usize = 64 * 1024;

    /// A directory whose filesystem takes O_DIRECT files.
    pub(crate) fn test_dir() -> PathBuf {
        let dir = std::env::temp_dir();
        // Tests need O_DIRECT; /tmp may be tmpfs on other machines.
        if BlockFile::temporary_in(&dir, &BlockOptions::default()).is_ok() {
            dir
        } else {
            PathBuf::from("/var/tmp")
        }
    }

    fn temp_file(engine: Engine) -> BlockFile {
        let opts = BlockOptions {
            engine,
            ..BlockOptions::default()
        };
        BlockFile::temporary_in(&test_dir(), &opts).expect("temporary block file")
    }

    fn pattern(seed: u64, len: usize) -> AlignedBuf {
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

    #[test]
    fn auto_falls_back_when_io_uring_setup_fails() {
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(test_dir())
            .unwrap();
        let f = BlockFile::from_file_with_rings(
            raw,
            PathBuf::from("fallback-test"),
            &BlockOptions::default(),
            |_| Err(io::Error::from_raw_os_error(libc::EPERM)),
        )
        .expect("Auto must fall back");
        assert_eq!(f.engine_name(), "pread/pwrite");
        let data = pattern(7, UNIT);
        f.write_at(0, &data).unwrap();
        let mut back = AlignedBuf::new(UNIT, 4096);
        f.read_at(0, &mut back).unwrap();
        assert!(back[..] == data[..]);
    }

    #[test]
    fn forced_io_uring_reports_setup_failure() {
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(test_dir())
            .unwrap();
        let opts = BlockOptions {
            engine: Engine::IoUring,
            ..BlockOptions::default()
        };
        let err = BlockFile::from_file_with_rings(raw, PathBuf::from("x"), &opts, |_| {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        })
        .unwrap_err();
        assert!(matches!(err, BlockIoError::RingSetup { .. }), "{err}");
        assert!(err.to_string().contains("io_uring_disabled"));
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
    fn create_new_is_private_and_never_reuses_a_file() {
        use std::os::unix::fs::PermissionsExt;
        let path = test_dir().join(format!(".blockio-create-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let f = BlockFile::create_new(&path, &BlockOptions::default()).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 0);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(f);
        std::fs::write(&path, vec![1u8; 3 * UNIT]).unwrap();
        let err = BlockFile::create_new(&path, &BlockOptions::default()).unwrap_err();
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&err, BlockIoError::Open { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
        assert!(kept == vec![1u8; 3 * UNIT], "an existing file must be kept");
    }

    #[test]
    fn reserve_allocates_and_keeps_content() {
        let f = temp_file(Engine::Sync);
        f.write_at(0, &pattern(3, UNIT)).unwrap();
        f.reserve(4 * UNIT as u64).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 4 * UNIT as u64);
        let mut buf = AlignedBuf::new(UNIT, 4096);
        f.read_at(0, &mut buf).unwrap();
        assert!(buf[..] == pattern(3, UNIT)[..]);
        assert!(f.fs_free_bytes().unwrap() > 0);
        f.set_len(0).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 0);
    }

    /// Runs `f` on a fresh ramfs directory (ramfs refuses O_DIRECT), mounted
    /// in a private mount namespace of a new thread so that nothing outside
    /// the test sees it. None where mounting is not allowed.
    pub(crate) fn with_ramfs<R: Send>(f: impl FnOnce(&Path) -> R + Send) -> Option<R> {
        with_mount(c"ramfs", None, f)
    }

    /// [`with_ramfs`] for any filesystem type with mount data, e.g. a
    /// `size=16m` tmpfs to fill up. None where mounting is not allowed.
    pub(crate) fn with_mount<R: Send>(
        fstype: &std::ffi::CStr,
        data: Option<&std::ffi::CStr>,
        f: impl FnOnce(&Path) -> R + Send,
    ) -> Option<R> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: unshare affects only this thread's mount namespace.
                    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                        return None;
                    }
                    // SAFETY: a mount syscall with NUL-terminated strings; it
                    // makes this namespace's mounts private so that none of
                    // ours propagates to the host.
                    let private = unsafe {
                        libc::mount(
                            c"none".as_ptr(),
                            c"/".as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        )
                    } == 0;
                    if !private {
                        return None;
                    }
                    let dir = test_dir().join(format!(
                        ".blockio-{}-{}-{:?}",
                        fstype.to_string_lossy(),
                        std::process::id(),
                        std::thread::current().id()
                    ));
                    std::fs::create_dir_all(&dir).ok()?;
                    let cdir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
                    // SAFETY: as above.
                    let mounted = unsafe {
                        libc::mount(
                            c"none".as_ptr(),
                            cdir.as_ptr(),
                            fstype.as_ptr(),
                            0,
                            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
                        )
                    } == 0;
                    let result = mounted.then(|| f(&dir));
                    if mounted {
                        // SAFETY: unmounting what this thread mounted.
                        unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) };
                    }
                    let _ = std::fs::remove_dir(&dir);
                    result
                })
                .join()
                .expect("ramfs test thread")
        })
    }

    #[test]
    fn direct_io_refusal_is_reported() {
        let outcome =
            with_ramfs(
                |dir| match BlockFile::temporary_in(dir, &BlockOptions::default()) {
                    Err(e @ BlockIoError::DirectIoUnsupported { .. }) => e.to_string(),
                    other => format!("unexpected: {other:?}"),
                },
            );
        match outcome {
            Some(msg) => {
                assert!(msg.contains("refuses O_DIRECT"), "{msg}");
                assert!(msg.contains("/var/tmp"), "{msg}");
            }
            None => test_resources::skip(
                "a ramfs directory refuses O_DIRECT",
                test_resources::Resource::Mount,
                "cannot mount a ramfs here (needs root)",
            ),
        }
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
