//! The slot allocator shared by the stores: a bitmap of used slots that
//! hands out the lowest free slot first, so a file store stays dense at its
//! start and reuses freed space before it grows.

use super::SlotId;

/// Used/free state of a store's slots. Not thread safe by itself; stores keep
/// it under a mutex held only for the bit flips.
#[derive(Debug)]
pub(crate) struct SlotTable {
    /// One bit per slot, set when used. Grows a word at a time as slots are
    /// first handed out, so a huge, mostly empty store costs little.
    used_bits: Vec<u64>,
    /// No word before this one has a free bit: where the search starts.
    first_free_word: usize,
    used_slots: u64,
    capacity_slots: u64,
}

impl SlotTable {
    /// A table of `capacity_slots` free slots (at most 2^32, the SlotId range).
    pub(crate) fn new(capacity_slots: u64) -> Self {
        Self {
            used_bits: Vec::new(),
            first_free_word: 0,
            used_slots: 0,
            capacity_slots: capacity_slots.min(u64::from(SlotId::MAX) + 1),
        }
    }

    /// Slots the table can hand out.
    pub(crate) fn capacity_slots(&self) -> u64 {
        self.capacity_slots
    }

    /// Slots currently in use.
    pub(crate) fn used_slots(&self) -> u64 {
        self.used_slots
    }

    /// Takes the lowest free slot, or `None` when all are used.
    pub(crate) fn alloc(&mut self) -> Option<SlotId> {
        if self.used_slots >= self.capacity_slots {
            return None;
        }
        let mut w = self.first_free_word;
        loop {
            if w == self.used_bits.len() {
                self.used_bits.push(0);
            }
            let word = self.used_bits[w];
            if word != u64::MAX {
                let bit = (!word).trailing_zeros() as u64;
                let slot = w as u64 * 64 + bit;
                // Free bits past capacity in the last word are never taken:
                // used_slots < capacity guarantees a free slot before them.
                debug_assert!(slot < self.capacity_slots);
                self.used_bits[w] |= 1 << bit;
                self.used_slots += 1;
                self.first_free_word = w;
                return Some(SlotId::new(slot as u32));
            }
            w += 1;
        }
    }

    /// Returns `slot` to the free pool; false if it was not in use.
    pub(crate) fn free(&mut self, slot: SlotId) -> bool {
        if !self.is_used(slot) {
            return false;
        }
        let (w, bit) = Self::position(slot);
        self.used_bits[w] &= !(1 << bit);
        self.used_slots -= 1;
        self.first_free_word = self.first_free_word.min(w);
        true
    }

    /// Whether `slot` is allocated.
    pub(crate) fn is_used(&self, slot: SlotId) -> bool {
        let (w, bit) = Self::position(slot);
        self.used_bits
            .get(w)
            .is_some_and(|word| word & (1 << bit) != 0)
    }

    fn position(slot: SlotId) -> (usize, u32) {
        let slot = slot.get();
        ((slot / 64) as usize, slot % 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_slot_first_and_reuse() {
        let mut t = SlotTable::new(200);
        let slots: Vec<SlotId> = (0..150).map(|_| t.alloc().unwrap()).collect();
        assert_eq!(slots, (0..150).map(SlotId::new).collect::<Vec<_>>());
        assert!(t.free(SlotId::new(70)));
        assert!(t.free(SlotId::new(3)));
        assert!(!t.free(SlotId::new(3)), "double free is refused");
        assert_eq!(t.used_slots(), 148);
        assert_eq!(t.alloc(), Some(SlotId::new(3)));
        assert_eq!(t.alloc(), Some(SlotId::new(70)));
        assert_eq!(t.alloc(), Some(SlotId::new(150)));
    }

    #[test]
    fn capacity_is_respected() {
        let mut t = SlotTable::new(65);
        for i in 0..65 {
            assert_eq!(t.alloc(), Some(SlotId::new(i)));
        }
        assert_eq!(t.alloc(), None);
        t.free(SlotId::new(64));
        assert_eq!(t.alloc(), Some(SlotId::new(64)));
        assert_eq!(t.alloc(), None);
        assert!(!t.is_used(SlotId::new(1000)));
    }
}
