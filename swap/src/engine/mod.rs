//! The swap engine: keeps guest RAM in whole units (2 MiB chunks mapped
//! huge, or 4 KiB pages for the baseline), evicts them to a store and
//! restores a whole unit on a guest fault.
//!
//! Components, each owning its state and holding only the ones below it
//! (docs/ARCHITECTURE.md draws them):
//! - [`geometry`], [`lifecycle`], [`stats`] counters, the chunk table, the
//!   store, the [`parking`] area, the [`limit`] accounting and the
//!   [`hooks`]: shared leaves, depending on nothing above;
//! - [`recycle`]: restore buffers (the [`buffers`] pool and recycled
//!   evicted pages);
//! - [`install`]: puts content into guest RAM and wakes;
//! - [`evict`]: takes units and pages out into the store; the limiter asks
//!   it for room through [`limit::MakeRoom`];
//! - [`restore`]: whole-unit restores, over the installer;
//! - [`split`] and [`collapse`]: chunks into pages and back, over the
//!   installer;
//! - [`discard`]: units the guest freed;
//! - [`prefetch`]: sequential prefetch, over the restorer;
//! - [`fault`]: the fault service, the only place that asks the
//!   [`granularity`] policy and the hooks what to do;
//! - [`working_set`]: samples resident units through the evictor and
//!   estimates active and cold memory from the faults that bring them
//!   back.
//!
//! Threads: fault service (`fault_threads`), background evictor
//! ([`evict::background`]), buffer refill ([`recycle`]), prefetch (auto
//! unit), working-set sampler ([`working_set`], when on). The unit state
//! machine and who may take which transition is in [`crate::chunk`].

mod access;
pub mod buffers;
mod collapse;
pub mod config;
pub mod discard;
pub mod error;
pub mod evict;
mod fault;
mod geometry;
pub mod granularity;
pub mod hash;
pub mod hooks;
mod install;
mod lifecycle;
pub mod limit;
pub(crate) mod log_budget;
mod mem_limit;
#[cfg(feature = "model-check")]
pub mod model;
mod outcome;
mod page_tables;
pub mod parking;
pub mod policy;
mod prefetch;
mod recycle;
mod restore;
mod sampler;
pub mod sizing;
mod split;
mod stall;
mod start;
pub mod stats;
pub mod thread_setup;
pub mod working_set;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::{EngineConfig, ManagedRegion, MemoryKind, SwapUnit};
pub use discard::DiscardReport;
pub use error::SwapError;
pub use evict::EvictReport;
pub use hooks::{BufferKnobs, EngineHooks, NoHooks};
pub use lifecycle::FatalHandler;
pub use mem_limit::{MemLimit, MemLimitError};
pub use stall::{StallBySource, StallStats};
pub use stats::{
    BufferStats, CollapseFailure, CollapseFailures, CollapsesByReason, FaultCounts, FaultSource,
    LatencyBySource, LatencyHistogram, PageFaults, PrefetchStats, SplitStats, SplitsByOrigin,
    SplitsByReason, SwapStats,
};
pub use thread_setup::{EngineThread, ThreadSetup};
pub use working_set::{ColdMemory, WorkingSetConfig, WorkingSetStats};

use crate::chunk::Tag;
use crate::chunk::{ChunkTable, PageTable, TagCounts, UnitState};
use crate::index::UnitRange;
use crate::store::SharedStore;
use crate::uffd::Uffd;
use buffers::PoolMode;
use collapse::Collapser;
use config::InstallMode;
use discard::Discarder;
use evict::EvictService;
use fault::FaultService;
use geometry::Geometry;
use granularity::{CollapseReason, Fixed, GranularityPolicy, SplitReason};
use guestmem::addr::RegionOffset;
use guestmem::host::PAGE_BYTES;
use install::Installer;
use lifecycle::Lifecycle;
use limit::{Limiter, MakeRoom};
use parking::Parking;
use policy::Clock;
use prefetch::Prefetcher;
use recycle::{RestoreBuffers, RestoreBuffersParts};
use restore::Restorer;
use split::Splitter;
use stall::StallClock;
use stats::Counters;
use working_set::WorkingSet;

