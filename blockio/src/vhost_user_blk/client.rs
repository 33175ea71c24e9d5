//! The client: requests from any number of threads, placed on the request
//! queues of the current session, completed by one worker thread, and
//! placed again on a new session after the backend came back.
//!
//! Requests live in one table under one lock with their outcome. A caller
//! takes data pages in the shared area for its own requests, copies a
//! write's data in, places the chains, kicks, and waits; the worker waits
//! on the call eventfds and the socket, takes used chains, frees a
//! write's pages and wakes the callers; a caller copies its read's data
//! out of the pages and then frees them. The copies run without the
//! lock, on the threads that asked for the I/O: a 2 MiB copy takes about
//! 0.2 ms here, and with the copies under the lock an evictor placing a
//! batch of eight writes held every fault's read (its placement, and the
//! worker's completion of it) for over a millisecond, while one worker
//! thread made every read's copy. Measured on seqwrite (2 vCPUs, 256 MiB
//! limit), this alone changed nothing: 2.81-2.85 s against 2.77-2.92 s;
//! what the store's 2 MiB requests wait on is the backend's pinning of
//! 4 KiB pages ([`super::shared`]). A request whose chain
//! was never completed when its session ended (the backend died, or kept
//! it past the timeout) loses its placement and is placed again by its
//! caller on the next session: the backend (QEMU's among them) offers no
//! in-flight tracking, and a request re-sent whole is the same request. A
//! unit's write and its read never overlap another request's sectors in
//! flight (the store writes a slot only while it owns it), so requests may
//! finish in any order.
//!
//! Each session has its own shared memory: a backend that went away but
//! still holds the old mapping (one that hung) can only write into memory
//! this client no longer uses.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::blk::{header, range, status, RequestType, HEADER_BYTES, RANGE_BYTES, SECTOR_BYTES};
use super::ring::Segment;
use super::session::{connect, Session, Want};
use super::shared::{SharedArea, DATA_PAGE_BYTES};
use super::watchdog::Watchdog;

/// How often the worker looks at the clock while nothing happens.
const TICK: Duration = Duration::from_millis(100);

/// Status byte value written before a chain goes out: a backend that
/// reports a chain used without writing its status is caught.
const STATUS_UNSET: u8 = 0xff;

/// One request: a piece of a caller's op, a flush, or one range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    /// What is asked.
    pub(crate) kind: RequestType,
    /// First sector.
    pub(crate) sector: u64,
    /// The caller's buffer (reads and writes), valid while it waits.
    pub(crate) buf: CallerBuf,
    /// Bytes of data (reads and writes).
    pub(crate) len_bytes: usize,
    /// Sectors of a discard or write-zeroes range.
    pub(crate) range_sectors: u32,
}

/// A caller's buffer address. Sent to the worker, which copies a read's
/// data into it while the caller waits for that very request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallerBuf(pub(crate) *mut u8);

// SAFETY: the pointer is only dereferenced while its caller is blocked in
// `Client::run` waiting for the request (the contract of `run`).
unsafe impl Send for CallerBuf {}

/// The outcome of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Completed without error on session `generation`.
    Done {
        /// The session it completed on.
        generation: u64,
    },
    /// The backend answered with an error status; the errno says which.
    Failed {
        /// `EIO` for `VIRTIO_BLK_S_IOERR`, `EOPNOTSUPP` for `UNSUPP`.
        errno: i32,
        /// What the backend did.
        message: String,
    },
    /// The client gave up on the backend; the message says why.
    Dead {
        /// Why.
        message: String,
    },
}

/// A placed request: its chain is on a ring of the current session.
#[derive(Clone, Copy, Debug)]
struct Placement {
    since: Instant,
}

/// The data pages a read or write holds in one session's shared area:
/// taken before a write's data is copied in, given back when a write
/// completes or after a read's data is copied out.
#[derive(Clone)]
struct Staged {
    /// The area, held here so a copy without the lock stays inside a
    /// mapping even if the worker ends the session meanwhile.
    area: Arc<SharedArea>,
    /// The session the pages belong to: pages of an ended session are
    /// not given back (its allocation ended with it).
    generation: u64,
    first_page: usize,
    pages: usize,
    /// The offset of the first page in the area.
    offset_bytes: usize,
    /// The data is in the pages (a write's copied in; always for reads).
    ready: bool,
}

