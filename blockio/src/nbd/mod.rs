//! The NBD transport: a [`BlockFile`] whose storage is an export of a
//! Network Block Device server (nbdkit, qemu-nbd, nbd-server, Ceph's
//! rbd-nbd tooling), reached over TCP or a Unix socket.
//!
//! Hand-written on the standard library rather than on the published `nbd`
//! crate: that crate is synchronous (one request, then its reply) and
//! early-stage, while a swap store needs many requests in flight on one
//! connection (a batch of 2 MiB writes from an evictor and a fault's read
//! side by side), reconnection that re-sends what had no reply, and
//! durability tracking across reconnects. The protocol part is small:
//! the fixed-newstyle handshake with `NBD_OPT_GO` ([`handshake`]) and
//! simple replies ([`conn`]).
//!
//! Writes are durable when they complete: each goes out with
//! `NBD_CMD_FLAG_FUA` where the server offers it, else the batch is
//! followed by an `NBD_CMD_FLUSH`, and a write acknowledged on a
//! connection that dropped before its flush is written again
//! ([`NbdClient`]'s `write_durable`). The swap engine keeps a chunk's
//! parked copy until its store write returns, so a server that restarts
//! and loses what it had not flushed loses nothing of the guest's. A
//! virtio-blk disk on NBD is write-through for the same reason.

mod conn;
#[cfg(any(test, feature = "test-support"))]
pub(crate) mod fake_server;
pub(crate) mod handshake;
pub(crate) mod tls;
mod uri;

pub use conn::{clients_reconnecting, set_reader_thread_setup, NbdClient};
pub use handshake::ExportInfo;
#[doc(hidden)]
pub use handshake::{negotiate_replayed, start_tls_replayed};
pub use uri::{
    NbdAddress, NbdTls, NbdUri, NbdUriError, DEFAULT_PORT, NBD_URI_FORMS, SYSTEM_CA_FILE,
};

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use conn::{Command, Outcome, Submit, CMD_FLAG_FUA};

use crate::batch::Tracker;
use crate::{Backend, BlockFile, BlockIoError, OpKind};

/// How long a dropped connection is retried by default before requests
/// fail: long enough for a storage server to restart, short enough that a
/// guest waiting on it is not stuck for minutes without a word.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest payload one request carries even if the server allows
/// more: 32 MiB is what every server accepts (the protocol's default
/// maximum), and a 2 MiB unit never needs more.
const MAX_REQUEST_BYTES: u32 = 32 << 20;

/// How to open an NBD export.
#[derive(Clone, Debug)]
pub struct NbdOptions {
    /// How long a dropped connection is retried before every request fails.
    pub reconnect_timeout: Duration,
    /// Open for reading only; without it a read-only export is refused.
    pub read_only: bool,
}

impl Default for NbdOptions {
    fn default() -> Self {
        Self {
            reconnect_timeout: DEFAULT_RECONNECT_TIMEOUT,
            read_only: false,
        }
    }
}

impl BlockFile {
    /// Connects to the export `uri` names. The handshake's block size
    /// constraints become [`BlockFile::offset_align_bytes`] (buffers need
    /// no alignment); the export's size is fixed, so it counts as a block
    /// device ([`BlockFile::is_block_device`]).
    pub fn open_nbd(uri: &NbdUri, opts: &NbdOptions) -> Result<Self, BlockIoError> {
        let fail = |reason: String| BlockIoError::Nbd {
            uri: uri.to_string(),
            reason,
        };
        let client = NbdClient::connect(uri, opts.reconnect_timeout).map_err(fail)?;
        let export = *client.export();
        if export.read_only() && !opts.read_only {
            return Err(fail(
                "the server exports it read-only, and this use writes; export it writable (nbdkit without -r, qemu-nbd without -r), or attach a disk with ,readonly".into(),
            ));
        }
        Ok(BlockFile {
            file: None,
            path: PathBuf::from(uri.to_string()),
            is_block_device: true,
            direct: false,
            offset_align_bytes: export.min_block_bytes as usize,
            mem_align_bytes: 1,
            backend: Backend::Nbd(client),
        })
    }

