//! Where units and pages are: host addresses, guest addresses and the
//! names errors give them. Every component that addresses guest RAM holds
//! one (shared), so no component needs another to compute an address.

use super::config::ManagedRegion;
use crate::chunk::PageRef;
use crate::index::{PageIndex, StoreKey, UnitIndex, UnitRange};
use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{RawRange, PAGE_BYTES};

/// The managed guest RAM cut into units.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    /// The region as the VMM described it (guest addresses for messages).
    pub region: ManagedRegion,
    /// The registered guest RAM mapping.
    pub guest: RawRange,
    /// Bytes per unit (2 MiB or 4 KiB).
    pub unit_bytes: u64,
    /// Number of units.
    pub units: usize,
}

impl Geometry {
    /// Guest address (or region offset, marked) naming a unit in messages.
    pub fn unit_name(&self, unit: UnitIndex) -> String {
        let offset = self.unit_offset(unit);
        match self.region.gpa_of(offset) {
            Some(gpa) => format!("guest address {gpa:#x}"),
            None => format!("region offset {offset:#x} (no guest address)"),
        }
    }

    /// Region offset of a unit.
    pub fn unit_offset(&self, unit: UnitIndex) -> RegionOffset {
        unit.region_offset(self.unit_bytes)
    }

    /// The key a store files a unit under: its guest-physical address, or
    /// its region offset where no guest range covers it (stores use it as
    /// a key and in messages, never to reach memory).
    pub fn unit_store_key(&self, unit: UnitIndex) -> StoreKey {
        let offset = self.unit_offset(unit);
        self.region
            .gpa_of(offset)
            .map_or(StoreKey::of_region_offset(offset), StoreKey::of_guest)
    }

    /// Host address of a unit.
    pub fn unit_addr(&self, unit: UnitIndex) -> Hva {
        Hva::new(self.guest.base()).offset_by(self.unit_offset(unit).get())
    }

    /// Host address of a page of a split chunk.
    pub fn page_addr(&self, at: PageRef) -> Hva {
        self.unit_addr(at.chunk).offset_by(at.page.offset_bytes())
    }

    /// Store key of a page of a split chunk (for the store and for
    /// messages).
    pub fn page_store_key(&self, at: PageRef) -> StoreKey {
        self.unit_store_key(at.chunk)
            .offset_by(at.page.offset_bytes())
    }

    /// The unit and the page within it that host address `address` falls
    /// in, if it is guest RAM.
    pub fn locate(&self, address: Hva) -> Option<(UnitIndex, PageIndex)> {
        let offset = address.offset_from(Hva::new(self.guest.base()))?;
        if offset >= self.guest.len() {
            return None;
        }
        Some(self.unit_at(RegionOffset::new(offset)))
    }

    /// The unit and the page within it that region offset `offset` falls
    /// in (not checked against the region's length).
    pub fn unit_at(&self, offset: RegionOffset) -> (UnitIndex, PageIndex) {
        let offset = offset.get();
        (
            UnitIndex::new((offset / self.unit_bytes) as usize),
            PageIndex::new((offset % self.unit_bytes / PAGE_BYTES) as usize),
        )
    }

    /// The units overlapping region bytes `[offset, offset + len_bytes)`.
    pub fn units_overlapping(&self, offset: RegionOffset, len_bytes: u64) -> UnitRange {
        let offset = offset.get();
        let first = (offset / self.unit_bytes) as usize;
        let end =
            (offset.saturating_add(len_bytes).div_ceil(self.unit_bytes) as usize).min(self.units);
        UnitRange::new(UnitIndex::new(first), UnitIndex::new(end))
    }

    /// The units wholly inside region bytes `[offset, offset + len_bytes)`.
    pub fn units_inside(&self, offset: RegionOffset, len_bytes: u64) -> UnitRange {
        let offset = offset.get();
        let first = offset.div_ceil(self.unit_bytes) as usize;
        let end = ((offset.saturating_add(len_bytes) / self.unit_bytes) as usize).min(self.units);
        UnitRange::new(UnitIndex::new(first), UnitIndex::new(end))
    }

    /// Every unit.
    pub fn all_units(&self) -> UnitRange {
        UnitRange::all(self.units)
    }
}
