//! Where units and pages are: host addresses, guest addresses and the
//! names errors give them. Every component that addresses guest RAM holds
//! one (shared), so no component needs another to compute an address.

use super::config::ManagedRegion;
use crate::chunk::PageRef;
use guestmem::host::{RawRange, PAGE_BYTES};
use std::ops::Range;

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
    pub fn unit_name(&self, unit: usize) -> String {
        let offset = self.unit_offset(unit);
        match self.region.gpa_of(offset) {
            Some(gpa) => format!("guest address {gpa:#x}"),
            None => format!("region offset {offset:#x} (no guest address)"),
        }
    }

    /// Region offset of a unit.
    pub fn unit_offset(&self, unit: usize) -> u64 {
        unit as u64 * self.unit_bytes
    }

    /// The address a store files a unit under: its guest-physical address,
    /// or its region offset where no guest range covers it (stores use it
    /// as a key and in messages, never to reach memory).
    pub fn unit_store_key(&self, unit: usize) -> u64 {
        let offset = self.unit_offset(unit);
        self.region.gpa_of(offset).unwrap_or(offset)
    }

    /// Host address of a unit.
    pub fn unit_addr(&self, unit: usize) -> u64 {
        self.guest.base() + self.unit_offset(unit)
    }

    /// Host address of a page of a split chunk.
    pub fn page_addr(&self, at: PageRef) -> u64 {
        self.unit_addr(at.chunk) + at.page as u64 * PAGE_BYTES
    }

    /// Guest address of a page of a split chunk (for the store and for
    /// messages).
    pub fn page_gpa(&self, at: PageRef) -> u64 {
        self.unit_store_key(at.chunk) + at.page as u64 * PAGE_BYTES
    }

    /// The unit and the page within it that host address `address` falls
    /// in, if it is guest RAM.
    pub fn locate(&self, address: u64) -> Option<(usize, usize)> {
        let base = self.guest.base();
        if address < base || address >= base + self.guest.len() {
            return None;
        }
        let offset = address - base;
        Some((
            (offset / self.unit_bytes) as usize,
            (offset % self.unit_bytes / PAGE_BYTES) as usize,
        ))
    }

    /// The units overlapping region bytes `[offset, offset + len)`.
    pub fn units_overlapping(&self, offset: u64, len: u64) -> Range<usize> {
        let first = (offset / self.unit_bytes) as usize;
        let end = (offset.saturating_add(len).div_ceil(self.unit_bytes) as usize).min(self.units);
        first..end.max(first)
    }

    /// The units wholly inside region bytes `[offset, offset + len)`.
    pub fn units_inside(&self, offset: u64, len: u64) -> Range<usize> {
        let first = offset.div_ceil(self.unit_bytes) as usize;
        let end = ((offset.saturating_add(len) / self.unit_bytes) as usize).min(self.units);
        first..end.max(first)
    }
}
