//! Why opening or using a [`BlockFile`](crate::BlockFile) failed.

use std::io;
use std::path::PathBuf;

use crate::OpKind;

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
    /// An NBD export could not be reached or negotiated.
    #[error("cannot use the NBD export {uri}: {reason}; check that the server runs and serves this export (e.g. `nbdkit memory 4G`, or `qemu-nbd --persistent -f raw FILE`)")]
    Nbd {
        /// The export's URI.
        uri: String,
        /// What went wrong.
        reason: String,
    },
    /// A vhost-user-blk backend could not be reached or set up.
    #[error("cannot use the vhost-user-blk backend at {}: {reason}", path.display())]
    VhostUser {
        /// The backend's socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
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
            BlockIoError::Nbd { .. } | BlockIoError::VhostUser { .. } => {
                io::Error::new(io::ErrorKind::NotConnected, err)
            }
            BlockIoError::Misaligned { .. } | BlockIoError::DirectIoUnsupported { .. } => {
                io::Error::new(io::ErrorKind::InvalidInput, err)
            }
        }
    }
}
