//! Page eviction of split chunks: each resident page is moved out into a
//! page of the evictor's own parking slot, dropped if all zero, else
//! written in place into the chunk's store slot with the rest of the
//! batch, and only then `Stored`.

use std::time::Duration;

use super::{Evictor, PAGE_BATCH};
use crate::chunk::{PageRef, PageState, PageTag, PageTransition, Tag, PAGES_PER_CHUNK};
use crate::engine::error::SwapError;
use crate::engine::hash::scan;
use crate::engine::stats::{add, bump};
use crate::index::{PageIndex, ParkingSlot, UnitIndex};
use crate::store::{PageWrite, SlotId};
use crate::uffd::MoveOptions;
use guestmem::addr::Hva;
use guestmem::host::PAGE_BYTES;

impl Evictor<'_> {
    /// Evicts every resident page of a split chunk.
    pub(super) fn evict_split(&mut self, chunk: UnitIndex) -> Result<(), SwapError> {
        for at in chunk.pages() {
            self.evict_page(at)?;
        }
        Ok(())
    }

    /// A page of this evictor's parking slot for one evicted page; flushes
    /// the page batch when the slot is full.
    pub(super) fn page_parking(&mut self) -> Result<(ParkingSlot, PageIndex), SwapError> {
        if let Some((p, next)) = self.pages.slot {
            if next < PAGES_PER_CHUNK {
                self.pages.slot = Some((p, next + 1));
                return Ok((p, PageIndex::new(next)));
            }
            self.flush_pages()?;
            return self.page_parking();
        }
        let p = self.parking_slot()?;
        self.pages.slot = Some((p, 1));
        Ok((p, PageIndex::FIRST))
    }

    /// Evicts one page of a split chunk if it is resident.
    pub(super) fn evict_page(&mut self, at: PageRef) -> Result<(), SwapError> {
        let s = self.s;
        let pages = s.split_pages();
        let evicting = loop {
            let state = pages.load(at);
            if state.tag() != PageTag::Resident {
                return Ok(());
            }
            if let Ok(evicting) = pages.begin_evict(at, state) {
                break evicting;
            }
        };
        pages.stamp_eviction(
            at,
            s.counters
                .split
                .page_evictions
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        bump(&s.counters.split.page_evictions);
        let (p, index) = match self.page_parking() {
            Ok(place) => place,
            Err(e) => {
                pages.settle(at, evicting, PageTransition::AbortEvict);
                return Err(e);
            }
        };
        let parked = s.parking.addr(p).offset_by(index.offset_bytes());
        // Holes are not allowed: a hole comes back as ENOENT and is settled
        // as a zero page below, which spares every other page a mincore
        // call to find out whether the move left its parking page empty.
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: false,
        };
        let mut tries = 0;
        let mut stray_dropped = false;
        loop {
            // SAFETY: this evictor owns the page (Evicting) and its parking
            // page (empty: a fresh or discarded slot); raw addresses only.
            match unsafe {
                s.uffd
                    .move_all(parked, s.geo.page_addr(at), PAGE_BYTES, options)
            } {
                Ok(()) => break,
                Err(e) if e.errno() == Some(libc::ENOENT) => {
                    // The guest page was a hole (discarded while resident):
                    // it reads as zeros, and nothing was parked.
                    self.settle_zero_page(at, evicting);
                    return Ok(());
                }
                Err(e)
                    if e.is_eexist() && !stray_dropped && self.drop_stray_zero_page(p, index) =>
                {
                    stray_dropped = true;
                }
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
                            "moving out the page at guest address {:#x} into page {} of parking slot {p}",
                            s.geo.page_store_key(at),
                            index.get()
                        ),
                        e,
                    );
                    s.life.fatal(&e);
                    return Err(e);
                }
            }
        }
        let offset = s.parking.offset(p).offset_by(index.offset_bytes());
        // SAFETY: the parking page is populated (a page moved in: holes
        // were refused) and owned by this evictor until released.
        let data = unsafe { s.parking.raw().slice(offset, PAGE_BYTES) };
        if scan(data).zero {
            let _ = s.parking.raw().discard(offset, PAGE_BYTES);
            self.settle_zero_page(at, evicting);
            return Ok(());
        }
        // The chunk's slot, taken while this page is in flight: no merge
        // of the chunk can finish (and free it) before the page settles.
        // Taken only for a page to write, so a chunk of zero pages gets none.
        let slot = match self.split_slot(at.chunk) {
            Ok(Some(slot)) => slot,
            Ok(None) => {
                // Being merged back or split: put the page back.
                self.put_page_back(at, parked)?;
                let _ = s.parking.raw().discard(offset, PAGE_BYTES);
                pages.settle(at, evicting, PageTransition::AbortEvict);
                bump(&s.counters.split.pages_given_up);
                return Ok(());
            }
            Err(e) => {
                s.life.fatal(&e);
                return Err(e);
            }
        };
        self.pages.batch.push((at, index, slot));
        if self.pages.batch.len() >= PAGE_BATCH {
            self.flush_pages()?;
        }
        Ok(())
    }

    /// Settles an `Evicting` page that read as zeros: `Absent`, nothing
    /// written, its memory given back.
    fn settle_zero_page(&mut self, at: PageRef, evicting: PageState) {
        let s = self.s;
        s.split_pages()
            .settle(at, evicting, PageTransition::SettleZero);
        s.limiter.release(1);
        self.report.zero_pages += 1;
        bump(&s.counters.split.pages_zero);
    }

    /// Whether page `index` of this evictor's parking slot `p`, which the
    /// move found populated, held only zeros and was emptied. CI saw such
    /// a page once (engine_split's forced splits, 2026-12-06; not
    /// reproduced in 45 runs here): a fault on an empty parking page is
    /// resolved with the zero page (`Installer::resolve_stray`), and a
    /// late one lands in whatever slot owns the page by then. A page
    /// holding data is left alone, and the move's failure stays fatal.
    fn drop_stray_zero_page(&self, p: ParkingSlot, index: PageIndex) -> bool {
        let s = self.s;
        // SAFETY: this evictor owns slot `p`, and the page is populated (the
        // move into it failed with EEXIST).
        let dropped = unsafe { s.parking.drop_zero_page(p, index.get() as u64) };
        if dropped {
            log::warn!(
                "swap engine: page {} of parking slot {p} ({}) held a stray zero page when a page eviction moved into it; dropped it and moved again",
                index.get(),
                s.parking.last_release(p)
            );
        }
        dropped
    }

    /// Moves an evicted page back from its parking page `parked` into the
    /// guest (the eviction is given up).
    pub(super) fn put_page_back(&self, at: PageRef, parked: Hva) -> Result<(), SwapError> {
        let s = self.s;
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: false,
        };
        // SAFETY: this evictor owns the page (Evicting) and its parking
        // page; the guest page is empty since the move out.
        unsafe {
            s.uffd
                .move_all(s.geo.page_addr(at), parked, PAGE_BYTES, options)
        }
        .map_err(|e| {
            let e = SwapError::uffd(
                format!(
                    "putting back the page at guest address {:#x}",
                    s.geo.page_store_key(at)
                ),
                e,
            );
            s.life.fatal(&e);
            e
        })
    }

    /// The store slot of split chunk `chunk`, allocating one on its first
    /// page write; `None` unless the chunk's word says `Split`. Called
    /// while this evictor holds one of the chunk's pages `Evicting`.
    ///
    /// A `Loading` word is never trusted for a slot. It is either a merge,
    /// which waits for this page (the page goes back instead), or a
    /// resident chunk being split: its pages are unlocked before its word
    /// says `Split`, and until then the word still names the whole chunk's
    /// clean store copy, which the splitter has freed. Writing a page there
    /// wrote into a slot that another chunk could be given
    /// (`tests/model_clean.rs` found it).
    pub(super) fn split_slot(&self, chunk: UnitIndex) -> Result<Option<SlotId>, SwapError> {
        let s = self.s;
        loop {
            let word = s.table.load(chunk);
            if word.tag() != Tag::Split {
                return Ok(None);
            }
            if let Some(slot) = word.split_slot() {
                return Ok(Some(slot));
            }
            let slot = s
                .store
                .allocate_paged(s.geo.unit_store_key(chunk))
                .map_err(|e| {
                    SwapError::unit_store(
                        format!(
                            "swap out pages of the split chunk at {}",
                            s.geo.unit_name(chunk)
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
    pub(super) fn flush_pages(&mut self) -> Result<(), SwapError> {
        let s = self.s;
        let Some((p, used)) = self.pages.slot else {
            return Ok(());
        };
        let pages = s.split_pages();
        let mut batch = std::mem::take(&mut self.pages.batch);
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
                    gpa: s.geo.page_store_key(at),
                    // SAFETY: the parking page is populated and stays in
                    // place until this batch settles.
                    data: unsafe {
                        s.parking.raw().slice(
                            s.parking.offset(p).offset_by(index.offset_bytes()),
                            PAGE_BYTES,
                        )
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
                        bump(&s.counters.split.pages_written);
                        add(&s.counters.bytes_written, PAGE_BYTES);
                    }
                    Err(e) => {
                        // The page stays Evicting (its faults block) and
                        // parked; the VM ends.
                        let error = SwapError::unit_store(
                            format!(
                                "swap out the page at guest address {:#x} of the split chunk at {}",
                                s.geo.page_store_key(at),
                                s.geo.unit_name(chunk)
                            ),
                            e,
                        );
                        s.life.fatal(&error);
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
            self.pages.slot = Some((p, 0));
        } else {
            self.pages.batch = kept;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
