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
pub mod config;
pub mod discard;
pub mod error;
pub mod evict;
pub mod fault;
pub mod hash;
pub mod limit;
pub mod mapping;
pub mod policy;
mod recycle;
pub mod staging;
pub mod stats;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::{EngineConfig, ManagedRegion, MemoryKind, SwapUnit};
pub use error::SwapError;
pub use evict::EvictReport;
pub use stats::{FaultCounts, FaultSource, LatencyBySource, LatencyHistogram, SwapStats};

use crate::chunk::{ChunkTable, UnitState};
use crate::store::SharedStore;
use crate::uffd::{mode, Uffd};
use buffers::{BufferPool, PoolMode};
use limit::Limiter;
use mapping::{AnonMapping, PagemapScanner, RawRange, HUGE_PAGE_BYTES};
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
        eprintln!(
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
        let unit_bytes = config.unit.bytes();
        let backing = match (region.kind, config.unit) {
            (MemoryKind::Anonymous, SwapUnit::Huge2M) => Backing::Thp,
            (MemoryKind::Anonymous, SwapUnit::Small4K) => Backing::Small,
            (MemoryKind::Hugetlb { memfd }, SwapUnit::Huge2M) => Backing::Hugetlb { memfd },
            (MemoryKind::Hugetlb { .. }, SwapUnit::Small4K) => {
                return Err(SwapError::Config(
                    "hugetlb guest memory has 2 MiB pages; use --swap-unit 2m or anonymous (THP) memory for 4k units".into(),
                ))
            }
        };
        if region.host_base & (unit_bytes - 1) != 0
            || region.len_bytes & (unit_bytes - 1) != 0
            || region.len_bytes == 0
        {
            return Err(SwapError::Config(format!(
                "region {:#x}+{:#x} is not aligned to the {} unit; align guest RAM and its size to {unit_bytes} bytes",
                region.host_base, region.len_bytes, config.unit
            )));
        }
        if store.unit_bytes() as u64 != unit_bytes {
            return Err(SwapError::Config(format!(
                "store {} has {}-byte slots but the swap unit is {unit_bytes} bytes; create the store with the same unit",
                store.describe(),
                store.unit_bytes()
            )));
        }
        let units = (region.len_bytes / unit_bytes) as usize;
        if units > u32::MAX as usize {
            return Err(SwapError::Config(
                "more than 2^32 units; use 2m units".into(),
            ));
        }

        let uffd = Uffd::open(0).map_err(|e| SwapError::uffd("opening the userfaultfd", e))?;
        let wp_ok = match backing {
            Backing::Hugetlb { .. } => {
                uffd.features() & crate::uffd::feature::WP_HUGETLBFS_SHMEM != 0
            }
            _ => uffd.features() & crate::uffd::feature::PAGEFAULT_FLAG_WP != 0,
        };
        let is_hugetlb = matches!(backing, Backing::Hugetlb { .. });
        if is_hugetlb && !wp_ok {
            return Err(SwapError::Config(
                "this kernel's userfaultfd cannot write-protect hugetlbfs (UFFD_FEATURE_WP_HUGETLBFS_SHMEM); hugetlb guest memory cannot be evicted safely, use THP memory".into(),
            ));
        }
        let track_clean = config.track_clean && wp_ok;
        // Hugetlb eviction write-protects the unit while copying it out.
        let wp_registered = track_clean || is_hugetlb;
        if !matches!(backing, Backing::Hugetlb { .. }) && !uffd.has_move() {
            return Err(SwapError::Config(
                "this kernel's userfaultfd lacks UFFDIO_MOVE (Linux >= 6.8 needed)".into(),
            ));
        }

        // SAFETY: the VMM hands us this mapping for the engine's lifetime
        // and accesses it only as guest memory (raw pointers, KVM).
        let guest = unsafe { RawRange::new(region.host_base, region.len_bytes) };
        match backing {
            Backing::Thp => guest
                .advise_hugepage(0, guest.len())
                .map_err(|e| SwapError::os("madvise(MADV_HUGEPAGE) on guest RAM", e))?,
            // The 4 KiB baseline must not be rescued by khugepaged.
            Backing::Small => guest
                .advise_nohugepage(0, guest.len())
                .map_err(|e| SwapError::os("madvise(MADV_NOHUGEPAGE) on guest RAM", e))?,
            Backing::Hugetlb { .. } => {}
        }
        let modes = mode::MISSING | if wp_registered { mode::WP } else { 0 };
        // SAFETY: the VMM hands this mapping to the engine for its lifetime
        // and reaches it only as guest memory (raw pointers, KVM, devices
        // through vm-memory); the fault threads started below serve its
        // faults until shutdown, and they never touch guest RAM themselves.
        unsafe { uffd.register(guest.base(), guest.len(), modes) }
            .map_err(|e| SwapError::uffd("registering guest RAM", e))?;

        let batch_units = config.batch_units_or_default();
        let parking_units = config.parking_units_or_default();
        let fault_threads = config.fault_threads.max(1);
        let buffer_count = config.buffer_count.unwrap_or(2 * fault_threads + 4).max(1);
        // Recycled pages stay in their parking slots (see `recycle`): one
        // extra slot per buffer, so they never take slots from evictors.
        let recycle_slots = if backing == Backing::Thp {
            buffer_count
        } else {
            0
        };
        let parking = Parking::new(parking_units + recycle_slots, unit_bytes)
            .map_err(|e| SwapError::os("mapping the parking area", e))?;
        let parking_registered = !matches!(backing, Backing::Hugetlb { .. });
        if parking_registered {
            // SAFETY: the parking area is the engine's own mapping, reached
            // through raw addresses only; its holes are filled before any
            // thread reads them (see `staging`).
            unsafe { uffd.register(parking.raw().base(), parking.raw().len(), mode::MISSING) }
                .map_err(|e| SwapError::uffd("registering the parking area", e))?;
        }
        let pool_mode = if backing == Backing::Thp {
            PoolMode::Thp
        } else {
            PoolMode::Reusable
        };
        let buffers = BufferPool::new(buffer_count, unit_bytes, pool_mode)
            .map_err(|e| SwapError::os("mapping restore buffers", e))?;
        let pagemap = if backing == Backing::Thp {
            match PagemapScanner::open() {
                Ok(scanner) => Some(scanner),
                Err(e) => {
                    eprintln!(
                        "swap engine: PAGEMAP_SCAN on /proc/self/pagemap failed ({e}); evicted huge pages are not reused as restore buffers"
                    );
                    None
                }
            }
        } else {
            None
        };
        let zero_source = match backing {
            Backing::Hugetlb { .. } => {
                let zero = AnonMapping::new(HUGE_PAGE_BYTES)
                    .map_err(|e| SwapError::os("mapping the zero buffer", e))?;
                zero.range().touch(0, HUGE_PAGE_BYTES);
                Some(zero)
            }
            _ => None,
        };

        let table = ChunkTable::new(units, unit_bytes, backing == Backing::Thp && track_clean);
        for &(offset, len) in &config.pinned_offsets {
            let first = offset / unit_bytes;
            let end = (offset + len).div_ceil(unit_bytes).min(units as u64);
            for unit in first..end {
                // Nothing else runs yet: the word cannot change under us.
                let _ = table.pin((unit as usize).into());
            }
        }
        let limit_units = config.mem_limit_bytes.map(|b| (b / unit_bytes).max(1));
        let shared = Arc::new(Shared {
            uffd,
            region,
            guest,
            backing,
            unit_bytes,
            table,
            store,
            parking,
            parking_registered,
            buffers,
            pagemap,
            zero_source,
            counters: Counters::default(),
            limiter: Limiter::new(limit_units),
            policy: Box::new(Clock::default()),
            on_fatal,
            shutdown: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            track_clean,
            batch_units,
            fault_threads,
        });

        let mut engine = SwapEngine {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for i in 0..fault_threads {
            let s = shared.clone();
            let nice = config.fault_thread_nice;
            engine.spawn(format!("swap-fault-{i}"), move || {
                set_thread_nice(nice);
                fault::run(&s)
            })?;
        }
        let s = shared.clone();
        engine.spawn("swap-evictor".into(), move || {
            limit::run_background_evictor(&s)
        })?;
        if pool_mode == PoolMode::Thp && config.refill_buffers {
            let s = shared.clone();
            engine.spawn("swap-refill".into(), move || {
                while !s.stopping() {
                    recycle::refill_step(&s, Duration::from_millis(50));
                }
            })?;
        }
        Ok(engine)
    }

    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), SwapError> {
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(body)
            .map_err(|e| SwapError::os(format!("spawning thread {name}"), e))?;
        self.threads.push(handle);
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SwapStats {
        let s = &self.shared;
        let mut stats = s.counters.snapshot();
        stats.resident_bytes = s.limiter.held_units() * s.unit_bytes;
        stats.resident_bytes_max = s.limiter.held_units_max() * s.unit_bytes;
        stats.metadata_bytes = s.table.metadata_bytes();
        stats.unit_bytes = s.unit_bytes;
        stats.mem_limit_bytes = s.limiter.limit_units().map(|u| u * s.unit_bytes);
        stats.buffers_idle_max = s.buffers.idle_max() as u64;
        stats.buffers_bound = s.buffers.bound() as u64;
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
    pub fn discard_range(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<discard::DiscardReport, SwapError> {
        let s = &self.shared;
        let first = offset.div_ceil(s.unit_bytes) as usize;
        let end = ((offset.saturating_add(len) / s.unit_bytes) as usize).min(s.table.units());
        discard::discard_units(s, first..end.max(first))
    }

    /// Changes the memory limit at run time (`None`: no limit).
    pub fn set_mem_limit_bytes(&self, bytes: Option<u64>) {
        let s = &self.shared;
        s.limiter
            .set_limit_units(bytes.map(|b| (b / s.unit_bytes).max(1)));
    }

    /// Per-state unit counts `[absent, resident, staged, stored, loading,
    /// evicting]` (not an atomic snapshot).
    pub fn unit_states(&self) -> [u64; 6] {
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
