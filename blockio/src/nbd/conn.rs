//! The NBD client's connection: many requests in flight on one socket,
//! replies matched by cookie, reconnection within a bound.
//!
//! Threads that submit requests (fault service, evictors, vCPUs serving
//! virtio-blk) register each request in a table under a fresh cookie and
//! write its header (and payload) on the socket themselves, one request at
//! a time under the send lock, so a fault's 28-byte read request is never
//! queued behind a whole batch of 2 MiB writes. One reader thread per
//! client reads the simple replies, finds the request by its cookie, reads
//! a read's payload straight into the caller's buffer, records the outcome
//! and wakes the waiters. Structured replies (`NBD_OPT_STRUCTURED_REPLY`)
//! are not negotiated: they only pay off for sparse reads and block status,
//! which neither a store nor a disk needs, and simple replies keep one
//! reply per request.
//!
//! When the connection drops (a read or write on the socket fails, or a
//! reply breaks the protocol), the reader thread reconnects with backoff
//! until `reconnect_timeout` has passed since the drop. Meanwhile waiters
//! block: a read is never answered with anything but the server's data.
//! On success it installs the new socket under a new *generation* and
//! wakes everyone; each waiter sends again those of its requests that have
//! no reply yet and were last sent on an older generation (the send lock
//! and the per-request `sent_generation` make sure a request goes out once
//! per connection, so no cookie is ever answered twice). The reader does
//! not send itself: it must keep reading replies, or a server blocked on
//! writing them would stop reading our requests. After the bound the
//! client is dead: every waiting and later request fails with a message
//! naming the server and how long it was gone.
//!
//! A reply is recorded with the generation of the connection that carried
//! it. That is what makes writes durable across a restart (see
//! [`NbdClient::write_durable`]): a server may lose writes it acknowledged
//! but had not flushed when it died, so a flush only covers the writes
//! acknowledged on its own connection.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::{self, ExportInfo, Stream};
use super::uri::NbdUri;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// `NBD_CMD_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    Read = 0,
    Write = 1,
    Disconnect = 2,
    Flush = 3,
    Trim = 4,
    WriteZeroes = 6,
}

/// `NBD_CMD_FLAG_FUA`: the write is durable when its reply comes.
pub(crate) const CMD_FLAG_FUA: u16 = 1 << 0;

/// The first wait between reconnection attempts; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between reconnection attempts: a restarted server is
/// found within a second of listening again.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A hook every client's reader thread runs first (the VMM installs its
/// seccomp filter there); see [`set_reader_thread_setup`].
type ThreadSetup = Box<dyn Fn() + Send + Sync>;
static READER_SETUP: OnceLock<ThreadSetup> = OnceLock::new();

/// Sets the function each NBD client's reader thread runs before anything
/// else, once per process (a second call is ignored and returns false).
///
/// A process-wide hook rather than an option of each open: stores and
/// disks are opened by crates (swap, devices) that know nothing of the
/// VMM's seccomp filters, and every NBD reader thread gets the same one.
/// The thread needs `socket` and `connect` for reconnecting, which no other
/// thread of the VMM may call.
pub fn set_reader_thread_setup(setup: impl Fn() + Send + Sync + 'static) -> bool {
    READER_SETUP.set(Box::new(setup)).is_ok()
}

/// Clients of this process whose connection is down and being retried.
static DISCONNECTED_CLIENTS: AtomicU64 = AtomicU64::new(0);

/// How many NBD clients of this process are reconnecting right now: their
/// callers are blocked until the server is back or the bound passes. The
/// VMM's end of a run asks, so that it does not join threads that wait on
/// a server that may never come back (a SIGTERM must still end the VM).
pub fn clients_reconnecting() -> u64 {
    DISCONNECTED_CLIENTS.load(Ordering::Relaxed)
}

/// The outcome of one request.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    /// The server replied without error on connection `generation`.
    Done { generation: u64 },
    /// The server replied with this errno.
    Failed { errno: i32 },
    /// The client gave up on the server; the message says why.
    Dead { message: String },
}

