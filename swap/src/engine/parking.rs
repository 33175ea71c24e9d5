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
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()
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
        free.pop()
    }

    /// Slots taken and not released yet.
    pub fn taken_slots(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.is_free.len() - free.stack.len()
    }

    /// Empties a slot's pages and makes it available again.
    ///
    /// # Panics
    ///
    /// As [`Parking::release_empty`], and before discarding anything: a
    /// free slot may already hold another unit's pages.
    pub fn release(&self, slot: ParkingSlot) {
        let taken = !self.free.lock().unwrap_or_else(|e| e.into_inner()).is_free[slot.index()];
        assert_taken(taken, slot);
        // Discarding makes the slot a valid (empty) move destination again.
        let _ = self.raw().discard(self.offset(slot), self.slot_bytes);
        self.release_empty(slot);
    }

    /// Makes an already-empty slot available again.
    ///
    /// # Panics
    ///
    /// If the slot is free already: an engine bug, which ends the VM with
    /// this message (engine-thread panics are fatal) before a second owner
    /// could move a unit onto the first one's pages.
    pub fn release_empty(&self, slot: ParkingSlot) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let is_free = &mut free.is_free[slot.index()];
        assert_taken(!*is_free, slot);
        *is_free = true;
        free.stack.push(slot);
        drop(free);
        self.freed.notify_one();
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
        parking.release_empty(b);
        parking.release_empty(a);
        assert!(parking.acquire_timeout(Duration::from_millis(1)).is_some());
    }

    #[test]
    #[should_panic(expected = "released while free")]
    fn a_slot_released_twice_is_caught() {
        let parking = Parking::new(2, 4096).unwrap();
        let slot = parking.try_acquire().unwrap();
        parking.release_empty(slot);
        parking.release_empty(slot);
    }

    #[test]
    #[should_panic(expected = "released while free")]
    fn releasing_a_free_slot_is_caught_before_its_pages_are_discarded() {
        let parking = Parking::new(2, 4096).unwrap();
        parking.release(ParkingSlot::new(0));
    }
}
