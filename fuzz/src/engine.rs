//! The swap engine against a reference model, without KVM: guest RAM is
//! an anonymous mapping served by a real `SwapEngine` (userfaultfd, fault
//! threads, evictor, the parking area, a `mem:lz4` store inside a
//! `FaultyStore`), and host threads stand in for vCPUs. The input picks
//! the swap unit (`2m`, `4k` or the default `auto`, which splits and
//! collapses chunks), whether the store is sealed (`--swap-encrypt`:
//! AES-256-GCM in place of the crc32) and whether the retry policy wraps
//! it (`RetryingStore`, as every store `hugevmm` opens is, with the
//! transient faults it must absorb: `EIO`s, checksum failures, delays),
//! then a sequence of operations: word writes and reads from several
//! threads, evictions of ranges or of everything (`--pageout`), discards
//! (the balloon), memory limit changes, and which store operations fail
//! for good. The model is what every page's first word must read; each
//! read, and every page at the end (and at a `CheckAll`), is compared with
//! it. A mismatch, a thread stuck without a reported store failure, a
//! fatal error without a lasting injected failure, or a transient fault
//! the retry layer did not absorb panics with the operations so far
//! (libFuzzer's `-minimize_crash=1` shrinks the input).
//!
//! Built on the engine's public API (`swap::engine::SwapEngine`) only,
//! like the tests in `swap/tests/`, so that it follows the engine as it
//! changes.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use guestmem::host::AnonMapping;
use swap::engine::{
    EngineConfig, ManagedRegion, MemoryKind, SwapEngine, SwapError, SwapStats, SwapUnit,
};
use swap::store::{
    Codec, Faults, FaultyStore, Integrity, MemStore, RetryPolicy, RetryingStore, Sealer,
    SharedStore, StoreReport,
};

use crate::input::{Input, InputWriter};
use guestmem::addr::RegionOffset;

/// Guest addresses start here, so that messages name a recognisable gpa.
const GPA_BASE: u64 = 0x1_0000_0000;
const PAGE: u64 = 4096;
/// Host threads touching guest memory (the vCPUs).
const WORKERS: usize = 3;
/// How long a sync waits without one more job finishing before calling
/// the workers stuck. Counted from the last progress, not from the sync's
/// start: on this 2-core host, starved by builds, a run of thrashing
/// faults at a 2-unit limit took more than 10 s in all while every fault
/// finished (single faults have taken up to 12 s under a CI build, see
/// docs/FUZZING.md), so only a minute with nothing finishing is a hang.
/// Below `tools/fuzz`'s `-timeout=300`.
const STUCK: Duration = Duration::from_secs(60);
/// How long a sync waits once the engine reported a fatal error.
const AFTER_FATAL: Duration = Duration::from_millis(300);

/// One step of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Worker `thread` writes `value` to the first word of `page`.
    Write {
        /// Worker.
        thread: usize,
        /// Page of the region.
        page: u64,
        /// Value.
        value: u64,
    },
    /// Worker `thread` reads the first word of `page` and checks it.
    Read {
        /// Worker.
        thread: usize,
        /// Page of the region.
        page: u64,
    },
    /// `evict_range` over `count` units from `unit`.
    EvictRange {
        /// First unit.
        unit: u64,
        /// Units.
        count: u64,
    },
    /// `evict_all`, what `--pageout` and `hugevmm ctl pageout` call.
    EvictAll,
    /// `discard_range` over pages `[page, page + pages)` (after the
    /// workers are idle: a write racing a discard may land either side).
    Discard {
        /// First page.
        page: u64,
        /// Pages.
        pages: u64,
    },
    /// `set_mem_limit` to `units` units, at least one (`None`: no limit).
    SetLimit {
        /// Units held at most.
        units: Option<u64>,
    },
    /// Waits until the workers are idle.
    Sync,
    /// Waits, then reads every page and checks it.
    CheckAll,
}

