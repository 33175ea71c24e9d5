//! The io_uring engine: a pool of rings shared by the threads using one
//! file.
//!
//! seccomp cannot see what a ring does: a thread allowed `io_uring_enter`
//! could open files or connect sockets through it. So each ring is created
//! disabled, gets the file registered as its only file and restrictions
//! (only `READ` and `WRITE`, only on registered files, no registration
//! afterwards), and only then is enabled. Rings are made when the file is
//! opened, never later: `io_uring_setup` is outside every thread's
//! seccomp filter once the VM runs.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use io_uring::register::Restriction;
use io_uring::{opcode, squeue, types, IoUring};

use crate::batch::{Next, Tracker};
use crate::{BlockOptions, OpKind};

/// How many times a failing `io_uring_enter` is retried before giving up.
/// Giving up means aborting: see [`RingPool::run`] for why.
const ENTER_RETRY_LIMIT: u32 = 1000;

/// Rings shared by the threads using one file.
pub(crate) struct RingPool {
    rings: Box<[Mutex<IoUring>]>,
    next: AtomicUsize,
    /// The caller's descriptor, for checks.
    fd: RawFd,
    /// The file as registered (index 0) with every ring: another open
    /// file description of it (see [`reopen`]).
    _registered: File,
}

/// The file behind `fd` opened again, with the same access mode and
/// O_DIRECT: a new open file description, without the caller's `flock`.
///
/// A ring holds its registered files until the kernel tears the ring
/// down, which after the process exits happens later, in a kernel
/// worker; registered itself, the caller's description would keep its
/// lock that while. This one carries no lock. (An exited process's files
/// can still be closed a moment late on a loaded host; `lockfile::lock`
/// waits for such a holder.)
fn reopen(fd: RawFd) -> io::Result<File> {
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let access = flags & libc::O_ACCMODE;
    OpenOptions::new()
        .read(access != libc::O_WRONLY)
        .write(access != libc::O_RDONLY)
        .custom_flags(flags & (libc::O_DIRECT | libc::O_DSYNC | libc::O_SYNC))
        .open(format!("/proc/self/fd/{fd}"))
}

/// The index of the file in each ring's registered-file table.
const FILE_INDEX: u32 = 0;

/// A ring for `fd` that can only read and write the registered `fd`.
fn restricted_ring(entries: u32, fd: RawFd) -> io::Result<IoUring> {
    let ring = IoUring::builder().setup_r_disabled().build(entries)?;
    let submitter = ring.submitter();
    submitter.register_files(&[fd])?;
    let fixed = squeue::Flags::FIXED_FILE.bits();
    submitter.register_restrictions(&mut [
        Restriction::sqe_op(opcode::Read::CODE),
        Restriction::sqe_op(opcode::Write::CODE),
        Restriction::sqe_flags_required(fixed),
        Restriction::sqe_flags_allowed(fixed),
    ])?;
    submitter.register_enable_rings()?;
    Ok(ring)
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
    /// Restricted rings (see the module docs) for `fd`, which must stay
    /// open while the pool lives (the rings hold it open too).
    pub(crate) fn new(opts: &BlockOptions, fd: RawFd) -> io::Result<Self> {
        let registered = reopen(fd)?;
        let rings = (0..opts.rings.max(1))
            .map(|_| {
                restricted_ring(opts.ring_entries.max(1), registered.as_raw_fd()).map(Mutex::new)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self {
            rings: rings.into_boxed_slice(),
            next: AtomicUsize::new(0),
            fd,
            _registered: registered,
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
    pub(crate) unsafe fn run(&self, fd: RawFd, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
        // The rings reach only the file they were made for.
        assert_eq!(fd, self.fd, "a ring pool serves one file");
        let file = types::Fixed(FILE_INDEX);
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
                        OpKind::Read => opcode::Read::new(file, addr, len32).offset(offset).build(),
                        OpKind::Write => opcode::Write::new(file, addr.cast_const(), len32)
                            .offset(offset)
                            .build(),
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
mod tests {
    use super::*;

    /// The result of one submission on a fresh restricted ring for `file`.
    fn submit_one(ring: &mut IoUring, entry: squeue::Entry) -> i32 {
        // SAFETY: the entries below point at `buf` of the caller, alive
        // until the completion is reaped here.
        unsafe { ring.submission().push(&entry) }.expect("room in the SQ");
        ring.submit_and_wait(1).expect("io_uring_enter");
        ring.completion().next().expect("a completion").result()
    }

    #[test]
    fn rings_only_read_and_write_the_registered_file() {
        let file = tempfile_in_tmp();
        let fd = file.as_raw_fd();
        let mut ring = match restricted_ring(8, fd) {
            Ok(ring) => ring,
            Err(e) => {
                test_resources::skip(
                    "rings_only_read_and_write_the_registered_file",
                    test_resources::Resource::IoUring,
                    format!("no restricted io_uring here: {e}"),
                );
                return;
            }
        };
        let mut buf = [7u8; 512];
        let fixed = types::Fixed(FILE_INDEX);
        let write = opcode::Write::new(fixed, buf.as_ptr(), 512)
            .offset(0)
            .build();
        assert_eq!(submit_one(&mut ring, write), 512);
        let read = opcode::Read::new(fixed, buf.as_mut_ptr(), 512)
            .offset(0)
            .build();
        assert_eq!(submit_one(&mut ring, read), 512);
        // The same read on the plain fd, another opcode, and registering
        // more after the start are all refused.
        let plain = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), 512).build();
        assert_eq!(submit_one(&mut ring, plain), -libc::EACCES);
        assert_eq!(
            submit_one(&mut ring, opcode::Nop::new().build()),
            -libc::EACCES
        );
        let path = c"/etc/passwd";
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr()).build();
        assert_eq!(submit_one(&mut ring, open), -libc::EACCES);
        let err = ring.submitter().register_files(&[fd]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    }

    #[test]
    fn the_registered_file_does_not_carry_the_lock() {
        let file = tempfile_in_tmp();
        // SAFETY: flock on a descriptor we own.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(locked, 0);
        let again = reopen(file.as_raw_fd()).unwrap();
        // Another description: its own lock conflicts with the caller's.
        // SAFETY: as above.
        let r = unsafe { libc::flock(again.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EWOULDBLOCK)
        );
    }

    fn tempfile_in_tmp() -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(std::env::temp_dir())
            .expect("an O_TMPFILE in the temp dir")
    }
}
