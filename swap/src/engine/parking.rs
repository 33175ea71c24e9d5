//! The parking area: where evicted units wait, still in memory, until
//! their store write completes (the "staged" state, a swap cache).
//!
//! For anonymous memory it is registered with the same userfaultfd as guest
//! RAM, because UFFDIO_MOVE only moves into a range registered with the
//! userfaultfd it is issued on (moving into an unregistered range fails
//! with EINVAL). So an empty parking page must never be touched: after a
//! move the engine fills the holes the unit had with the zero page
//! (the evictor) and releases slots by discarding them. For hugetlb
//! the parking area is plain anonymous memory (units are copied, not
//! moved).

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{AnonMapping, RawRange};

use crate::index::ParkingSlot;

/// Fixed-size parking slots.
pub struct Parking {
    mapping: AnonMapping,
    slots: usize,
    slot_bytes: u64,
    free: Mutex<FreeSlots>,
    freed: Condvar,
}

/// The free slots, and which slots are free: a slot released twice would
/// have two owners (two units moved into one slot, the second move failing
/// with `EEXIST` or, worse, one unit's pages discarded under the other),
/// so a second release is caught where it happens.
struct FreeSlots {
    stack: Vec<ParkingSlot>,
    is_free: Vec<bool>,
    /// How each slot was last released: a page found in a free slot names
    /// the path that should have emptied it.
    last_release: Vec<Release>,
}

/// How a slot was last released. Every release discards, so a page in a
/// free slot came after its release: the releasing call names the owner
/// that still had a hand on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Never taken.
    Never,
    /// Discarded by [`Parking::release`], called from there.
    Discarded(&'static std::panic::Location<'static>),
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Release::Never => f.write_str("never taken before"),
            Release::Discarded(at) => write!(f, "last released by a discard at {at}"),
        }
    }
}

/// The pages a slot held when it should have been empty, after
/// [`Parking::drop_stray_zero_pages`] dropped the zero ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrayPages {
    /// Zero pages, dropped.
    pub zero_dropped: usize,
    /// Pages holding data, left in place (page indexes in the slot).
    pub with_data: Vec<u64>,
}

impl FreeSlots {
    fn pop(&mut self) -> Option<ParkingSlot> {
        let slot = self.stack.pop()?;
        self.is_free[slot.index()] = false;
        Some(slot)
    }
}

impl Parking {
    /// Maps `slots` slots of `slot_bytes`.
    pub fn new(slots: usize, slot_bytes: u64) -> std::io::Result<Parking> {
        let slots = slots.max(1);
        let mapping = AnonMapping::new(slots as u64 * slot_bytes)?;
        // Parked units are guest memory on its way to the store: a core
        // dump of hugevmm must not hold them (with --swap-encrypt the store
        // only ever sees them sealed; docs/ENCRYPTION.md).
        mapping
            .range()
            .dont_dump(RegionOffset::ZERO, mapping.range().len())?;
        Ok(Parking {
            mapping,
            slots,
            slot_bytes,
            free: Mutex::new(FreeSlots {
                stack: (0..slots as u32).rev().map(ParkingSlot::new).collect(),
                is_free: vec![true; slots],
                last_release: vec![Release::Never; slots],
            }),
            freed: Condvar::new(),
        })
    }

    /// The whole area.
    pub fn raw(&self) -> &RawRange {
        self.mapping.range()
    }

    /// Offset of slot `slot` in the area.
    pub fn offset(&self, slot: ParkingSlot) -> RegionOffset {
        RegionOffset::new(u64::from(slot.get()) * self.slot_bytes)
    }

    /// Address of slot `slot`.
    pub fn addr(&self, slot: ParkingSlot) -> Hva {
        Hva::new(self.raw().base()).offset_by(self.offset(slot).get())
    }

    /// The slot and the page in it that address `address` falls in, if it
    /// is in the area.
    pub fn locate(&self, address: u64) -> Option<(ParkingSlot, u64)> {
        let offset = address.checked_sub(self.raw().base())?;
        // The mapping may be longer than its slots (rounded up).
        if offset >= self.slots as u64 * self.slot_bytes {
            return None;
        }
        let slot = u32::try_from(offset / self.slot_bytes).ok()?;
        Some((
            ParkingSlot::new(slot),
            offset % self.slot_bytes / guestmem::PAGE_BYTES,
        ))
    }