/// How the engine and its store are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// Swap unit.
    pub unit: SwapUnit,
    /// Fault-service threads.
    pub fault_threads: usize,
    /// Clean tracking (write-protection) on.
    pub track_clean: bool,
    /// Initial limit in units (`None`: no limit).
    pub limit_units: Option<u64>,
    /// Store failures injected. The transient ones only with `retry`.
    pub faults: Faults,
    /// The store wrapped in the retry policy (`RetryingStore`), as
    /// `hugevmm` opens every store.
    pub retry: bool,
    /// The memory store seals what it keeps (`--swap-encrypt`).
    pub sealed: bool,
}

impl Setup {
    /// Units in the region: a few 2 MiB chunks, or a few dozen pages.
    /// `auto` gets more chunks than the granularity policy's 8 stream
    /// slots: with fewer, every chunk that faults again is the last chunk
    /// of some "stream" and the policy never splits it.
    pub fn units(&self) -> u64 {
        match self.unit {
            SwapUnit::Huge2M => 6,
            SwapUnit::Auto => 12,
            SwapUnit::Small4K => 48,
        }
    }

    /// Pages in the region.
    pub fn pages(&self) -> u64 {
        self.units() * self.unit.bytes() / PAGE
    }

    /// Whether a lasting failure is injected: only then may the engine
    /// report a fatal error. Transient faults never may: the retry layer
    /// absorbs them.
    fn lasting_faults(&self) -> bool {
        let f = self.faults;
        f.read_error_after.is_some()
            || f.corrupt_after.is_some()
            || f.write_error_after.is_some()
            || f.full_after_slots.is_some()
    }
}

/// Bits of the first byte of an input. Inputs committed before bits 5 and
/// 6 existed had them clear, and decode as they did.
mod flag {
    /// The 4 KiB unit.
    pub const SMALL_4K: u8 = 1;
    /// Bits 1-2: fault threads - 1 (mod 3).
    pub const THREADS_SHIFT: u8 = 1;
    /// Clean tracking off.
    pub const NO_TRACK_CLEAN: u8 = 8;
    /// The granularity policy (`auto`), unless `SMALL_4K`.
    pub const AUTO: u8 = 16;
    /// The retry layer, and three more header bytes after the limit: the
    /// transient faults.
    pub const RETRY: u8 = 32;
    /// A sealed store.
    pub const SEALED: u8 = 64;
}

/// Decodes an input: the setup, then the operations.
pub fn decode(data: &[u8]) -> (Setup, Vec<Op>) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let unit = if flags & flag::SMALL_4K != 0 {
        SwapUnit::Small4K
    } else if flags & flag::AUTO != 0 {
        SwapUnit::Auto
    } else {
        SwapUnit::Huge2M
    };
    let fault_flags = input.u8();
    let counts = [input.u8(), input.u8(), input.u8(), input.u8()];
    let when = |bit: u8, count: u8| (fault_flags & (1 << bit) != 0).then_some(u64::from(count));
    let mut setup = Setup {
        unit,
        fault_threads: 1 + usize::from((flags >> flag::THREADS_SHIFT) & 3) % 3,
        track_clean: flags & flag::NO_TRACK_CLEAN == 0,
        limit_units: None,
        faults: Faults {
            read_error_after: when(0, counts[0]),
            corrupt_after: when(1, counts[1]),
            write_error_after: when(2, counts[2]),
            full_after_slots: when(3, counts[3]),
            ..Faults::default()
        },
        retry: flags & flag::RETRY != 0,
        sealed: flags & flag::SEALED != 0,
    };
    setup.limit_units = limit(&setup, input.u8());
    if setup.retry {
        // The transient faults are the retry policy's (docs/RETRY.md):
        // without it each would be fatal, so only inputs with the retry
        // layer have them. 0 is none.
        let some = |b: u8| (b != 0).then_some(u64::from(b));
        setup.faults.transient_eio_every = some(input.u8());
        setup.faults.transient_corrupt_every = some(input.u8());
        setup.faults.delay_us = some(input.u8());
    }
    let pages = setup.pages();
    let units = setup.units();
    let mut ops = Vec::new();
    while !input.is_empty() {
        let op = match input.u8() % 10 {
            0 | 1 => Op::Write {
                thread: usize::from(input.u8()) % WORKERS,
                page: u64::from(input.u16()) % pages,
                value: input.u64(),
            },
            2 | 3 => Op::Read {
                thread: usize::from(input.u8()) % WORKERS,
                page: u64::from(input.u16()) % pages,
            },
            4 => Op::EvictRange {
                unit: u64::from(input.u8()) % units,
                count: 1 + u64::from(input.u8()) % units,
            },
            5 => Op::EvictAll,
            6 => Op::Discard {
                page: u64::from(input.u16()) % pages,
                pages: u64::from(input.u16()) % (pages + 1),
            },
            7 => Op::SetLimit {
                units: limit(&setup, input.u8()),
            },
            8 => Op::Sync,
            _ => Op::CheckAll,
        };
        ops.push(op);
    }
    (setup, ops)
}

