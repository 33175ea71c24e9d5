//! Hole punching in files that back memory (hugetlbfs memfds).

use std::io;
use std::os::fd::RawFd;

/// Punches a hole in a (hugetlbfs) file, keeping its size: the pages are
/// freed and the next touch of a mapping faults MISSING.
pub fn punch_hole(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a caller-provided fd only changes that file.
    let ret = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