    /// Takes a free slot, if any.
    pub fn try_acquire(&self) -> Option<ParkingSlot> {
        let slot = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        self.check_empty(slot);
        Some(slot)
    }

    /// Says so when slot `slot`, just taken free, holds pages. Why here and
    /// not only where a move into it fails (`EEXIST`): a move may touch
    /// only some of the slot's pages, and by then the owner that left the
    /// page is long gone; this names its release. The moves still handle
    /// what they find ([`Parking::clear_strays_for_move`]). Cost: one
    /// `mincore` per slot taken, against a 2 MiB move.
    fn check_empty(&self, slot: ParkingSlot) {
        if let Some(report) = self.pages_held(slot) {
            log::error!("swap engine: {report}: an engine bug");
        }
    }

    /// What slot `slot` holds, if anything, with its last release; None
    /// when it is empty (or `mincore` failed: nothing to say then).
    fn pages_held(&self, slot: ParkingSlot) -> Option<String> {
        let mut residency = Vec::new();
        self.raw()
            .residency(self.offset(slot), self.slot_bytes, &mut residency)
            .ok()?;
        let mut present = residency
            .iter()
            .enumerate()
            .filter(|(_, r)| *r & 1 != 0)
            .map(|(page, _)| page);
        let first = present.next()?;
        Some(format!(
            "parking slot {slot}, taken free, holds {} page(s), the first page {first} ({})",
            present.count() + 1,
            self.last_release(slot)
        ))
    }

    /// Takes a free slot, waiting up to `wait` for one.
    pub fn acquire_timeout(&self, wait: Duration) -> Option<ParkingSlot> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.stack.is_empty() {
            free = self
                .freed
                .wait_timeout(free, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let slot = free.pop()?;
        drop(free);
        self.check_empty(slot);
        Some(slot)
    }

    /// Slots taken and not released yet.
    pub fn taken_slots(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.is_free.len() - free.stack.len()
    }

    /// Empties a slot's pages and makes it available again. Always a
    /// discard, even after a move took every page out (a few µs on an
    /// empty range): a slot released without one, trusting the move,
    /// could not be told apart from a slot a late owner filled again.
    ///
    /// # Panics
    ///
    /// If the slot is free already, before discarding anything (a free
    /// slot may already hold another unit's pages): an engine bug, which
    /// ends the VM with this message (engine-thread panics are fatal)
    /// before a second owner could move a unit onto the first one's pages.
    #[track_caller]
    pub fn release(&self, slot: ParkingSlot) {
        let taken = !self.free.lock().unwrap_or_else(|e| e.into_inner()).is_free[slot.index()];
        assert_taken(taken, slot);
        // Discarding makes the slot a valid (empty) move destination again.
        // A failure would leave its pages for the next owner's move to
        // find (EEXIST): say so where it happens.
        if let Err(e) = self.raw().discard(self.offset(slot), self.slot_bytes) {
            log::warn!("swap engine: emptying parking slot {slot} failed: {e}");
        }
        self.release_as(slot, Release::Discarded(std::panic::Location::caller()));
    }

    fn release_as(&self, slot: ParkingSlot, how: Release) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let is_free = &mut free.is_free[slot.index()];
        assert_taken(!*is_free, slot);
        *is_free = true;
        free.last_release[slot.index()] = how;
        free.stack.push(slot);
        drop(free);
        self.freed.notify_one();
    }

    /// How slot `slot` was last released.
    pub fn last_release(&self, slot: ParkingSlot) -> Release {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_release[slot.index()]
    }

