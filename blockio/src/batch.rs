//! Progress of one batch of requests, shared by both engines.

use std::io;

use crate::{is_aligned, BlockFile, BlockIoError, OpKind, RawBlockOp};

/// The largest piece one SQE or syscall moves; longer requests are issued in
/// pieces, because an SQE length is 32 bits and a syscall caps at ~2 GiB.
const MAX_PIECE_BYTES: usize = 1 << 30;

/// Progress of one batch, shared by both engines: bytes done per request and
/// the final results.
pub(crate) struct Tracker<'a> {
    pub(crate) file: &'a BlockFile,
    pub(crate) ops: &'a [RawBlockOp],
    pub(crate) done_bytes: Vec<usize>,
    pub(crate) results: &'a mut Vec<Option<Result<(), BlockIoError>>>,
}

/// What to do with a request after one piece of it completed.
pub(crate) enum Next {
    Finished,
    Again,
}

impl Tracker<'_> {
    /// The next piece of request `i`: (file offset, buffer address, length).
    pub(crate) fn piece(&self, i: usize) -> (u64, *mut u8, usize) {
        let op = &self.ops[i];
        let done = self.done_bytes[i];
        let len = (op.len_bytes - done).min(MAX_PIECE_BYTES);
        // wrapping_add: the address stays inside the caller's buffer, and
        // the pointer is only handed to the kernel.
        (op.offset + done as u64, op.addr.wrapping_add(done), len)
    }

    /// Accounts for a piece of request `i` that returned `res` (bytes, or
    /// -errno as the kernel reports it).
    pub(crate) fn complete(&mut self, i: usize, res: i64) -> Next {
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

    /// Records that request `i` failed with `source`.
    pub(crate) fn fail(&mut self, i: usize, source: io::Error) {
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
