//! Merging a split chunk back into one unit: collapse (into one huge
//! mapping) and discard (the guest freed the whole chunk).
//!
//! The merging thread takes the chunk word to `Loading` (`BeginMerge`) and
//! then locks every page (waiting for pages in flight), so no fault or
//! eviction acts on the chunk's pages until it publishes the chunk again;
//! faults on the chunk meanwhile wait on the chunk word.
//!
//! Collapse, in order of cost:
//! 1. every page resident: `MADV_COLLAPSE` (the kernel copies the pages
//!    into a new THP under its own locks). It refuses a range holding a
//!    hole, the zero page or a write-protected page (see
//!    docs/KERNEL_FACTS.md), and can fail when busy;
//! 2. otherwise, or when it refused: move the resident pages out into a
//!    parking slot (the guest's next touch faults and waits), fill a THP
//!    restore buffer from them, from the store (stored pages) and with
//!    zeros (absent pages), `MADV_DONTNEED` the chunk so the kernel frees
//!    its empty page table (`CONFIG_PT_RECLAIM`), and move the THP in.
//!
//! Either way the collapse counts only when PAGEMAP_SCAN sees one huge
//! mapping; a chunk installed whole but mapped small is a resident unit
//! all the same (counted under `not_huge`). The chunk's slot is freed: the
//! merged chunk is dirty (its pages were never write-protected).

use std::sync::Arc;

use super::error::SwapError;
use super::geometry::Geometry;
use super::granularity::CollapseReason;
use super::install::Installer;
use super::lifecycle::Lifecycle;
use super::limit::{Limiter, MakeRoom};
use super::parking::Parking;
use super::recycle::{RestoreBuffer, RestoreBuffers};
use super::stats::{bump, CollapseFailure, Counters};
use crate::chunk::ChunkTable;
use crate::chunk::PageTable;
use crate::chunk::{PageState, PageTag, Tag, UnitState, PAGES_PER_CHUNK};
use crate::index::{ParkingSlot, UnitIndex};
use crate::store::SharedStore;
use crate::uffd::MoveOptions;
use guestmem::host::PagemapScanner;
use guestmem::host::PAGE_BYTES;
use std::time::Duration;

/// Merges split chunks back (collapse, discard). Exists only where
/// chunks can split.
pub(crate) struct Collapser {
    pub geo: Arc<Geometry>,
    pub table: Arc<ChunkTable>,
    pub pages: Arc<PageTable>,
    pub store: SharedStore,
    pub installer: Arc<Installer>,
    pub buffers: Arc<RestoreBuffers>,
    pub parking: Arc<Parking>,
    /// Tells whether a collapsed chunk maps huge (`None`: the kernel lacks
    /// `PAGEMAP_SCAN`; a collapse then never counts as verified).
    pub pagemap: Option<Arc<PagemapScanner>>,
    pub limiter: Arc<Limiter>,
    pub room: Arc<dyn MakeRoom>,
    pub counters: Arc<Counters>,
    pub life: Arc<Lifecycle>,
}

/// From this many stored pages on, a collapse reads the chunk's whole slot
/// in one I/O rather than page by page: on this host's disk one 2 MiB
/// O_DIRECT read costs about as much as 16 random 4 KiB ones.
const WHOLE_READ_PAGES: u64 = 16;

/// A split chunk taken for merging, its pages locked.
struct Merging {
    chunk: UnitIndex,
    loading: UnitState,
    before: Vec<PageState>,
}

impl Merging {
    fn count(&self, tag: PageTag) -> u64 {
        self.before.iter().filter(|p| p.tag() == tag).count() as u64
    }

    /// Gives up: pages and chunk as they were.
    fn abort(self, s: &Collapser) {
        let pages = &s.pages;
        pages.unlock_pages(self.chunk, &self.before);
        s.table.abort_merge(self.chunk.into(), self.loading);
    }

    fn free_slot(&self, s: &Collapser) {
        if let Some(slot) = self.loading.split_slot() {
            s.store.free(slot);
        }
    }
}

/// The debug lines of collapse decisions (summarized past the first ones).
static COLLAPSES: super::log_budget::LogBudget = super::log_budget::LogBudget::new();

impl Collapser {
    /// Takes split chunk `chunk` and locks its pages; `None` if it is not
    /// split, someone else took it first, or the engine stops meanwhile.
    fn begin(&self, chunk: UnitIndex) -> Option<Merging> {
        let s = self;
        let split = s.table.load(chunk);
        if split.tag() != Tag::Split {
            return None;
        }
        let loading = s.table.begin_merge(chunk.into(), split).ok()?;
        let pages = &s.pages;
        match pages.lock_all(chunk, &|| s.life.giving_up()) {
            Some(before) => Some(Merging {
                chunk,
                loading,
                before,
            }),
            None => {
                s.table.abort_merge(chunk.into(), loading);
                None
            }
        }
    }

