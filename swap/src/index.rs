//! The engine's indices and addresses, as types. A unit index, a page
//! index, a parking slot and a store slot are all small integers, and a
//! guest address, a region offset and a host address are all `u64`s:
//! as types, one passed where another is meant is a compile error instead
//! of a unit evicted from, or restored into, the wrong place.
//!
//! Host addresses and region offsets are guestmem's
//! ([`guestmem::addr::Hva`], [`guestmem::addr::RegionOffset`]), store
//! slots are [`crate::store::SlotId`], and a page of a split chunk is a
//! [`PageRef`] (a unit index and a page index). The raw
//! integer comes out (`.get()`, `.raw()`) only where it meets the kernel,
//! a store, or a message.

use std::fmt;

use guestmem::addr::RegionOffset;
use guestmem::host::PAGE_BYTES;

/// Pages in one 2 MiB chunk.
pub const PAGES_PER_CHUNK: usize = 512;

/// Which page of a split chunk (a transition's target, a page eviction's
/// victim): here rather than in `chunk`, which uses these indices, so that
/// the two modules do not import each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRef {
    /// The chunk's index in the chunk table.
    pub chunk: UnitIndex,
    /// The page's index in the chunk.
    pub page: PageIndex,
}

/// A unit's index in the chunk table (`0..units`): the unit that starts
/// `index * unit_bytes` bytes into the managed region. For 2 MiB units
/// also the chunk's index in the page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnitIndex(usize);

impl UnitIndex {
    /// The first unit of the region.
    pub const FIRST: UnitIndex = UnitIndex(0);

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

    /// The unit after this one in a table of `units` units, the first
    /// after the last (a CLOCK hand's next position).
    pub const fn wrapping_next(self, units: usize) -> UnitIndex {
        UnitIndex((self.0 + 1) % units)
    }

    /// Where the unit starts in the region, for units of `unit_bytes`.
    pub const fn region_offset(self, unit_bytes: u64) -> RegionOffset {
        RegionOffset::new(self.0 as u64 * unit_bytes)
    }

    /// Page `page` of this (split) chunk.
    pub const fn page(self, page: PageIndex) -> PageRef {
        PageRef { chunk: self, page }
    }

    /// The chunk's first page.
    pub const fn first_page(self) -> PageRef {
        self.page(PageIndex::FIRST)
    }

    /// The chunk's pages, first to last.
    pub fn pages(self) -> impl Iterator<Item = PageRef> {
        PageIndex::all().map(move |page| self.page(page))
    }
}

impl fmt::Display for UnitIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Consecutive units `[start, end)` of the chunk table, first to last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitRange {
    next: usize,
    end: usize,
}

impl UnitRange {
    /// The units from `start` up to, not including, `end` (none if `end`
    /// is not after `start`).
    pub const fn new(start: UnitIndex, end: UnitIndex) -> UnitRange {
        UnitRange {
            next: start.0,
            end: if end.0 > start.0 { end.0 } else { start.0 },
        }
    }

    /// Every unit of a table of `units` units.
    pub const fn all(units: usize) -> UnitRange {
        UnitRange {
            next: 0,
            end: units,
        }
    }
}

impl Iterator for UnitRange {
    type Item = UnitIndex;

    fn next(&mut self) -> Option<UnitIndex> {
        (self.next < self.end).then(|| {
            self.next += 1;
            UnitIndex(self.next - 1)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.end - self.next;
        (left, Some(left))
    }
}

impl DoubleEndedIterator for UnitRange {
    fn next_back(&mut self) -> Option<UnitIndex> {
        (self.next < self.end).then(|| {
            self.end -= 1;
            UnitIndex(self.end)
        })
    }
}

impl ExactSizeIterator for UnitRange {}

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

    /// The page after this one, the first after the last (a CLOCK hand's
    /// next position).
    pub const fn wrapping_next(self) -> PageIndex {
        self.wrapping_add(1)
    }

    /// The page `pages` after this one, counting on from the first after
    /// the last.
    pub const fn wrapping_add(self, pages: usize) -> PageIndex {
        PageIndex((self.0 + pages) % PAGES_PER_CHUNK)
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

/// The number a store files a unit or page under and names it by in
/// errors: its guest-physical address, or its region offset where no guest
/// range covers it. A key, never a way to reach memory, so neither a
/// [`Gpa`] nor a [`RegionOffset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreKey(u64);

impl StoreKey {
    /// Key number `key`, for callers of a store that file images under
    /// plain numbers of their own (tests, benchmarks, fuzz targets); the
    /// engine builds its keys with [`StoreKey::of_guest`] and
    /// [`StoreKey::of_region_offset`].
    pub const fn new(key: u64) -> StoreKey {
        StoreKey(key)
    }

    /// The key of what sits at guest-physical address `gpa`.
    pub const fn of_guest(gpa: Gpa) -> StoreKey {
        StoreKey(gpa.raw())
    }

    /// The key of what sits at region offset `offset`, outside every guest
    /// range.
    pub const fn of_region_offset(offset: RegionOffset) -> StoreKey {
        StoreKey(offset.get())
    }

    /// The key of what sits `bytes` further on (a page of a unit).
    pub const fn offset_by(self, bytes: u64) -> StoreKey {
        StoreKey(self.0 + bytes)
    }

    /// The key as the store takes it.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::LowerHex for StoreKey {
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
        assert_eq!(unit.wrapping_next(4), UnitIndex::FIRST);
        assert_eq!(unit.first_page().page, PageIndex::FIRST);
        let last = unit.pages().last().unwrap();
        assert_eq!(last.chunk, unit);
        assert_eq!(last.page.offset_bytes(), (2 << 20) - PAGE_BYTES);
        assert_eq!(PageIndex::all().count(), PAGES_PER_CHUNK);
        let run: Vec<_> = UnitRange::new(UnitIndex::new(2), unit.next()).collect();
        assert_eq!(run, [UnitIndex::new(2), UnitIndex::new(3)]);
        assert_eq!(UnitRange::new(unit, UnitIndex::new(1)).len(), 0);
        assert_eq!(UnitRange::all(3).next_back(), Some(UnitIndex::new(2)));
        assert_eq!(last.page.wrapping_next(), PageIndex::FIRST);
    }

    #[test]
    fn slots_and_addresses_keep_their_numbers() {
        assert_eq!(ParkingSlot::new(7).get(), 7);
        assert_eq!(ParkingSlot::new(7).index(), 7);
        assert_eq!(Gpa::new(0x1000).offset_by(0x10).raw(), 0x1010);
        assert_eq!(format!("{:#x}", Gpa::new(0x20_0000)), "0x200000");
    }
}
