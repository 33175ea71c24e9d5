//! Split chunks: splitting a huge chunk into 512 pages, and serving a fault
//! on one page of a split chunk.
//!
//! Only chunks of anonymous (THP) memory split, on a store that keeps pages
//! ([`crate::store::Store::supports_pages`]): a hugetlb page cannot be
//! mapped in parts, and a 4 KiB unit is a page already.
//!
//! How a chunk splits, by what it was (the chunk's owner, a fault thread
//! holding it `Loading`, publishes the pages and then `Split`):
//! - absent: every page absent; the faulting page is then zero-filled
//!   alone (4 KiB of memory, not 2 MiB);
//! - stored: the store reads the slot once, verified whole, and keeps its
//!   pages where they are with a checksum each (`read_and_split`); every
//!   page is stored, and each fault reads its 4 KiB only;
//! - staged: handed back whole (moved, no I/O), then split as resident;
//! - resident: metadata only. The pages stay in the chunk's huge mapping
//!   until the first page is moved out (the kernel then splits the PMD;
//!   see docs/KERNEL_FACTS.md). A write-protected (clean) chunk is
//!   unprotected whole first and its store copy freed: a split chunk's
//!   pages are not write-protected, and a WRITEPROTECT over less than
//!   2 MiB would split a huge mapping.
//!
//! A zero fill of a page installs a zeroed page by `UFFDIO_COPY`, not the
//! shared zero page (`UFFDIO_ZEROPAGE`): `MADV_COLLAPSE` refuses a range
//! holding the zero page.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::access;
use super::error::SwapError;
use super::geometry::Geometry;
use super::granularity::SplitReason;
use super::install::Installer;
use super::lifecycle::Lifecycle;
use super::limit::{Limiter, MakeRoom};
use super::outcome::Outcome;
use super::recycle::RestoreBuffers;
use super::stats::{add, bump, Counters, FaultSource};
use crate::chunk::{ChunkTable, PageRef, PageState, PageTable, PageTag, Tag, UnitState};
use crate::index::{PageIndex, UnitIndex};
use crate::store::{SharedStore, SlotId};
use crate::uffd::FaultKind;
use blockio::AlignedBuf;
use guestmem::addr::Hva;
use guestmem::host::PAGE_BYTES;

/// Splits chunks and serves faults on the pages of split chunks. Exists
/// only where chunks can split (THP memory, a store that keeps pages).
pub(crate) struct Splitter {
    pub geo: Arc<Geometry>,
    pub table: Arc<ChunkTable>,
    pub pages: Arc<PageTable>,
    pub store: SharedStore,
    pub installer: Arc<Installer>,
    pub buffers: Arc<RestoreBuffers>,
    pub limiter: Arc<Limiter>,
    pub room: Arc<dyn MakeRoom>,
    pub counters: Arc<Counters>,
    pub life: Arc<Lifecycle>,
    /// A zeroed page to copy from (page zero fills).
    pub zero_page: AlignedBuf,
}

/// The debug lines of split decisions (summarized past the first ones).
static SPLITS: super::log_budget::LogBudget = super::log_budget::LogBudget::new();

impl Splitter {
    /// Splits a chunk a fault thread took to `Loading` from `from` (absent or
    /// stored) instead of restoring it whole. `Ok(false)`: a store error was
    /// reported (the chunk stays `Loading`, its faults blocked).
    pub(crate) fn split_on_restore(
        &self,
        chunk: UnitIndex,
        loading: UnitState,
        from: UnitState,
        reason: SplitReason,
    ) -> Result<bool, SwapError> {
        let s = self;
        let (slot, page_tag) = match from.tag() {
            Tag::Absent => (None, PageTag::Absent),
            Tag::Stored => {
                let slot = from.store_slot();
                let buf = s.buffers.for_overwrite();

                let (range, offset) = s.buffers.place(&buf);
                // SAFETY: the buffer is ours until given back and populated, so
                // writing it never faults into the userfaultfd.
                let data = unsafe { range.slice_mut(offset, s.geo.unit_bytes) };
                let read = s
                    .store
                    .read_and_split(slot, s.geo.unit_store_key(chunk), data);
                s.buffers.give_back_populated(buf);
                if let Err(e) = read {
                    s.life.fatal(&SwapError::unit_store(
                        format!("split the swapped-out chunk at {}", s.geo.unit_name(chunk)),
                        e,
                    ));
                    return Ok(false);
                }
                add(&s.counters.bytes_read, s.geo.unit_bytes);
                (Some(slot), PageTag::Stored)
            }
            other => unreachable!("split_on_restore from {other:?}"),
        };
        s.table
            .finish_split(chunk.into(), loading, slot, &|_| PageState::new(page_tag));
        bump(s.counters.split.splits_by_origin.of(from.tag()));
        bump(s.counters.split.splits_by_reason.of(reason));
        SPLITS.debug(|| {
            format!(
                "swap engine: split the {:?} chunk at {} on its restore ({reason:?})",
                from.tag(),
                s.geo.unit_name(chunk)
            )
        });
        Ok(true)
    }

