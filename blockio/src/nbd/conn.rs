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
//! When the connection drops (a read or write on the socket fails: EOF,
//! `ECONNRESET`, `EPIPE`, ...; or a reply breaks the protocol), the reader
//! thread reconnects with backoff until `reconnect_timeout` has passed
//! since the outage began. A server stopped the normal way (nbdkit on
//! SIGTERM) first answers what it holds with `NBD_ESHUTDOWN` and then
//! waits for its clients to leave: such a reply is no answer, the request
//! stays for the next connection; nothing more is sent on this one, and
//! once nothing sent on it lacks a reply the client disconnects
//! (`NBD_CMD_DISC`, as the protocol asks) and waits for the server to
//! close, as for a drop. The outage begins at the first drop or
//! `NBD_ESHUTDOWN` since the server last answered a request, so a server
//! that takes each new connection and then drops or refuses it is bounded
//! too. A connection that stays up but brings no reply for the whole bound
//! while requests wait (a frozen server, a host gone without a reset) is
//! taken for a drop whose outage began when the replies stopped; each
//! handshake has a deadline of its own. Meanwhile waiters
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
use super::tls::TlsSetup;
use super::uri::NbdUri;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_ESHUTDOWN`: the server is shutting down (Linux's `ESHUTDOWN`).
const NBD_ESHUTDOWN: u32 = 108;

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

/// How long the reader waits for the next reply before it looks at the
/// clock: whether a request has waited past the bound (a frozen server),
/// or a shutting-down server past its drain.
const READ_TICK: Duration = Duration::from_secs(1);

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
    /// The generation whose server answered it `NBD_ESHUTDOWN` (0: none):
    /// no answer, it goes out again on the next connection.
    refused_generation: u64,
    /// When it was last sent: a request without a reply for the whole
    /// bound means the server is gone, even if its connection is not.
    sent_at: Instant,
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
    /// The generation of the connection requests may be sent on; 0 while
    /// there is none (disconnected, or the server is shutting down).
    generation: u64,
    /// Set once the reconnection bound has passed.
    dead: Option<String>,
}

impl State {
    /// Requests sent on connection `generation` that wait for its reply.
    fn in_flight_on(&self, generation: u64) -> usize {
        self.requests
            .values()
            .filter(|r| {
                r.outcome.is_none()
                    && r.sent_generation == generation
                    && r.refused_generation != generation
            })
            .count()
    }

    /// When the longest-waiting request in flight on `generation` was sent.
    fn oldest_in_flight_on(&self, generation: u64) -> Option<Instant> {
        self.requests
            .values()
            .filter(|r| {
                r.outcome.is_none()
                    && r.sent_generation == generation
                    && r.refused_generation != generation
            })
            .map(|r| r.sent_at)
            .min()
    }

    /// Whether any request waits for an outcome.
    fn any_waiting(&self) -> bool {
        self.requests.values().any(|r| r.outcome.is_none())
    }

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
    /// The TLS settings, certificates read at open (`None`: in the clear).
    tls: Option<TlsSetup>,
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
        let tls = TlsSetup::load(uri)?;
        let (stream, export) = handshake::connect(uri, &tcp_addrs, tls.as_ref(), reconnect_timeout)
            .map_err(|e| e.message)?;
        let reader_stream = stream
            .try_clone()
            .map_err(|e| format!("cannot duplicate the socket: {e}"))?;
        let shared = Arc::new(Shared {
            uri: uri.clone(),
            tcp_addrs,
            tls,
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
                            refused_generation: 0,
                            sent_at: Instant::now(),
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
                if state.generation != generation {
                    // The reader has declared this connection lost or its
                    // server shutting down: the request waits for the
                    // next one.
                    return;
                }
                let Some(r) = state.requests.get_mut(&cookie) else {
                    continue;
                };
                if r.outcome.is_some() || r.sent_generation == generation {
                    continue;
                }
                r.sent_generation = generation;
                r.sent_at = Instant::now();
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

    /// The reader thread: replies until the connection ends, then a
    /// reconnection, until the client closes or gives up.
    fn read_loop(&self, mut stream: Stream, mut generation: u64) {
        // When the current outage began: None while the server answers.
        let mut outage_since: Option<Instant> = None;
        loop {
            // Whether this connection already counts in DISCONNECTED_CLIENTS
            // (from its server's NBD_ESHUTDOWN on).
            let mut counted = false;
            let error = self.serve(&mut stream, generation, &mut outage_since, &mut counted);
            if self.closing.load(Ordering::Acquire) {
                if counted {
                    DISCONNECTED_CLIENTS.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
            stream.shutdown();
            let started = *outage_since.get_or_insert_with(Instant::now);
            let left = (started + self.reconnect_timeout).saturating_duration_since(Instant::now());
            log::warn!(
                "NBD server {}: connection lost ({error}); reconnecting for up to {:.1} s",
                self.uri,
                left.as_secs_f64()
            );
            {
                let mut tx = lock(&self.tx);
                tx.usable = false;
                if let Some(s) = tx.stream.take() {
                    s.shutdown();
                }
            }
            lock(&self.state).generation = 0;
            if !counted {
                DISCONNECTED_CLIENTS.fetch_add(1, Ordering::Relaxed);
            }
            let reconnected = self.reconnect(&error, started);
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
                if !state.any_waiting() {
                    // Nothing to prove the server with: as far as anyone
                    // knows it is back, and a later drop is a new outage.
                    outage_since = None;
                }
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

    /// Reads the replies of connection `generation` until it ends, and
    /// returns how it ended. A reply to any request ends an outage
    /// (`outage_since`). An `NBD_ESHUTDOWN` reply begins one: nothing more
    /// is sent on this connection, and once nothing sent on it waits for
    /// a reply the client disconnects softly and reads on until the server
    /// closes (or, for a server that never does, until the outage's bound).
    fn serve(
        &self,
        stream: &mut Stream,
        generation: u64,
        outage_since: &mut Option<Instant>,
        counted: &mut bool,
    ) -> io::Error {
        let mut shutting_down = false;
        let mut disconnected = false;
        // Until when a shutting-down server may take to close.
        let mut drain_deadline = None;
        // When the server last replied: a server whose replies keep coming
        // is slow at worst, however long its queue makes a request wait.
        let mut last_reply = Instant::now();
        loop {
            let reply = self.read_reply(stream, generation);
            if matches!(reply, Ok(Reply::Answered | Reply::ShuttingDown)) {
                last_reply = Instant::now();
            }
            match reply {
                Ok(Reply::Answered) if !shutting_down => *outage_since = None,
                Ok(Reply::Answered) => {}
                Ok(Reply::Nothing) => {
                    if let Some(deadline) = drain_deadline {
                        if Instant::now() >= deadline {
                            return io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the server answered NBD_ESHUTDOWN but kept the connection open",
                            );
                        }
                    } else if let Some(oldest) = lock(&self.state).oldest_in_flight_on(generation) {
                        // Silent since the later of its last reply and the
                        // oldest request waiting for one.
                        let silent_since = oldest.max(last_reply);
                        let silent = silent_since.elapsed();
                        if silent >= self.reconnect_timeout {
                            // The outage began when the server fell silent:
                            // the bound is spent already.
                            outage_since.get_or_insert(silent_since);
                            return io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!(
                                    "no reply for {:.1} s with requests waiting: the server is frozen, or its host is gone",
                                    silent.as_secs_f64()
                                ),
                            );
                        }
                    }
                }
                Ok(Reply::ShuttingDown) if !shutting_down => {
                    shutting_down = true;
                    let started = *outage_since.get_or_insert_with(Instant::now);
                    // Senders check this under the state lock before they
                    // mark a request sent, so from here the requests in
                    // flight on this connection only decrease.
                    lock(&self.state).generation = 0;
                    DISCONNECTED_CLIENTS.fetch_add(1, Ordering::Relaxed);
                    *counted = true;
                    log::warn!(
                        "NBD server {}: the server is shutting down (it answered NBD_ESHUTDOWN); requests without a reply wait for it to come back and are sent again",
                        self.uri
                    );
                    drain_deadline = Some(started + self.reconnect_timeout);
                }
                Ok(Reply::ShuttingDown) => {}
                Err(e) if shutting_down => {
                    return match e.kind() {
                        io::ErrorKind::UnexpectedEof => io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "the server shut down: it answered NBD_ESHUTDOWN, then closed",
                        ),
                        _ => e,
                    };
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::TimedOut {
                        // Stalled mid-reply for the whole bound, or TCP gave
                        // up on the peer: the outage began that long ago.
                        let since = Instant::now()
                            .checked_sub(self.reconnect_timeout)
                            .unwrap_or_else(Instant::now);
                        outage_since.get_or_insert(since);
                    }
                    return e;
                }
            }
            if shutting_down && !disconnected && lock(&self.state).in_flight_on(generation) == 0 {
                self.disconnect_softly(generation);
                disconnected = true;
            }
        }
    }

    /// `NBD_CMD_DISC` on connection `generation`, after which nothing is
    /// sent on it: what the protocol asks of a client that got
    /// `NBD_ESHUTDOWN` (nbdkit waits for it before it exits). Called with
    /// nothing in flight on the connection, so no sender holds the send
    /// lock for long: none is writing a request the server has not read.
    fn disconnect_softly(&self, generation: u64) {
        let mut tx = lock(&self.tx);
        if tx.generation != generation || !tx.usable {
            return;
        }
        tx.usable = false;
        if let Some(stream) = tx.stream.as_mut() {
            // Best effort: if it fails, the server's close or the outage's
            // bound ends the connection all the same.
            let _ = stream.write_all(&disconnect_request());
        }
    }

    /// Tries to connect again with backoff until the bound passes, counted
    /// from `started`, when the outage began. `None`: the client is
    /// closing, or gave up (every request is failed then).
    fn reconnect(&self, cause: &io::Error, started: Instant) -> Option<Stream> {
        let deadline = started + self.reconnect_timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut last = String::from("none made: the outage had lasted the whole bound");
        loop {
            if self.closing.load(Ordering::Acquire) {
                return None;
            }
            if Instant::now() >= deadline {
                break;
            }
            match handshake::connect_by(
                &self.uri,
                &self.tcp_addrs,
                self.tls.as_ref(),
                deadline,
                self.reconnect_timeout,
            ) {
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
            // Sleep in short steps so that closing is noticed promptly.
            let until = (now + backoff).min(deadline);
            while Instant::now() < until && !self.closing.load(Ordering::Acquire) {
                std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        let message = format!(
            "the NBD server {} is unreachable: the connection was lost ({cause}) and reconnecting failed for {:.1} s (last attempt: {last}); check the server, or give it more time with ,timeout=SECONDS",
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

    /// Reads one simple reply and records it. An `NBD_ESHUTDOWN` error is
    /// no outcome: the request is marked for sending again. Nothing within
    /// [`READ_TICK`] is [`Reply::Nothing`]; once a reply has begun, the
    /// rest of it may take up to the bound between bytes, and a server
    /// that stalls longer in the middle of a reply has gone.
    fn read_reply(&self, stream: &mut Stream, generation: u64) -> io::Result<Reply> {
        let mut header = [0u8; 16];
        stream.set_read_timeout(Some(READ_TICK))?;
        let first = match stream.read(&mut header) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(Reply::Nothing)
            }
            Err(e) => return Err(e),
        };
        stream.set_read_timeout(Some(self.reconnect_timeout))?;
        let stalled = |e: io::Error| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the server stalled for {:.1} s in the middle of a reply: it is frozen, or its host is gone",
                        self.reconnect_timeout.as_secs_f64()
                    ),
                )
            } else {
                e
            }
        };
        stream.read_exact(&mut header[first..]).map_err(stalled)?;
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
            let mut state = lock(&self.state);
            match state.requests.get_mut(&cookie) {
                Some(r)
                    if r.outcome.is_none()
                        && r.sent_generation == generation
                        && r.refused_generation != generation =>
                {
                    if errno == NBD_ESHUTDOWN {
                        r.refused_generation = generation;
                        return Ok(Reply::ShuttingDown);
                    }
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
            stream.read_exact(dest).map_err(stalled)?;
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
        Ok(Reply::Answered)
    }
}

/// What one reply was.
enum Reply {
    /// The request has its outcome.
    Answered,
    /// `NBD_ESHUTDOWN`: the server is going away; the request is to be
    /// sent again on the next connection.
    ShuttingDown,
    /// No reply began within [`READ_TICK`].
    Nothing,
}

/// `NBD_CMD_DISC`: the client's end of a connection (no reply comes).
fn disconnect_request() -> [u8; 28] {
    let mut header = [0u8; 28];
    header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    header[6..8].copy_from_slice(&(Command::Disconnect as u16).to_be_bytes());
    header
}

/// The local errno for an `NBD_E*` error: the protocol uses Linux's
/// numbers (EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP);
/// anything else is reported as EIO, as the protocol says. (ESHUTDOWN is
/// no error of the request: `read_reply` has it sent again.)
fn errno_of(nbd_error: u32) -> i32 {
    match nbd_error as i32 {
        e @ (libc::EPERM
        | libc::EIO
        | libc::ENOMEM
        | libc::EINVAL
        | libc::ENOSPC
        | libc::EOVERFLOW
        | libc::ENOTSUP) => e,
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
                let _ = stream.write_all(&disconnect_request());
                stream.shutdown();
            }
            tx.stream = None;
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