/// A pointer to a caller's buffer, sent to the reader thread.
#[derive(Clone, Copy, Debug)]
struct BufPtr(*mut u8);
// SAFETY: the pointer is only dereferenced by the reader thread while the
// submitting thread waits for the request's outcome, under the contract
// of `NbdClient::run` that the buffer stays valid and unaliased until then.
unsafe impl Send for BufPtr {}

/// One request of the table.
#[derive(Debug)]
struct Request {
    command: Command,
    flags: u16,
    offset: u64,
    len_bytes: u32,
    /// The payload of a write, or where a read's goes.
    buf: BufPtr,
    /// The connection generation it was last sent on (0: not yet).
    sent_generation: u64,
    outcome: Option<Outcome>,
    /// The batch it belongs to, woken when the batch's last reply comes.
    waiter: Arc<Waiter>,
}

/// One batch's wake-up: each submitting thread waits on its own condition
/// variable, and the reader wakes it once, when the batch's last request
/// has its outcome (or a reconnection asks it to send again), rather than
/// every waiter on every reply: with several fault threads and an evictor
/// waiting on one connection, waking them all per 2 MiB reply costs more
/// CPU than the replies.
#[derive(Debug)]
struct Waiter {
    cond: Condvar,
    /// Requests of the batch without an outcome.
    remaining: AtomicU64,
}

impl Waiter {
    /// Records one outcome; true when it was the batch's last.
    fn one_done(&self) -> bool {
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// One request a caller submits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Submit {
    pub(crate) command: Command,
    pub(crate) flags: u16,
    pub(crate) offset: u64,
    pub(crate) len_bytes: u32,
    pub(crate) buf: *mut u8,
}

#[derive(Default)]
struct State {
    requests: HashMap<u64, Request>,
    /// The current connection's generation; 0 while disconnected.
    generation: u64,
    /// Set once the reconnection bound has passed.
    dead: Option<String>,
}

impl State {
    /// The batches that wait on a request, each once.
    fn waiters(&self) -> Vec<Arc<Waiter>> {
        let mut out: Vec<Arc<Waiter>> = Vec::new();
        for r in self.requests.values() {
            if r.outcome.is_none() && !out.iter().any(|w| Arc::ptr_eq(w, &r.waiter)) {
                out.push(Arc::clone(&r.waiter));
            }
        }
        out
    }
}

/// The sending side: the current socket and its generation.
struct Tx {
    stream: Option<Stream>,
    /// Cleared by a sender whose write failed. The socket itself is only
    /// dropped by the reader thread (or the client's drop): closing a
    /// descriptor in a debug build makes std check it with `fcntl`, which
    /// the submitting threads' seccomp filters do not allow.
    usable: bool,
    generation: u64,
}

struct Shared {
    uri: NbdUri,
    tcp_addrs: Vec<SocketAddr>,
    export: ExportInfo,
    reconnect_timeout: Duration,
    tx: Mutex<Tx>,
    state: Mutex<State>,
    next_cookie: AtomicU64,
    closing: AtomicBool,
    reconnects: AtomicU64,
}

/// A connection to one export of one NBD server; see the module docs.
pub struct NbdClient {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("uri", &self.shared.uri.to_string())
            .field("export", &self.shared.export)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single statement, so a panic
    // elsewhere cannot leave them half changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NbdClient {
    /// Connects to `uri`'s server and negotiates its export. A failure here
    /// is not retried: at start, an unreachable server is a mistake to
    /// report, not an outage to ride out.
    pub(crate) fn connect(uri: &NbdUri, reconnect_timeout: Duration) -> Result<Self, String> {
        let tcp_addrs = uri
            .resolve()
            .map_err(|e| format!("cannot resolve the host name: {e}"))?;
        let (stream, export) = handshake::connect(uri, &tcp_addrs).map_err(|e| e.message)?;
        let reader_stream = stream
            .try_clone()
            .map_err(|e| format!("cannot duplicate the socket: {e}"))?;
        let shared = Arc::new(Shared {
            uri: uri.clone(),
            tcp_addrs,
            export,
            reconnect_timeout,
            tx: Mutex::new(Tx {
                stream: Some(stream),
                usable: true,
                generation: 1,
            }),
            state: Mutex::new(State {
                generation: 1,
                ..State::default()
            }),
            next_cookie: AtomicU64::new(1),
            closing: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
        });
        let for_reader = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name("nbd-reader".into())
            .spawn(move || {
                if let Some(setup) = READER_SETUP.get() {
                    setup();
                }
                for_reader.read_loop(reader_stream, 1);
            })
            .map_err(|e| format!("cannot start the reply reader thread: {e}"))?;
        Ok(NbdClient {
            shared,
            reader: Some(reader),
        })
    }