struct Request {
    piece: Piece,
    staged: Option<Staged>,
    placement: Option<Placement>,
    outcome: Option<Outcome>,
}

impl Request {
    /// Whether the request moves data through the shared area.
    fn has_data(&self) -> bool {
        matches!(self.piece.kind, RequestType::In | RequestType::Out) && self.piece.len_bytes > 0
    }
}

/// A copy between a caller's buffer and the shared area, done without
/// the lock.
struct DataCopy {
    id: u64,
    /// Into the area (a write's data) or out of it (a read's).
    into_area: bool,
    area: Arc<SharedArea>,
    offset_bytes: usize,
    buf: CallerBuf,
    len_bytes: usize,
}

impl DataCopy {
    /// Copies.
    ///
    /// # Safety
    ///
    /// The caller's buffer is valid for `len_bytes` (readable into the
    /// area, writable and unaliased out of it), and the area's pages are
    /// held by this copy's request, so nothing else writes them.
    unsafe fn run(&self) {
        let at = self.area.at(self.offset_bytes);
        // SAFETY: the buffer per the contract; `at` lies inside the held
        // area (`Staged` took the pages inside it) for len_bytes.
        unsafe {
            if self.into_area {
                std::ptr::copy_nonoverlapping(self.buf.0, at, self.len_bytes);
            } else {
                std::ptr::copy_nonoverlapping(at, self.buf.0, self.len_bytes);
            }
        }
    }
}

struct State {
    session: Option<Session>,
    /// Counts sessions; a request completed on an older one than a flush
    /// may not be covered by it.
    generation: u64,
    /// Set once the client gave up: every request fails with it.
    dead: Option<String>,
    closing: bool,
    requests: HashMap<u64, Request>,
    next_id: u64,
    /// Placed requests by (queue, head).
    by_head: HashMap<(usize, u16), u64>,
    next_queue: usize,
}

/// What a reconnected backend must still be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    /// Capacity in bytes.
    pub(crate) capacity_bytes: u64,
    /// Block size in bytes.
    pub(crate) blk_size_bytes: u32,
    /// Acked features.
    pub(crate) features: u64,
    /// Largest piece of data one request carries.
    pub(crate) max_piece_bytes: usize,
    /// Most sectors of one discard range (0: none).
    pub(crate) max_discard_sectors: u32,
    /// Most sectors of one write-zeroes range (0: none).
    pub(crate) max_write_zeroes_sectors: u32,
}

struct Inner {
    dog: Watchdog,
    path: PathBuf,
    want: Want,
    timeout: Duration,
    device: Device,
    state: Mutex<State>,
    changed: Condvar,
    completed: AtomicU64,
    /// Why the first session's shared buffers are in 4 KiB pages, if
    /// they are.
    small_pages_why: Option<String>,
}

/// The worker thread's setup hook (a seccomp filter in the VMM).
type ThreadSetup = Box<dyn Fn() + Send + Sync>;
static WORKER_SETUP: OnceLock<ThreadSetup> = OnceLock::new();

/// Sets the function each vhost-user-blk client's worker thread runs
/// before anything else, once per process (a second call is ignored and
/// returns false). The worker reconnects, so it makes sockets, memfds and
/// shared mappings, which no other thread of the VMM may; the same hook
/// runs on the client's setup watchdog thread, which shuts a socket down.
pub fn set_worker_thread_setup(setup: impl Fn() + Send + Sync + 'static) -> bool {
    WORKER_SETUP.set(Box::new(setup)).is_ok()
}

/// Clients of this process whose backend is gone and being reconnected.
static DISCONNECTED_CLIENTS: AtomicU64 = AtomicU64::new(0);

/// How many vhost-user-blk clients of this process are reconnecting now:
/// their callers are blocked until the backend is back or the bound passes.
pub fn clients_reconnecting() -> u64 {
    DISCONNECTED_CLIENTS.load(Ordering::Relaxed)
}

/// A vhost-user-blk client; see the module docs.
pub struct Client {
    inner: Arc<Inner>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("vhost_user_blk::Client")
            .field("path", &self.inner.path)
            .field("device", &self.inner.device)
            .finish()
    }
}

fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Client {
    /// Connects to the backend at `path`; `timeout` bounds both how long a
    /// request may go unanswered and how long a lost backend is retried.
    pub(crate) fn connect(
        path: &Path,
        want: Want,
        timeout: Duration,
        max_piece_bytes: usize,
    ) -> Result<Client, String> {
        let dog = Watchdog::start(|| {
            if let Some(setup) = WORKER_SETUP.get() {
                setup();
            }
        })
        .map_err(|e| format!("cannot start the setup watchdog thread: {e}"))?;
        let session = connect(path, want, &dog)?;
        let small_pages_why = session.area.small_pages_why().map(str::to_owned);
        if let Some(why) = &small_pages_why {
            log::warn!(
                "vhost-user-blk backend {}: the buffers shared with it are in 4 KiB pages, so each 2 MiB request is 512 pages for the backend to pin and a slower I/O: {why}",
                path.display()
            );
        }
        let config = session.config;
        let size_max = match config.size_max_bytes {
            0 => usize::MAX,
            n => n as usize / DATA_PAGE_BYTES * DATA_PAGE_BYTES,
        };
        let device = Device {
            capacity_bytes: config.capacity_bytes(),
            blk_size_bytes: config.blk_size_bytes,
            features: session.features,
            max_piece_bytes: max_piece_bytes
                .min(size_max)
                .min(session.data.pages() / 2 * DATA_PAGE_BYTES)
                .max(DATA_PAGE_BYTES),
            max_discard_sectors: config.max_discard_sectors,
            max_write_zeroes_sectors: config.max_write_zeroes_sectors,
        };
        let inner = Arc::new(Inner {
            dog,
            path: path.to_path_buf(),
            want,
            timeout,
            device,
            state: Mutex::new(State {
                session: Some(session),
                generation: 1,
                dead: None,
                closing: false,
                requests: HashMap::new(),
                next_id: 0,
                by_head: HashMap::new(),
                next_queue: 0,
            }),
            changed: Condvar::new(),
            completed: AtomicU64::new(0),
            small_pages_why,
        });
        let worker = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("vhost-user-blk".into())
                .spawn(move || {
                    if let Some(setup) = WORKER_SETUP.get() {
                        setup();
                    }
                    worker(&inner);
                })
                .map_err(|e| format!("cannot start the completion thread: {e}"))?
        };
        Ok(Client {
            inner,
            worker: Some(worker),
        })
    }

    /// What the backend is.
    pub(crate) fn device(&self) -> Device {
        self.inner.device
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether the backend acked `bit`.
    pub(crate) fn has(&self, bit: u64) -> bool {
        self.inner.device.features & bit != 0
    }

    /// Sessions so far: 1 plus the reconnects.
    pub(crate) fn sessions(&self) -> u64 {
        lock(&self.inner).generation
    }

    /// Why the first session's buffers shared with the backend are in
    /// 4 KiB pages (the host's hugetlb pool had none free, which makes
    /// every 2 MiB request slower); `None` when they are in 2 MiB pages.
    pub fn small_pages_why(&self) -> Option<&str> {
        self.inner.small_pages_why.as_deref()
    }

    /// Requests completed so far (for tests and stats).
    pub(crate) fn completed(&self) -> u64 {
        self.inner.completed.load(Ordering::Relaxed)
    }

    /// Runs `pieces` and returns one outcome each, in order, once all have
    /// one.
    ///
    /// # Safety
    ///
    /// Each piece's buffer must be valid for `len_bytes` for the whole
    /// call: readable for writes, writable and not accessed by anything
    /// else for reads.
    pub(crate) unsafe fn run(&self, pieces: &[Piece]) -> Vec<Outcome> {
        let inner = &*self.inner;
        let mut state = lock(inner);
        let first = state.next_id;
        state.next_id += pieces.len() as u64;
        for (k, piece) in pieces.iter().enumerate() {
            state.requests.insert(
                first + k as u64,
                Request {
                    piece: *piece,
                    staged: None,
                    placement: None,
                    outcome: None,
                },
            );
        }
        let ids: Vec<u64> = (first..first + pieces.len() as u64).collect();
        loop {
            if let Some(message) = state.dead.clone() {
                for id in &ids {
                    let request = state.requests.get_mut(id).expect("ours");
                    if request.outcome.is_none() && request.placement.is_none() {
                        request.outcome = Some(Outcome::Dead {
                            message: message.clone(),
                        });
                    }
                }
            }
            let copies = stage(inner, &mut state, &ids);
            if !copies.is_empty() {
                drop(state);
                for copy in &copies {
                    // SAFETY: the buffers per run's contract; the pages
                    // are the request's own (stage took them for it).
                    unsafe { copy.run() };
                }
                state = lock(inner);
                copied(inner, &mut state, &copies);
                continue;
            }
            let mut kicks = Vec::new();
            if state.session.is_some() {
                for id in &ids {
                    let request = &state.requests[id];
                    if request.outcome.is_some() || request.placement.is_some() {
                        continue;
                    }
                    if request.has_data() && !request.staged.as_ref().is_some_and(|s| s.ready) {
                        // Placement keeps the order: this one's pages
                        // come first.
                        break;
                    }
                    match place(&mut state, *id) {
                        Some(queue) => {
                            if !kicks.contains(&queue) {
                                kicks.push(queue);
                            }
                        }
                        // No room now: what is placed frees some as it
                        // completes.
                        None => break,
                    }
                }
            }
            if let Some(session) = &state.session {
                for q in kicks {
                    let queue = &session.queues[q];
                    queue.ring.before_kick();
                    // A failed kick (never seen; the eventfd is ours) would
                    // show as the request timing out and being re-sent.
                    let _ = queue.kick.write(1);
                }
            }
            if ids.iter().all(|id| {
                let request = &state.requests[id];
                request.outcome.is_some() && request.staged.is_none()
            }) {
                break;
            }
            state = inner
                .changed
                .wait_timeout(state, TICK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        ids.iter()
            .map(|id| {
                state
                    .requests
                    .remove(id)
                    .and_then(|r| r.outcome)
                    .expect("every request has an outcome")
            })
            .collect()
    }
}

/// Gives `staged`'s pages back to the current session's allocation, if
/// they are of it (the pages of an ended session went with it); whether
/// they were.
fn give_back(state: &mut State, staged: &Staged) -> bool {
    match state.session.as_mut() {
        Some(session) if staged.generation == state.generation => {
            session.data.give_back(staged.first_page, staged.pages);
            true
        }
        _ => false,
    }
}

/// The page work of the requests `ids` that can be done now, under the
/// lock: pages of finished or stale requests given back, pages taken for
/// the next requests in order; and the copies to do without the lock:
/// writes' data into their new pages, completed reads' data out.
fn stage(inner: &Inner, state: &mut State, ids: &[u64]) -> Vec<DataCopy> {
    let mut copies = Vec::new();
    let mut freed = false;
    let mut taking = true;
    for id in ids {
        let generation = state.generation;
        let request = state.requests.get_mut(id).expect("ours");
        let stale = request
            .staged
            .as_ref()
            .is_some_and(|s| s.generation != generation && request.placement.is_none());
        let done_read = matches!(request.outcome, Some(Outcome::Done { .. }))
            && request.piece.kind == RequestType::In;
        if let Some(staged) = &request.staged {
            if done_read {
                copies.push(DataCopy {
                    id: *id,
                    into_area: false,
                    area: Arc::clone(&staged.area),
                    offset_bytes: staged.offset_bytes,
                    buf: request.piece.buf,
                    len_bytes: request.piece.len_bytes,
                });
                continue;
            }
            if request.outcome.is_some() || stale {
                // Finished without data to copy out, or its pages belong
                // to a session that ended before it completed: placed
                // again, it needs pages of the current one.
                let staged = request.staged.take().expect("checked");
                freed |= give_back(state, &staged);
            }
        }
        let request = &state.requests[id];
        if !taking || !request.has_data() || request.outcome.is_some() || request.staged.is_some() {
            continue;
        }
        let Some(session) = state.session.as_mut() else {
            taking = false;
            continue;
        };
        let pages = request.piece.len_bytes.div_ceil(DATA_PAGE_BYTES);
        let Some(first_page) = session.data.take(pages) else {
            // In order: later requests wait for this one's pages.
            taking = false;
            continue;
        };
        let staged = Staged {
            area: Arc::clone(&session.area),
            generation: state.generation,
            first_page,
            pages,
            offset_bytes: session.data_offset + first_page * DATA_PAGE_BYTES,
            ready: request.piece.kind == RequestType::In,
        };
        if !staged.ready {
            copies.push(DataCopy {
                id: *id,
                into_area: true,
                area: Arc::clone(&staged.area),
                offset_bytes: staged.offset_bytes,
                buf: request.piece.buf,
                len_bytes: request.piece.len_bytes,
            });
        }
        state.requests.get_mut(id).expect("ours").staged = Some(staged);
    }
    if freed {
        inner.changed.notify_all();
    }
    copies
}

/// After `copies` ran: writes' pages are ready to be placed, reads' pages
/// are given back.
fn copied(inner: &Inner, state: &mut State, copies: &[DataCopy]) {
    let mut freed = false;
    for copy in copies {
        let request = state.requests.get_mut(&copy.id).expect("ours");
        if copy.into_area {
            if let Some(staged) = request.staged.as_mut() {
                staged.ready = true;
            }
        } else if let Some(staged) = request.staged.take() {
            freed |= give_back(state, &staged);
        }
    }
    if freed {
        inner.changed.notify_all();
    }
}

/// Places request `id`, whose data (if any) is staged and ready in the
/// current session's area, on a queue of that session: header and status
/// written, chain published. The queue, or `None` when no queue has room
/// for the chain now.
fn place(state: &mut State, id: u64) -> Option<usize> {
    let generation_queues = state.session.as_ref()?.queues.len();
    let piece = state.requests[&id].piece;
    let data_offset = state.requests[&id].staged.as_ref().map(|s| s.offset_bytes);
    let chain_len = match piece.kind {
        RequestType::Flush => 2,
        _ => 3,
    };
    let start = state.next_queue;
    let queue = (0..generation_queues)
        .map(|k| (start + k) % generation_queues)
        .find(|&q| {
            state.session.as_ref().expect("checked").queues[q]
                .ring
                .free_descriptors()
                >= chain_len
        })?;
    let session = state.session.as_mut().expect("checked");
    let head = session.queues[queue]
        .ring
        .peek_head()
        .expect("descriptors counted");
    let head_area = session.head_area(queue, head);
    let header_bytes = header(piece.kind, piece.sector);
    let range_bytes = range(piece.sector, piece.range_sectors);
    // SAFETY: the head's area belongs to the head, which is free (it is
    // the next descriptor the ring hands out), inside the shared area.
    unsafe {
        std::ptr::copy_nonoverlapping(
            header_bytes.as_ptr(),
            session.area.at(head_area),
            HEADER_BYTES,
        );
        std::ptr::copy_nonoverlapping(
            range_bytes.as_ptr(),
            session.area.at(head_area + 16),
            RANGE_BYTES,
        );
        session.area.at(head_area + 32).write_volatile(STATUS_UNSET);
    }
    let header_seg = Segment {
        addr: head_area as u64,
        len_bytes: HEADER_BYTES as u32,
        device_writes: false,
    };
    let status_seg = Segment {
        addr: head_area as u64 + 32,
        len_bytes: 1,
        device_writes: true,
    };
    let mut segments = vec![header_seg];
    match piece.kind {
        RequestType::In | RequestType::Out => segments.push(Segment {
            // A request without data (zero bytes) points at the data
            // area's start, with no length.
            addr: data_offset.unwrap_or(session.data_offset) as u64,
            len_bytes: piece.len_bytes as u32,
            device_writes: piece.kind == RequestType::In,
        }),
        RequestType::Discard | RequestType::WriteZeroes => segments.push(Segment {
            addr: head_area as u64 + 16,
            len_bytes: RANGE_BYTES as u32,
            device_writes: false,
        }),
        RequestType::Flush => {}
    }
    segments.push(status_seg);
    let published = session.queues[queue]
        .ring
        .publish(&segments)
        .expect("descriptors counted");
    debug_assert_eq!(published, head);
    state.next_queue = (queue + 1) % generation_queues;
    state.by_head.insert((queue, head), id);
    state.requests.get_mut(&id).expect("ours").placement = Some(Placement {
        since: Instant::now(),
    });
    Some(queue)
}

/// Takes every used chain of the session, completing its request; how
/// many, or how the backend broke the protocol.
fn reap(inner: &Inner, state: &mut State) -> Result<usize, String> {
    let mut done = 0;
    let generation = state.generation;
    let Some(session) = state.session.as_mut() else {
        return Ok(0);
    };
    for q in 0..session.queues.len() {
        // Drained first: a call that comes after is for chains used after
        // this drain, and the loop below sees those before the next wait.
        let _ = session.queues[q].call.read();
        while let Some(used) = session.queues[q]
            .ring
            .take_used()
            .map_err(|e| format!("queue {q}: {e}"))?
        {
            let id = state
                .by_head
                .remove(&(q, used.head))
                .expect("the ring's chains in flight are placed requests");
            let request = state.requests.get_mut(&id).expect("placed requests exist");
            request.placement.take().expect("placed");
            let head_area = session.head_area(q, used.head);
            // SAFETY: the status byte of a chain the backend returned.
            let status_byte = unsafe { session.area.at(head_area + 32).read_volatile() };
            let piece = request.piece;
            let outcome = match status_byte {
                status::OK if piece.kind == RequestType::In
                    && used.written_bytes as usize != piece.len_bytes + 1 =>
                {
                    Outcome::Failed {
                        errno: libc::EIO,
                        message: format!(
                            "the backend reported {} of {} bytes read",
                            u64::from(used.written_bytes).saturating_sub(1),
                            piece.len_bytes
                        ),
                    }
                }
                // A read's data is copied out by its caller, which then
                // gives its pages back.
                status::OK => Outcome::Done { generation },
                status::UNSUPP => Outcome::Failed {
                    errno: libc::EOPNOTSUPP,
                    message: format!("the backend does not support {}", piece.kind.name()),
                },
                status::IOERR => Outcome::Failed {
                    errno: libc::EIO,
                    message: format!("the backend's {} failed (VIRTIO_BLK_S_IOERR)", piece.kind.name()),
                },
                other => Outcome::Failed {
                    errno: libc::EIO,
                    message: format!(
                        "the backend returned {} with status {other:#x}, which is none of virtio-blk's",
                        piece.kind.name()
                    ),
                },
            };
            let keeps_pages =
                piece.kind == RequestType::In && matches!(outcome, Outcome::Done { .. });
            if !keeps_pages {
                // Nothing to copy out: the pages are free as of now (the
                // caller copies nothing into a placed request's pages).
                if let Some(staged) = request.staged.take() {
                    session.data.give_back(staged.first_page, staged.pages);
                }
            }
            request.outcome = Some(outcome);
            done += 1;
        }
    }
    inner.completed.fetch_add(done as u64, Ordering::Relaxed);
    Ok(done)
}

/// Why the session must go, if it must: the socket hung up, or a request
/// has been in flight longer than the timeout.
fn broken(inner: &Inner, state: &State, hung_up: bool) -> Option<String> {
    if hung_up {
        return Some("the backend closed the connection".into());
    }
    let oldest = state
        .requests
        .values()
        .filter_map(|r| r.placement.map(|p| p.since))
        .min()?;
    (oldest.elapsed() > inner.timeout).then(|| {
        format!(
            "a request went unanswered for {:.0} s (timeout={})",
            oldest.elapsed().as_secs_f64(),
            inner.timeout.as_secs()
        )
    })
}

/// Ends the session: requests in flight lose their placement, to be
/// placed again on the next one.
fn drop_session(state: &mut State) {
    state.session = None;
    state.by_head.clear();
    for request in state.requests.values_mut() {
        request.placement = None;
    }
}

/// Waits up to [`TICK`] for a call on any queue or a hang-up of the
/// socket; whether the socket hung up.
fn wait_for_event(fds: &[i32]) -> bool {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .enumerate()
        .map(|(k, &fd)| libc::pollfd {
            fd,
            // The socket (first) is watched for a hang-up only: the
            // backend sends nothing unasked (no backend requests acked).
            events: if k == 0 {
                libc::POLLRDHUP
            } else {
                libc::POLLIN
            },
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes the array we own, of that length.
    let rc = unsafe {
        libc::poll(
            polls.as_mut_ptr(),
            polls.len() as libc::nfds_t,
            TICK.as_millis() as i32,
        )
    };
    rc > 0
        && polls[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL)
            != 0
}

/// The worker: completions, hang-ups, timeouts, reconnects.
fn worker(inner: &Inner) {
    /// Ends the client if the worker ends for any other reason than a
    /// close (a panic): callers must not wait for completions no thread
    /// takes any more.
    struct Ended<'a>(&'a Inner);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            let mut state = lock(self.0);
            if !state.closing {
                give_up(
                    self.0,
                    &mut state,
                    "its completion thread ended unexpectedly".into(),
                );
            }
        }
    }
    let _ended = Ended(inner);
    loop {
        let fds: Option<Vec<i32>> = {
            let state = lock(inner);
            if state.closing {
                return;
            }
            state.session.as_ref().map(|s| {
                std::iter::once(s.socket_fd())
                    .chain(s.queues.iter().map(|q| q.call.as_raw_fd()))
                    .collect()
            })
        };
        let Some(fds) = fds else {
            reconnect(inner);
            continue;
        };
        // The descriptors stay open while we poll: only this thread ends
        // a session.
        let hung_up = wait_for_event(&fds);
        let mut state = lock(inner);
        match reap(inner, &mut state) {
            Ok(0) => {}
            Ok(_) => inner.changed.notify_all(),
            Err(violation) => {
                // Not reconnected: a backend that corrupts its rings cannot
                // be trusted with the next ones either.
                give_up(
                    inner,
                    &mut state,
                    format!("the backend broke the virtio protocol ({violation})"),
                );
                return;
            }
        }
        if let Some(why) = broken(inner, &state, hung_up) {
            if state.closing {
                return;
            }
            log::warn!(
                "vhost-user-blk backend {}: {why}; reconnecting (for up to {} s)",
                inner.path.display(),
                inner.timeout.as_secs()
            );
            drop_session(&mut state);
            inner.changed.notify_all();
        }
    }
}

/// Connects again until it works or the timeout passes; then the client
/// is dead.
fn reconnect(inner: &Inner) {
    DISCONNECTED_CLIENTS.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let mut last_error;
    let outcome = loop {
        if lock(inner).closing {
            break Err("the client is closing".to_string());
        }
        match connect(&inner.path, inner.want, &inner.dog) {
            Ok(session) => {
                let config = session.config;
                if config.capacity_bytes() != inner.device.capacity_bytes
                    || config.blk_size_bytes != inner.device.blk_size_bytes
                    || session.features != inner.device.features
                {
                    break Err(format!(
                        "the backend came back as another device: {} bytes in blocks of {} (features {:#x}), it was {} bytes in blocks of {} (features {:#x})",
                        config.capacity_bytes(),
                        config.blk_size_bytes,
                        session.features,
                        inner.device.capacity_bytes,
                        inner.device.blk_size_bytes,
                        inner.device.features
                    ));
                }
                break Ok(session);
            }
            Err(e) => last_error = e,
        }
        if started.elapsed() > inner.timeout {
            break Err(format!(
                "the backend could not be reached again within {} s (timeout=): {last_error}",
                inner.timeout.as_secs()
            ));
        }
        std::thread::sleep(TICK);
    };
    DISCONNECTED_CLIENTS.fetch_sub(1, Ordering::Relaxed);
    let mut state = lock(inner);
    match outcome {
        Ok(session) => {
            log::warn!(
                "vhost-user-blk backend {}: reconnected after {:.1} s; requests in flight are sent again",
                inner.path.display(),
                started.elapsed().as_secs_f64()
            );
            if let (Some(why), None) = (session.area.small_pages_why(), &inner.small_pages_why) {
                log::warn!(
                    "vhost-user-blk backend {}: the new session's shared buffers are in 4 KiB pages (the first session's were in 2 MiB pages), so its 2 MiB requests are slower: {why}",
                    inner.path.display()
                );
            }
            state.generation += 1;
            state.session = Some(session);
        }
        Err(message) => give_up(inner, &mut state, message),
    }
    inner.changed.notify_all();
}

/// Makes the client dead: the session dropped, every request and every
/// later one failing with `why`.
fn give_up(inner: &Inner, state: &mut State, why: String) {
    let message = format!("vhost-user-blk backend {}: {why}", inner.path.display());
    log::error!("{message}");
    drop_session(state);
    state.dead = Some(message);
    state.closing = true;
    inner.changed.notify_all();
}

impl Drop for Client {
    fn drop(&mut self) {
        lock(&self.inner).closing = true;
        self.inner.changed.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Sectors of `bytes`, which the caller checked are whole sectors.
pub(crate) fn sectors(bytes: u64) -> u64 {
    bytes / SECTOR_BYTES
}
