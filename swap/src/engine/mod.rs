//! The swap engine: keeps guest RAM in whole units (2 MiB chunks mapped
//! huge, or 4 KiB pages for the baseline), evicts them to a store and
//! restores a whole unit on a guest fault.
//!
//! Threads:
//! - fault service (`fault_threads`, [`fault`]): read userfaultfd messages,
//!   restore units, resolve write-protect faults;
//! - background evictor ([`limit`]): keeps resident memory below the limit
//!   minus headroom, choosing victims with the [`policy`];
//! - buffer refill ([`buffers`]): clears evicted huge pages kept for reuse
//!   as restore buffers ([`recycle`]) and pre-touches fresh THP buffers
//!   (fewer near the memory limit, where evicted pages take their place).
//!
//! The unit state machine and who may take which transition is in
//! [`crate::chunk`].

pub mod buffers;
mod collapse;
pub mod config;
pub mod discard;
pub mod error;
pub mod evict;
pub mod fault;
pub mod granularity;
pub mod hash;
pub mod limit;
pub(crate) mod log_budget;
pub mod policy;
mod prefetch;
mod recycle;
mod split;
pub mod staging;
mod start;
pub mod stats;
pub mod thread_setup;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::{EngineConfig, ManagedRegion, MemoryKind, SwapUnit};
pub use discard::DiscardReport;
pub use error::SwapError;
pub use evict::EvictReport;
pub use stats::{
    CollapseFailure, FaultCounts, FaultSource, LatencyBySource, LatencyHistogram, PrefetchStats,
    SplitStats, SwapStats,
};
pub use thread_setup::{EngineThread, ThreadSetup};

use crate::chunk::{ChunkTable, Tag, UnitState};
use crate::store::SharedStore;
use crate::uffd::Uffd;
use buffers::{BufferPool, PoolMode};
use granularity::{CollapseReason, SplitReason};
use guestmem::host::{AnonMapping, PagemapScanner, RawRange, PAGE_BYTES};
use limit::Limiter;
use policy::{Clock, EvictionPolicy};
use staging::Parking;
use stats::Counters;

/// How units are installed and taken away, from memory kind and unit size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Anonymous memory, 2 MiB units: UFFDIO_MOVE of THP buffers.
    Thp,
    /// Hugetlb memfd, 2 MiB units: UFFDIO_COPY of 2 MiB, hole punching.
    Hugetlb {
        /// The memfd.
        memfd: RawFd,
    },
    /// Anonymous memory, 4 KiB units: UFFDIO_COPY / ZEROPAGE / MOVE of
    /// single pages.
    Small,
}

/// Callback for unrecoverable errors (the VMM exits); the error names the
/// unit's guest address where one is concerned.
pub type FatalHandler = Box<dyn Fn(&SwapError) + Send + Sync>;

/// State shared by the engine's threads.
pub(crate) struct Shared {
    pub uffd: Uffd,
    pub region: ManagedRegion,
    pub guest: RawRange,
    pub backing: Backing,
    pub unit_bytes: u64,
    pub table: ChunkTable,
    pub store: SharedStore,
    pub parking: Parking,
    pub parking_registered: bool,
    pub buffers: BufferPool,
    /// Tells whether a parked page is huge (THP units; `None` when the
    /// kernel lacks `PAGEMAP_SCAN`: evicted pages are then not recycled).
    pub pagemap: Option<PagemapScanner>,
    /// A populated all-zero unit to copy from (hugetlb zero fill).
    pub zero_source: Option<AnonMapping>,
    pub counters: Counters,
    pub limiter: Limiter,
    pub policy: Box<dyn EvictionPolicy>,
    pub on_fatal: FatalHandler,
    pub shutdown: AtomicBool,
    /// Set once `on_fatal` was called: waits for units that can no longer
    /// settle give up.
    pub failed: AtomicBool,
    pub track_clean: bool,
    pub batch_units: usize,
    pub fault_threads: usize,
    /// Whether chunks split, and the test knob.
    pub split: split::SplitControl,
    /// The granularity policy (`--swap-unit auto`).
    pub granularity: granularity::Granularity,
    /// Sequential prefetch (`--swap-unit auto`).
    pub prefetch: prefetch::Prefetcher,
    /// Sequential prefetch runs: the auto unit with
    /// [`EngineConfig::prefetch`] on.
    pub prefetch_on: bool,
    /// Test knob [`EngineConfig::small_restore_buffers`].
    pub small_restore_buffers: bool,
    /// Test knob [`EngineConfig::pin_restore_buffers_us`].
    pub pin_restore_buffers_us: Option<u64>,
}