    /// What the server said about the export at the first connection.
    pub fn export(&self) -> &ExportInfo {
        &self.shared.export
    }

    /// The server's URI.
    pub fn uri(&self) -> &NbdUri {
        &self.shared.uri
    }

    /// Connections re-established after a drop so far.
    pub fn reconnects(&self) -> u64 {
        self.shared.reconnects.load(Ordering::Relaxed)
    }

    /// Sends `requests` (all of them before waiting for any reply) and
    /// returns one outcome each, in order, once every one has one.
    ///
    /// # Safety
    ///
    /// Each request's `buf..buf+len_bytes` (for reads and writes) must be
    /// valid until this returns: readable for writes, writable and not
    /// accessed by anything else for reads.
    pub(crate) unsafe fn run(&self, requests: &[Submit]) -> Vec<Outcome> {
        let shared = &*self.shared;
        let waiter = Arc::new(Waiter {
            cond: Condvar::new(),
            remaining: AtomicU64::new(requests.len() as u64),
        });
        let cookies: Vec<u64> = {
            let mut state = lock(&shared.state);
            if let Some(message) = &state.dead {
                let message = message.clone();
                return requests
                    .iter()
                    .map(|_| Outcome::Dead {
                        message: message.clone(),
                    })
                    .collect();
            }
            requests
                .iter()
                .map(|r| {
                    let cookie = shared.next_cookie.fetch_add(1, Ordering::Relaxed);
                    state.requests.insert(
                        cookie,
                        Request {
                            command: r.command,
                            flags: r.flags,
                            offset: r.offset,
                            len_bytes: r.len_bytes,
                            buf: BufPtr(r.buf),
                            sent_generation: 0,
                            outcome: None,
                            waiter: Arc::clone(&waiter),
                        },
                    );
                    cookie
                })
                .collect()
        };
        shared.send(&cookies);
        let mut state = lock(&shared.state);
        loop {
            if cookies.iter().all(|c| state.requests[c].outcome.is_some()) {
                break;
            }
            // A new connection: send what has no reply and was last sent
            // on an older one. (The send lock, not this check, is what
            // keeps a request from going out twice on one connection.)
            let generation = state.generation;
            if generation != 0
                && cookies.iter().any(|c| {
                    let r = &state.requests[c];
                    r.outcome.is_none() && r.sent_generation != generation
                })
            {
                drop(state);
                shared.send(&cookies);
                state = lock(&shared.state);
                continue;
            }
            state = waiter.cond.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        cookies
            .iter()
            .map(|c| {
                state
                    .requests
                    .remove(c)
                    .and_then(|r| r.outcome)
                    .expect("checked above")
            })
            .collect()
    }
}

impl Shared {
    /// Sends those of `cookies` that have no outcome and were not sent on
    /// the current connection yet. A failed send leaves the request to the
    /// next connection and shuts the socket down, so that the reader
    /// thread notices the drop even if its side of the socket looks fine.
    fn send(&self, cookies: &[u64]) {
        for &cookie in cookies {
            let mut tx = lock(&self.tx);
            let generation = tx.generation;
            if !tx.usable {
                return;
            }
            let Some(stream) = tx.stream.as_mut() else {
                return;
            };
            let request = {
                let mut state = lock(&self.state);
                let Some(r) = state.requests.get_mut(&cookie) else {
                    continue;
                };
                if r.outcome.is_some() || r.sent_generation == generation {
                    continue;
                }
                r.sent_generation = generation;
                (r.command, r.flags, r.offset, r.len_bytes, r.buf)
            };
            let (command, flags, offset, len_bytes, buf) = request;
            let mut header = [0u8; 28];
            header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            header[4..6].copy_from_slice(&flags.to_be_bytes());
            header[6..8].copy_from_slice(&(command as u16).to_be_bytes());
            header[8..16].copy_from_slice(&cookie.to_be_bytes());
            header[16..24].copy_from_slice(&offset.to_be_bytes());
            header[24..28].copy_from_slice(&len_bytes.to_be_bytes());
            let payload: &[u8] = if command == Command::Write {
                // SAFETY: `run`'s contract keeps a write's buffer valid and
                // readable for len_bytes until its outcome is taken, which
                // happens after this send returns.
                unsafe { std::slice::from_raw_parts(buf.0, len_bytes as usize) }
            } else {
                &[]
            };
            if let Err(e) = write_all_vectored(stream, &header, payload) {
                log::warn!(
                    "NBD server {}: sending a request failed ({e}); reconnecting",
                    self.uri
                );
                stream.shutdown();
                tx.usable = false;
                return;
            }
        }
    }

