//! Evicted huge pages reused as restore buffers.
//!
//! With 2 MiB units on THP memory, eviction moves a unit's PMD into a
//! parking slot. Once that content is no longer needed (written to the
//! store, dropped as clean, or dropped as all zero) the slot still holds a
//! perfectly good huge page. Before, the engine freed it (`MADV_DONTNEED`)
//! and the refill thread had the kernel allocate and clear a fresh one for
//! the next restore: a third of a swapping run's CPU samples. Now the page
//! stays in its slot and becomes the buffer of a later restore: the store
//! read (or the staging copy) goes into it and it is moved onto the
//! faulting unit whole, as one PMD.
//!
//! The refill thread clears (zeroes) each kept page before a restore takes
//! it, and a restore prefers cleared pages. Measured on the nested host of
//! `docs/BENCHMARKS.md`: in some runs, the first writes to a page the
//! guest has just used were slow wherever they happened, 0.4-0.8 ms more
//! per 2 MiB (a store read into it took 1.7 ms instead of 1.2 on average, a
//! memset 0.7-1 ms instead of 60 us); the kernel's clear of a fresh page
//! paid the same on the refill thread before. Clearing a kept page there
//! keeps that cost off the fault path and needs no allocation, no free and
//! no TLB shootdown; and a cleared page serves a zero fill as it is.
//!
//! Invariants:
//! - Only content nobody needs is recycled: [`release_parked`] is called
//!   where the engine used to free the slot, i.e. after the writer settled
//!   the unit `Stored` (or a fault thread finished copying out of it), or
//!   after a clean or zero drop. A slot that is `Staged` or that a fault
//!   copies from is never offered.
//! - Only whole huge pages are kept (checked with `PAGEMAP_SCAN` when
//!   offered, cleared and taken: a page split meanwhile is freed rather
//!   than installed as small pages). Parking slots are 2 MiB aligned and a
//!   recycled page is only ever moved whole.
//! - The pool's bound covers recycled and fresh idle buffers together
//!   ([`super::buffers`]), so host memory stays what the memory limit
//!   expects: the limiter counts a unit until the moment its page is
//!   recycled, and a restore reserves its unit before it takes the page.
//! - A recycled page lies in the registered parking area, where no engine
//!   thread may touch an empty page; a kept page is populated (checked
//!   present), and only the thread holding it (the refill thread while it
//!   clears it, then its taker) writes it.
//! - The parking area has `bound` extra slots, so recycled pages never take
//!   slots away from evictors.

use super::buffers::{Buffer, RefillJob};
use super::stats::bump;
use super::{Backing, Shared};
use guestmem::host::RawRange;
use std::time::Duration;

/// Where a restore buffer's memory is.
#[derive(Debug)]
enum Origin {
    /// A buffer of the (unregistered) pool.
    Pool(Buffer),
    /// A recycled huge page in this parking slot.
    Parked(u32),
}

/// A buffer for one restore, owned by the fault thread that took it until
/// given back with [`put_moved`] or [`put_populated`].
#[derive(Debug)]
pub(crate) struct RestoreBuffer {
    /// Address of the buffer.
    pub addr: u64,
    /// The buffer is one huge page.
    pub huge: bool,
    origin: Origin,
}

impl RestoreBuffer {
    /// The range holding the buffer and the buffer's offset in it.
    pub fn place<'a>(&self, s: &'a Shared) -> (&'a RawRange, u64) {
        match &self.origin {
            Origin::Pool(buf) => (s.buffers.raw(), s.buffers.offset_of(buf)),
            Origin::Parked(slot) => (s.parking.raw(), s.parking.offset(*slot)),
        }
    }

    /// Copies parked unit `p` into the buffer.
    pub fn copy_from_parked(&self, s: &Shared, p: u32) {
        let (range, offset) = self.place(s);
        range.copy_from(offset, s.parking.raw(), s.parking.offset(p), s.unit_bytes);
    }
}

/// True when evicted pages are recycled: 2 MiB units on THP memory, a
/// kernel that tells whether a page is huge, and restore buffers that may
/// be huge (not the `small_restore_buffers` test knob).
fn enabled(s: &Shared) -> bool {
    s.backing == Backing::Thp && s.pagemap.is_some() && !s.small_restore_buffers
}

/// Whether parking slot `p` holds one whole huge page.
fn parked_huge(s: &Shared, p: u32) -> bool {
    s.pagemap.as_ref().is_some_and(|scanner| {
        scanner
            .is_huge(s.parking.raw(), s.parking.offset(p), s.unit_bytes)
            .unwrap_or(false)
    })
}

/// Takes a recycled page, cleared ones first (`cleared_only`: only those),
/// with whether it was cleared; pages split since they were kept are
/// freed on the way.
fn take_recycled(s: &Shared, cleared_only: bool) -> Option<(u32, bool)> {
    loop {
        let (slot, cleared) = match s.buffers.take_cleared() {
            Some(slot) => (slot, true),
            None if cleared_only => return None,
            None => (s.buffers.take_raw()?, false),
        };
        if parked_huge(s, slot) {
            return Some((slot, cleared));
        }
        bump(&s.counters.buffers_recycle_dropped);
        s.parking.release(slot);
    }
}