impl Shared {
    /// Guest address (or host offset, marked) naming a unit in messages.
    pub fn unit_name(&self, unit: usize) -> String {
        let offset = unit as u64 * self.unit_bytes;
        match self.region.gpa_of(offset) {
            Some(gpa) => format!("guest address {gpa:#x}"),
            None => format!("region offset {offset:#x} (no guest address)"),
        }
    }

    /// Guest-physical address of a unit (its region offset if unmapped).
    pub fn unit_gpa(&self, unit: usize) -> u64 {
        let offset = unit as u64 * self.unit_bytes;
        self.region.gpa_of(offset).unwrap_or(offset)
    }

    /// Host address of a unit.
    pub fn unit_addr(&self, unit: usize) -> u64 {
        self.guest.base() + unit as u64 * self.unit_bytes
    }

    /// True once shutdown started.
    pub fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// True once an unrecoverable error was reported.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Reports an unrecoverable error to the VMM.
    pub fn fatal(&self, error: &SwapError) {
        self.failed.store(true, Ordering::Release);
        (self.on_fatal)(error);
    }
}

/// The running engine. Dropping it shuts it down.
pub struct SwapEngine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The limit in pages for `bytes`: whole units, at least one.
fn limit_pages(bytes: u64, unit_bytes: u64) -> u64 {
    (bytes / unit_bytes).max(1) * (unit_bytes / PAGE_BYTES)
}

/// Sets the calling thread's nice value, best effort: without CAP_SYS_NICE
/// a raise is refused and the thread keeps the default priority.
fn set_thread_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: gettid has no preconditions; setpriority on our own thread id
    // only changes this thread's scheduling priority.
    let result = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if result != 0 {
        log::warn!(
            "swap engine: cannot set the fault thread's nice value to {nice} ({}); it runs at the default priority",
            std::io::Error::last_os_error()
        );
    }
}

impl SwapEngine {
    /// Registers the region with a new userfaultfd and starts the threads.
    /// Must be called before anything touches guest RAM: pages populated
    /// before registration are unknown to the engine.
    pub fn start(
        region: ManagedRegion,
        store: SharedStore,
        config: EngineConfig,
        on_fatal: FatalHandler,
    ) -> Result<SwapEngine, SwapError> {
        let backing = start::backing_for(region.kind, config.unit)?;
        let units = start::check_region(&region, &store, config.unit)?;
        let (uffd, features) = start::open_userfaultfd(backing, config.track_clean)?;
        let guest = start::register_guest(&uffd, &region, backing, features.wp_registered)?;
        let staging = start::staging_area(&uffd, backing, &config)?;
        let table = start::unit_table(units, &config, backing, features.track_clean);
        let split = start::split_control(backing, &store, &config)?;
        let granularity =
            granularity::Granularity::new(config.unit == SwapUnit::Auto && split.enabled);
        let prefetch_on = config.prefetch && granularity.auto;
        let shared = Arc::new(Shared {
            uffd,
            region,
            guest,
            backing,
            unit_bytes: config.unit.bytes(),
            table,
            store,
            parking: staging.parking,
            parking_registered: staging.parking_registered,
            buffers: staging.buffers,
            pagemap: start::pagemap_scanner(backing),
            zero_source: start::zero_source(backing)?,
            counters: Counters::default(),
            limiter: Limiter::new(
                config
                    .mem_limit_bytes
                    .map(|b| limit_pages(b, config.unit.bytes())),
                config.unit.bytes() / PAGE_BYTES,
            ),
            policy: Box::new(Clock::default()),
            on_fatal,
            shutdown: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            track_clean: features.track_clean,
            batch_units: config.batch_units_or_default(),
            fault_threads: config.fault_threads.max(1),
            split,
            granularity,
            prefetch: prefetch::Prefetcher::default(),
            prefetch_on,
            small_restore_buffers: config.small_restore_buffers,
            pin_restore_buffers_us: config.pin_restore_buffers_us,
        });
        let engine = SwapEngine::start_threads(shared, &config, staging.pool_mode)?;
        let s = &engine.shared;
        log::info!(
            "swap store: {}, {} slots of {} ({})",
            s.store.describe(),
            s.store.capacity_slots(),
            guestmem::format_size(s.unit_bytes),
            guestmem::format_size(s.store.capacity_slots() * s.unit_bytes)
        );
        log::info!(
            "swap engine: started over {} of guest RAM ({}), unit {}{}, limit {}, {} fault thread(s){}",
            guestmem::format_size(s.region.len_bytes),
            match backing {
                Backing::Thp => "THP",
                Backing::Hugetlb { .. } => "hugetlb",
                Backing::Small => "4 KiB pages",
            },
            config.unit,
            if s.split.enabled { " (chunks may split)" } else { "" },
            config
                .mem_limit_bytes
                .map_or_else(|| "none".to_string(), guestmem::format_size),
            s.fault_threads,
            if s.prefetch_on { ", sequential prefetch" } else { "" }
        );
        Ok(engine)
    }