/// A limit byte: 0 is no limit, else at least 2 units (one word access
/// needs one unit; two leave room for a worker's unit and another's).
fn limit(setup: &Setup, byte: u8) -> Option<u64> {
    (byte != 0).then(|| 2 + u64::from(byte) % (setup.units() - 1))
}

/// Encodes a setup and operations as an input (the seed generator's).
pub fn encode(setup: &Setup, ops: &[Op]) -> Vec<u8> {
    let mut w = InputWriter::new();
    let mut flags = match setup.unit {
        SwapUnit::Small4K => flag::SMALL_4K,
        SwapUnit::Auto => flag::AUTO,
        SwapUnit::Huge2M => 0,
    };
    flags |= ((setup.fault_threads.clamp(1, 3) - 1) as u8) << flag::THREADS_SHIFT;
    if !setup.track_clean {
        flags |= flag::NO_TRACK_CLEAN;
    }
    if setup.retry {
        flags |= flag::RETRY;
    }
    if setup.sealed {
        flags |= flag::SEALED;
    }
    w.u8(flags);
    let f = setup.faults;
    let all = [
        f.read_error_after,
        f.corrupt_after,
        f.write_error_after,
        f.full_after_slots,
    ];
    let mut fault_flags = 0u8;
    for (bit, v) in all.iter().enumerate() {
        if v.is_some() {
            fault_flags |= 1 << bit;
        }
    }
    w.u8(fault_flags);
    for v in all {
        w.u8(v.unwrap_or(0).min(255) as u8);
    }
    // limit() reads b != 0 as 2 + b % (units - 1).
    let encode_limit = |units: Option<u64>| match units {
        None => 0,
        Some(u) => match (u.clamp(2, setup.units()) - 2) as u8 {
            0 => (setup.units() - 1) as u8,
            r => r,
        },
    };
    w.u8(encode_limit(setup.limit_units));
    let transient = [f.transient_eio_every, f.transient_corrupt_every, f.delay_us];
    if setup.retry {
        for v in transient {
            w.u8(v.unwrap_or(0).min(255) as u8);
        }
    } else {
        assert!(
            transient.iter().all(Option::is_none),
            "transient faults need the retry layer: without it each one is fatal"
        );
    }
    for op in ops {
        match *op {
            Op::Write {
                thread,
                page,
                value,
            } => {
                w.u8(0).u8(thread as u8).u16(page as u16).u64(value);
            }
            Op::Read { thread, page } => {
                w.u8(2).u8(thread as u8).u16(page as u16);
            }
            Op::EvictRange { unit, count } => {
                w.u8(4).u8(unit as u8).u8((count - 1) as u8);
            }
            Op::EvictAll => {
                w.u8(5);
            }
            Op::Discard { page, pages } => {
                w.u8(6).u16(page as u16).u16(pages as u16);
            }
            Op::SetLimit { units } => {
                w.u8(7).u8(encode_limit(units));
            }
            Op::Sync => {
                w.u8(8);
            }
            Op::CheckAll => {
                w.u8(9);
            }
        }
    }
    w.finish()
}