    /// The NBD client, when this block file is an NBD export.
    pub fn nbd(&self) -> Option<&NbdClient> {
        match &self.backend {
            Backend::Nbd(client) => Some(client),
            _ => None,
        }
    }
}

impl NbdClient {
    /// The largest payload of one request.
    fn max_request_bytes(&self) -> u32 {
        self.export().max_block_bytes.min(MAX_REQUEST_BYTES)
    }

    /// Moves a batch's pending requests: reads in pieces of at most the
    /// server's maximum payload, all sent before any reply is awaited, and
    /// writes the same way through [`Self::write_durable`].
    ///
    /// # Safety
    ///
    /// As for [`BlockFile::submit_raw`].
    pub(crate) unsafe fn run_batch(&self, tracker: &mut Tracker<'_>, pending: Vec<usize>) {
        let max = self.max_request_bytes() as usize;
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        let mut owner_reads = Vec::new();
        let mut owner_writes = Vec::new();
        for i in pending {
            let op = tracker.ops[i];
            let mut done = 0;
            while done < op.len_bytes {
                let len = (op.len_bytes - done).min(max);
                let submit = Submit {
                    command: match op.kind {
                        OpKind::Read => Command::Read,
                        OpKind::Write => Command::Write,
                    },
                    flags: 0,
                    offset: op.offset + done as u64,
                    len_bytes: len as u32,
                    // wrapping_add: inside the caller's buffer.
                    buf: op.addr.wrapping_add(done),
                };
                match op.kind {
                    OpKind::Read => {
                        reads.push(submit);
                        owner_reads.push(i);
                    }
                    OpKind::Write => {
                        writes.push(submit);
                        owner_writes.push(i);
                    }
                }
                done += len;
            }
        }
        let mut first_error: std::collections::HashMap<usize, Outcome> = Default::default();
        let mut note = |owners: &[usize], outcomes: Vec<Outcome>| {
            for (&i, outcome) in owners.iter().zip(outcomes) {
                if !matches!(outcome, Outcome::Done { .. }) {
                    first_error.entry(i).or_insert(outcome);
                }
            }
        };
        if !reads.is_empty() {
            // SAFETY: the pieces lie inside the callers' buffers, which the
            // contract keeps valid (and writable, unaliased for reads) for
            // this whole call.
            note(&owner_reads, unsafe { self.run(&reads) });
        }
        if !writes.is_empty() {
            // SAFETY: as above.
            note(&owner_writes, unsafe { self.write_durable(&writes) });
        }
        let mut owners: Vec<usize> = owner_reads.into_iter().chain(owner_writes).collect();
        owners.dedup();
        for i in owners {
            match first_error.remove(&i) {
                None => {
                    let len = tracker.ops[i].len_bytes as i64;
                    tracker.complete(i, len);
                }
                Some(Outcome::Failed { errno }) => {
                    tracker.fail(i, io::Error::from_raw_os_error(errno));
                }
                Some(Outcome::Dead { message }) => {
                    tracker.fail(i, io::Error::new(io::ErrorKind::NotConnected, message));
                }
                Some(Outcome::Done { .. }) => unreachable!("only failures are noted"),
            }
        }
    }