    /// Splits a resident chunk (metadata only, see the module docs); does
    /// nothing if it is not resident, pinned, or taken by someone else first.
    /// `origin`: what it was before its restore, for the stats.
    pub(crate) fn split_resident(
        &self,
        chunk: UnitIndex,
        origin: Tag,
        reason: SplitReason,
    ) -> Result<(), SwapError> {
        let s = self;
        let state = s.table.load(chunk);
        if state.tag() != Tag::Resident || state.pinned() {
            return Ok(());
        }
        let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
            return Ok(());
        };
        if state.wp() {
            if let Err(e) = s.installer.unprotect_and_wake(chunk) {
                s.table
                    .end_resident_fault(chunk.into(), loading, state, false);
                return Err(SwapError::unit_uffd(
                    format!(
                        "unprotect the chunk at {} to split it",
                        s.geo.unit_name(chunk)
                    ),
                    e,
                ));
            }
        }
        if state.clean() {
            s.store.free(state.store_slot());
        }
        s.table.finish_split(chunk.into(), loading, None, &|_| {
            PageState::new(PageTag::Resident)
        });
        bump(s.counters.split.splits_by_origin.of(origin));
        bump(s.counters.split.splits_by_reason.of(reason));
        SPLITS.debug(|| {
            format!(
            "swap engine: split the resident chunk at {} ({reason:?}, restored from {origin:?})",
            s.geo.unit_name(chunk)
        )
        });
        Ok(())
    }

    /// Serves a fault at `address` in the split chunk `chunk`. `None`: the
    /// chunk changed mode meanwhile; the caller reads its word again.
    pub(crate) fn page_fault(
        &self,
        chunk: UnitIndex,
        address: u64,
        kind: FaultKind,
    ) -> Result<Option<Outcome>, SwapError> {
        let s = self;
        let pages = &s.pages;
        let page = (address - s.geo.unit_addr(chunk).raw()) / PAGE_BYTES;
        let at = chunk.page(PageIndex::new(page as usize));
        loop {
            let state = pages.load(at);
            match state.tag() {
                PageTag::Locked => return Ok(None),
                PageTag::Loading | PageTag::Evicting => {
                    let settled = pages.wait_settled(at, &|| s.life.giving_up());
                    if settled.tag().in_flight() {
                        return Ok(Some(Outcome::Blocked));
                    }
                }
                PageTag::Resident => {
                    // Owned while the message is resolved: an evictor that
                    // moved the page out between this load and the zero
                    // install below would leave a zero page over content
                    // it is writing to the store.
                    let Ok(owned) = pages.begin_resident_fault(at, state) else {
                        continue;
                    };
                    return s.resident_page_fault(at, owned, kind).map(Some);
                }
                PageTag::Absent | PageTag::Stored => {
                    s.limiter.claim(1, &*s.room);
                    let Ok(loading) = pages.begin_fault(at, state) else {
                        s.limiter.release(1);
                        continue;
                    };
                    return s.restore_page(at, loading, state.tag()).map(Some);
                }
            }
        }
    }

    /// The slot holding the stored pages of `chunk`, one of which this
    /// thread holds `Loading`; `None` only when the engine stops meanwhile.
    ///
    /// A chunk split on its restore has its pages unlocked before its word
    /// says `Split` (`finish_split`), so a fault that read the word as
    /// `Split` before the chunk was collapsed, evicted and split again can
    /// take one of those pages while the word is still the restore's
    /// `Loading`, which names no split slot yet; the splitter publishes
    /// without waiting for pages, so this waits for its word
    /// (`model_split.rs` found the race: a panic here). A merge's `Loading`
    /// word keeps the chunk's slot, and a merge waits for this page, so it
    /// is never waited for.
    fn split_slot_of(&self, chunk: UnitIndex) -> Option<SlotId> {
        let s = self;
        loop {
            let word = s.table.load(chunk);
            if let Some(slot) = word.split_slot() {
                return Some(slot);
            }
            assert_eq!(
                word.tag(),
                Tag::Loading,
                "a stored page lives in its chunk's slot: {word:?}"
            );
            let settled = s.table.wait_settled(chunk, &|| s.life.giving_up());
            if settled.tag().in_flight() {
                return None;
            }
        }
    }

    /// Installs one page (zero or read from the chunk's slot), then wakes the
    /// threads faulting on it.
    fn restore_page(
        &self,
        at: PageRef,
        loading: PageState,
        from: PageTag,
    ) -> Result<Outcome, SwapError> {
        let s = self;
        let pages = &s.pages;
        let name = || {
            format!(
                "page at guest address {:#x} of the split chunk at {}",
                s.geo.page_store_key(at),
                s.geo.unit_name(at.chunk)
            )
        };
        let mut read_buf = None;
        let (src, source) = if from == PageTag::Stored {
            let Some(slot) = s.split_slot_of(at.chunk) else {
                // The engine stops: the page stays Loading, its faults blocked.
                return Ok(Outcome::Blocked);
            };
            let mut buf = AlignedBuf::new(PAGE_BYTES as usize, PAGE_BYTES as usize);
            if let Err(e) = s
                .store
                .read_page(slot, at.page, s.geo.page_store_key(at), &mut buf)
            {
                // Never zero-fill: the page stays Loading, its faults blocked.
                s.life.fatal(&SwapError::unit_store(
                    format!("restore the swapped-out {}", name()),
                    e,
                ));
                return Ok(Outcome::Blocked);
            }
            add(&s.counters.bytes_read, PAGE_BYTES);
            bump(&s.counters.split.page_faults.store);
            let src = Hva::new(buf.as_ptr() as u64);
            read_buf = Some(buf);
            (src, FaultSource::Store)
        } else {
            bump(&s.counters.split.page_faults.zero);
            (Hva::new(s.zero_page.as_ptr() as u64), FaultSource::Zero)
        };
        let copied = s.installer.install_page(at, src);
        drop(read_buf);
        copied.map_err(|e| SwapError::unit_uffd(format!("install the {}", name()), e))?;
        let chances = if from == PageTag::Stored {
            let evictions = s.counters.split.page_evictions.load(Ordering::Relaxed);
            access::page_chances(
                pages.evictions_since(at, evictions),
                s.limiter.limit_pages(),
            )
        } else {
            0
        };
        if chances > 0 {
            bump(&s.counters.split.page_activations);
        }
        pages.set_chances(at, chances);
        pages.finish_restore(at, loading);
        s.installer.wake_page(at, Some(source))
    }

    /// A fault on a page that is resident, which this thread holds
    /// `Loading` (`owned`) so that it stays mapped or stays a hole until the
    /// message is resolved: a message another thread already served, a
    /// write-protect fault left from before the chunk split (it was
    /// unprotected whole then), or a real hole (reads as zero).
    fn resident_page_fault(
        &self,
        at: PageRef,
        owned: PageState,
        kind: FaultKind,
    ) -> Result<Outcome, SwapError> {
        let s = self;
        let result = match kind {
            FaultKind::WriteProtect => s.installer.unprotect_page(at),
            FaultKind::Missing => match s
                .installer
                .install_page(at, Hva::new(s.zero_page.as_ptr() as u64))
            {
                Err(e) if e.is_eexist() => {
                    bump(&s.counters.stale_faults);
                    Ok(())
                }
                other => other,
            },
            FaultKind::Minor => Ok(()),
        };
        s.pages.end_resident_fault(at, owned);
        result.map_err(|e| {
            SwapError::unit_uffd(
                format!(
                    "resolve a fault on the resident page at guest address {:#x}",
                    s.geo.page_store_key(at)
                ),
                e,
            )
        })?;
        s.installer.wake_page(at, None)
    }
}