/// A job for a worker: touch one word.
struct Job {
    op_index: usize,
    addr: u64,
    write: Option<u64>,
    expect: u64,
}

/// The workers' shared progress.
#[derive(Default)]
struct Progress {
    done: Mutex<u64>,
    changed: Condvar,
    mismatches: Mutex<Vec<String>>,
}

struct Workers {
    senders: Vec<Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
    progress: Arc<Progress>,
    sent: u64,
    /// Which worker has jobs in flight on a page, since the last sync.
    owners: HashMap<u64, usize>,
}

impl Workers {
    fn start() -> Self {
        let progress = Arc::new(Progress::default());
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for t in 0..WORKERS {
            let (tx, rx) = channel::<Job>();
            let progress = progress.clone();
            senders.push(tx);
            let handle = std::thread::Builder::new()
                .name(format!("fuzz-vcpu-{t}"))
                .spawn(move || {
                    for job in rx {
                        let got = match job.write {
                            Some(value) => {
                                // SAFETY: the address is inside the test's
                                // guest mapping, which outlives the workers
                                // (joined before it is unmapped); the engine's
                                // threads serve the fault, not this one.
                                unsafe { std::ptr::write_volatile(job.addr as *mut u64, value) };
                                value
                            }
                            // SAFETY: as for the write.
                            None => unsafe { std::ptr::read_volatile(job.addr as *const u64) },
                        };
                        if job.write.is_none() && got != job.expect {
                            progress.mismatches.lock().unwrap().push(format!(
                                "op {}: read {got:#x} at {:#x}, the model says {:#x}",
                                job.op_index, job.addr, job.expect
                            ));
                        }
                        *progress.done.lock().unwrap() += 1;
                        progress.changed.notify_all();
                    }
                })
                .expect("spawn a fuzz worker");
            handles.push(handle);
        }
        Self {
            senders,
            handles,
            progress,
            sent: 0,
            owners: HashMap::new(),
        }
    }

    fn send(&mut self, thread: usize, page: u64, job: Job) {
        self.sent += 1;
        self.owners.insert(page, thread);
        self.senders[thread].send(job).expect("worker alive");
    }

    /// Waits for every job sent; false if they did not finish within
    /// [`STUCK`] of the last one finishing, or within [`AFTER_FATAL`] of `failed()` turning true (a
    /// worker may then wait for memory for ever, as a vCPU would).
    fn sync(&mut self, failed: impl Fn() -> bool) -> bool {
        self.owners.clear();
        let mut last_progress = (Instant::now(), 0);
        let mut failed_at = None;
        let mut done = self.progress.done.lock().unwrap();
        while *done < self.sent {
            let now = Instant::now();
            if *done != last_progress.1 {
                last_progress = (now, *done);
            }
            if failed_at.is_none() && failed() {
                failed_at = Some(now);
            }
            if now - last_progress.0 > STUCK || failed_at.is_some_and(|t| now - t > AFTER_FATAL) {
                return false;
            }
            done = self
                .progress
                .changed
                .wait_timeout(done, Duration::from_millis(20))
                .unwrap()
                .0;
        }
        true
    }

    fn mismatches(&self) -> Vec<String> {
        self.progress.mismatches.lock().unwrap().clone()
    }

    fn join(self) {
        drop(self.senders);
        for h in self.handles {
            h.join().expect("worker panicked");
        }
    }
}

/// The engine, its memory and what it reported.
struct Rig {
    mem: AnonMapping,
    engine: Option<SwapEngine>,
    fatal: Arc<Mutex<Vec<String>>>,
    /// The outermost store, for its report.
    store: SharedStore,
}