    /// Drops page `page` of slot `slot` if it holds only zeros; true when
    /// it did. A zero page where the slot should be empty loses nothing
    /// when dropped: an empty parking page reads as zeros to anyone.
    ///
    /// # Safety
    ///
    /// The caller owns the slot, and the page is populated (a move into it
    /// failed with `EEXIST`, or `mincore` says so): reading it cannot fault
    /// into the userfaultfd.
    pub unsafe fn drop_zero_page(&self, slot: ParkingSlot, page: u64) -> bool {
        let offset = self
            .offset(slot)
            .offset_by(page * guestmem::host::PAGE_BYTES);
        // SAFETY: as the caller promises.
        let data = unsafe { self.raw().slice(offset, guestmem::host::PAGE_BYTES) };
        super::hash::scan(data).zero
            && self
                .raw()
                .discard(offset, guestmem::host::PAGE_BYTES)
                .is_ok()
    }

    /// For a move into slot `slot` that failed with `EEXIST`, the slot
    /// having been taken free: drops its stray zero pages
    /// ([`Parking::drop_stray_zero_pages`]) and logs them, `Ok` when the
    /// move may be tried again (every stray page was zero), else what the
    /// slot held, for the error. `what`: the move, for the log ("a
    /// collapse of the chunk at ...").
    ///
    /// # Safety
    ///
    /// As [`Parking::drop_stray_zero_pages`].
    pub unsafe fn clear_strays_for_move(
        &self,
        slot: ParkingSlot,
        what: &str,
    ) -> Result<(), String> {
        // SAFETY: as the caller promises.
        match unsafe { self.drop_stray_zero_pages(slot) } {
            Ok(stray) if stray.with_data.is_empty() => {
                log::warn!(
                    "swap engine: parking slot {slot} ({}) held {} stray zero page(s) when {what} moved into it; dropped them and moved again",
                    self.last_release(slot),
                    stray.zero_dropped
                );
                Ok(())
            }
            Ok(stray) => Err(format!(
                "parking slot {slot} ({}) was not empty: {} zero page(s), dropped, and {} with data, first page {} (an engine bug)",
                self.last_release(slot),
                stray.zero_dropped,
                stray.with_data.len(),
                stray.with_data[0]
            )),
            Err(e) => Err(format!(
                "parking slot {slot} was not empty (an engine bug; mincore failed: {e})"
            )),
        }
    }

    /// Finds the pages of slot `slot`, which should be empty, drops those
    /// that hold only zeros (see [`Parking::drop_zero_page`]) and names the
    /// others.
    ///
    /// # Safety
    ///
    /// The caller owns the slot: no other thread moves pages into it or
    /// out of it, or discards it, meanwhile (its pages are read).
    pub unsafe fn drop_stray_zero_pages(&self, slot: ParkingSlot) -> std::io::Result<StrayPages> {
        let mut residency = Vec::new();
        self.raw()
            .residency(self.offset(slot), self.slot_bytes, &mut residency)?;
        let mut stray = StrayPages::default();
        for (page, present) in residency.iter().enumerate() {
            if present & 1 == 0 {
                continue;
            }
            let page = page as u64;
            // SAFETY: the caller owns the slot (no one changes it
            // meanwhile), and mincore says the page is present.
            if unsafe { self.drop_zero_page(slot, page) } {
                stray.zero_dropped += 1;
            } else {
                stray.with_data.push(page);
            }
        }
        Ok(stray)
    }
}

