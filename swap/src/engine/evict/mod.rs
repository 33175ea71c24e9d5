//! Live eviction: take a unit away from the guest atomically, then decide
//! what it costs to keep it outside memory.
//!
//! Take-away, by backing:
//! - anonymous (THP and 4 KiB units): UFFDIO_MOVE the unit out of guest RAM
//!   into a parking slot (a 2 MiB THP moves as one PMD). From that instant
//!   the guest's next touch faults MISSING and is served from the parking
//!   slot ([`super::restore`]). Holes the unit had (pages discarded by someone)
//!   are filled with the zero page in the parking slot, so every thread can
//!   read the slot without faulting into the userfaultfd.
//! - hugetlb: write-protect the unit (a write now faults and waits, as the
//!   unit is `Evicting`), copy it into the parking slot, punch the hole.
//!
//! Then:
//! - clean (the store slot still holds the content): drop it, no write. For
//!   2 MiB anonymous units the content hash is checked first (see
//!   [`super::hash`] for the window it closes);
//! - all zero: drop it, it becomes `Absent` (never written);
//! - otherwise: `Staged`, and written to the store in batches by the same
//!   thread; when the write completes the parking slot is released.
//!
//! A released slot's huge page is kept as a restore buffer when the pool
//! has room ([`super::recycle`]); only content nobody needs is released.
//!
//! Files: this one holds the service the rest of the engine calls (a
//! range, room for a claim, the background loop in [`background`]) and
//! the [`Evictor`] of one call with its two batches; [`unit`] evicts
//! whole units, [`page`] pages of split chunks. Both write through the
//! store's batch calls and share the evictor's parking slots.
//!
//! A fault on a staged unit before its write starts gets the parked pages
//! moved back (no copy, no I/O); during the write it gets a copy (the
//! pages may be pinned by O_DIRECT) and the write's slot is freed.
//!
//! A split chunk's pages are evicted one by one: each is moved out into a
//! page of the evictor's own parking slot (`Evicting`), dropped if all
//! zero, else written in place into the chunk's store slot (given to the
//! chunk by its first page write) with the other pages of the batch, and
//! only then `Stored`. A fault on such a page waits for that write: a page
//! has no `Staged` state, which keeps its state in 4 bits.

pub(crate) mod background;
mod page;
mod unit;

use std::sync::Arc;
use std::time::Duration;

use super::config::InstallMode;
use super::error::SwapError;
use super::geometry::Geometry;
use super::lifecycle::Lifecycle;
use super::limit::{Limiter, MakeRoom};
use super::page_tables::PageTables;
use super::parking::Parking;
use super::policy::{EvictionPolicy, Victim};
use super::recycle::RestoreBuffers;
use super::stats::{bump, Counters};
use crate::chunk::{ChunkTable, PageRef, PageTable, Tag};
use crate::index::{PageIndex, ParkingSlot, UnitIndex, UnitRange};
use crate::store::{SharedStore, SlotId};
use crate::uffd::Userfaults;

/// What an eviction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Units written to the store.
    pub written_units: u64,
    /// Clean units dropped without a write.
    pub clean_dropped_units: u64,
    /// All-zero units dropped (now absent).
    pub zero_units: u64,
    /// Units left resident because the kernel refused to move them (pinned).
    pub busy_units: u64,
    /// Bytes written to the store.
    pub written_bytes: u64,
    /// Pages of split chunks written to the store.
    pub written_pages: u64,
    /// Pages of split chunks found all zero and dropped.
    pub zero_pages: u64,
}

impl EvictReport {
    /// Units that left memory.
    pub fn released_units(&self) -> u64 {
        self.written_units + self.clean_dropped_units + self.zero_units
    }

    /// Pages that left memory, with `unit_pages` pages per whole unit.
    pub fn released_pages(&self, unit_pages: u64) -> u64 {
        self.released_units() * unit_pages + self.written_pages + self.zero_pages
    }
}

/// Takes units and pages out of guest RAM into the store: what every
/// eviction (background, for a claim, for a range) goes through.
pub(crate) struct EvictService {
    pub geo: Arc<Geometry>,
    pub uffd: Arc<dyn Userfaults>,
    pub mode: InstallMode,
    pub table: Arc<ChunkTable>,
    /// The pages of split chunks (2 MiB units only).
    pub pages: Option<Arc<PageTable>>,
    pub store: SharedStore,
    pub parking: Arc<Parking>,
    pub buffers: Arc<RestoreBuffers>,
    /// Empty page tables under chunks moved out whole.
    pub page_tables: Arc<PageTables>,
    pub limiter: Arc<Limiter>,
    pub policy: Box<dyn EvictionPolicy>,
    pub counters: Arc<Counters>,
    pub life: Arc<Lifecycle>,
    /// Units written to the store per batch.
    pub batch_units: usize,
}

impl EvictService {
    /// The pages of split chunks. Only called for a split chunk or one of
    /// its pages, which exist only where the table has pages.
    fn split_pages(&self) -> &PageTable {
        self.pages
            .as_deref()
            .expect("a split chunk exists only where chunks split")
    }
}

/// Pages of split chunks written per batch.
const PAGE_BATCH: usize = 64;

/// Staged whole units waiting for their batch write: the unit and its
/// parking slot.
struct UnitBatch {
    batch: Vec<(UnitIndex, ParkingSlot)>,
}

/// Evicted pages of split chunks waiting for their write.
struct PageBatch {
    /// The parking slot whose pages hold this evictor's evicted pages, and
    /// how many of its pages are taken (the next free one's index, or
    /// `PAGES_PER_CHUNK` when full).
    slot: Option<(ParkingSlot, usize)>,
    /// The page, where it is parked in `slot`, and its chunk's store slot.
    batch: Vec<(PageRef, PageIndex, SlotId)>,
}