impl Rig {
    fn start(setup: &Setup) -> Rig {
        let unit_bytes = setup.unit.bytes();
        let len = setup.units() * unit_bytes;
        let mem = AnonMapping::new(len).expect("map fuzz guest RAM");
        let mut mem_store = MemStore::new(Codec::Lz4, unit_bytes as usize, 4 * setup.units(), None)
            .expect("a memory store");
        if setup.sealed {
            let sealer = Sealer::random()
                .unwrap_or_else(|e| panic!("no sealing key here (the target runs as root): {e}"));
            mem_store.set_integrity(Integrity::Sealed(Arc::new(sealer)));
        }
        let inner: SharedStore = Arc::new(mem_store);
        let faulty: SharedStore = Arc::new(FaultyStore::new(inner, setup.faults));
        let store: SharedStore = if setup.retry {
            Arc::new(RetryingStore::new(faulty, RetryPolicy::default()))
        } else {
            faulty
        };
        let region = ManagedRegion {
            host_base: guestmem::addr::Hva::new(mem.range().base()),
            len_bytes: len,
            kind: MemoryKind::Anonymous,
            gpa_ranges: vec![(
                swap::index::Gpa::new(GPA_BASE),
                guestmem::addr::RegionOffset::ZERO,
                len,
            )],
        };
        let config = EngineConfig {
            unit: setup.unit,
            mem_limit_bytes: setup.limit_units.map(|u| u * unit_bytes),
            fault_threads: setup.fault_threads,
            track_clean: setup.track_clean,
            // Few restore buffers: each is a huge page to clear.
            buffer_count: Some(2),
            fault_thread_nice: 0,
            ..EngineConfig::default()
        };
        let fatal = Arc::new(Mutex::new(Vec::new()));
        let log = fatal.clone();
        let engine = SwapEngine::start(
            region,
            store.clone(),
            config,
            Box::new(move |e: &SwapError| log.lock().unwrap().push(e.to_string())),
        )
        .unwrap_or_else(|e| panic!("the swap engine does not start here: {e}"));
        Rig {
            mem,
            engine: Some(engine),
            fatal,
            store,
        }
    }

    fn engine(&self) -> &SwapEngine {
        self.engine.as_ref().expect("running")
    }

    fn fatal(&self) -> Vec<String> {
        self.fatal.lock().unwrap().clone()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // The engine stops before the memory is unmapped.
        if let Some(engine) = self.engine.take() {
            engine.shutdown();
        }
    }
}

/// Every thread of this process with its name, what it waits in
/// (`wchan`) and its kernel stack (readable as root): which engine
/// thread holds a unit in flight is the first question a hang report
/// must answer, and the userspace side is in the panic's own backtrace.
fn thread_report() -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return "  (no /proc/self/task)".into();
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} {} wchan={} state={}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan").trim(),
            read("stat").split_whitespace().nth(2).unwrap_or("?")
        );
        for line in read("stack").lines().take(8) {
            let _ = writeln!(out, "      {line}");
        }
    }
    out
}

/// The page model and the run of one sequence.
struct Run<'a> {
    setup: &'a Setup,
    ops: &'a [Op],
    rig: Rig,
    workers: Workers,
    /// What the first word of each page must read.
    model: Vec<u64>,
}

