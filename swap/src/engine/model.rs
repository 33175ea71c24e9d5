//! The engine on a model of the kernel, for the model checker
//! (`--features model-check`; `tests/model.rs`).
//!
//! The model checker runs the engine's own steps (the fault service's
//! `handle`, the evictor, the discarder) on shuttle threads, with the unit
//! table's atomics and locks replaced by shuttle's, so that shuttle's
//! schedulers choose the interleavings. What the kernel does around them
//! is [`ModelKernel`], behind the same [`Userfaults`] trait the engine's
//! components hold the real userfaultfd by.
//!
//! The model keeps guest RAM, the parking area and the restore buffers in
//! real anonymous memory that is not registered with any userfaultfd, and
//! takes the kernel's own page table as the truth of what is mapped:
//! a page is present when `mincore` says so. A move copies the bytes and
//! discards the source pages (`MADV_DONTNEED`), so the source reads as
//! missing after, as it does after `UFFDIO_MOVE`; a copy or a zero page
//! onto a present page fails with `EEXIST`, as the kernel's do. The
//! engine's own `madvise` calls (a discard, a released parking slot) then
//! act on the same truth without going through the model.
//!
//! Shuttle runs its threads one at a time and switches only at its own
//! operations, so each model call, and each guest access, is one atomic
//! step; the model's lock gives shuttle a scheduling point at each.
//!
//! Write protection is modelled as anonymous memory has it: a
//! protection bit on a present page, set by `UFFDIO_WRITEPROTECT` and by
//! a write-protected `UFFDIO_COPY`, cleared by an unprotect, and not
//! carried by `UFFDIO_MOVE` (which clears uffd-wp) nor by a page that
//! goes away. A guest write to a protected page faults (`WriteProtect`)
//! and is served by the fault service like a missing page; a read does
//! not. So an engine built with [`ModelEngine::tracking_clean`] checks
//! clean tracking: a clean unit dropped without a write must not have
//! been written since its store copy.
//!
//! What it does not model: hugetlb, and the fault threads' message loop (a
//! guest thread that finds its page missing or protected resolves the
//! fault itself through the fault service, as the woken vCPU would find it
//! resolved).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::config::{EngineConfig, InstallMode, ManagedRegion, MemoryKind, SwapUnit};
use super::fault::FaultService;
use super::granularity::{CollapseReason, SplitReason};
use super::hooks::EngineHooks;
use super::outcome::Outcome;
use super::{start, SwapEngine};
use crate::chunk::{PageTag, Tag, UnitState};
use crate::index::{PageIndex, UnitIndex, UnitRange};
use crate::store::mem::MemStore;
use crate::store::{Codec, SharedStore};
use crate::uffd::{CopyOptions, FaultKind, MoveOptions, UffdError, Userfaults};
use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{AnonMapping, RawRange, PAGE_BYTES};

/// The kernel's side of the userfaultfd calls, on unregistered memory.
pub struct ModelKernel {
    /// The write-protected pages (their first byte's address). Only a
    /// present page's entry counts: every call that maps a page sets or
    /// clears its entry, so an entry left by a page the engine discarded
    /// with `madvise` is overwritten before the page is seen again.
    ///
    /// Held across each call and each guest access: one shuttle step each.
    protected: shuttle::sync::Mutex<HashSet<u64>>,
}

/// The one page at `address`.
fn page_at(address: u64) -> RawRange {
    // SAFETY: the model is called only on the engine's own mappings (guest
    // RAM, the parking area, restore buffers), which outlive every call;
    // the range is used for mincore and madvise only, never referenced.
    unsafe { RawRange::new(page_base(address), PAGE_BYTES) }
}

/// The first byte of the page holding `address`.
fn page_base(address: u64) -> u64 {
    address & !(PAGE_BYTES - 1)
}

fn present(address: u64) -> bool {
    let mut residency = Vec::with_capacity(1);
    page_at(address)
        .residency(RegionOffset::ZERO, PAGE_BYTES, &mut residency)
        .expect("mincore on the model's own memory");
    residency[0] & 1 != 0
}

fn failed(op: &'static str, address: u64, done_bytes: u64, errno: i32) -> UffdError {
    UffdError::Ioctl {
        op,
        range: format!("{address:#x} (the model kernel)"),
        done_bytes,
        source: std::io::Error::from_raw_os_error(errno),
    }
}

