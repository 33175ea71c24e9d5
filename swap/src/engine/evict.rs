//! Live eviction: take a unit away from the guest atomically, then decide
//! what it costs to keep it outside memory.
//!
//! Take-away, by backing:
//! - anonymous (THP and 4 KiB units): UFFDIO_MOVE the unit out of guest RAM
//!   into a parking slot (a 2 MiB THP moves as one PMD). From that instant
//!   the guest's next touch faults MISSING and is served from the parking
//!   slot ([`super::fault`]). Holes the unit had (pages discarded by someone)
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

use std::ops::Range;
use std::time::Duration;

use super::hash::scan;
use super::policy::Victim;
use super::recycle::release_parked;
use super::split::{page_addr, page_gpa};
use super::stats::{add, bump};
use super::{Backing, Shared, SwapError};
use crate::chunk::{PageRef, PageTag, PageTransition, Settled, Tag, UnitState, PAGES_PER_CHUNK};
use crate::store::{PageWrite, SlotId, WriteRequest};
use crate::uffd::MoveOptions;
use guestmem::host::{punch_hole, PAGE_BYTES};

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

/// Pages of split chunks written per batch.
const PAGE_BATCH: usize = 64;

/// Evicts a set of units and writes them in batches.
struct Evictor<'a> {
    s: &'a Shared,
    batch: Vec<(usize, u32)>,
    report: EvictReport,
    residency: Vec<u8>,
    /// The parking slot whose pages hold this evictor's evicted pages of
    /// split chunks, and the next free page in it.
    page_slot: Option<(u32, usize)>,
    /// Evicted pages waiting for their write: the page, where it is
    /// parked in `page_slot`, and its chunk's store slot.
    page_batch: Vec<(PageRef, usize, SlotId)>,
}

impl Drop for Evictor<'_> {
    fn drop(&mut self) {
        // Pages still in the batch (a failed write: the VM ends) keep the
        // slot, so their content is never discarded.
        if let (Some((p, _)), true) = (self.page_slot, self.page_batch.is_empty()) {
            self.s.parking.release(p);
        }
    }
}