impl Run<'_> {
    fn fail(&self, at: usize, what: &str) -> ! {
        let mut trace = String::new();
        for (i, op) in self.ops.iter().enumerate().take(at + 1) {
            let _ = writeln!(trace, "  {i}: {op:?}");
        }
        panic!(
            "engine target: {what}\nsetup {:?}\noperations up to {at}:\n{trace}fatal errors: {:?}\nunit states {:?}",
            self.setup,
            self.rig.fatal(),
            self.rig.engine().unit_states()
        );
    }

    fn addr(&self, page: u64) -> u64 {
        self.rig.mem.range().base() + page * PAGE
    }

    fn job(&mut self, at: usize, thread: usize, page: u64, write: Option<u64>) {
        if self.workers.owners.get(&page).is_some_and(|&t| t != thread) && !self.sync(at) {
            return;
        }
        let expect = self.model[page as usize];
        if let Some(v) = write {
            self.model[page as usize] = v;
        }
        let addr = self.addr(page);
        self.workers.send(
            thread,
            page,
            Job {
                op_index: at,
                addr,
                write,
                expect,
            },
        );
    }

    /// Waits for the workers; false when the sequence must end because
    /// the engine reported a fatal error (the VM would end there too).
    fn sync(&mut self, at: usize) -> bool {
        let fatal = self.rig.fatal.clone();
        let idle = self.workers.sync(|| !fatal.lock().unwrap().is_empty());
        let mismatches = self.workers.mismatches();
        if !mismatches.is_empty() {
            self.fail(at, &mismatches.join("; "));
        }
        self.check_fatal(at);
        if !idle && self.rig.fatal().is_empty() {
            self.fail(
                at,
                &format!(
                    "workers stuck without a fatal error from the engine\nthreads:\n{}",
                    thread_report()
                ),
            );
        }
        idle && self.rig.fatal().is_empty()
    }

    /// A fatal error must come from an injected store failure and name a
    /// unit's guest address.
    fn check_fatal(&self, at: usize) {
        for message in self.rig.fatal() {
            if !self.setup.lasting_faults() {
                self.fail(
                    at,
                    &format!("fatal error without a lasting injected failure: {message}"),
                );
            }
            let names_unit = (0..self.setup.units()).any(|u| {
                message.contains(&format!("{:#x}", GPA_BASE + u * self.setup.unit.bytes()))
            });
            if !names_unit {
                self.fail(at, &format!("fatal error naming no unit: {message}"));
            }
        }
    }

    fn check_all(&mut self, at: usize) -> bool {
        if !self.sync(at) {
            return false;
        }
        for page in 0..self.setup.pages() {
            self.job(at, 0, page, None);
        }
        self.sync(at)
    }

    /// Runs the operations; false if a fatal error ended them early.
    fn run(&mut self) -> bool {
        let unit_bytes = self.setup.unit.bytes();
        for (at, &op) in self.ops.iter().enumerate() {
            let go_on = match op {
                Op::Write {
                    thread,
                    page,
                    value,
                } => {
                    self.job(at, thread, page, Some(value));
                    true
                }
                Op::Read { thread, page } => {
                    self.job(at, thread, page, None);
                    true
                }
                Op::EvictRange { unit, count } => {
                    let _ = self
                        .rig
                        .engine()
                        .evict_range(RegionOffset::new(unit * unit_bytes), count * unit_bytes);
                    true
                }
                Op::EvictAll => {
                    let _ = self.rig.engine().evict_all();
                    true
                }
                Op::Discard { page, pages } => {
                    if !self.sync(at) {
                        return false;
                    }
                    let offset = page * PAGE;
                    let len = pages * PAGE;
                    if self
                        .rig
                        .engine()
                        .discard_range(RegionOffset::new(offset), len)
                        .is_ok()
                    {
                        // Whole units inside the range only.
                        let first = offset.div_ceil(unit_bytes);
                        let end = ((offset + len) / unit_bytes).min(self.setup.units());
                        for unit in first..end.max(first) {
                            let per_unit = unit_bytes / PAGE;
                            for p in unit * per_unit..(unit + 1) * per_unit {
                                self.model[p as usize] = 0;
                            }
                        }
                    }
                    true
                }
                Op::SetLimit { units } => {
                    // A limit below one unit is one unit (the engine refuses 0).
                    let limit = units.map(|u| {
                        swap::engine::MemLimit::whole_units(u.max(1), unit_bytes)
                            .expect("at least one unit")
                    });
                    self.rig
                        .engine()
                        .set_mem_limit(limit)
                        .expect("a limit of this engine's unit");
                    true
                }
                Op::Sync => self.sync(at),
                Op::CheckAll => self.check_all(at),
            };
            self.check_fatal(at);
            if !go_on || !self.rig.fatal().is_empty() {
                return false;
            }
        }
        let last = self.ops.len().saturating_sub(1);
        self.check_all(last)
    }
}