    /// The reader thread: replies until the connection drops, then a
    /// reconnection, until the client closes or gives up.
    fn read_loop(&self, mut stream: Stream, mut generation: u64) {
        loop {
            let error = loop {
                if let Err(e) = self.read_reply(&mut stream, generation) {
                    break e;
                }
            };
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            stream.shutdown();
            log::warn!(
                "NBD server {}: connection lost ({error}); reconnecting for up to {} s",
                self.uri,
                self.reconnect_timeout.as_secs_f64()
            );
            {
                let mut tx = lock(&self.tx);
                tx.usable = false;
                if let Some(s) = tx.stream.take() {
                    s.shutdown();
                }
            }
            lock(&self.state).generation = 0;
            DISCONNECTED_CLIENTS.fetch_add(1, Ordering::Relaxed);
            let reconnected = self.reconnect(&error);
            DISCONNECTED_CLIENTS.fetch_sub(1, Ordering::Relaxed);
            match reconnected {
                Some(new_stream) => {
                    generation += 1;
                    stream = new_stream;
                }
                None => return,
            }
            // Only now, with the reader's copy in hand, may senders use it.
            let Ok(sender) = stream.try_clone() else {
                // Cannot happen short of running out of descriptors; the
                // next read fails and the reconnection starts over.
                stream.shutdown();
                continue;
            };
            {
                let mut tx = lock(&self.tx);
                tx.stream = Some(sender);
                tx.usable = true;
                tx.generation = generation;
            }
            let waiters = {
                let mut state = lock(&self.state);
                state.generation = generation;
                state.waiters()
            };
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "NBD server {}: reconnected; requests without a reply are sent again",
                self.uri
            );
            // Every waiting batch sends again what has no reply.
            for w in waiters {
                w.cond.notify_one();
            }
        }
    }