impl<'a> Evictor<'a> {
    fn new(s: &'a Shared) -> Evictor<'a> {
        Evictor {
            s,
            batch: Vec::with_capacity(s.batch_units),
            report: EvictReport::default(),
            residency: Vec::new(),
            page_slot: None,
            page_batch: Vec::new(),
        }
    }

    /// Evicts one policy victim.
    fn evict_victim(&mut self, victim: Victim) -> Result<(), SwapError> {
        match victim {
            Victim::Unit(unit) => self.evict(unit),
            Victim::Page(at) => self.evict_page(at),
        }
    }

    /// Evicts every resident page of a split chunk.
    fn evict_split(&mut self, chunk: usize) -> Result<(), SwapError> {
        for page in 0..PAGES_PER_CHUNK {
            self.evict_page(PageRef { chunk, page })?;
        }
        Ok(())
    }

    /// A page of this evictor's parking slot for one evicted page; flushes
    /// the page batch when the slot is full.
    fn page_parking(&mut self) -> Result<(u32, usize), SwapError> {
        if let Some((p, next)) = self.page_slot {
            if next < PAGES_PER_CHUNK {
                self.page_slot = Some((p, next + 1));
                return Ok((p, next));
            }
            self.flush_pages()?;
            return self.page_parking();
        }
        let p = self.parking_slot()?;
        self.page_slot = Some((p, 1));
        Ok((p, 0))
    }

    /// Evicts one page of a split chunk if it is resident.
    fn evict_page(&mut self, at: PageRef) -> Result<(), SwapError> {
        let s = self.s;
        let pages = s.table.pages().expect("only 2 MiB chunks split");
        let evicting = loop {
            let state = pages.load(at);
            if state.tag() != PageTag::Resident {
                return Ok(());
            }
            if let Ok(evicting) = pages.begin_evict(at, state) {
                break evicting;
            }
        };
        bump(&s.counters.page_evictions);
        let (p, index) = match self.page_parking() {
            Ok(place) => place,
            Err(e) => {
                pages.settle(at, evicting, PageTransition::AbortEvict);
                return Err(e);
            }
        };
        let parked = s.parking.addr(p) + index as u64 * PAGE_BYTES;
        let options = MoveOptions {
            allow_src_holes: true,
            dont_wake: false,
        };
        let mut tries = 0;
        loop {
            // SAFETY: this evictor owns the page (Evicting) and its parking
            // page (empty: a fresh or discarded slot); raw addresses only.
            match unsafe {
                s.uffd
                    .move_all(parked, page_addr(s, at), PAGE_BYTES, options)
            } {
                Ok(()) => break,
                Err(e) if e.errno() == Some(libc::EBUSY) && tries < 3 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(e) if e.errno() == Some(libc::EBUSY) => {
                    // Pinned (device I/O): nothing moved, leave it.
                    pages.settle(at, evicting, PageTransition::AbortEvict);
                    self.report.busy_units += 1;
                    bump(&s.counters.evict_busy);
                    return Ok(());
                }
                Err(e) => {
                    let e = SwapError::uffd(
                        format!(
                            "moving out the page at guest address {:#x}",
                            page_gpa(s, at)
                        ),
                        e,
                    );
                    s.fatal(&e);
                    return Err(e);
                }
            }
        }
        let offset = s.parking.offset(p) + index as u64 * PAGE_BYTES;
        self.fill_page_hole(offset)?;
        // SAFETY: the parking page is populated (moved in, or its hole
        // filled) and owned by this evictor until released.
        let data = unsafe { s.parking.raw().slice(offset, PAGE_BYTES) };
        if scan(data).zero {
            let _ = s.parking.raw().discard(offset, PAGE_BYTES);
            pages.settle(at, evicting, PageTransition::SettleZero);
            s.limiter.release(1);
            self.report.zero_pages += 1;
            bump(&s.counters.pages_zero);
            return Ok(());
        }
        // The chunk's slot, taken while this page is in flight: no merge
        // of the chunk can finish (and free it) before the page settles.
        // Taken only for a page to write, so a chunk of zero pages gets none.
        let slot = match self.split_slot(at.chunk) {
            Ok(Some(slot)) => slot,
            Ok(None) => {
                // Being merged back and no slot yet: put the page back.
                self.put_page_back(at, parked)?;
                let _ = s.parking.raw().discard(offset, PAGE_BYTES);
                pages.settle(at, evicting, PageTransition::AbortEvict);
                return Ok(());
            }
            Err(e) => {
                s.fatal(&e);
                return Err(e);
            }
        };
        self.page_batch.push((at, index, slot));
        if self.page_batch.len() >= PAGE_BATCH {
            self.flush_pages()?;
        }
        Ok(())
    }

    /// Moves an evicted page back from its parking page `parked` into the
    /// guest (the eviction is given up).
    fn put_page_back(&self, at: PageRef, parked: u64) -> Result<(), SwapError> {
        let s = self.s;
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: false,
        };
        // SAFETY: this evictor owns the page (Evicting) and its parking
        // page; the guest page is empty since the move out.
        unsafe {
            s.uffd
                .move_all(page_addr(s, at), parked, PAGE_BYTES, options)
        }
        .map_err(|e| {
            let e = SwapError::uffd(
                format!(
                    "putting back the page at guest address {:#x}",
                    page_gpa(s, at)
                ),
                e,
            );
            s.fatal(&e);
            e
        })
    }

    /// Maps the zero page over a parking page the move left empty (the
    /// guest page was a hole).
    fn fill_page_hole(&mut self, offset: u64) -> Result<(), SwapError> {
        let s = self.s;
        s.parking
            .raw()
            .residency(offset, PAGE_BYTES, &mut self.residency)
            .map_err(|e| SwapError::os("mincore on the parking area", e))?;
        if self.residency[0] & 1 == 0 {
            match s
                .uffd
                .zeropage(s.parking.raw().base() + offset, PAGE_BYTES, true)
            {
                Ok(()) => {}
                Err(e) if e.is_eexist() => {}
                Err(e) => return Err(SwapError::uffd("filling a hole in the parking area", e)),
            }
        }
        Ok(())
    }

