//! The `pread`/`pwrite` engine: one request at a time per calling thread.

use std::io;
use std::os::fd::RawFd;

use crate::batch::{Next, Tracker};
use crate::OpKind;

/// The `pread`/`pwrite` engine.
///
/// # Safety
///
/// As for [`BlockFile::submit_raw`].
pub(crate) unsafe fn run_sync(fd: RawFd, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
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