    /// Tries to connect again with backoff until the bound passes. `None`:
    /// the client is closing, or gave up (every request is failed then).
    fn reconnect(&self, cause: &io::Error) -> Option<Stream> {
        let started = Instant::now();
        let deadline = started + self.reconnect_timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut last: String;
        loop {
            if self.closing.load(Ordering::Acquire) {
                return None;
            }
            match handshake::connect(&self.uri, &self.tcp_addrs) {
                Ok((stream, info)) if info.size_bytes == self.export.size_bytes => {
                    return Some(stream)
                }
                Ok((stream, info)) => {
                    stream.shutdown();
                    last = format!(
                        "the export came back with {} bytes instead of {}",
                        info.size_bytes, self.export.size_bytes
                    );
                }
                Err(e) if !e.retryable => {
                    last = e.message;
                    break;
                }
                Err(e) => last = e.message,
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            log::info!("NBD server {}: reconnect attempt failed: {last}", self.uri);
            // Sleep in short steps so that closing is noticed promptly.
            let until = (now + backoff).min(deadline);
            while Instant::now() < until && !self.closing.load(Ordering::Acquire) {
                std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        let message = format!(
            "the NBD server {} is unreachable: the connection dropped ({cause}) and reconnecting failed for {:.1} s (last error: {last}); check the server, or give it more time with ,timeout=SECONDS",
            self.uri,
            started.elapsed().as_secs_f64()
        );
        log::error!("{message}");
        let mut state = lock(&self.state);
        state.dead = Some(message.clone());
        // Taken before the outcomes are set: it lists the waiting ones.
        let waiters = state.waiters();
        for r in state.requests.values_mut() {
            if r.outcome.is_none() {
                r.outcome = Some(Outcome::Dead {
                    message: message.clone(),
                });
                r.waiter.one_done();
            }
        }
        drop(state);
        for w in waiters {
            w.cond.notify_one();
        }
        None
    }

    /// Reads one simple reply and records it.
    fn read_reply(&self, stream: &mut Stream, generation: u64) -> io::Result<()> {
        let mut header = [0u8; 16];
        stream.read_exact(&mut header)?;
        let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
        let errno = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes"));
        let cookie = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad reply magic {magic:#x} (a structured reply we did not ask for?)"),
            ));
        }
        let (command, len_bytes, buf) = {
            let state = lock(&self.state);
            match state.requests.get(&cookie) {
                Some(r) if r.outcome.is_none() && r.sent_generation == generation => {
                    (r.command, r.len_bytes, r.buf)
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("reply to unknown cookie {cookie:#x}"),
                    ))
                }
            }
        };
        if command == Command::Read && errno == 0 {
            // SAFETY: `run`'s contract keeps a read's buffer valid, writable
            // and unaliased until its outcome is taken; the outcome is set
            // only below, after this read, by this thread.
            let dest = unsafe { std::slice::from_raw_parts_mut(buf.0, len_bytes as usize) };
            stream.read_exact(dest)?;
        }
        let outcome = if errno == 0 {
            Outcome::Done { generation }
        } else {
            Outcome::Failed {
                errno: errno_of(errno),
            }
        };
        let finished = {
            let mut state = lock(&self.state);
            state.requests.get_mut(&cookie).and_then(|r| {
                r.outcome = Some(outcome);
                r.waiter.one_done().then(|| Arc::clone(&r.waiter))
            })
        };
        if let Some(waiter) = finished {
            waiter.cond.notify_one();
        }
        Ok(())
    }
}

/// The local errno for an `NBD_E*` error: the protocol uses Linux's
/// numbers (EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP,
/// ESHUTDOWN); anything else is reported as EIO, as the protocol says.
fn errno_of(nbd_error: u32) -> i32 {
    match nbd_error as i32 {
        e @ (libc::EPERM
        | libc::EIO
        | libc::ENOMEM
        | libc::EINVAL
        | libc::ENOSPC
        | libc::EOVERFLOW
        | libc::ENOTSUP
        | libc::ESHUTDOWN) => e,
        _ => libc::EIO,
    }
}

fn write_all_vectored(stream: &mut Stream, header: &[u8], payload: &[u8]) -> io::Result<()> {
    let mut header = header;
    let mut payload = payload;
    while !header.is_empty() || !payload.is_empty() {
        let n = stream.write_vectored(&[IoSlice::new(header), IoSlice::new(payload)])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_header = n.min(header.len());
        header = &header[from_header..];
        payload = &payload[n - from_header..];
    }
    Ok(())
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        {
            let mut tx = lock(&self.shared.tx);
            if let Some(stream) = tx.stream.as_mut() {
                // NBD_CMD_DISC: a polite end, so the server does not log a
                // dropped client. Best effort; the shutdown follows.
                let mut header = [0u8; 28];
                header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                header[6..8].copy_from_slice(&(Command::Disconnect as u16).to_be_bytes());
                let _ = stream.write_all(&header);
                stream.shutdown();
            }
            tx.stream = None;
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
