//! The checks of a paged slot (the pages of a split chunk): one crc32, or
//! with `--swap-encrypt` one seal (generation and tag), per written page,
//! kept only while the slot is paged. A page never written has none and
//! cannot be read: the engine reads only pages it wrote (or that were
//! there when the chunk split).

use super::seal::{Check, CheckTable, Integrity};
use super::PAGE_BYTES;

/// Pages in one 2 MiB slot.
pub const PAGES_PER_SLOT: usize = 512;

/// Per-page checks of one paged slot.
#[derive(Debug, Clone)]
pub struct PageChecksums {
    checks: CheckTable,
    written: [u64; PAGES_PER_SLOT / 64],
}

impl PageChecksums {
    /// No page written yet, records for `integrity`.
    pub fn empty(integrity: &Integrity) -> PageChecksums {
        PageChecksums {
            checks: CheckTable::with_len(integrity, PAGES_PER_SLOT),
            written: [0; PAGES_PER_SLOT / 64],
        }
    }

    /// Every page of `unit` (one whole 2 MiB chunk) written, checked by
    /// crc32 (a sealed store seals each page itself).
    pub fn of_unit(unit: &[u8]) -> PageChecksums {
        let mut sums = PageChecksums::empty(&Integrity::Checksum);
        for (page, data) in unit.chunks_exact(PAGE_BYTES).enumerate() {
            sums.set(page, Check::Crc(crc32fast::hash(data)));
        }
        sums
    }

    /// Records page `page`'s check.
    pub fn set(&mut self, page: usize, check: Check) {
        self.checks.set(page, check);
        self.written[page / 64] |= 1 << (page % 64);
    }

    /// The check of page `page`, if it was written.
    pub fn get(&self, page: usize) -> Option<Check> {
        if self.written[page / 64] & (1 << (page % 64)) != 0 {
            self.checks.get(page)
        } else {
            None
        }
    }

    /// Bytes this takes: 2 KiB with checksums, 12 KiB sealed (plus the
    /// 64-byte written bitmap).
    pub fn bytes(&self) -> usize {
        PAGES_PER_SLOT * self.checks.record_bytes() + PAGES_PER_SLOT / 8
    }
}