impl ModelKernel {
    fn new() -> ModelKernel {
        ModelKernel {
            protected: shuttle::sync::Mutex::new(HashSet::new()),
        }
    }

    /// Runs `access` on the word at `address` as a guest access (a write
    /// when `write`) that does not fault; the fault it takes instead when
    /// its page is missing, or protected against a write.
    fn access<T>(
        &self,
        address: u64,
        write: bool,
        access: impl FnOnce(*mut u64) -> T,
    ) -> Result<T, FaultKind> {
        let protected = self.protected.lock().unwrap();
        if !present(address) {
            return Err(FaultKind::Missing);
        }
        if write && protected.contains(&page_base(address)) {
            return Err(FaultKind::WriteProtect);
        }
        Ok(access(address as *mut u64))
    }

    /// Fills the missing pages of `[dst, dst+len)` from `fill`, one page at
    /// a time, write-protected when `protect`; `EEXIST` at the first
    /// present one, with the bytes done.
    fn fill_missing(
        &self,
        op: &'static str,
        dst: Hva,
        len: u64,
        protect: bool,
        mut fill: impl FnMut(u64, *mut u8),
    ) -> Result<(), UffdError> {
        let mut protected = self.protected.lock().unwrap();
        for done in (0..len).step_by(PAGE_BYTES as usize) {
            let page = dst.raw() + done;
            if present(page) {
                return Err(failed(op, page, done, libc::EEXIST));
            }
            fill(done, page as *mut u8);
            set_protected(&mut protected, page, protect);
        }
        Ok(())
    }

    /// Sets or clears the protection of the present pages of
    /// `[start, start+len)`: an absent anonymous page has no bit to set
    /// (without `UFFD_FEATURE_WP_UNPOPULATED`, which the engine does not
    /// ask for).
    fn protect_present(&self, start: Hva, len: u64, protect: bool) {
        let mut protected = self.protected.lock().unwrap();
        for done in (0..len).step_by(PAGE_BYTES as usize) {
            let page = start.raw() + done;
            set_protected(&mut protected, page, protect && present(page));
        }
    }
}

fn set_protected(protected: &mut HashSet<u64>, page: u64, protect: bool) {
    if protect {
        protected.insert(page);
    } else {
        protected.remove(&page);
    }
}

impl Userfaults for ModelKernel {
    fn prepare_page_table(&self, _chunk: Hva) -> Result<(), UffdError> {
        // The model keeps no page tables: nothing it shows changes.
        Ok(())
    }

    fn wake(&self, _start: Hva, _len: u64) -> Result<(), UffdError> {
        // No thread sleeps in the model: a guest thread resolves its own
        // fault and retries its access.
        Ok(())
    }

    fn copy(&self, dst: Hva, src: Hva, len: u64, options: CopyOptions) -> Result<(), UffdError> {
        let protect = options.write_protect;
        self.fill_missing("UFFDIO_COPY", dst, len, protect, |done, to| {
            // SAFETY: `src` is readable memory the caller owns for the
            // call, and `to` a missing page of the model's memory, which no
            // one references; one page each, not overlapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src.raw() + done) as *const u8,
                    to,
                    PAGE_BYTES as usize,
                )
            }
        })
    }

    fn zeropage(&self, start: Hva, len: u64, _dont_wake: bool) -> Result<(), UffdError> {
        self.fill_missing("UFFDIO_ZEROPAGE", start, len, false, |_, to| {
            // SAFETY: `to` is a missing page of the model's memory, which no
            // one references.
            unsafe { std::ptr::write_bytes(to, 0, PAGE_BYTES as usize) }
        })
    }

    unsafe fn move_pages(
        &self,
        dst: Hva,
        src: Hva,
        len: u64,
        options: MoveOptions,
    ) -> Result<(), UffdError> {
        let mut protected = self.protected.lock().unwrap();
        for done in (0..len).step_by(PAGE_BYTES as usize) {
            let (from, to) = (src.raw() + done, dst.raw() + done);
            if !present(from) {
                if options.allow_src_holes {
                    continue;
                }
                return Err(failed("UFFDIO_MOVE", from, done, libc::ENOENT));
            }
            if present(to) {
                return Err(failed("UFFDIO_MOVE", to, done, libc::EEXIST));
            }
            // SAFETY: the caller owns both ranges and holds no reference
            // into them (this call's contract); one page each, in two
            // different pages.
            unsafe {
                std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, PAGE_BYTES as usize)
            };
            page_at(from)
                .discard(RegionOffset::ZERO, PAGE_BYTES)
                .expect("madvise on the model's own memory");
            // The moved page arrives unprotected (MOVE clears uffd-wp),
            // and the source's bit went with its page.
            set_protected(&mut protected, to, false);
            set_protected(&mut protected, from, false);
        }
        Ok(())
    }

    fn write_protect(&self, start: Hva, len: u64) -> Result<(), UffdError> {
        self.protect_present(start, len, true);
        Ok(())
    }

    fn write_unprotect(&self, start: Hva, len: u64, _dont_wake: bool) -> Result<(), UffdError> {
        self.protect_present(start, len, false);
        Ok(())
    }
}

