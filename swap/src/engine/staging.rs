//! The parking area: where evicted units wait, still in memory, until
//! their store write completes (the "staged" state, a swap cache).
//!
//! For anonymous memory it is registered with the same userfaultfd as guest
//! RAM, because UFFDIO_MOVE only moves into a range registered with the
//! userfaultfd it is issued on (moving into an unregistered range fails
//! with EINVAL). So an empty parking page must never be touched: after a
//! move the engine fills the holes the unit had with the zero page
//! ([`super::evict`]) and releases slots by discarding them. For hugetlb
//! the parking area is plain anonymous memory (units are copied, not
//! moved).

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use guestmem::host::{AnonMapping, RawRange};

/// Fixed-size parking slots.
pub struct Parking {
    mapping: AnonMapping,
    slot_bytes: u64,
    free: Mutex<Vec<u32>>,
    freed: Condvar,
}

impl Parking {
    /// Maps `slots` slots of `slot_bytes`.
    pub fn new(slots: usize, slot_bytes: u64) -> std::io::Result<Parking> {
        let slots = slots.max(1);
        let mapping = AnonMapping::new(slots as u64 * slot_bytes)?;
        // Parked units are guest memory on its way to the store: a core
        // dump of hugevmm must not hold them (with --swap-encrypt the store
        // only ever sees them sealed; docs/ENCRYPTION.md).
        mapping.range().dont_dump(0, mapping.range().len())?;
        Ok(Parking {
            mapping,
            slot_bytes,
            free: Mutex::new((0..slots as u32).rev().collect()),
            freed: Condvar::new(),
        })
    }

    /// The whole area.
    pub fn raw(&self) -> &RawRange {
        self.mapping.range()
    }

    /// Offset of slot `slot` in the area.
    pub fn offset(&self, slot: u32) -> u64 {
        u64::from(slot) * self.slot_bytes
    }

    /// Address of slot `slot`.
    pub fn addr(&self, slot: u32) -> u64 {
        self.raw().base() + self.offset(slot)
    }

    /// Takes a free slot, if any.
    pub fn try_acquire(&self) -> Option<u32> {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Takes a free slot, waiting up to `wait` for one.
    pub fn acquire_timeout(&self, wait: Duration) -> Option<u32> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.is_empty() {
            free = self
                .freed
                .wait_timeout(free, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        free.pop()
    }

    /// Empties a slot's pages and makes it available again.
    pub fn release(&self, slot: u32) {
        // Discarding makes the slot a valid (empty) move destination again.
        let _ = self.raw().discard(self.offset(slot), self.slot_bytes);
        self.release_empty(slot);
    }

    /// Makes an already-empty slot available again.
    pub fn release_empty(&self, slot: u32) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot);
        self.freed.notify_one();
    }
}
