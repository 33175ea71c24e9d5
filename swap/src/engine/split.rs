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

use std::sync::atomic::{AtomicU64, Ordering};

use super::fault::Outcome;
use super::granularity::SplitReason;
use super::recycle::RestoreBuffer;
use super::stats::{add, bump, FaultSource};
use super::{limit, Shared, SwapError};
use crate::chunk::{PageRef, PageState, PageTag, Tag, UnitState};
use crate::uffd::{CopyOptions, FaultKind};
use blockio::AlignedBuf;
use guestmem::host::PAGE_BYTES;

/// Whether chunks split, and the test knob's counters.
pub(crate) struct SplitControl {
    /// Chunks can split here (THP memory, a store that keeps pages).
    pub enabled: bool,
    /// `--force-split-every N`.
    force_every: Option<u64>,
    restores: AtomicU64,
    page_faults: AtomicU64,
    /// A zeroed page to copy from (page zero fills).
    zero_page: AlignedBuf,
}

impl SplitControl {
    pub fn new(enabled: bool, force_every: Option<u32>) -> SplitControl {
        SplitControl {
            enabled,
            force_every: force_every.map(|n| u64::from(n.max(1))),
            restores: AtomicU64::new(0),
            page_faults: AtomicU64::new(0),
            zero_page: AlignedBuf::new(PAGE_BYTES as usize, PAGE_BYTES as usize),
        }
    }