/// One call's eviction: its batches, written when full and at the end.
struct Evictor<'a> {
    s: &'a EvictService,
    units: UnitBatch,
    pages: PageBatch,
    report: EvictReport,
    /// mincore's answer, reused.
    residency: Vec<u8>,
}

impl Drop for Evictor<'_> {
    fn drop(&mut self) {
        // Pages still in the batch (a failed write: the VM ends) keep the
        // slot, so their content is never discarded.
        if let (Some((p, _)), true) = (self.pages.slot, self.pages.batch.is_empty()) {
            self.s.parking.release(p);
        }
    }
}

impl<'a> Evictor<'a> {
    fn new(s: &'a EvictService) -> Evictor<'a> {
        Evictor {
            s,
            units: UnitBatch {
                batch: Vec::with_capacity(s.batch_units),
            },
            pages: PageBatch {
                slot: None,
                batch: Vec::new(),
            },
            report: EvictReport::default(),
            residency: Vec::new(),
        }
    }

    /// Evicts one policy victim.
    fn evict_victim(&mut self, victim: Victim) -> Result<(), SwapError> {
        match victim {
            Victim::Unit(unit) => self.evict(unit),
            Victim::Page(at) => self.evict_page(at),
        }
    }

    /// A parking slot; flushes this evictor's batch when none is free, so
    /// evictors holding slots always make progress.
    fn parking_slot(&mut self) -> Result<ParkingSlot, SwapError> {
        loop {
            if let Some(p) = self.s.parking.try_acquire() {
                return Ok(p);
            }
            if !self.units.batch.is_empty() {
                self.flush_units()?;
                continue;
            }
            if self.s.life.stopping() {
                return Err(SwapError::ShuttingDown);
            }
            if self.s.life.failed() {
                // A failed write may never give its parking slot back.
                return Err(SwapError::Failed);
            }
            if let Some(p) = self.s.parking.acquire_timeout(Duration::from_millis(10)) {
                return Ok(p);
            }
        }
    }

    /// Writes both batches (units, pages) and settles them.
    fn flush(&mut self) -> Result<(), SwapError> {
        let units = self.flush_units();
        let pages = self.flush_pages();
        units.and(pages)
    }
}

impl EvictService {
    /// Evicts every resident unit of `units` and waits until their writes (and
    /// writes of units other evictors staged there) completed.
    pub(crate) fn evict_range(&self, units: UnitRange) -> Result<EvictReport, SwapError> {
        let s = self;
        let mut evictor = Evictor::new(s);
        for unit in units.clone() {
            if s.life.stopping() {
                return Err(SwapError::ShuttingDown);
            }
            // After a fatal error a unit can stay in flight for good (a fault
            // whose store read failed keeps its toucher blocked): give up then.
            let state = s
                .table
                .wait_settled(unit, &|| s.life.stopping() || s.life.failed());
            if state.tag().in_flight() {
                return Err(if s.life.stopping() {
                    SwapError::ShuttingDown
                } else {
                    SwapError::Failed
                });
            }
            if matches!(state.tag(), Tag::Resident | Tag::Split) {
                evictor.evict(unit)?;
            }
        }
        evictor.flush()?;
        for unit in units {
            // A unit another evictor failed to write stays staged for good.
            while matches!(s.table.load(unit).tag(), Tag::Staged | Tag::Evicting)
                && !s.life.stopping()
                && !s.life.failed()
            {
                crate::chunk::poll_pause(Duration::from_micros(200));
            }
            if let (Tag::Split, Some(pages)) = (s.table.load(unit).tag(), s.pages.as_deref()) {
                for at in unit.pages() {
                    pages.wait_settled(at, &|| s.life.stopping() || s.life.failed());
                }
            }
        }
        Ok(std::mem::take(&mut evictor.report))
    }

    /// Evicts the pages `pages` of split chunks, each if it is resident,
    /// and writes them back: the model checker's page evictions.
    #[cfg(feature = "model-check")]
    pub(crate) fn evict_pages(&self, pages: &[PageRef]) -> Result<EvictReport, SwapError> {
        let mut evictor = Evictor::new(self);
        for &at in pages {
            evictor.evict_page(at)?;
        }
        evictor.flush()?;
        Ok(std::mem::take(&mut evictor.report))
    }

    /// Evicts victims chosen by the policy until about `want_pages` pages
    /// left memory; returns how many pages did. Errors were already reported
    /// to the VMM.
    pub(crate) fn evict_for_room(&self, want_pages: u64) -> u64 {
        let s = self;
        let mut victims = Vec::new();
        let unit_pages = s.limiter.unit_pages();
        s.policy
            .pick(&s.table, want_pages, unit_pages, &mut victims);
        let mut evictor = Evictor::new(s);
        for victim in victims {
            if evictor.evict_victim(victim).is_err() {
                break;
            }
        }
        let _ = evictor.flush();
        evictor.report.released_pages(unit_pages)
    }

    /// True when no unit is being evicted or written by anyone (so waiting for
    /// memory to free up would wait forever).
    pub(crate) fn nothing_in_flight(&self) -> bool {
        let s = self;
        let counts = s.table.count_tags();
        counts.staged == 0 && counts.evicting == 0
    }
}

impl MakeRoom for EvictService {
    fn make_room(&self, pages: u64) -> u64 {
        self.evict_for_room(pages)
    }

    fn nothing_in_flight(&self) -> bool {
        EvictService::nothing_in_flight(self)
    }

    fn stopping(&self) -> bool {
        self.life.stopping()
    }

    fn claim_waits(&self) {
        bump(&self.counters.evict_waits);
    }
}