fn assert_taken(taken: bool, slot: ParkingSlot) {
    assert!(
        taken,
        "parking slot {slot} released while free (released twice): an engine bug"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_located_in_its_slot_and_page() {
        let parking = Parking::new(3, 4 * 4096).unwrap();
        let base = parking.raw().base();
        assert_eq!(parking.locate(base), Some((ParkingSlot::new(0), 0)));
        assert_eq!(
            parking.locate(base + 4 * 4096 + 2 * 4096 + 17),
            Some((ParkingSlot::new(1), 2))
        );
        assert_eq!(
            parking.locate(base + 3 * 4 * 4096 - 1),
            Some((ParkingSlot::new(2), 3))
        );
        assert_eq!(parking.locate(base + 3 * 4 * 4096), None, "past the end");
        assert_eq!(parking.locate(base - 1), None, "before the start");
    }

    #[test]
    fn slots_come_back_once_each() {
        let parking = Parking::new(2, 4096).unwrap();
        let a = parking.try_acquire().unwrap();
        let b = parking.try_acquire().unwrap();
        assert_ne!(a, b);
        assert_eq!(parking.try_acquire(), None);
        parking.release(a);
        assert_eq!(parking.try_acquire(), Some(a));
        parking.release(b);
        parking.release(a);
        assert!(parking.acquire_timeout(Duration::from_millis(1)).is_some());
    }

    #[test]
    #[should_panic(expected = "released while free")]
    fn a_slot_released_twice_is_caught() {
        let parking = Parking::new(2, 4096).unwrap();
        let slot = parking.try_acquire().unwrap();
        parking.release(slot);
        parking.release(slot);
    }

    #[test]
    #[should_panic(expected = "released while free")]
    fn releasing_a_free_slot_is_caught_before_its_pages_are_discarded() {
        let parking = Parking::new(2, 4096).unwrap();
        parking.release(ParkingSlot::new(0));
    }

    #[test]
    fn a_slot_says_how_it_was_last_released() {
        let parking = Parking::new(2, 4096).unwrap();
        let a = parking.try_acquire().unwrap();
        assert_eq!(parking.last_release(a), Release::Never);
        let line = line!() + 1;
        parking.release(a);
        let said = parking.last_release(a).to_string();
        assert!(
            said.starts_with(&format!(
                "last released by a discard at {}:{line}:",
                file!()
            )),
            "the releasing call, not the release itself: {said}"
        );
    }

    #[test]
    fn a_slot_taken_free_with_pages_in_it_names_its_last_release() {
        let page = guestmem::host::PAGE_BYTES;
        let parking = Parking::new(1, 4 * page).unwrap();
        let slot = parking.try_acquire().unwrap();
        assert_eq!(parking.pages_held(slot), None, "a fresh slot is empty");
        let line = line!() + 1;
        parking.release(slot);
        // A late owner writes into the free slot (a plain anonymous
        // mapping here, not registered with a userfaultfd).
        // SAFETY: this test owns the mapping; no slice outlives the write.
        let bytes = unsafe {
            parking
                .raw()
                .slice_mut(parking.offset(slot).offset_by(2 * page), 1)
        };
        bytes[0] = 9;
        assert_eq!(parking.try_acquire(), Some(slot));
        let said = parking.pages_held(slot).unwrap();
        assert!(
            said.starts_with(&format!(
                "parking slot {slot}, taken free, holds 1 page(s), the first page 2 (last released by a discard at {}:{line}:",
                file!()
            )),
            "{said}"
        );
    }

    #[test]
    fn stray_zero_pages_are_dropped_and_pages_with_data_named() {
        let page = guestmem::host::PAGE_BYTES;
        let parking = Parking::new(2, 4 * page).unwrap();
        let _first = parking.try_acquire().unwrap();
        let slot = parking.try_acquire().unwrap();
        let at = parking.offset(slot);
        let write = |offset: u64, byte: u8| {
            // SAFETY: a plain anonymous mapping (not registered with a
            // userfaultfd here), owned by this test; no slice outlives
            // the write.
            let bytes = unsafe { parking.raw().slice_mut(at.offset_by(offset), 1) };
            bytes[0] = byte;
        };
        let strays = || {
            // SAFETY: this test owns the slot, and nothing else touches the
            // mapping meanwhile.
            unsafe { parking.drop_stray_zero_pages(slot) }.unwrap()
        };
        // SAFETY: as above.
        let clear = || unsafe { parking.clear_strays_for_move(slot, "a test") };
        write(page, 0);
        write(2 * page + 7, 1);
        assert_eq!(
            strays(),
            StrayPages {
                zero_dropped: 1,
                with_data: vec![2],
            },
            "page 1 was zero, page 2 held data, pages 0 and 3 were never touched"
        );
        assert_eq!(
            clear().unwrap_err(),
            format!("parking slot {slot} (never taken before) was not empty: 0 zero page(s), dropped, and 1 with data, first page 2 (an engine bug)")
        );
        write(2 * page + 7, 0);
        assert_eq!(clear(), Ok(()));
        assert_eq!(strays(), StrayPages::default(), "the slot is empty");
    }
}