fn from_pool(s: &Shared, buf: Buffer) -> RestoreBuffer {
    if s.backing == Backing::Thp {
        bump(&s.counters.buffers_fresh);
    }
    RestoreBuffer {
        addr: buf.addr,
        huge: buf.huge,
        origin: Origin::Pool(buf),
    }
}

fn from_parking(s: &Shared, slot: u32, cleared: bool) -> RestoreBuffer {
    bump(&s.counters.buffers_recycled);
    if !cleared {
        bump(&s.counters.buffers_recycled_uncleared);
    }
    RestoreBuffer {
        addr: s.parking.addr(slot),
        huge: true,
        origin: Origin::Parked(slot),
    }
}

/// Zeroes a recycled page in place.
fn clear(s: &Shared, slot: u32) {
    // SAFETY: the slot holds a whole huge page (checked by the caller), so
    // writing it never faults into the userfaultfd; the caller took it
    // from the pool, so it is this thread's alone.
    unsafe {
        s.parking
            .raw()
            .slice_mut(s.parking.offset(slot), s.unit_bytes)
    }
    .fill(0);
}

impl RestoreBuffer {
    /// A buffer whose content the caller overwrites entirely (store read,
    /// staging copy), cheapest first: a cleared recycled page, a ready
    /// fresh one, a recycled page not cleared yet, a fresh one filled
    /// inline.
    pub(crate) fn for_overwrite(s: &Shared) -> RestoreBuffer {
        take(s, false)
    }

    /// A zeroed buffer (THP units), in the same order as
    /// [`RestoreBuffer::for_overwrite`], a recycled page not cleared yet
    /// being cleared here.
    pub(crate) fn zeroed(s: &Shared) -> RestoreBuffer {
        take(s, true)
    }

    /// Gives the buffer back after its pages were moved into the guest.
    pub(crate) fn give_back_moved(self, s: &Shared) {
        match self.origin {
            Origin::Pool(buf) => s.buffers.put_moved(buf),
            // The move emptied the slot: a valid move destination again.
            Origin::Parked(slot) => s.parking.release_empty(slot),
        }
    }

    /// Gives the buffer back while it still holds its pages (a copy
    /// source, or the restore failed).
    pub(crate) fn give_back_populated(self, s: &Shared) {
        match self.origin {
            Origin::Pool(buf) => s.buffers.put_used(buf),
            // May have been moved in part: empty it before reuse.
            Origin::Parked(slot) => s.parking.release(slot),
        }
    }
}

fn take(s: &Shared, zeroed: bool) -> RestoreBuffer {
    if enabled(s) {
        if let Some((slot, cleared)) = take_recycled(s, true) {
            return from_parking(s, slot, cleared);
        }
        if let Some(buf) = s.buffers.try_take_ready() {
            return from_pool(s, buf);
        }
        if let Some((slot, cleared)) = take_recycled(s, false) {
            if zeroed && !cleared {
                clear(s, slot);
            }
            return from_parking(s, slot, cleared);
        }
    }
    from_pool(s, s.buffers.take())
}

/// Parking slot `p` holds content nobody needs any more (written, or
/// dropped as clean or zero): keep its huge page as a restore buffer if
/// the pool has room, else free the slot.
pub(crate) fn release_parked(s: &Shared, p: u32) {
    if enabled(s) {
        if parked_huge(s, p) && s.buffers.offer_recycled(p) {
            return;
        }
        bump(&s.counters.buffers_recycle_dropped);
    }
    s.parking.release(p);
}

/// One step of the refill thread: clear a kept page, or fill a fresh
/// buffer, or wait up to `wait` for work.
pub(crate) fn refill_step(s: &Shared, wait: Duration) {
    match s.buffers.next_refill_job(wait, refill_target(s)) {
        None => {}
        Some(RefillJob::Fill(index)) => s.buffers.fill_job(index),
        Some(RefillJob::Clear(slot)) => {
            if parked_huge(s, slot) {
                clear(s, slot);
                s.buffers.finish_clear(slot);
            } else {
                s.buffers.abandon_clear();
                bump(&s.counters.buffers_recycle_dropped);
                s.parking.release(slot);
            }
        }
    }
}

/// How many buffers the refill thread keeps ready for use (fresh ones
/// plus cleared recycled ones). Near the memory limit every restore is
/// paired with an eviction that hands back a page, so a small reserve
/// covers the restores that come before their eviction's page (and
/// bursts); the rest of the pool's room is left to recycled pages. Below
/// the limit (no evictions) the whole pool is kept ready, as before
/// recycling.
fn refill_target(s: &Shared) -> usize {
    let bound = s.buffers.bound();
    if enabled(s) && s.limiter.near_limit() {
        (s.fault_threads + 1).min(bound / 2).max(1)
    } else {
        bound
    }
}