    /// The store slot of split chunk `chunk`, allocating one on its first
    /// page write; `None` when the chunk is being merged back and has none
    /// (a slot is only given to a chunk whose word says `Split`). Called
    /// while this evictor holds one of the chunk's pages `Evicting`.
    fn split_slot(&self, chunk: usize) -> Result<Option<SlotId>, SwapError> {
        let s = self.s;
        loop {
            let word = s.table.load(chunk);
            if let Some(slot) = word.split_slot() {
                return Ok(Some(slot));
            }
            if word.tag() != Tag::Split {
                return Ok(None);
            }
            let slot = s.store.allocate_paged(s.unit_gpa(chunk)).map_err(|e| {
                SwapError::unit_store(
                    format!(
                        "swap out pages of the split chunk at {}",
                        s.unit_name(chunk)
                    ),
                    e,
                )
            })?;
            if s.table.assign_split_slot(chunk.into(), word, slot).is_ok() {
                return Ok(Some(slot));
            }
            // Another writer gave the chunk a slot first, or it changed.
            s.store.free(slot);
        }
    }

    /// Writes the page batch, chunk by chunk, and settles its pages.
    fn flush_pages(&mut self) -> Result<(), SwapError> {
        let s = self.s;
        let Some((p, used)) = self.page_slot else {
            return Ok(());
        };
        let pages = s.table.pages().expect("only 2 MiB chunks split");
        let mut batch = std::mem::take(&mut self.page_batch);
        batch.sort_by_key(|&(at, _, _)| (at.chunk, at.page));
        let mut first_error = None;
        let mut kept = Vec::new();
        for group in batch.chunk_by(|a, b| a.0.chunk == b.0.chunk) {
            let chunk = group[0].0.chunk;
            let slot = group[0].2;
            let writes: Vec<PageWrite<'_>> = group
                .iter()
                .map(|&(at, index, _)| PageWrite {
                    page: at.page,
                    gpa: page_gpa(s, at),
                    // SAFETY: the parking page is populated and stays in
                    // place until this batch settles.
                    data: unsafe {
                        s.parking
                            .raw()
                            .slice(s.parking.offset(p) + index as u64 * PAGE_BYTES, PAGE_BYTES)
                    },
                })
                .collect();
            let results = s.store.write_pages(slot, &writes);
            drop(writes);
            for (&(at, index, slot), result) in group.iter().zip(results) {
                match result {
                    Ok(()) => {
                        let evicting = pages.load(at);
                        pages.settle(at, evicting, PageTransition::SettleWritten);
                        s.limiter.release(1);
                        self.report.written_pages += 1;
                        bump(&s.counters.pages_written);
                        add(&s.counters.bytes_written, PAGE_BYTES);
                    }
                    Err(e) => {
                        // The page stays Evicting (its faults block) and
                        // parked; the VM ends.
                        let error = SwapError::unit_store(
                            format!(
                                "swap out the page at guest address {:#x} of the split chunk at {}",
                                page_gpa(s, at),
                                s.unit_name(chunk)
                            ),
                            e,
                        );
                        s.fatal(&error);
                        kept.push((at, index, slot));
                        first_error.get_or_insert(error);
                    }
                }
            }
        }
        if kept.is_empty() {
            // Every parked page is written or was dropped: empty the slot
            // for the next batch.
            let _ = s
                .parking
                .raw()
                .discard(s.parking.offset(p), used as u64 * PAGE_BYTES);
            self.page_slot = Some((p, 0));
        } else {
            self.page_batch = kept;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A parking slot; flushes this evictor's batch when none is free, so
    /// evictors holding slots always make progress.
    fn parking_slot(&mut self) -> Result<u32, SwapError> {
        loop {
            if let Some(p) = self.s.parking.try_acquire() {
                return Ok(p);
            }
            if !self.batch.is_empty() {
                self.flush_units()?;
                continue;
            }
            if self.s.stopping() {
                return Err(SwapError::ShuttingDown);
            }
            if self.s.failed() {
                // A failed write may never give its parking slot back.
                return Err(SwapError::Failed);
            }
            if let Some(p) = self.s.parking.acquire_timeout(Duration::from_millis(10)) {
                return Ok(p);
            }
        }
    }

    /// Evicts one unit if it is resident and not pinned.
    fn evict(&mut self, unit: usize) -> Result<(), SwapError> {
        let s = self.s;
        let (resident, evicting) = loop {
            let state = s.table.load(unit);
            if state.tag() == Tag::Split {
                return self.evict_split(unit);
            }
            if state.tag() != Tag::Resident || state.pinned() {
                return Ok(());
            }
            let epoch = s
                .counters
                .evictions
                .load(std::sync::atomic::Ordering::Relaxed) as u16;
            if let Ok(evicting) = s.table.begin_evict_at(unit.into(), state, epoch) {
                if state.prefetched() {
                    bump(&s.counters.prefetch_waste);
                }
                break (state, evicting);
            }
        };
        bump(&s.counters.evictions);
        let p = match self.parking_slot() {
            Ok(p) => p,
            Err(e) => {
                s.table.abort_evict(unit.into(), evicting, resident);
                return Err(e);
            }
        };
        match self.take_away(unit, evicting, p) {
            Ok(true) => {}
            Ok(false) => {
                s.parking.release(p);
                s.table.abort_evict(unit.into(), evicting, resident);
                self.report.busy_units += 1;
                bump(&s.counters.evict_busy);
                return Ok(());
            }
            Err(e) => {
                // The unit may be half moved: leave it Evicting (faults on it
                // block) and let the VMM exit.
                s.fatal(&e);
                return Err(e);
            }
        }
        self.classify(unit, evicting, p)
    }

    /// Moves or copies the unit into parking slot `p`. `Ok(false)`: the
    /// kernel refused (pinned pages); nothing was taken.
    fn take_away(&mut self, unit: usize, resident: UnitState, p: u32) -> Result<bool, SwapError> {
        let s = self.s;
        let src = s.unit_addr(unit);
        let dst = s.parking.addr(p);
        let len = s.unit_bytes;
        match s.backing {
            Backing::Thp | Backing::Small => {
                let options = MoveOptions {
                    allow_src_holes: true,
                    dont_wake: false,
                };
                let mut tries = 0;
                loop {
                    // SAFETY: this evictor owns the unit (Evicting) and the
                    // parking slot; both are reached through raw addresses.
                    match unsafe { s.uffd.move_all(dst, src, len, options) } {
                        Ok(()) => break,
                        Err(e)
                            if e.errno() == Some(libc::EBUSY)
                                && e.done_bytes() == 0
                                && tries < 3 =>
                        {
                            tries += 1;
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        Err(e) if e.errno() == Some(libc::EBUSY) => {
                            // Put back what moved, if anything, and give up.
                            let moved = e.done_bytes();
                            if moved > 0 {
                                let back = MoveOptions {
                                    allow_src_holes: true,
                                    dont_wake: false,
                                };
                                // SAFETY: as for the move above, reversed.
                                unsafe { s.uffd.move_all(src, dst, moved, back) }.map_err(|e| {
                                    SwapError::uffd(
                                        format!(
                                            "putting back the partly moved chunk at {}",
                                            s.unit_name(unit)
                                        ),
                                        e,
                                    )
                                })?;
                            }
                            return Ok(false);
                        }
                        Err(e) => {
                            let why = if e.is_eexist() {
                                format!(
                                    " into parking slot {p}, which was not empty (an engine bug)"
                                )
                            } else {
                                String::new()
                            };
                            return Err(SwapError::uffd(
                                format!("moving out the chunk at {}{why}", s.unit_name(unit)),
                                e,
                            ));
                        }
                    }
                }
                self.fill_holes(p)?;
            }
            Backing::Hugetlb { memfd } => {
                if !resident.wp() {
                    s.uffd.write_protect(src, len).map_err(|e| {
                        SwapError::uffd(
                            format!("write-protecting the chunk at {}", s.unit_name(unit)),
                            e,
                        )
                    })?;
                }
                let offset = unit as u64 * len;
                s.parking
                    .raw()
                    .copy_from(s.parking.offset(p), &s.guest, offset, len);
                punch_hole(memfd, offset, len).map_err(|e| {
                    SwapError::os(
                        format!("punching the hugetlb chunk at {}", s.unit_name(unit)),
                        e,
                    )
                })?;
            }
        }
        Ok(true)
    }

    /// Maps the zero page over every page of parking slot `p` that the
    /// move left empty (the unit had holes).
    fn fill_holes(&mut self, p: u32) -> Result<(), SwapError> {
        let s = self.s;
        s.parking
            .raw()
            .residency(s.parking.offset(p), s.unit_bytes, &mut self.residency)
            .map_err(|e| SwapError::os("mincore on the parking area", e))?;
        for (i, &present) in self.residency.iter().enumerate() {
            if present & 1 == 0 {
                let page = s.parking.addr(p) + i as u64 * PAGE_BYTES;
                match s.uffd.zeropage(page, PAGE_BYTES, true) {
                    Ok(()) => {}
                    // Present after all (mincore reports swapped-out pages as
                    // absent).
                    Err(e) if e.is_eexist() => {}
                    Err(e) => return Err(SwapError::uffd("filling a hole in the parking area", e)),
                }
            }
        }
        Ok(())
    }

    /// Decides the fate of a unit parked in `p`.
    fn classify(&mut self, unit: usize, evicting: UnitState, p: u32) -> Result<(), SwapError> {
        let s = self.s;
        // SAFETY: slot `p` is populated (moved in and holes filled, or
        // copied) and owned by this thread until released or staged.
        let data = unsafe { s.parking.raw().slice(s.parking.offset(p), s.unit_bytes) };
        // Without a recorded hash the write-protection is exact (the unit
        // was installed write-protected by UFFDIO_COPY): skip the scan.
        let recorded = s.table.hash(unit);
        let content = if evicting.clean() && recorded.is_none() {
            None
        } else {
            Some(scan(data))
        };
        if evicting.clean() {
            let slot = evicting.store_slot();
            let unchanged = match (recorded, content) {
                (Some(hash), Some(content)) => hash == content.hash,
                _ => true,
            };
            if unchanged {
                release_parked(s, p);
                s.table.settle(unit.into(), evicting, Settled::Clean);
                s.limiter.release(s.limiter.unit_pages());
                self.report.clean_dropped_units += 1;
                bump(&s.counters.clean_drops);
                return Ok(());
            }
            bump(&s.counters.clean_hash_mismatches);
            s.store.free(slot);
        }
        let content = content.unwrap_or_else(|| scan(data));
        if content.zero {
            release_parked(s, p);
            s.table.settle(unit.into(), evicting, Settled::Zero);
            s.limiter.release(s.limiter.unit_pages());
            self.report.zero_units += 1;
            bump(&s.counters.zero_chunks);
            return Ok(());
        }
        s.table.set_hash(unit, content.hash);
        s.table
            .settle(unit.into(), evicting, Settled::Dirty { parking: p });
        self.batch.push((unit, p));
        if self.batch.len() >= s.batch_units {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes both batches (units, pages) and settles them.
    fn flush(&mut self) -> Result<(), SwapError> {
        let units = self.flush_units();
        let pages = self.flush_pages();
        units.and(pages)
    }

    /// Writes the unit batch and settles its units.
    fn flush_units(&mut self) -> Result<(), SwapError> {
        let s = self.s;
        let mut batch = std::mem::take(&mut self.batch);
        // Claim the staged units for writing; a unit handed back before this
        // point had its slot released by the fault thread.
        batch.retain(|&(unit, p)| loop {
            let state = s.table.load(unit);
            if state.tag() != Tag::Staged || state.index() != p || state.writing() {
                return false;
            }
            if s.table.begin_write(unit.into(), state).is_ok() {
                return true;
            }
        });
        if batch.is_empty() {
            return Ok(());
        }
        let requests: Vec<WriteRequest<'_>> = batch
            .iter()
            .map(|&(unit, p)| WriteRequest {
                gpa: s.unit_gpa(unit),
                // SAFETY: slot `p` is populated and stays in place while
                // WRITING is set: the fault path only copies out of it then.
                data: unsafe { s.parking.raw().slice(s.parking.offset(p), s.unit_bytes) },
            })
            .collect();
        let results = s.store.write_batch(&requests);
        drop(requests);
        let mut first_error = None;
        let mut results = results.into_iter();
        for &(unit, p) in &batch {
            match results.next() {
                Some(Ok(slot)) => self.complete(unit, p, Some(slot)),
                Some(Err(e)) => {
                    let error = SwapError::unit_store(
                        format!("swap out the chunk at {}", s.unit_name(unit)),
                        e,
                    );
                    s.fatal(&error);
                    self.complete(unit, p, None);
                    first_error.get_or_insert(error);
                }
                None => {
                    s.fatal(&SwapError::StoreContract(format!(
                        "store {} returned no result for the chunk at {}",
                        s.store.describe(),
                        s.unit_name(unit)
                    )));
                    self.complete(unit, p, None);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Settles a written unit (`slot`), or keeps it staged after a failed
    /// write (`None`).
    fn complete(&mut self, unit: usize, p: u32, slot: Option<SlotId>) {
        let s = self.s;
        loop {
            let state = s.table.load(unit);
            let ours = state.tag() == Tag::Staged && state.index() == p && state.writing();
            if ours {
                let settled = match slot {
                    Some(slot) => s.table.finish_write(unit.into(), state, slot),
                    None => s.table.fail_write(unit.into(), state),
                };
                if settled.is_err() {
                    continue;
                }
                if slot.is_some() {
                    release_parked(s, p);
                    s.limiter.release(s.limiter.unit_pages());
                    self.report.written_units += 1;
                    self.report.written_bytes += s.unit_bytes;
                    bump(&s.counters.units_written);
                    add(&s.counters.bytes_written, s.unit_bytes);
                }
                return;
            }
            // Handed back during the write: the stored copy is not needed.
            // Wait until the fault thread finished copying out of `p`.
            if let Some(slot) = slot {
                s.store.free(slot);
            }
            // A fault that failed fatally can stay `Loading` for good, so
            // waiting stops on a failure as on shutdown.
            let state = s
                .table
                .wait_while(unit, &|st| st.tag() == Tag::Loading, &|| {
                    s.stopping() || s.failed()
                });
            if state.tag() != Tag::Loading {
                // The fault thread has finished copying out of `p`.
                release_parked(s, p);
            }
            // else: stopping or failed while a fault thread may still copy
            // out of `p`; leave the slot allocated.
            return;
        }
    }
}

/// Evicts every resident unit of `units` and waits until their writes (and
/// writes of units other evictors staged there) completed.
pub(crate) fn evict_range(s: &Shared, units: Range<usize>) -> Result<EvictReport, SwapError> {
    let mut evictor = Evictor::new(s);
    for unit in units.clone() {
        if s.stopping() {
            return Err(SwapError::ShuttingDown);
        }
        // After a fatal error a unit can stay in flight for good (a fault
        // whose store read failed keeps its toucher blocked): give up then.
        let state = s.table.wait_settled(unit, &|| s.stopping() || s.failed());
        if state.tag().in_flight() {
            return Err(if s.stopping() {
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
            && !s.stopping()
            && !s.failed()
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        if let (Tag::Split, Some(pages)) = (s.table.load(unit).tag(), s.table.pages()) {
            for page in 0..PAGES_PER_CHUNK {
                pages.wait_settled(PageRef { chunk: unit, page }, &|| {
                    s.stopping() || s.failed()
                });
            }
        }
    }
    Ok(std::mem::take(&mut evictor.report))
}

/// Evicts victims chosen by the policy until about `want_pages` pages
/// left memory; returns how many pages did. Errors were already reported
/// to the VMM.
pub(crate) fn evict_for_room(s: &Shared, want_pages: u64) -> u64 {
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
pub(crate) fn nothing_in_flight(s: &Shared) -> bool {
    let counts = s.table.count_tags();
    counts[Tag::Staged as usize] == 0 && counts[Tag::Evicting as usize] == 0
}