    /// The fault-service threads, the background evictor and the buffer
    /// refill thread.
    fn start_threads(
        shared: Arc<Shared>,
        config: &EngineConfig,
        pool_mode: PoolMode,
    ) -> Result<SwapEngine, SwapError> {
        let mut engine = SwapEngine {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for i in 0..shared.fault_threads {
            let s = shared.clone();
            let nice = config.fault_thread_nice;
            let setup = config.thread_setup.clone();
            engine.spawn(format!("swap-fault-{i}"), move || {
                set_thread_nice(nice);
                ThreadSetup::run(&setup, EngineThread::FaultService);
                fault::run(&s)
            })?;
        }
        if shared.prefetch_on {
            let s = shared.clone();
            let setup = config.thread_setup.clone();
            engine.spawn("swap-prefetch".into(), move || {
                // A prefetch is a restore without a fault: the same calls
                // as a fault-service thread.
                ThreadSetup::run(&setup, EngineThread::FaultService);
                prefetch::run(&s)
            })?;
        }
        let s = shared.clone();
        let setup = config.thread_setup.clone();
        engine.spawn("swap-evictor".into(), move || {
            ThreadSetup::run(&setup, EngineThread::Evictor);
            limit::run_background_evictor(&s)
        })?;
        if pool_mode == PoolMode::Thp && config.refill_buffers {
            let s = shared.clone();
            let setup = config.thread_setup.clone();
            engine.spawn("swap-refill".into(), move || {
                ThreadSetup::run(&setup, EngineThread::BufferRefill);
                while !s.stopping() {
                    recycle::refill_step(&s, Duration::from_millis(50));
                }
            })?;
        }
        Ok(engine)
    }

    /// Spawns an engine thread. A panic in it (an engine bug) is reported
    /// through `on_fatal`, so the VM ends with a message instead of its
    /// vCPUs waiting for ever on faults nobody serves.
    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), SwapError> {
        let shared = self.shared.clone();
        let thread = name.clone();
        let guarded = move || {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|m| m.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                shared.fatal(&SwapError::ThreadPanicked { thread, message });
            }
        };
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(guarded)
            .map_err(|e| SwapError::os(format!("spawning thread {name}"), e))?;
        self.threads.push(handle);
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SwapStats {
        let s = &self.shared;
        let mut stats = s.counters.snapshot();
        stats.resident_bytes = s.limiter.held_pages() * PAGE_BYTES;
        stats.resident_bytes_max = s.limiter.held_pages_max() * PAGE_BYTES;
        stats.metadata_bytes = s.table.metadata_bytes();
        stats.unit_bytes = s.unit_bytes;
        stats.mem_limit_bytes = s.limiter.limit_pages().map(|p| p * PAGE_BYTES);
        let tags = s.table.count_tags();
        stats.split.chunks_split = tags[Tag::Split as usize];
        stats.split.chunks_huge = s.table.count_huge_resident();
        stats.buffers_idle_max = s.buffers.idle_max() as u64;
        stats.buffers_bound = s.buffers.bound() as u64;
        stats.store = s.store.report();
        stats
    }

    /// Evicts every resident unit overlapping `[offset, offset+len)` and
    /// waits until their writes completed.
    pub fn evict_range(&self, offset: u64, len: u64) -> Result<EvictReport, SwapError> {
        let s = &self.shared;
        let first = (offset / s.unit_bytes) as usize;
        let end = (offset.saturating_add(len).div_ceil(s.unit_bytes) as usize).min(s.table.units());
        evict::evict_range(s, first..end)
    }

    /// Evicts every resident unit and waits until the writes completed.
    pub fn evict_all(&self) -> Result<EvictReport, SwapError> {
        evict::evict_range(&self.shared, 0..self.shared.table.units())
    }

    /// Drops the units inside `[offset, offset+len)` (whole units only; a
    /// partly covered unit at either end is left alone): the guest declared
    /// this memory free, so nothing is written and the next touch reads
    /// zeros.
    pub fn discard_range(&self, offset: u64, len: u64) -> Result<DiscardReport, SwapError> {
        let s = &self.shared;
        let first = offset.div_ceil(s.unit_bytes) as usize;
        let end = ((offset.saturating_add(len) / s.unit_bytes) as usize).min(s.table.units());
        discard::discard_units(s, first..end.max(first))
    }