/// The running engine: its components, and the threads that run them.
/// Dropping it shuts it down.
pub struct SwapEngine {
    geo: Arc<Geometry>,
    /// The kernel's userfaultfd the fault threads read, once registered
    /// (`None` in the model checker, which runs the engine on a model of
    /// it and starts no threads).
    uffd: Option<Arc<Uffd>>,
    /// Whether the parking area is registered with the userfaultfd (to
    /// unregister it at shutdown).
    parking_registered: bool,
    life: Arc<Lifecycle>,
    table: Arc<ChunkTable>,
    store: SharedStore,
    parking: Arc<Parking>,
    buffers: Arc<RestoreBuffers>,
    limiter: Arc<Limiter>,
    counters: Arc<Counters>,
    stall: Arc<StallClock>,
    evictor: Arc<EvictService>,
    splitter: Option<Arc<Splitter>>,
    collapser: Option<Arc<Collapser>>,
    discarder: Discarder,
    working_set: Option<Arc<WorkingSet>>,
    threads: Vec<JoinHandle<()>>,
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
        let mode = start::backing_for(region.kind, config.unit)?;
        let units = start::check_region(&region, &store, config.unit)?;
        let (uffd, features) = start::open_userfaultfd(mode, config.track_clean)?;
        let guest = start::register_guest(&uffd, &region, mode, features.wp_registered)?;
        let staging = start::staging_area(mode, &config)?;
        if staging.parking_registered {
            start::register_parking(&uffd, &staging.parking)?;
        }
        let uffd = Arc::new(uffd);
        let pagemap = start::pagemap_scanner(mode);
        let page_tables_freed =
            mode == InstallMode::Thp && start::empty_page_tables_are_freed(&uffd, pagemap.as_ref());
        let kernel = start::KernelParts {
            userfaults: uffd.clone(),
            guest,
            track_clean: features.track_clean,
            pagemap,
            page_tables_freed,
        };
        let pool_mode = staging.pool_mode;
        let (mut engine, faults, prefetcher) = SwapEngine::assemble(
            region, store, &config, on_fatal, mode, units, staging, kernel,
        )?;
        engine.uffd = Some(uffd);
        engine.start_threads(&config, pool_mode, faults, prefetcher.clone())?;
        let s = &engine;
        let unit_bytes = s.geo.unit_bytes;
        log::info!(
            "swap store: {}, {} slots of {} ({})",
            s.store.describe(),
            s.store.capacity_slots(),
            guestmem::format_size(unit_bytes),
            guestmem::format_size(s.store.capacity_slots() * unit_bytes)
        );
        log::info!(
            "swap engine: started over {} of guest RAM ({}), unit {}{}, limit {}, {} fault thread(s){}",
            guestmem::format_size(s.geo.region.len_bytes),
            match mode {
                InstallMode::Thp => "THP",
                InstallMode::Hugetlb { .. } => "hugetlb",
                InstallMode::Small => "4 KiB pages",
            },
            config.unit,
            if s.splitter.is_some() { " (chunks may split)" } else { "" },
            config
                .mem_limit_bytes
                .map_or_else(|| "none".to_string(), guestmem::format_size),
            config.fault_threads.max(1),
            if prefetcher.is_some() { ", sequential prefetch" } else { "" }
        );
        if let Some(ws) = &config.working_set {
            log::info!(
                "swap engine: working-set sampling, {} unit(s) per second, window {:?}",
                ws.units_per_second,
                ws.window
            );
        }
        Ok(engine)
    }

    /// Builds the engine's components over guest RAM that `kernel` serves
    /// (registered with the kernel's userfaultfd, or the model checker's
    /// model of it), without starting a thread. Returns the engine, the
    /// fault service its fault threads run and the prefetcher, if any.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn assemble(
        region: ManagedRegion,
        store: SharedStore,
        config: &EngineConfig,
        on_fatal: FatalHandler,
        mode: InstallMode,
        units: usize,
        staging: start::StagingArea,
        kernel: start::KernelParts,
    ) -> Result<(SwapEngine, Arc<FaultService>, Option<Arc<Prefetcher>>), SwapError> {
        let start::KernelParts {
            userfaults,
            guest,
            track_clean,
            pagemap,
            page_tables_freed,
        } = kernel;
        let table = Arc::new(start::unit_table(units, config, mode, track_clean));
        let splits = start::chunks_split(mode, &store, config)?;
        let unit_bytes = config.unit.bytes();
        let fault_threads = config.fault_threads.max(1);
        let auto = config.unit == SwapUnit::Auto && splits;
        let geo = Arc::new(Geometry {
            region,
            guest,
            unit_bytes,
            units,
        });
        let life = Arc::new(Lifecycle::new(on_fatal));
        let counters = Arc::new(Counters::default());
        let hooks: Arc<dyn EngineHooks> = match config.force_split_every {
            Some(every) if splits => {
                Arc::new(hooks::ForcedSplits::new(every, config.hooks.clone()))
            }
            _ => config.hooks.clone(),
        };
        let limit = config
            .mem_limit_bytes
            .map(|bytes| MemLimit::of_bytes(bytes, unit_bytes))
            .transpose()
            .map_err(|e| SwapError::Config(format!("memory limit: {e}")))?;
        let limiter = Arc::new(Limiter::new(
            limit.map(|l| l.bytes() / PAGE_BYTES),
            unit_bytes / PAGE_BYTES,
        ));
        let parking = Arc::new(staging.parking);
        let pagemap = pagemap.map(Arc::new);
        let buffers = Arc::new(RestoreBuffers::new(RestoreBuffersParts {
            pool: staging.buffers,
            parking: parking.clone(),
            pagemap: pagemap.clone(),
            backing: mode,
            small_restore_buffers: hooks.small_restore_buffers(),
            unit_bytes,
            limiter: limiter.clone(),
            counters: counters.clone(),
            fault_threads,
        }));
        let page_tables = Arc::new(page_tables::PageTables::new(
            userfaults.clone(),
            geo.clone(),
            mode,
            page_tables_freed,
        ));
        page_tables.prepare_all(UnitRange::all(units));
        let installer = Arc::new(Installer {
            uffd: userfaults.clone(),
            geo: geo.clone(),
            mode,
            buffers: buffers.clone(),
            parking: parking.clone(),
            page_tables: page_tables.clone(),
            zero_source: start::zero_source(mode)?,
            hooks: hooks.clone(),
            counters: counters.clone(),
        });
        let page_table: Option<Arc<PageTable>> = table.page_table();
        let evictor = Arc::new(EvictService {
            geo: geo.clone(),
            uffd: userfaults,
            mode,
            table: table.clone(),
            pages: page_table.clone(),
            store: store.clone(),
            parking: parking.clone(),
            buffers: buffers.clone(),
            page_tables: page_tables.clone(),
            limiter: limiter.clone(),
            policy: Box::new(Clock::default()),
            counters: counters.clone(),
            life: life.clone(),
            batch_units: config.batch_units_or_default(),
        });
        let room: Arc<dyn MakeRoom> = evictor.clone();
        let restorer = Arc::new(Restorer {
            geo: geo.clone(),
            table: table.clone(),
            store: store.clone(),
            installer: installer.clone(),
            buffers: buffers.clone(),
            counters: counters.clone(),
            life: life.clone(),
            track_clean,
        });
        let split_pages = page_table.filter(|_| splits);
        let splitter = split_pages.clone().map(|pages| {
            Arc::new(Splitter {
                geo: geo.clone(),
                table: table.clone(),
                pages,
                store: store.clone(),
                installer: installer.clone(),
                buffers: buffers.clone(),
                limiter: limiter.clone(),
                room: room.clone(),
                counters: counters.clone(),
                life: life.clone(),
                zero_page: blockio::AlignedBuf::new(PAGE_BYTES as usize, PAGE_BYTES as usize),
            })
        });
        let collapser = split_pages.map(|pages| {
            Arc::new(Collapser {
                geo: geo.clone(),
                table: table.clone(),
                pages,
                store: store.clone(),
                installer: installer.clone(),
                buffers: buffers.clone(),
                parking: parking.clone(),
                pagemap: pagemap.clone(),
                limiter: limiter.clone(),
                room: room.clone(),
                counters: counters.clone(),
                life: life.clone(),
            })
        });
        if let Some(ws) = &config.working_set {
            ws.check().map_err(SwapError::Config)?;
        }
        let working_set = config
            .working_set
            .clone()
            .map(|ws| Arc::new(WorkingSet::new(table.units(), ws)));
        let prefetcher = (config.prefetch && auto).then(|| {
            Arc::new(Prefetcher::new(
                table.clone(),
                limiter.clone(),
                restorer.clone(),
                counters.clone(),
                working_set.clone(),
                life.clone(),
            ))
        });
        let granularity: Arc<dyn GranularityPolicy> = if auto {
            Arc::new(granularity::refault_distance::RefaultDistance::new(
                table.units(),
                config.vcpus,
            ))
        } else {
            Arc::new(Fixed)
        };
        let stall = Arc::new(StallClock::new(config.vcpus));
        let faults = Arc::new(FaultService {
            geo: geo.clone(),
            table: table.clone(),
            restorer,
            splitter: splitter.clone(),
            collapser: collapser.clone(),
            prefetcher: prefetcher.clone(),
            granularity,
            hooks,
            limiter: limiter.clone(),
            room,
            counters: counters.clone(),
            stall: stall.clone(),
            working_set: working_set.clone(),
            life: life.clone(),
        });
        let discarder = Discarder {
            geo: geo.clone(),
            mode,
            table: table.clone(),
            store: store.clone(),
            limiter: limiter.clone(),
            life: life.clone(),
            collapser: collapser.clone(),
            page_tables: page_tables.clone(),
        };
        let engine = SwapEngine {
            geo,
            uffd: None,
            parking_registered: staging.parking_registered,
            life,
            table,
            store,
            parking,
            buffers,
            limiter,
            counters,
            stall,
            evictor,
            splitter,
            collapser,
            discarder,
            working_set,
            threads: Vec::new(),
        };
        Ok((engine, faults, prefetcher))
    }

    /// The fault-service threads, the prefetch thread, the background
    /// evictor and the buffer refill thread.
    fn start_threads(
        &mut self,
        config: &EngineConfig,
        pool_mode: PoolMode,
        faults: Arc<FaultService>,
        prefetcher: Option<Arc<Prefetcher>>,
    ) -> Result<(), SwapError> {
        let Some(uffd) = self.uffd.clone() else {
            unreachable!("threads start only on a registered userfaultfd");
        };
        for i in 0..config.fault_threads.max(1) {
            let faults = faults.clone();
            let uffd = uffd.clone();
            let nice = config.fault_thread_nice;
            let setup = config.thread_setup.clone();
            self.spawn(format!("swap-fault-{i}"), move || {
                set_thread_nice(nice);
                ThreadSetup::run(&setup, EngineThread::FaultService);
                faults.run(&uffd)
            })?;
        }
        if let Some(prefetcher) = prefetcher {
            let setup = config.thread_setup.clone();
            self.spawn("swap-prefetch".into(), move || {
                // A prefetch is a restore without a fault: the same calls
                // as a fault-service thread.
                ThreadSetup::run(&setup, EngineThread::FaultService);
                prefetcher.run()
            })?;
        }
        let evictor = self.evictor.clone();
        let setup = config.thread_setup.clone();
        self.spawn("swap-evictor".into(), move || {
            ThreadSetup::run(&setup, EngineThread::Evictor);
            evict::background::run(&evictor)
        })?;
        if let Some(ws) = self.working_set.clone() {
            let pinned_units = UnitRange::all(self.table.units())
                .filter(|&u| self.table.load(u).pinned())
                .count() as u64;
            ws.set_pinned_bytes(pinned_units * self.geo.unit_bytes);
            let sampler = sampler::Sampler {
                working_set: ws,
                evictor: self.evictor.clone(),
                table: self.table.clone(),
                limiter: self.limiter.clone(),
                life: self.life.clone(),
            };
            let setup = config.thread_setup.clone();
            self.spawn("swap-sampler".into(), move || {
                // A sample is an eviction: the evictor's calls.
                ThreadSetup::run(&setup, EngineThread::Evictor);
                sampler.run()
            })?;
        }
        if pool_mode == PoolMode::Thp && config.refill_buffers {
            let buffers = self.buffers.clone();
            let life = self.life.clone();
            let setup = config.thread_setup.clone();
            self.spawn("swap-refill".into(), move || {
                ThreadSetup::run(&setup, EngineThread::BufferRefill);
                while !life.stopping() {
                    buffers.refill_step(Duration::from_millis(50));
                }
            })?;
        }
        Ok(())
    }

    /// Spawns an engine thread. A panic in it (an engine bug) is reported
    /// through `on_fatal`, so the VM ends with a message instead of its
    /// vCPUs waiting for ever on faults nobody serves.
    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), SwapError> {
        let life = self.life.clone();
        let thread = name.clone();
        let guarded = move || {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|m| m.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                life.fatal(&SwapError::ThreadPanicked { thread, message });
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
        let s = self;
        let mut stats = s.counters.snapshot_all();
        stats.resident_bytes = s.limiter.held_pages() * PAGE_BYTES;
        stats.resident_bytes_max = s.limiter.held_pages_max() * PAGE_BYTES;
        stats.metadata_bytes = s.table.metadata_bytes();
        stats.unit_bytes = s.geo.unit_bytes;
        stats.mem_limit_bytes = s.limiter.limit_pages().map(|p| p * PAGE_BYTES);
        let tags = s.table.count_tags();
        stats.split.chunks_split = tags.split;
        stats.split.chunks_huge = s.table.count_huge_resident();
        stats.buffers.idle_max = s.buffers.pool().idle_max() as u64;
        stats.buffers.bound = s.buffers.pool().bound() as u64;
        stats.store = s.store.report();
        stats.stall = s.stall.snapshot();
        if let Some(ws) = &s.working_set {
            stats.working_set = ws.snapshot();
        }
        stats
    }

    /// Evicts every resident unit overlapping `[offset, offset+len)` and
    /// waits until their writes completed.
    pub fn evict_range(&self, offset: RegionOffset, len: u64) -> Result<EvictReport, SwapError> {
        self.evictor
            .evict_range(self.geo.units_overlapping(offset, len))
    }

    /// Evicts every resident unit and waits until the writes completed.
    pub fn evict_all(&self) -> Result<EvictReport, SwapError> {
        self.evictor.evict_range(self.geo.all_units())
    }

    /// Drops the units inside `[offset, offset+len)` (whole units only; a
    /// partly covered unit at either end is left alone): the guest declared
    /// this memory free, so nothing is written and the next touch reads
    /// zeros.
    pub fn discard_range(
        &self,
        offset: RegionOffset,
        len: u64,
    ) -> Result<DiscardReport, SwapError> {
        self.discarder
            .discard_units(self.geo.units_inside(offset, len))
    }

    /// Splits every chunk overlapping `[offset, offset+len)` that is
    /// resident, absent or stored into pages (in-flight, staged and pinned
    /// chunks are left alone); returns how many split. Errors (a store read
    /// of a stored chunk) are also reported as fatal. For tests and the
    /// granularity policy; needs a configuration where chunks split.
    pub fn split_range(&self, offset: RegionOffset, len: u64) -> Result<u64, SwapError> {
        let s = self;
        let Some(splitter) = &s.splitter else {
            return Err(SwapError::Config(
                "chunks do not split here: 2 MiB units of anonymous (THP) memory on a store that keeps pages are needed".into(),
            ));
        };
        let mut splits = 0;
        for chunk in self.geo.units_overlapping(offset, len) {
            let state = s.table.load(chunk);
            if state.pinned() {
                continue;
            }
            match state.tag() {
                Tag::Resident => {
                    splitter.split_resident(chunk, Tag::Resident, SplitReason::Requested)?;
                }
                Tag::Absent | Tag::Stored => {
                    let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
                        continue;
                    };
                    if !splitter.split_on_restore(chunk, loading, state, SplitReason::Requested)? {
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
    pub fn collapse_range(&self, offset: RegionOffset, len: u64) -> Result<u64, SwapError> {
        let s = self;
        let mut huge = 0;
        let Some(collapser) = &s.collapser else {
            return Ok(0);
        };
        for chunk in self.geo.units_overlapping(offset, len) {
            if s.table.load(chunk).tag() != Tag::Split {
                continue;
            }
            collapser.try_collapse(chunk, CollapseReason::Requested)?;
            let state = s.table.load(chunk);
            huge += u64::from(state.tag() == Tag::Resident && state.huge());
        }
        Ok(huge)
    }

    /// The state of the page at region offset `offset` if its chunk is
    /// split (for tests and debugging).
    pub fn page_state(&self, offset: RegionOffset) -> Option<crate::chunk::PageState> {
        let s = self;
        let (chunk, page) = s.geo.unit_at(offset);
        if s.table.load(chunk).tag() != Tag::Split {
            return None;
        }
        s.table.pages().map(|pages| pages.load(chunk.page(page)))
    }

    /// Changes the memory limit at run time (`None`: no limit). A limit
    /// checked for another unit size is refused.
    pub fn set_mem_limit(&self, limit: Option<MemLimit>) -> Result<(), SwapError> {
        let s = self;
        if let Some(limit) = limit {
            if limit.unit_bytes() != s.geo.unit_bytes {
                return Err(SwapError::Config(format!(
                    "a memory limit checked for {} units, but this engine swaps {} units",
                    guestmem::format_size(limit.unit_bytes()),
                    guestmem::format_size(s.geo.unit_bytes)
                )));
            }
        }
        let shown = |pages: Option<u64>| {
            pages.map_or_else(
                || "none".to_string(),
                |p| guestmem::format_size(p * PAGE_BYTES),
            )
        };
        let before = s.limiter.limit_pages();
        let after = limit.map(|l| l.bytes() / PAGE_BYTES);
        s.limiter.set_limit_pages(after);
        log::info!(
            "swap engine: memory limit {} -> {} ({} resident)",
            shown(before),
            shown(after),
            guestmem::format_size(s.limiter.held_pages() * PAGE_BYTES)
        );
        Ok(())
    }

    /// Per-state unit counts (not an atomic snapshot).
    pub fn unit_states(&self) -> TagCounts {
        self.table.count_tags()
    }

    /// The state of the unit holding region offset `offset` (for tests and
    /// debugging).
    pub fn unit_state(&self, offset: RegionOffset) -> UnitState {
        self.table.load(self.geo.unit_at(offset).0)
    }

    /// Bytes of one unit.
    pub fn unit_bytes(&self) -> u64 {
        self.geo.unit_bytes
    }

    /// Stops the threads and unregisters guest RAM. Faults after this are
    /// no longer served by the engine.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// [`SwapEngine::shutdown`], unless `give_up` holds while its threads
    /// are ending: then the engine is left as it is (registered, its
    /// threads running) for the process exit, and this returns false. For
    /// a VMM whose threads can be parked for good (a call its seccomp
    /// filter stopped), where a join would never return.
    pub fn shutdown_unless(mut self, give_up: &dyn Fn() -> bool) -> bool {
        self.life.stop();
        self.limiter.kick();
        while !self.threads.iter().all(JoinHandle::is_finished) {
            if give_up() {
                std::mem::forget(self);
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.stop();
        true
    }

    fn stop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.life.stop();
        self.limiter.kick();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
        let s = &*self;
        let Some(uffd) = &s.uffd else {
            return;
        };
        let _ = uffd.unregister(s.geo.guest.addr(RegionOffset::ZERO), s.geo.guest.len());
        if s.parking_registered {
            let _ = uffd.unregister(
                s.parking.raw().addr(RegionOffset::ZERO),
                s.parking.raw().len(),
            );
        }
    }
}

impl Drop for SwapEngine {
    fn drop(&mut self) {
        self.stop();
    }
}
