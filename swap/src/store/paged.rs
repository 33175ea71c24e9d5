//! The checksums of a paged slot (the pages of a split chunk): one crc32
//! per written page, 2 KiB per paged slot, kept only while the slot is
//! paged. A page never written has none and cannot be read: the engine
//! reads only pages it wrote (or that were there when the chunk split).

use super::PAGE_BYTES;

/// Pages in one 2 MiB slot.
pub const PAGES_PER_SLOT: usize = 512;

/// Per-page checksums of one paged slot.
#[derive(Debug, Clone)]
pub struct PageChecksums {
    crcs: Box<[u32]>,
    written: [u64; PAGES_PER_SLOT / 64],
}

impl PageChecksums {
    /// No page written yet.
    pub fn empty() -> PageChecksums {
        PageChecksums {
            crcs: vec![0; PAGES_PER_SLOT].into_boxed_slice(),
            written: [0; PAGES_PER_SLOT / 64],
        }
    }

    /// Every page of `unit` (one whole 2 MiB chunk) written.
    pub fn of_unit(unit: &[u8]) -> PageChecksums {
        let mut sums = PageChecksums::empty();
        for (page, data) in unit.chunks_exact(PAGE_BYTES).enumerate() {
            sums.set(page, crc32fast::hash(data));
        }
        sums
    }

    /// Records page `page`'s checksum.
    pub fn set(&mut self, page: usize, crc: u32) {
        self.crcs[page] = crc;
        self.written[page / 64] |= 1 << (page % 64);
    }

    /// The checksum of page `page`, if it was written.
    pub fn get(&self, page: usize) -> Option<u32> {
        (self.written[page / 64] & (1 << (page % 64)) != 0).then(|| self.crcs[page])
    }

    /// Bytes this takes.
    pub const BYTES: usize = PAGES_PER_SLOT * 4 + PAGES_PER_SLOT / 8;
}