    /// Writes `writes` so that each is durable when its outcome is
    /// `Done`: with FUA where the server offers it; else the writes, then
    /// a flush, and again any write acknowledged on an older connection
    /// than the flush's (the server may have lost it in a restart), until
    /// one flush covers them all. A server that offers neither FUA nor
    /// flush is taken at its word: its acknowledgement is all there is.
    ///
    /// # Safety
    ///
    /// As for `run`.
    unsafe fn write_durable(&self, writes: &[Submit]) -> Vec<Outcome> {
        let export = self.export();
        if export.can_fua() {
            let with_fua: Vec<Submit> = writes
                .iter()
                .map(|w| Submit {
                    flags: w.flags | CMD_FLAG_FUA,
                    ..*w
                })
                .collect();
            // SAFETY: passed on from the caller.
            return unsafe { self.run(&with_fua) };
        }
        // SAFETY: passed on from the caller.
        let mut outcomes = unsafe { self.run(writes) };
        if !export.can_flush() {
            return outcomes;
        }
        loop {
            let flush = Submit {
                command: Command::Flush,
                flags: 0,
                offset: 0,
                len_bytes: 0,
                buf: std::ptr::null_mut(),
            };
            // SAFETY: a flush carries no buffer.
            let flushed = unsafe { self.run(&[flush]) }.pop().expect("one outcome");
            let flush_generation = match flushed {
                Outcome::Done { generation } => generation,
                failure => {
                    // The writes are not known to be durable: each fails
                    // with the flush's error.
                    for o in outcomes.iter_mut() {
                        if matches!(o, Outcome::Done { .. }) {
                            *o = failure.clone();
                        }
                    }
                    return outcomes;
                }
            };
            let again: Vec<usize> = (0..writes.len())
                .filter(|&k| {
                    matches!(outcomes[k], Outcome::Done { generation } if generation != flush_generation)
                })
                .collect();
            if again.is_empty() {
                return outcomes;
            }
            log::warn!(
                "NBD server {}: {} write(s) acknowledged before the connection dropped are written again, since the server may have lost them unflushed",
                self.uri(),
                again.len()
            );
            let redo: Vec<Submit> = again.iter().map(|&k| writes[k]).collect();
            // SAFETY: passed on from the caller.
            for (k, o) in again.into_iter().zip(unsafe { self.run(&redo) }) {
                outcomes[k] = o;
            }
        }
    }

    /// One request without a buffer (flush, trim, write zeroes), as a
    /// block error on failure.
    fn control(
        &self,
        what: &'static str,
        command: Command,
        offset: u64,
        len_bytes: u64,
    ) -> Result<(), BlockIoError> {
        let err = |source| BlockIoError::Control {
            what,
            path: PathBuf::from(self.uri().to_string()),
            source,
        };
        // Trims and zeroings longer than one request's length field are
        // sent in pieces; they carry no payload, so the limit is the u32.
        let max = u64::from(u32::MAX) / 2 + 1;
        let mut pieces = Vec::new();
        let mut done = 0;
        loop {
            let len = (len_bytes - done).min(max);
            pieces.push(Submit {
                command,
                flags: 0,
                offset: offset + done,
                len_bytes: len as u32,
                buf: std::ptr::null_mut(),
            });
            done += len;
            if done >= len_bytes {
                break;
            }
        }
        // SAFETY: these commands carry no buffer.
        for outcome in unsafe { self.run(&pieces) } {
            match outcome {
                Outcome::Done { .. } => {}
                Outcome::Failed { errno } => return Err(err(io::Error::from_raw_os_error(errno))),
                Outcome::Dead { message } => {
                    return Err(err(io::Error::new(io::ErrorKind::NotConnected, message)))
                }
            }
        }
        Ok(())
    }

    pub(crate) fn flush(&self) -> Result<(), BlockIoError> {
        if !self.export().can_flush() {
            // Nothing to ask for: the server offers no flush, so its
            // acknowledgements are all the durability there is.
            return Ok(());
        }
        self.control("NBD_CMD_FLUSH", Command::Flush, 0, 0)
    }

    pub(crate) fn write_zeroes(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        if !self.export().can_write_zeroes() {
            return Err(self.unsupported("NBD_CMD_WRITE_ZEROES"));
        }
        self.control(
            "NBD_CMD_WRITE_ZEROES",
            Command::WriteZeroes,
            offset,
            len_bytes,
        )
    }

    pub(crate) fn trim(&self, offset: u64, len_bytes: u64) -> Result<(), BlockIoError> {
        if !self.export().can_trim() {
            return Err(self.unsupported("NBD_CMD_TRIM"));
        }
        self.control("NBD_CMD_TRIM", Command::Trim, offset, len_bytes)
    }

    fn unsupported(&self, what: &'static str) -> BlockIoError {
        BlockIoError::Control {
            what,
            path: PathBuf::from(self.uri().to_string()),
            source: io::Error::new(
                io::ErrorKind::Unsupported,
                "the server does not offer it for this export",
            ),
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