    /// Tries to collapse split chunk `chunk` into one huge mapping. Errors are
    /// fatal (the VMM exits); a collapse that does not happen leaves the chunk
    /// split.
    pub(crate) fn try_collapse(
        &self,
        chunk: UnitIndex,
        reason: CollapseReason,
    ) -> Result<(), SwapError> {
        let s = self;
        let Some(merging) = s.begin(chunk) else {
            return Ok(());
        };
        bump(s.counters.split.collapses_by_reason.of(reason));
        let missing = PAGES_PER_CHUNK as u64 - merging.count(PageTag::Resident);
        COLLAPSES.debug(|| {
        format!(
            "swap engine: collapsing the split chunk at {} ({reason:?}, {missing} of its pages to restore)",
            s.geo.unit_name(chunk)
        )
    });
        if missing == 0 && s.collapse_in_place(&merging) {
            merging.free_slot(s);
            s.table.finish_collapse(chunk.into(), merging.loading, true);
            bump(&s.counters.split.collapses_verified);
            bump(&s.counters.split.collapses_by_madvise);
            return s.installer.wake(chunk, None).map(drop);
        }
        if missing > 0 {
            s.limiter.claim(missing, &*s.room);
        }
        let give_back = |merging: Merging, reason: CollapseFailure| {
            merging.abort(s);
            if missing > 0 {
                s.limiter.release(missing);
            }
            bump(s.counters.split.collapse_failures.of(reason));
        };
        let p = loop {
            if let Some(p) = s.parking.acquire_timeout(Duration::from_millis(10)) {
                break p;
            }
            if s.life.giving_up() {
                give_back(merging, CollapseFailure::NoParking);
                return Ok(());
            }
        };
        let src = s.geo.unit_addr(chunk);
        let dst = s.parking.addr(p);
        let options = MoveOptions {
            allow_src_holes: true,
            dont_wake: false,
        };
        let mut stray_checked = false;
        // SAFETY: this thread owns the chunk (Loading, every page locked) and
        // parking slot `p`; both are reached through raw addresses only.
        while let Err(e) = unsafe {
            s.installer
                .uffd
                .move_all(dst, src, s.geo.unit_bytes, options)
        } {
            let moved = e.done_bytes();
            if moved > 0 {
                // SAFETY: as above, the moved part back where it was.
                unsafe { s.installer.uffd.move_all(src, dst, moved, options) }.map_err(|e| {
                    SwapError::uffd(
                        format!(
                            "putting back the partly collapsed chunk at {}",
                            s.geo.unit_name(chunk)
                        ),
                        e,
                    )
                })?;
            }
            if e.errno() == Some(libc::EBUSY) {
                s.parking.release(p);
                give_back(merging, CollapseFailure::Pinned);
                return Ok(());
            }
            // The slot was taken free, so it should be empty: stray zero
            // pages are dropped and the move tried once more; pages with
            // data end the VM, named, since whose they are is not known.
            let why = if e.is_eexist() && !stray_checked {
                stray_checked = true;
                let what = format!("a collapse of the chunk at {}", s.geo.unit_name(chunk));
                // SAFETY: this thread owns slot `p` (taken above, not yet
                // released) and nothing else moves into it meanwhile.
                match unsafe { s.parking.clear_strays_for_move(p, &what) } {
                    Ok(()) => continue,
                    Err(held) => format!(": {held}"),
                }
            } else {
                String::new()
            };
            return Err(SwapError::uffd(
                format!(
                    "moving out the split chunk at {} to collapse it{why}",
                    s.geo.unit_name(chunk)
                ),
                e,
            ));
        }
        let buf = s.buffers.for_overwrite();
        if let Err(e) = s.fill(&merging, p, &buf) {
            // The pages are in parking slot `p` and the buffer; the VM ends.
            s.buffers.give_back_populated(buf);
            s.life.fatal(&e);
            return Ok(());
        }
        s.parking.release(p);
        // Frees the chunk's empty page table, so that the THP maps huge.
        let _ = s
            .geo
            .guest
            .discard(s.geo.unit_offset(chunk), s.geo.unit_bytes);
        s.installer.install_thp_buffer(chunk, buf)?;
        let huge = s.pagemap.as_ref().is_some_and(|scanner| {
            scanner
                .is_huge(&s.geo.guest, s.geo.unit_offset(chunk), s.geo.unit_bytes)
                .unwrap_or(false)
        });
        merging.free_slot(s);
        s.table.finish_collapse(chunk.into(), merging.loading, huge);
        if huge {
            bump(&s.counters.split.collapses_verified);
        } else {
            bump(
                s.counters
                    .split
                    .collapse_failures
                    .of(CollapseFailure::NotHuge),
            );
        }
        s.installer.wake(chunk, None).map(drop)
    }