    fn every_nth(&self, counter: &AtomicU64) -> bool {
        match (self.enabled, self.force_every) {
            (true, Some(n)) => (counter.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(n),
            _ => false,
        }
    }

    /// The knob says this restore of a huge chunk splits it.
    pub fn split_this_restore(&self) -> bool {
        self.every_nth(&self.restores)
    }

    /// The knob says to try collapsing after this page fault.
    pub fn collapse_after_this_fault(&self) -> bool {
        self.every_nth(&self.page_faults)
    }
}

/// Index into [`super::stats::SplitStats::splits_by_origin`].
fn origin_index(tag: Tag) -> usize {
    match tag {
        Tag::Absent => 0,
        Tag::Stored => 1,
        Tag::Staged => 2,
        _ => 3,
    }
}

/// Splits a chunk a fault thread took to `Loading` from `from` (absent or
/// stored) instead of restoring it whole. `Ok(false)`: a store error was
/// reported (the chunk stays `Loading`, its faults blocked).
pub(crate) fn split_on_restore(
    s: &Shared,
    chunk: usize,
    loading: UnitState,
    from: UnitState,
    reason: SplitReason,
) -> Result<bool, SwapError> {
    let (slot, page_tag) = match from.tag() {
        Tag::Absent => (None, PageTag::Absent),
        Tag::Stored => {
            let slot = from.store_slot();
            let buf = RestoreBuffer::for_overwrite(s);
            let (range, offset) = buf.place(s);
            // SAFETY: the buffer is ours until given back and populated, so
            // writing it never faults into the userfaultfd.
            let data = unsafe { range.slice_mut(offset, s.unit_bytes) };
            let read = s.store.read_and_split(slot, s.unit_gpa(chunk), data);
            buf.give_back_populated(s);
            if let Err(e) = read {
                s.fatal(&SwapError::unit_store(
                    format!("split the swapped-out chunk at {}", s.unit_name(chunk)),
                    e,
                ));
                return Ok(false);
            }
            add(&s.counters.bytes_read, s.unit_bytes);
            (Some(slot), PageTag::Stored)
        }
        other => unreachable!("split_on_restore from {other:?}"),
    };
    s.table
        .finish_split(chunk.into(), loading, slot, &|_| PageState::new(page_tag));
    bump(&s.counters.splits_by_origin[origin_index(from.tag())]);
    bump(&s.counters.splits_by_reason[reason as usize]);
    SPLITS.debug(|| {
        format!(
            "swap engine: split the {:?} chunk at {} on its restore ({reason:?})",
            from.tag(),
            s.unit_name(chunk)
        )
    });
    Ok(true)
}

/// Splits a resident chunk (metadata only, see the module docs); does
/// nothing if it is not resident, pinned, or taken by someone else first.
/// `origin`: what it was before its restore, for the stats.
pub(crate) fn split_resident(
    s: &Shared,
    chunk: usize,
    origin: Tag,
    reason: SplitReason,
) -> Result<(), SwapError> {
    let state = s.table.load(chunk);
    if !s.split.enabled || state.tag() != Tag::Resident || state.pinned() {
        return Ok(());
    }
    let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
        return Ok(());
    };
    if state.wp() {
        if let Err(e) = s
            .uffd
            .write_unprotect(s.unit_addr(chunk), s.unit_bytes, false)
        {
            s.table
                .end_resident_fault(chunk.into(), loading, state, false);
            return Err(SwapError::unit_uffd(
                format!("unprotect the chunk at {} to split it", s.unit_name(chunk)),
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
    bump(&s.counters.splits_by_origin[origin_index(origin)]);
    bump(&s.counters.splits_by_reason[reason as usize]);
    SPLITS.debug(|| {
        format!(
            "swap engine: split the resident chunk at {} ({reason:?}, restored from {origin:?})",
            s.unit_name(chunk)
        )
    });
    Ok(())
}

/// The debug lines of split decisions (summarized past the first ones).
static SPLITS: super::log_budget::LogBudget = super::log_budget::LogBudget::new();

/// Guest address of page `page` of `chunk`, for messages and the store.
pub(crate) fn page_gpa(s: &Shared, at: PageRef) -> u64 {
    s.unit_gpa(at.chunk) + (at.page as u64) * PAGE_BYTES
}

/// Host address of a page.
pub(crate) fn page_addr(s: &Shared, at: PageRef) -> u64 {
    s.unit_addr(at.chunk) + (at.page as u64) * PAGE_BYTES
}

/// Serves a fault at `address` in the split chunk `chunk`. `None`: the
/// chunk changed mode meanwhile; the caller reads its word again.
pub(crate) fn page_fault(
    s: &Shared,
    chunk: usize,
    address: u64,
    kind: FaultKind,
) -> Result<Option<Outcome>, SwapError> {
    let pages = s.table.pages().expect("only 2 MiB chunks split");
    let page = ((address - s.unit_addr(chunk)) / PAGE_BYTES) as usize;
    let at = PageRef { chunk, page };
    loop {
        let state = pages.load(at);
        match state.tag() {
            PageTag::Locked => return Ok(None),
            PageTag::Loading | PageTag::Evicting => {
                let settled = pages.wait_settled(at, &|| s.stopping() || s.failed());
                if settled.tag().in_flight() {
                    return Ok(Some(Outcome::Blocked));
                }
            }
            PageTag::Resident => return resident_page_fault(s, at, kind).map(Some),
            PageTag::Absent | PageTag::Stored => {
                limit::claim_memory(s, 1);
                let Ok(loading) = pages.begin_fault(at, state) else {
                    s.limiter.release(1);
                    continue;
                };
                return restore_page(s, at, loading, state.tag()).map(Some);
            }
        }
    }
}

/// Installs one page (zero or read from the chunk's slot), then wakes the
/// threads faulting on it.
fn restore_page(
    s: &Shared,
    at: PageRef,
    loading: PageState,
    from: PageTag,
) -> Result<Outcome, SwapError> {
    let pages = s.table.pages().expect("only 2 MiB chunks split");
    let dst = page_addr(s, at);
    let name = || {
        format!(
            "page at guest address {:#x} of the split chunk at {}",
            page_gpa(s, at),
            s.unit_name(at.chunk)
        )
    };
    let mut read_buf = None;
    let (src, source) = if from == PageTag::Stored {
        let slot = s
            .table
            .load(at.chunk)
            .split_slot()
            .expect("a stored page lives in its chunk's slot");
        let mut buf = AlignedBuf::new(PAGE_BYTES as usize, PAGE_BYTES as usize);
        if let Err(e) = s.store.read_page(slot, at.page, page_gpa(s, at), &mut buf) {
            // Never zero-fill: the page stays Loading, its faults blocked.
            s.fatal(&SwapError::unit_store(
                format!("restore the swapped-out {}", name()),
                e,
            ));
            return Ok(Outcome::Blocked);
        }
        add(&s.counters.bytes_read, PAGE_BYTES);
        bump(&s.counters.page_faults_store);
        let src = buf.as_ptr() as u64;
        read_buf = Some(buf);
        (src, FaultSource::Store)
    } else {
        bump(&s.counters.page_faults_zero);
        (s.split.zero_page.as_ptr() as u64, FaultSource::Zero)
    };
    let copied = s.uffd.copy_all(
        dst,
        src,
        PAGE_BYTES,
        CopyOptions {
            write_protect: false,
            dont_wake: true,
        },
    );
    drop(read_buf);
    copied.map_err(|e| SwapError::unit_uffd(format!("install the {}", name()), e))?;
    pages.finish_restore(at, loading);
    wake_page(s, at, Some(source))
}

/// A fault on a page that is resident: a message another thread already
/// served, a write-protect fault left from before the chunk split (it was
/// unprotected whole then), or a real hole (reads as zero).
fn resident_page_fault(s: &Shared, at: PageRef, kind: FaultKind) -> Result<Outcome, SwapError> {
    let dst = page_addr(s, at);
    let result = match kind {
        FaultKind::WriteProtect => s.uffd.write_unprotect(dst, PAGE_BYTES, true),
        FaultKind::Missing => {
            let options = CopyOptions {
                write_protect: false,
                dont_wake: true,
            };
            match s
                .uffd
                .copy_all(dst, s.split.zero_page.as_ptr() as u64, PAGE_BYTES, options)
            {
                Err(e) if e.is_eexist() => {
                    bump(&s.counters.stale_faults);
                    Ok(())
                }
                other => other,
            }
        }
        FaultKind::Minor => Ok(()),
    };
    result.map_err(|e| {
        SwapError::unit_uffd(
            format!(
                "resolve a fault on the resident page at guest address {:#x}",
                page_gpa(s, at)
            ),
            e,
        )
    })?;
    wake_page(s, at, None)
}

fn wake_page(s: &Shared, at: PageRef, source: Option<FaultSource>) -> Result<Outcome, SwapError> {
    s.uffd.wake(page_addr(s, at), PAGE_BYTES).map_err(|e| {
        SwapError::unit_uffd(
            format!(
                "wake the threads faulting on guest address {:#x}",
                page_gpa(s, at)
            ),
            e,
        )
    })?;
    Ok(Outcome::Woken(source))
}
