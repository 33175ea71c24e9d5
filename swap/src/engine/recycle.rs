//! Evicted huge pages reused as restore buffers.
//!
//! With 2 MiB units on THP memory, eviction moves a unit's PMD into a
//! parking slot. Once that content is no longer needed (written to the
//! store, dropped as clean, or dropped as all zero) the slot still holds a
//! perfectly good huge page. Freeing it (`MADV_DONTNEED`) and having the
//! refill thread allocate and clear a fresh one for the next restore costs a third of a swapping run's CPU samples. So the page
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
//! - Only content nobody needs is recycled: [`RestoreBuffers::release_parked`]
//!   is called where a slot's content is done with: after the writer settled
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

use super::buffers::{Buffer, BufferPool, RefillJob};
use super::config::InstallMode;
use super::limit::Limiter;
use super::parking::Parking;
use super::stats::{bump, Counters};
use crate::index::ParkingSlot;
use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{PagemapScanner, RawRange};
use std::sync::Arc;
use std::time::Duration;

/// Where a restore buffer's memory is.
#[derive(Debug)]
enum Origin {
    /// A buffer of the (unregistered) pool.
    Pool(Buffer),
    /// A recycled huge page in this parking slot.
    Parked(ParkingSlot),
}

/// A buffer for one restore, owned by the fault thread that took it until
/// given back with [`RestoreBuffers::give_back_moved`] or
/// [`RestoreBuffers::give_back_populated`].
#[derive(Debug)]
pub(crate) struct RestoreBuffer {
    /// Address of the buffer.
    pub addr: Hva,
    /// The buffer is one huge page.
    pub huge: bool,
    origin: Origin,
}

/// The restore buffers: the pool of fresh THP buffers and the evicted huge
/// pages kept in parking slots for reuse.
pub(crate) struct RestoreBuffers {
    pool: BufferPool,
    parking: Arc<Parking>,
    /// Tells whether a parked page is huge (THP units; `None` when the
    /// kernel lacks `PAGEMAP_SCAN`: evicted pages are then not recycled).
    pagemap: Option<Arc<PagemapScanner>>,
    /// Evicted pages are recycled (see [`RestoreBuffers::new`]).
    recycling: bool,
    thp: bool,
    unit_bytes: u64,
    limiter: Arc<Limiter>,
    counters: Arc<Counters>,
    fault_threads: usize,
}

/// What [`RestoreBuffers`] is built from.
pub(crate) struct RestoreBuffersParts {
    pub pool: BufferPool,
    pub parking: Arc<Parking>,
    pub pagemap: Option<Arc<PagemapScanner>>,
    pub backing: InstallMode,
    pub small_restore_buffers: bool,
    pub unit_bytes: u64,
    pub limiter: Arc<Limiter>,
    pub counters: Arc<Counters>,
    pub fault_threads: usize,
}

impl RestoreBuffers {
    /// Evicted pages are recycled with 2 MiB units on THP memory, a kernel
    /// that tells whether a page is huge, and restore buffers that may be
    /// huge (not the `small_restore_buffers` test hook).
    pub fn new(parts: RestoreBuffersParts) -> RestoreBuffers {
        let thp = parts.backing == InstallMode::Thp;
        RestoreBuffers {
            recycling: thp && parts.pagemap.is_some() && !parts.small_restore_buffers,
            thp,
            pool: parts.pool,
            parking: parts.parking,
            pagemap: parts.pagemap,
            unit_bytes: parts.unit_bytes,
            limiter: parts.limiter,
            counters: parts.counters,
            fault_threads: parts.fault_threads,
        }
    }

    /// The pool of fresh buffers (for its statistics).
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The range holding the buffer and the buffer's offset in it.
    pub fn place(&self, buf: &RestoreBuffer) -> (&RawRange, RegionOffset) {
        match &buf.origin {
            Origin::Pool(pool_buf) => (self.pool.raw(), self.pool.offset_of(pool_buf)),
            Origin::Parked(slot) => (self.parking.raw(), self.parking.offset(*slot)),
        }
    }

    /// Copies parked unit `p` into the buffer.
    pub fn copy_from_parked(&self, buf: &RestoreBuffer, p: ParkingSlot) {
        let (range, offset) = self.place(buf);
        range.copy_from(
            offset,
            self.parking.raw(),
            self.parking.offset(p),
            self.unit_bytes,
        );
    }

    /// Whether parking slot `p` holds one whole huge page.
    fn parked_huge(&self, p: ParkingSlot) -> bool {
        self.pagemap.as_ref().is_some_and(|scanner| {
            scanner
                .is_huge(self.parking.raw(), self.parking.offset(p), self.unit_bytes)
                .unwrap_or(false)
        })
    }

    /// Takes a recycled page, cleared ones first (`cleared_only`: only
    /// those), with whether it was cleared; pages split since they were
    /// kept are freed on the way.
    fn take_recycled(&self, cleared_only: bool) -> Option<(ParkingSlot, bool)> {
        loop {
            let (slot, cleared) = match self.pool.take_cleared() {
                Some(slot) => (slot, true),
                None if cleared_only => return None,
                None => (self.pool.take_raw()?, false),
            };
            if self.parked_huge(slot) {
                return Some((slot, cleared));
            }
            bump(&self.counters.buffers.recycle_dropped);
            self.parking.release(slot);
        }
    }