    /// `MADV_COLLAPSE` on a chunk whose pages are all resident; true when
    /// PAGEMAP_SCAN then sees one huge mapping.
    fn collapse_in_place(&self, merging: &Merging) -> bool {
        let s = self;
        let offset = s.geo.unit_offset(merging.chunk);
        let huge = s.geo.guest.collapse(offset, s.geo.unit_bytes).is_ok()
            && s.pagemap.as_ref().is_some_and(|scanner| {
                scanner
                    .is_huge(&s.geo.guest, offset, s.geo.unit_bytes)
                    .unwrap_or(false)
            });
        if !huge {
            bump(
                s.counters
                    .split
                    .collapse_failures
                    .of(CollapseFailure::MadviseRefused),
            );
        }
        huge
    }

    /// Fills the restore buffer with the chunk's content: resident pages from
    /// parking slot `p` (where they were just moved), stored pages from the
    /// store, absent pages zero.
    fn fill(
        &self,
        merging: &Merging,
        p: ParkingSlot,
        buf: &RestoreBuffer,
    ) -> Result<(), SwapError> {
        let s = self;
        let (range, offset) = s.buffers.place(buf);
        // SAFETY: the buffer is ours until given back and populated; nothing
        // else accesses it.
        let data = unsafe { range.slice_mut(offset, s.geo.unit_bytes) };
        let parked = s.parking.offset(p);
        let slot = merging.loading.split_slot();
        // Many stored pages: one read of the whole slot (each written page
        // verified), then the resident and absent pages over it.
        let stored = merging.count(PageTag::Stored);
        let whole_read = stored >= WHOLE_READ_PAGES;
        if whole_read {
            let slot = slot.expect("stored pages live in their chunk's slot");
            s.store
                .read_paged_unit(slot, s.geo.unit_store_key(merging.chunk), data)
                .map_err(|e| {
                    SwapError::unit_store(
                        format!(
                            "read the swapped-out pages of the split chunk at {} to collapse it",
                            s.geo.unit_name(merging.chunk)
                        ),
                        e,
                    )
                })?;
            super::stats::add(&s.counters.bytes_read, s.geo.unit_bytes);
        }
        for (at, state) in merging.chunk.pages().zip(&merging.before) {
            let first_byte = at.page.offset_bytes() as usize;
            let bytes = first_byte..first_byte + PAGE_BYTES as usize;
            match state.tag() {
                PageTag::Resident => {
                    // SAFETY: the resident pages were just moved into slot `p`
                    // (present), and this thread owns the slot.
                    let src = unsafe {
                        s.parking
                            .raw()
                            .slice(parked.offset_by(at.page.offset_bytes()), PAGE_BYTES)
                    };
                    data[bytes].copy_from_slice(src);
                }
                PageTag::Stored if whole_read => {}
                PageTag::Stored => {
                    let slot = slot.expect("a stored page lives in its chunk's slot");
                    s.store
                    .read_page(slot, at.page, s.geo.page_store_key(at), &mut data[bytes])
                    .map_err(|e| {
                        SwapError::unit_store(
                            format!(
                                "read the swapped-out page at guest address {:#x} to collapse the chunk at {}",
                                s.geo.page_store_key(at),
                                s.geo.unit_name(merging.chunk)
                            ),
                            e,
                        )
                    })?;
                    super::stats::add(&s.counters.bytes_read, PAGE_BYTES);
                }
                _ => data[bytes].fill(0),
            }
        }
        Ok(())
    }

    /// Drops a split chunk the guest freed whole: its resident pages are
    /// zapped, its slot freed, and the chunk is absent. Returns the resident
    /// pages released, or `None` if the chunk was not split (any more).
    pub(crate) fn discard_split(&self, chunk: UnitIndex) -> Result<Option<u64>, SwapError> {
        let s = self;
        let Some(merging) = s.begin(chunk) else {
            return Ok(None);
        };
        let resident = merging.count(PageTag::Resident);
        if let Err(e) = s
            .geo
            .guest
            .discard(s.geo.unit_offset(chunk), s.geo.unit_bytes)
        {
            merging.abort(s);
            return Err(SwapError::os(
                format!(
                    "dropping the free split chunk at {}",
                    s.geo.unit_name(chunk)
                ),
                e,
            ));
        }
        merging.free_slot(s);
        // Empty now, as a chunk moved out whole: a table under it spares
        // the next write fault the kernel's zeroing of a huge page.
        s.installer.page_tables.prepare(chunk);
        s.table.finish_merge_absent(chunk.into(), merging.loading);
        s.limiter.release(resident);
        bump(&s.counters.split.merged_absent);
        Ok(Some(resident))
    }
}
