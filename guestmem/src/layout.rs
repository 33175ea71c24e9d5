//! Where guest RAM lives in guest-physical space and in the host mapping.
//!
//! RAM starts at guest-physical 0 and runs up to [`LOW_RAM_END`] (3 GiB); the
//! gap up to [`HIGH_RAM_START`] (4 GiB) is left for devices, and the rest of
//! RAM continues from there. All RAM lives in one host mapping: the low
//! region at its start and the high region right after it. Both region
//! boundaries are multiples of 2 MiB, so guest-physical and host offsets stay
//! congruent modulo [`CHUNK_BYTES`] and every chunk can be one huge page.

use vm_memory::{Address, GuestAddress};

use crate::addr::RegionOffset;
use crate::size::{format_size, format_size_arg};
use crate::CHUNK_BYTES;

/// End of the RAM region below the 32-bit device hole (exclusive).
pub const LOW_RAM_END: u64 = 3 << 30;

/// Start of the RAM region above the 32-bit device hole.
pub const HIGH_RAM_START: u64 = 4 << 30;

/// Smallest guest RAM accepted: the VMM keeps the first 2 MiB for itself and
/// a payload needs at least one chunk beyond it.
pub const MIN_RAM_BYTES: u64 = 4 << 20;

/// Largest guest RAM accepted: the VMM's identity page tables cover this
/// much RAM.
pub const MAX_RAM_BYTES: u64 = 192 << 30;

/// Why a RAM size cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The size was zero.
    #[error(
        "guest RAM size (--mem) must not be zero; use at least --mem {}",
        format_size_arg(MIN_RAM_BYTES)
    )]
    Zero,
    /// The size is below [`MIN_RAM_BYTES`].
    #[error(
        "guest RAM size (--mem) {} is too small; use at least --mem {}",
        format_size(*ram_bytes),
        format_size_arg(MIN_RAM_BYTES)
    )]
    TooSmall {
        /// The requested size.
        ram_bytes: u64,
    },
    /// The size is above [`MAX_RAM_BYTES`].
    #[error(
        "guest RAM size (--mem) {} is too large; use at most --mem {} (the VMM's page tables cover that much)",
        format_size(*ram_bytes),
        format_size_arg(MAX_RAM_BYTES)
    )]
    TooLarge {
        /// The requested size.
        ram_bytes: u64,
    },
    /// The size is not a multiple of [`CHUNK_BYTES`].
    #[error(
        "guest RAM size (--mem) {} ({ram_bytes} bytes) is not a multiple of 2 MiB; use {}",
        format_size(*ram_bytes),
        suggestions.iter().map(|s| format!("--mem {}", format_size_arg(*s))).collect::<Vec<_>>().join(" or ")
    )]
    NotChunkMultiple {
        /// The requested size.
        ram_bytes: u64,
        /// The nearest valid sizes (below and above, within limits).
        suggestions: Vec<u64>,
    },
}

/// One contiguous range of guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRegion {
    /// Guest-physical start address.
    pub gpa: GuestAddress,
    /// Length of the region.
    pub len_bytes: u64,
    /// Offset of the region's start inside the host mapping of all guest RAM.
    pub backing_offset: RegionOffset,
}

impl RamRegion {
    /// Guest-physical address one past the region's last byte.
    pub fn end_gpa(&self) -> GuestAddress {
        self.gpa.unchecked_add(self.len_bytes)
    }

    fn contains_gpa(&self, gpa: GuestAddress) -> bool {
        gpa >= self.gpa && gpa < self.end_gpa()
    }
}

/// The guest-physical layout of a given amount of RAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    ram_bytes: u64,
    regions: Vec<RamRegion>,
}

impl Layout {
    /// Lays out `ram_bytes` of guest RAM.
    ///
    /// The size must be a non-zero multiple of 2 MiB between
    /// [`MIN_RAM_BYTES`] and [`MAX_RAM_BYTES`].
    pub fn new(ram_bytes: u64) -> Result<Layout, LayoutError> {
        if ram_bytes == 0 {
            return Err(LayoutError::Zero);
        }
        if ram_bytes < MIN_RAM_BYTES {
            return Err(LayoutError::TooSmall { ram_bytes });
        }
        if ram_bytes > MAX_RAM_BYTES {
            return Err(LayoutError::TooLarge { ram_bytes });
        }
        if ram_bytes % CHUNK_BYTES != 0 {
            let below = ram_bytes / CHUNK_BYTES * CHUNK_BYTES;
            let above = below + CHUNK_BYTES;
            // Both neighbours are in range except at the limits, which are
            // themselves multiples of 2 MiB.
            let suggestions = [below, above]
                .into_iter()
                .filter(|s| (MIN_RAM_BYTES..=MAX_RAM_BYTES).contains(s))
                .collect();
            return Err(LayoutError::NotChunkMultiple {
                ram_bytes,
                suggestions,
            });
        }

        let low_bytes = ram_bytes.min(LOW_RAM_END);
        let mut regions = vec![RamRegion {
            gpa: GuestAddress(0),
            len_bytes: low_bytes,
            backing_offset: RegionOffset::ZERO,
        }];
        if ram_bytes > low_bytes {
            regions.push(RamRegion {
                gpa: GuestAddress(HIGH_RAM_START),
                len_bytes: ram_bytes - low_bytes,
                backing_offset: RegionOffset::new(low_bytes),
            });
        }
        Ok(Layout { ram_bytes, regions })
    }