    fn wrap_pooled(&self, buf: Buffer) -> RestoreBuffer {
        if self.thp {
            bump(&self.counters.buffers.fresh);
        }
        RestoreBuffer {
            addr: buf.addr,
            huge: buf.huge,
            origin: Origin::Pool(buf),
        }
    }

    fn wrap_parked(&self, slot: ParkingSlot, cleared: bool) -> RestoreBuffer {
        bump(&self.counters.buffers.recycled);
        if !cleared {
            bump(&self.counters.buffers.recycled_uncleared);
        }
        RestoreBuffer {
            addr: self.parking.addr(slot),
            huge: true,
            origin: Origin::Parked(slot),
        }
    }

    /// Zeroes a recycled page in place.
    fn clear(&self, slot: ParkingSlot) {
        // SAFETY: the slot holds a whole huge page (checked by the caller),
        // so writing it never faults into the userfaultfd; the caller took
        // it from the pool, so it is this thread's alone.
        unsafe {
            self.parking
                .raw()
                .slice_mut(self.parking.offset(slot), self.unit_bytes)
        }
        .fill(0);
    }

    /// A buffer whose content the caller overwrites entirely (store read,
    /// staging copy), cheapest first: a cleared recycled page, a ready
    /// fresh one, a recycled page not cleared yet, a fresh one filled
    /// inline.
    pub fn for_overwrite(&self) -> RestoreBuffer {
        self.take(false)
    }

    /// A zeroed buffer (THP units), in the same order as
    /// [`RestoreBuffers::for_overwrite`], a recycled page not cleared yet
    /// being cleared here.
    pub fn zeroed(&self) -> RestoreBuffer {
        self.take(true)
    }

    fn take(&self, zeroed: bool) -> RestoreBuffer {
        if self.recycling {
            if let Some((slot, cleared)) = self.take_recycled(true) {
                return self.wrap_parked(slot, cleared);
            }
            if let Some(buf) = self.pool.try_take_ready() {
                return self.wrap_pooled(buf);
            }
            if let Some((slot, cleared)) = self.take_recycled(false) {
                if zeroed && !cleared {
                    self.clear(slot);
                }
                return self.wrap_parked(slot, cleared);
            }
        }
        self.wrap_pooled(self.pool.take())
    }

    /// Gives the buffer back after its pages were moved into the guest.
    pub fn give_back_moved(&self, buf: RestoreBuffer) {
        match buf.origin {
            Origin::Pool(pool_buf) => self.pool.put_moved(pool_buf),
            // The move emptied the slot; the release's discard checks
            // nothing but costs little, and leaves no slot free on trust.
            Origin::Parked(slot) => self.parking.release(slot),
        }
    }

    /// Gives the buffer back while it still holds its pages (a copy
    /// source, or the restore failed).
    pub fn give_back_populated(&self, buf: RestoreBuffer) {
        match buf.origin {
            Origin::Pool(pool_buf) => self.pool.put_used(pool_buf),
            // May have been moved in part: empty it before reuse.
            Origin::Parked(slot) => self.parking.release(slot),
        }
    }

    /// Parking slot `p` holds content nobody needs any more (written, or
    /// dropped as clean or zero): keep its huge page as a restore buffer if
    /// the pool has room, else free the slot.
    pub fn release_parked(&self, p: ParkingSlot) {
        if self.recycling {
            if self.parked_huge(p) && self.pool.offer_recycled(p) {
                return;
            }
            bump(&self.counters.buffers.recycle_dropped);
        }
        self.parking.release(p);
    }

    /// One step of the refill thread: clear a kept page, or fill a fresh
    /// buffer, or wait up to `wait` for work.
    pub fn refill_step(&self, wait: Duration) {
        match self.pool.next_refill_job(wait, self.refill_target()) {
            None => {}
            Some(RefillJob::Fill(index)) => self.pool.fill_job(index),
            Some(RefillJob::Clear(slot)) => {
                if self.parked_huge(slot) {
                    self.clear(slot);
                    self.pool.finish_clear(slot);
                } else {
                    self.pool.abandon_clear();
                    bump(&self.counters.buffers.recycle_dropped);
                    self.parking.release(slot);
                }
            }
        }
    }

    /// How many buffers the refill thread keeps ready for use (fresh ones
    /// plus cleared recycled ones). Near the memory limit every restore is
    /// paired with an eviction that hands back a page, so a small reserve
    /// covers the restores that come before their eviction's page (and
    /// bursts); the rest of the pool's room is left to recycled pages.
    /// Below the limit (no evictions) the whole pool is kept ready.
    fn refill_target(&self) -> usize {
        let bound = self.pool.bound();
        if self.recycling && self.limiter.near_limit() {
            (self.fault_threads + 1).min(bound / 2).max(1)
        } else {
            bound
        }
    }
}