/// What one sequence did, for tests that check an input exercises what it
/// is kept for.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Every operation ran (no fatal error ended the sequence early).
    pub completed: bool,
    /// The engine's figures after the last operation.
    pub stats: SwapStats,
    /// The store wrappers' counts once the engine stopped.
    pub store: StoreReport,
}

/// Checks the store's report against the setup: the retry layer absorbed
/// every transient fault it met (each `EIO` retried, each damaged read
/// read again and verified) when nothing lasting was injected.
fn check_report(setup: &Setup, sealed: bool, report: &StoreReport) -> Result<(), String> {
    // The retry layer reports for the stats whether its store seals.
    if sealed != setup.sealed || (setup.retry && report.sealed != setup.sealed) {
        return Err(format!(
            "the store says sealed={sealed} (its report {}), the setup {}",
            report.sealed, setup.sealed
        ));
    }
    if !setup.retry || setup.lasting_faults() {
        return Ok(());
    }
    let rereads = report.retry.checksum_rereads + report.retry.auth_rereads;
    let reread_ok = report.retry.checksum_recovered + report.retry.auth_recovered;
    let fine = report.retry.exhausted == 0
        && report.retry.checksum_fatal == 0
        && report.retry.auth_fatal == 0
        && report.retry.transient_errors == report.injected.transient_errors
        && report.retry.retries == report.retry.transient_errors
        && rereads == report.injected.transient_corruptions
        && reread_ok == rereads
        // A sealed store's damage fails authentication, a plain one's its
        // checksum.
        && if setup.sealed {
            report.retry.checksum_rereads == 0
        } else {
            report.retry.auth_rereads == 0
        };
    if fine {
        Ok(())
    } else {
        Err(format!(
            "the retry layer did not absorb the transient faults exactly: {report:?}"
        ))
    }
}

/// Runs one sequence against the engine and the model.
pub fn run_sequence(setup: &Setup, ops: &[Op]) -> Outcome {
    let rig = Rig::start(setup);
    let mut run = Run {
        setup,
        ops,
        rig,
        workers: Workers::start(),
        model: vec![0; setup.pages() as usize],
    };
    let completed = run.run();
    let states: u64 = run.rig.engine().unit_states().total();
    assert_eq!(
        states,
        setup.units(),
        "unit states {:?}",
        run.rig.engine().unit_states()
    );
    let stats = run.rig.engine().stats();
    if completed {
        assert!(stats.unit_bytes == setup.unit.bytes());
    }
    let Run {
        mut rig, workers, ..
    } = run;
    // Shutting down releases a worker that a failed store read left
    // blocked; the memory goes only after the workers.
    if let Some(engine) = rig.engine.take() {
        engine.shutdown();
    }
    workers.join();
    // Every store operation has ended: the counts are final.
    let store = rig.store.report();
    let sealed = rig.store.sealed();
    drop(rig);
    if let Err(why) = check_report(setup, sealed, &store) {
        panic!("engine target: {why}\nsetup {setup:?}\noperations: {ops:?}");
    }
    Outcome {
        completed,
        stats,
        store,
    }
}

/// The operations of one input that run: long sequences add little but
/// time (libFuzzer's -max_len bounds them too).
pub const MAX_OPS: usize = 200;

/// Runs one input and says what it did.
pub fn run_input(data: &[u8]) -> Outcome {
    let (setup, ops) = decode(data);
    run_sequence(&setup, &ops[..ops.len().min(MAX_OPS)])
}

/// Runs one input.
pub fn run(data: &[u8]) {
    run_input(data);
}