    /// Splits every chunk overlapping `[offset, offset+len)` that is
    /// resident, absent or stored into pages (in-flight, staged and pinned
    /// chunks are left alone); returns how many split. Errors (a store read
    /// of a stored chunk) are also reported as fatal. For tests and the
    /// granularity policy; needs a configuration where chunks split.
    pub fn split_range(&self, offset: u64, len: u64) -> Result<u64, SwapError> {
        let s = &self.shared;
        if !s.split.enabled {
            return Err(SwapError::Config(
                "chunks do not split here: 2 MiB units of anonymous (THP) memory on a store that keeps pages are needed".into(),
            ));
        }
        let mut splits = 0;
        for chunk in self.chunks_of(offset, len) {
            let state = s.table.load(chunk);
            if state.pinned() {
                continue;
            }
            match state.tag() {
                Tag::Resident => {
                    split::split_resident(s, chunk, Tag::Resident, SplitReason::Requested)?;
                }
                Tag::Absent | Tag::Stored => {
                    let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
                        continue;
                    };
                    if !split::split_on_restore(s, chunk, loading, state, SplitReason::Requested)? {
                        return Err(SwapError::ShuttingDown);
                    }
                }
                _ => continue,
            }
            splits += u64::from(s.table.load(chunk).tag() == Tag::Split);
        }
        Ok(splits)
    }

    /// Tries to collapse every split chunk overlapping `[offset,
    /// offset+len)` into one huge mapping (restoring its absent and stored
    /// pages first); returns how many are one huge mapping afterwards, as
    /// PAGEMAP_SCAN confirmed.
    pub fn collapse_range(&self, offset: u64, len: u64) -> Result<u64, SwapError> {
        let s = &self.shared;
        let mut huge = 0;
        for chunk in self.chunks_of(offset, len) {
            if s.table.load(chunk).tag() != Tag::Split {
                continue;
            }
            collapse::try_collapse(s, chunk, CollapseReason::Requested)?;
            let state = s.table.load(chunk);
            huge += u64::from(state.tag() == Tag::Resident && state.huge());
        }
        Ok(huge)
    }

    /// The state of the page at region offset `offset` if its chunk is
    /// split (for tests and debugging).
    pub fn page_state(&self, offset: u64) -> Option<crate::chunk::PageState> {
        let s = &self.shared;
        let chunk = (offset / s.unit_bytes) as usize;
        if s.table.load(chunk).tag() != Tag::Split {
            return None;
        }
        let page = ((offset % s.unit_bytes) / PAGE_BYTES) as usize;
        s.table
            .pages()
            .map(|pages| pages.load(crate::chunk::PageRef { chunk, page }))
    }

    fn chunks_of(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        let s = &self.shared;
        let first = (offset / s.unit_bytes) as usize;
        let end = (offset.saturating_add(len).div_ceil(s.unit_bytes) as usize).min(s.table.units());
        first..end.max(first)
    }

    /// Changes the memory limit at run time (`None`: no limit).
    pub fn set_mem_limit_bytes(&self, bytes: Option<u64>) {
        let s = &self.shared;
        let shown = |pages: Option<u64>| {
            pages.map_or_else(
                || "none".to_string(),
                |p| guestmem::format_size(p * PAGE_BYTES),
            )
        };
        let before = s.limiter.limit_pages();
        let after = bytes.map(|b| limit_pages(b, s.unit_bytes));
        s.limiter.set_limit_pages(after);
        log::info!(
            "swap engine: memory limit {} -> {} ({} resident)",
            shown(before),
            shown(after),
            guestmem::format_size(s.limiter.held_pages() * PAGE_BYTES)
        );
    }

    /// Per-state unit counts `[absent, resident, staged, stored, loading,
    /// evicting, split]` (not an atomic snapshot).
    pub fn unit_states(&self) -> [u64; 7] {
        self.shared.table.count_tags()
    }

    /// The state of the unit holding region offset `offset` (for tests and
    /// debugging).
    pub fn unit_state(&self, offset: u64) -> UnitState {
        self.shared
            .table
            .load((offset / self.shared.unit_bytes) as usize)
    }

    /// Bytes of one unit.
    pub fn unit_bytes(&self) -> u64 {
        self.shared.unit_bytes
    }

    /// Stops the threads and unregisters guest RAM. Faults after this are
    /// no longer served by the engine.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        let s = &self.shared;
        s.shutdown.store(true, Ordering::Release);
        s.limiter.kick();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
        let _ = s.uffd.unregister(s.guest.base(), s.guest.len());
        if s.parking_registered {
            let _ = s
                .uffd
                .unregister(s.parking.raw().base(), s.parking.raw().len());
        }
    }
}

impl Drop for SwapEngine {
    fn drop(&mut self) {
        self.stop();
    }
}