/// Runs `scenario` under shuttle's random scheduler and its PCT scheduler
/// (priority-based, depth 3: finds bugs that need up to three ill-timed
/// preemptions with a known probability), `MODEL_ITERATIONS` schedules
/// each, `default_iterations` when that is unset.
pub fn check(scenario: fn(), default_iterations: usize) {
    let iterations = std::env::var("MODEL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_iterations);
    let mut config = shuttle::Config::new();
    // A page group's 512 state words are shuttle's atomics in this build,
    // tens of bytes each, and the thread that first touches the group
    // builds them on its stack: more than shuttle's default 32 KiB (a
    // SIGSEGV, not a failure).
    config.stack_size = 1 << 20;
    shuttle::Runner::new(
        shuttle::scheduler::RandomScheduler::new(iterations),
        config.clone(),
    )
    .run(scenario);
    shuttle::Runner::new(shuttle::scheduler::PctScheduler::new(3, iterations), config)
        .run(scenario);
}

/// A model thread running `steps` on `model`.
pub fn spawn(model: &Arc<ModelEngine>, steps: fn(&ModelEngine)) -> shuttle::thread::JoinHandle<()> {
    let model = model.clone();
    shuttle::thread::spawn(move || steps(&model))
}

/// The model's switch for splitting chunks on their restore (the
/// production hooks otherwise): while on, every restore of a whole chunk
/// splits it, as `--force-split-every 1` would.
#[derive(Debug, Default)]
struct SplitRestores(AtomicBool);

impl EngineHooks for SplitRestores {
    fn split_this_restore(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The engine's components over model guest RAM of 2 MiB units (THP
/// backing, a memory store that keeps pages, so chunks can split), with no
/// thread of its own: the model's threads drive it.
pub struct ModelEngine {
    kernel: Arc<ModelKernel>,
    split_restores: Arc<SplitRestores>,
    engine: SwapEngine,
    faults: Arc<FaultService>,
    /// Guest RAM (unregistered; see the module text). Dropped last.
    guest: AnonMapping,
}

impl ModelEngine {
    /// An engine over `units` 2 MiB units, all absent, under `config`
    /// (its unit is set to 2 MiB, clean tracking and prefetch are off, and
    /// its hooks are the model's, see [`ModelEngine::split_restores`]).
    /// Every fatal error panics, which fails the schedule.
    pub fn new(units: usize, config: EngineConfig) -> ModelEngine {
        ModelEngine::build(units, config, SwapUnit::Huge2M, false)
    }

    /// As [`ModelEngine::new`], with clean tracking on and units of
    /// `unit` (2 MiB, or 4 KiB pages): a unit restored from the store for
    /// a read is write-protected and keeps its store copy, and is dropped
    /// without a write when evicted still clean. A 2 MiB unit is moved in
    /// and protected after, with a content hash to catch a write between
    /// the two; a 4 KiB unit is copied in protected and has no hash, so the
    /// protection alone must catch its first write.
    pub fn tracking_clean(units: usize, config: EngineConfig, unit: SwapUnit) -> ModelEngine {
        assert!(
            unit != SwapUnit::Auto,
            "the model runs fixed units; split 2 MiB chunks with ModelEngine::split"
        );
        ModelEngine::build(units, config, unit, true)
    }

    fn build(units: usize, config: EngineConfig, unit: SwapUnit, track_clean: bool) -> ModelEngine {
        let split_restores = Arc::new(SplitRestores::default());
        let mode = match unit {
            SwapUnit::Small4K => InstallMode::Small,
            _ => InstallMode::Thp,
        };
        let config = EngineConfig {
            hooks: split_restores.clone(),
            unit,
            track_clean,
            prefetch: false,
            // One unit is restored by one thread at a time, with one
            // buffer; populating fewer makes each schedule cheaper. (An
            // empty pool would block a thread outside shuttle's control.)
            buffer_count: config.buffer_count.or(Some(2)),
            ..config
        };
        let unit_bytes = config.unit.bytes();
        let guest = AnonMapping::new(units as u64 * unit_bytes).expect("mapping model guest RAM");
        // Khugepaged may fill the holes of a partly populated huge range
        // (max_ptes_none): that would map pages nobody installed.
        guest
            .range()
            .advise_nohugepage(RegionOffset::ZERO, guest.range().len())
            .expect("madvise on model guest RAM");
        let region = ManagedRegion {
            host_base: guest.range().addr(RegionOffset::ZERO),
            len_bytes: units as u64 * unit_bytes,
            kind: MemoryKind::Anonymous,
            gpa_ranges: Vec::new(),
        };
        let store: SharedStore = Arc::new(
            MemStore::new(Codec::Lz4, unit_bytes as usize, 4 * units as u64, None)
                .expect("a memory store"),
        );
        let staging = start::staging_area(mode, &config).expect("the staging area");
        let kernel = Arc::new(ModelKernel::new());
        let parts = start::KernelParts {
            userfaults: kernel.clone(),
            // SAFETY: `guest` is mapped for as long as the engine, which is
            // dropped before it (field order), and is reached only through
            // raw addresses.
            guest: unsafe { RawRange::new(guest.range().base(), guest.range().len()) },
            track_clean,
            // Without it no evicted page is kept as a restore buffer, so
            // every parking slot in use holds a unit.
            pagemap: None,
            // The model keeps no page tables.
            page_tables_freed: false,
        };
        let on_fatal = Box::new(|e: &super::SwapError| panic!("the engine failed: {e}"));
        let (engine, faults, _no_prefetcher) = SwapEngine::assemble(
            region, store, &config, on_fatal, mode, units, staging, parts,
        )
        .expect("assembling the engine on the model kernel");
        ModelEngine {
            kernel,
            split_restores,
            engine,
            faults,
            guest,
        }
    }

    /// The address of page `page` of unit `unit` (its first word).
    fn page_addr(&self, unit: usize, page: usize) -> u64 {
        assert!(
            (page as u64) < self.engine.geo.unit_bytes / PAGE_BYTES,
            "page {page} is not in a unit of {} bytes",
            self.engine.geo.unit_bytes
        );
        self.engine.geo.unit_addr(UnitIndex::new(unit)).raw() + page as u64 * PAGE_BYTES
    }

    /// A guest access to the first word of page `page` of unit `unit`:
    /// done if the page is mapped (and, for a write, not protected), else
    /// the fault is served by the fault service and the access retried, as
    /// a vCPU's would be.
    fn guest_access<T>(
        &self,
        unit: usize,
        page: usize,
        write: bool,
        mut access: impl FnMut(*mut u64) -> T,
    ) -> T {
        let address = self.page_addr(unit, page);
        loop {
            let kind = match self.kernel.access(address, write, &mut access) {
                Ok(result) => return result,
                Err(kind) => kind,
            };
            match self.faults.serve(address, kind, write) {
                Ok(Outcome::Woken(_) | Outcome::Blocked) => {}
                Err(e) => panic!("a guest fault failed: {e}"),
            }
        }
    }

    /// The guest reads the first word of page `page` of unit `unit`.
    pub fn read(&self, unit: usize, page: usize) -> u64 {
        // SAFETY: the word is in a mapped page (checked in the same step)
        // of model guest RAM, aligned, and nothing holds a reference to it.
        self.guest_access(unit, page, false, |word| unsafe { word.read() })
    }

    /// The guest adds one to the first word of page `page` of unit `unit`.
    pub fn write(&self, unit: usize, page: usize) {
        // SAFETY: as for `read`.
        self.guest_access(unit, page, true, |word| unsafe { *word += 1 })
    }

    /// The guest sets the first word of page `page` of unit `unit`.
    pub fn write_value(&self, unit: usize, page: usize, value: u64) {
        // SAFETY: as for `read`.
        self.guest_access(unit, page, true, |word| unsafe { word.write(value) })
    }

    /// While `on`, every restore of a whole chunk splits it.
    pub fn split_restores(&self, on: bool) {
        self.split_restores.0.store(on, Ordering::Relaxed);
    }

    /// Splits unit `unit` if it is resident (metadata only: its pages stay
    /// mapped), as the granularity policy would.
    pub fn split(&self, unit: usize) {
        let splitter = self.faults.splitter.as_ref().expect("chunks split here");
        let chunk = UnitIndex::new(unit);
        if let Err(e) = splitter.split_resident(chunk, Tag::Resident, SplitReason::Forced) {
            panic!("a split failed: {e}");
        }
    }

    /// Tries to merge the split chunk `unit` back into one huge mapping.
    pub fn collapse(&self, unit: usize) {
        let collapser = self.faults.collapser.as_ref().expect("chunks split here");
        if let Err(e) = collapser.try_collapse(UnitIndex::new(unit), CollapseReason::Forced) {
            panic!("a collapse failed: {e}");
        }
    }

    /// Evicts page `page` of the split chunk `unit` if it is resident, and
    /// writes it back.
    pub fn evict_page(&self, unit: usize, page: usize) {
        let at = UnitIndex::new(unit).page(PageIndex::new(page));
        if let Err(e) = self.engine.evictor.evict_pages(&[at]) {
            panic!("a page eviction failed: {e}");
        }
    }

    /// The tag of page `page` of unit `unit` in the page table.
    pub fn page_tag(&self, unit: usize, page: usize) -> PageTag {
        let pages = self.engine.table.pages().expect("chunks split here");
        pages
            .load(UnitIndex::new(unit).page(PageIndex::new(page)))
            .tag()
    }

    /// Evicts unit `unit` as the background evictor would pick it, and
    /// writes it back.
    pub fn evict(&self, unit: usize) {
        let units = UnitRange::new(UnitIndex::new(unit), UnitIndex::new(unit + 1));
        if let Err(e) = self.engine.evictor.evict_range(units) {
            panic!("an eviction failed: {e}");
        }
    }

    /// The guest gives unit `unit` back (a balloon inflation).
    pub fn discard(&self, unit: usize) {
        let units = UnitRange::new(UnitIndex::new(unit), UnitIndex::new(unit + 1));
        if let Err(e) = self.engine.discarder.discard_units(units) {
            panic!("a discard failed: {e}");
        }
    }

    /// Populates every page of the parking area with zeros, as a late
    /// fault on an empty parking page would (the fault service maps the
    /// zero page there): the next move into any of them finds it present.
    pub fn strew_zero_pages_in_parking(&self) {
        let raw = self.engine.parking.raw();
        for offset in (0..raw.len()).step_by(PAGE_BYTES as usize) {
            // SAFETY: the parking area is the model's own memory, no slot
            // is taken now (no thread runs), and one byte is written.
            unsafe {
                let page = raw.slice_mut(RegionOffset::new(offset), 1);
                std::ptr::write_volatile(page.as_mut_ptr(), 0);
            }
        }
    }

    /// The engine's counters now.
    pub fn stats(&self) -> crate::engine::SwapStats {
        self.engine.stats()
    }

    /// Unit `unit`'s state word.
    pub fn state(&self, unit: usize) -> UnitState {
        self.engine.table.load(UnitIndex::new(unit))
    }

    /// After the threads: nothing in flight, and no store or parking slot
    /// held by nobody.
    pub fn check_quiescent(&self) {
        let units = self.engine.table.units();
        let (mut staged, mut stored) = (0, 0);
        for unit in 0..units {
            let state = self.state(unit);
            assert!(
                !state.tag().in_flight(),
                "unit {unit} left in flight: {state:?}"
            );
            match state.tag() {
                Tag::Staged => staged += 1,
                Tag::Stored => stored += 1,
                // A clean chunk's store copy is still its content.
                Tag::Resident if state.clean() => stored += 1,
                Tag::Split => {
                    // A split chunk's pages live in its own slot, if any.
                    stored += u64::from(state.split_slot().is_some());
                    for page in 0..crate::chunk::PAGES_PER_CHUNK {
                        let tag = self.page_tag(unit, page);
                        assert!(
                            !matches!(tag, PageTag::Loading | PageTag::Evicting),
                            "page {page} of unit {unit} left in flight: {tag:?}"
                        );
                    }
                }
                _ => {}
            }
        }
        assert_eq!(
            self.engine.store.used_slots(),
            stored,
            "store slots in use against stored units"
        );
        assert_eq!(
            self.engine.parking.taken_slots() as u64,
            staged,
            "parking slots taken against staged units"
        );
        // Guest RAM is the model's; keep it alive to here.
        let _ = &self.guest;
    }
}