    /// Total guest RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.ram_bytes
    }

    /// The RAM regions in ascending guest-physical order (one or two).
    pub fn regions(&self) -> &[RamRegion] {
        &self.regions
    }

    /// Number of 2 MiB chunks of guest RAM; chunk `i` is at host offset
    /// `i * CHUNK_BYTES`.
    pub fn chunk_count(&self) -> u64 {
        self.ram_bytes / CHUNK_BYTES
    }

    /// Offset into the host mapping of guest-physical address `gpa`, or
    /// `None` if `gpa` is not RAM.
    pub fn gpa_to_offset(&self, gpa: GuestAddress) -> Option<RegionOffset> {
        self.region_of(gpa).map(|region| {
            region
                .backing_offset
                .offset_by(gpa.unchecked_offset_from(region.gpa))
        })
    }

    /// Guest-physical address of offset `offset` of the host mapping.
    ///
    /// # Panics
    ///
    /// If `offset` is not below [`Layout::ram_bytes`]: such an offset is
    /// outside the mapping, so asking is a bug in the caller.
    pub fn offset_to_gpa(&self, offset: RegionOffset) -> GuestAddress {
        let offset = offset.get();
        assert!(
            offset < self.ram_bytes,
            "host offset {offset:#x} is outside guest RAM of {} bytes",
            self.ram_bytes
        );
        let region = self
            .regions
            .iter()
            .rev()
            .find(|region| offset >= region.backing_offset.get())
            .expect("region 0 starts at offset 0");
        region
            .gpa
            .unchecked_add(offset - region.backing_offset.get())
    }

    /// Whether `[gpa, gpa + len_bytes)` lies entirely inside one RAM region.
    ///
    /// An empty range is contained if `gpa` is inside a region or at its
    /// end, so that e.g. a zero-length load at the very end of RAM is fine.
    pub fn contains(&self, gpa: GuestAddress, len_bytes: u64) -> bool {
        let Some(end) = gpa.checked_add(len_bytes) else {
            return false;
        };
        self.regions
            .iter()
            .any(|region| gpa >= region.gpa && end <= region.end_gpa())
    }

    /// Highest guest-physical RAM address plus one.
    pub fn end_gpa(&self) -> GuestAddress {
        self.regions
            .last()
            .expect("a layout has at least one region")
            .end_gpa()
    }

    /// The region holding `gpa`, if any.
    pub fn region_of(&self, gpa: GuestAddress) -> Option<&RamRegion> {
        self.regions.iter().find(|region| region.contains_gpa(gpa))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    // The tests speak in numbers; these convert at the edge.
    fn gpa_to_offset(layout: &Layout, gpa: u64) -> Option<u64> {
        layout
            .gpa_to_offset(GuestAddress(gpa))
            .map(RegionOffset::get)
    }

    fn offset_to_gpa(layout: &Layout, offset: u64) -> u64 {
        layout.offset_to_gpa(RegionOffset::new(offset)).raw_value()
    }

    fn contains(layout: &Layout, gpa: u64, len_bytes: u64) -> bool {
        layout.contains(GuestAddress(gpa), len_bytes)
    }

    #[test]
    fn small_ram_is_one_low_region() {
        let layout = Layout::new(64 * MIB).unwrap();
        assert_eq!(
            layout.regions(),
            &[RamRegion {
                gpa: GuestAddress(0),
                len_bytes: 64 * MIB,
                backing_offset: RegionOffset::new(0)
            }]
        );
        assert_eq!(layout.ram_bytes(), 64 * MIB);
        assert_eq!(layout.chunk_count(), 32);
        assert_eq!(layout.end_gpa().raw_value(), 64 * MIB);
    }

    #[test]
    fn exactly_3g_stays_below_the_hole() {
        let layout = Layout::new(3 * GIB).unwrap();
        assert_eq!(layout.regions().len(), 1);
        assert_eq!(layout.end_gpa().raw_value(), LOW_RAM_END);
        assert_eq!(
            gpa_to_offset(&layout, LOW_RAM_END - 1),
            Some(LOW_RAM_END - 1)
        );
        assert_eq!(gpa_to_offset(&layout, LOW_RAM_END), None);
    }

    #[test]
    fn ram_above_3g_continues_at_4g() {
        let layout = Layout::new(5 * GIB).unwrap();
        assert_eq!(
            layout.regions(),
            &[
                RamRegion {
                    gpa: GuestAddress(0),
                    len_bytes: 3 * GIB,
                    backing_offset: RegionOffset::new(0)
                },
                RamRegion {
                    gpa: GuestAddress(HIGH_RAM_START),
                    len_bytes: 2 * GIB,
                    backing_offset: RegionOffset::new(3 * GIB)
                },
            ]
        );
        assert_eq!(layout.end_gpa().raw_value(), 6 * GIB);
        assert_eq!(layout.chunk_count(), 5 * GIB / CHUNK_BYTES);
    }

    #[test]
    fn translates_between_gpa_and_offset() {
        let layout = Layout::new(3 * GIB + 4 * MIB).unwrap();
        assert_eq!(gpa_to_offset(&layout, 0), Some(0));
        assert_eq!(gpa_to_offset(&layout, 12345), Some(12345));
        assert_eq!(gpa_to_offset(&layout, 3 * GIB + 4096), None, "in the hole");
        assert_eq!(
            gpa_to_offset(&layout, HIGH_RAM_START - 1),
            None,
            "in the hole"
        );
        assert_eq!(gpa_to_offset(&layout, HIGH_RAM_START), Some(3 * GIB));
        assert_eq!(
            gpa_to_offset(&layout, HIGH_RAM_START + 4 * MIB - 1),
            Some(3 * GIB + 4 * MIB - 1)
        );
        assert_eq!(
            gpa_to_offset(&layout, HIGH_RAM_START + 4 * MIB),
            None,
            "past the end"
        );

        assert_eq!(offset_to_gpa(&layout, 0), 0);
        assert_eq!(offset_to_gpa(&layout, 3 * GIB - 1), 3 * GIB - 1);
        assert_eq!(offset_to_gpa(&layout, 3 * GIB), HIGH_RAM_START);
        assert_eq!(
            offset_to_gpa(&layout, 3 * GIB + 4 * MIB - 1),
            HIGH_RAM_START + 4 * MIB - 1
        );
        for offset in (0..layout.ram_bytes()).step_by(CHUNK_BYTES as usize) {
            let gpa = offset_to_gpa(&layout, offset);
            assert_eq!(gpa % CHUNK_BYTES, offset % CHUNK_BYTES);
            assert_eq!(gpa_to_offset(&layout, gpa), Some(offset));
        }
    }

    #[test]
    #[should_panic(expected = "outside guest RAM")]
    fn offset_past_ram_panics() {
        Layout::new(64 * MIB)
            .unwrap()
            .offset_to_gpa(RegionOffset::new(64 * MIB));
    }

    #[test]
    fn contains_needs_one_region() {
        let layout = Layout::new(3 * GIB + 4 * MIB).unwrap();
        assert!(contains(&layout, 0, 3 * GIB));
        assert!(contains(&layout, 2 * MIB, 4096));
        assert!(
            !contains(&layout, 3 * GIB - 4096, 8192),
            "runs into the hole"
        );
        assert!(
            !contains(&layout, 3 * GIB - 4096, HIGH_RAM_START),
            "spans the hole"
        );
        assert!(contains(&layout, HIGH_RAM_START, 4 * MIB));
        assert!(!contains(&layout, HIGH_RAM_START, 4 * MIB + 1));
        assert!(
            contains(&layout, HIGH_RAM_START + 4 * MIB, 0),
            "empty range at the end"
        );
        assert!(
            !contains(&layout, 3 * GIB + 1, 0),
            "empty range in the hole"
        );
        assert!(!contains(&layout, u64::MAX, 2), "overflow");
    }

    #[test]
    fn rejects_bad_sizes_with_advice() {
        assert_eq!(Layout::new(0), Err(LayoutError::Zero));
        assert_eq!(
            Layout::new(2 * MIB),
            Err(LayoutError::TooSmall { ram_bytes: 2 * MIB })
        );
        assert_eq!(
            Layout::new(193 * GIB),
            Err(LayoutError::TooLarge {
                ram_bytes: 193 * GIB
            })
        );
        assert!(Layout::new(MIN_RAM_BYTES).is_ok());
        assert!(Layout::new(MAX_RAM_BYTES).is_ok());

        let err = Layout::new(1001 * MIB).unwrap_err();
        assert_eq!(
            err,
            LayoutError::NotChunkMultiple {
                ram_bytes: 1001 * MIB,
                suggestions: vec![1000 * MIB, 1002 * MIB]
            }
        );
        let message = err.to_string();
        assert!(message.contains("not a multiple of 2 MiB"), "{message}");
        assert!(message.contains("--mem 1000M or --mem 1002M"), "{message}");

        let message = Layout::new(1_000_000_000).unwrap_err().to_string();
        assert!(message.contains("--mem 952M or --mem 954M"), "{message}");

        let message = Layout::new(4 * GIB - MIB).unwrap_err().to_string();
        assert!(message.contains("--mem 4094M or --mem 4G"), "{message}");

        let message = Layout::new(5 * MIB).unwrap_err().to_string();
        assert!(message.contains("--mem 4M or --mem 6M"), "{message}");

        let message = Layout::new(MAX_RAM_BYTES - MIB).unwrap_err().to_string();
        assert!(message.contains("--mem 196606M or --mem 192G"), "{message}");

        let message = Layout::new(MIB).unwrap_err().to_string();
        assert!(message.contains("at least --mem 4M"), "{message}");
        let message = Layout::new(1 << 50).unwrap_err().to_string();
        assert!(message.contains("at most --mem 192G"), "{message}");
    }
}
