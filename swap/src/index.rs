//! The engine's indices and addresses, as types. A unit index, a page
//! index, a parking slot and a store slot are all small integers, and a
//! guest address, a region offset and a host address are all `u64`s:
//! as types, one passed where another is meant is a compile error instead
//! of a unit evicted from, or restored into, the wrong place.
//!
//! Host addresses and region offsets are guestmem's
//! ([`guestmem::addr::Hva`], [`guestmem::addr::RegionOffset`]), store
//! slots are [`crate::store::SlotId`], and a page of a split chunk is a
//! `PageRef` (a unit index and a page index). The raw
//! integer comes out (`.get()`, `.raw()`) only where it meets the kernel,
//! a store, or a message.

use std::fmt;
use std::ops::Range;

use guestmem::addr::RegionOffset;
use guestmem::host::PAGE_BYTES;

use crate::chunk::PAGES_PER_CHUNK;

/// A unit's index in the chunk table (`0..units`): the unit that starts
/// `index * unit_bytes` bytes into the managed region. For 2 MiB units
/// also the chunk's index in the page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnitIndex(usize);

impl UnitIndex {
    /// Unit number `index`.
    pub const fn new(index: usize) -> UnitIndex {
        UnitIndex(index)
    }

    /// The index, for a table lookup.
    pub const fn get(self) -> usize {
        self.0
    }

    /// The unit after this one.
    pub const fn next(self) -> UnitIndex {
        UnitIndex(self.0 + 1)
    }

    /// Where the unit starts in the region, for units of `unit_bytes`.
    pub const fn region_offset(self, unit_bytes: u64) -> RegionOffset {
        RegionOffset::new(self.0 as u64 * unit_bytes)
    }

    /// The units with indices in `range`, in order.
    pub fn each(range: Range<usize>) -> impl DoubleEndedIterator<Item = UnitIndex> + Clone {
        range.map(UnitIndex)
    }
}

impl fmt::Display for UnitIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A page's index within its 2 MiB chunk (`0..PAGES_PER_CHUNK`): the page
/// that starts `index * 4 KiB` into the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageIndex(usize);

impl PageIndex {
    /// The chunk's first page.
    pub const FIRST: PageIndex = PageIndex(0);

    /// Page number `index` of a chunk.
    pub const fn new(index: usize) -> PageIndex {
        debug_assert!(index < PAGES_PER_CHUNK);
        PageIndex(index)
    }

    /// The index, for a table lookup.
    pub const fn get(self) -> usize {
        self.0
    }

    /// Bytes from the chunk's start to the page's.
    pub const fn offset_bytes(self) -> u64 {
        self.0 as u64 * PAGE_BYTES
    }

    /// The pages of a chunk, first to last.
    pub fn all() -> impl DoubleEndedIterator<Item = PageIndex> + Clone {
        (0..PAGES_PER_CHUNK).map(PageIndex)
    }
}

impl fmt::Display for PageIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A slot of the parking area (where an evicted unit waits in memory for
/// its store write), numbered from 0; a `Staged` unit's state word holds
/// it. Not a store slot ([`crate::store::SlotId`]): the two share the
/// state word's index field, and mixing them up discards a parked unit's
/// pages or reads the wrong store image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParkingSlot(u32);

impl ParkingSlot {
    /// Parking slot number `n`.
    pub const fn new(n: u32) -> ParkingSlot {
        ParkingSlot(n)
    }

    /// The slot's number, as the state word keeps it.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The slot's number as an index into a table of slots.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ParkingSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A guest-physical address, in bytes (this crate does not use vm-memory,
/// whose `GuestAddress` the VMM's other crates use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gpa(u64);

impl Gpa {
    /// Guest-physical address `address`.
    pub const fn new(address: u64) -> Gpa {
        Gpa(address)
    }

    /// The address `bytes` further on.
    pub const fn offset_by(self, bytes: u64) -> Gpa {
        Gpa(self.0 + bytes)
    }

    /// The address as a number, for a store or a message.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::LowerHex for Gpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_index_names_its_offset_and_pages() {
        let unit = UnitIndex::new(3);
        assert_eq!(unit.region_offset(2 << 20).get(), 6 << 20);
        assert_eq!(unit.next(), UnitIndex::new(4));
        let last = PageIndex::all().last().unwrap();
        assert_eq!(last.offset_bytes(), (2 << 20) - PAGE_BYTES);
        assert_eq!(PageIndex::all().count(), PAGES_PER_CHUNK);
    }

    #[test]
    fn slots_and_addresses_keep_their_numbers() {
        assert_eq!(ParkingSlot::new(7).get(), 7);
        assert_eq!(ParkingSlot::new(7).index(), 7);
        assert_eq!(Gpa::new(0x1000).offset_by(0x10).raw(), 0x1010);
        assert_eq!(format!("{:#x}", Gpa::new(0x20_0000)), "0x200000");
    }
}
