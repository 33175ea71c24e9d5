//! The boot info block of payload protocol v1 and the free-range list in it.

use super::layout::{BOOT_INFO_BYTES, BOOT_INFO_GPA, VMM_REGION_BYTES};

/// `HVMMPAYL` read as a little-endian u64.
pub const BOOT_INFO_MAGIC: u64 = 0x4c59_4150_4d4d_5648;
/// Highest protocol version this VMM speaks.
pub const PROTOCOL_VERSION: u32 = 2;
const HEADER_BYTES: u64 = 48;
const RANGE_BYTES: u64 = 16;

/// A half-open guest-physical range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpaRange {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
}

/// Why the boot info cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootInfoError {
    /// The argument string does not fit in the VMM's boot info area.
    #[error("--payload-args is {len_bytes} bytes; at most {limit_bytes} fit in the boot info")]
    ArgsTooLong {
        /// Length given.
        len_bytes: usize,
        /// Room available.
        limit_bytes: usize,
    },
}

/// Guest RAM left to the payload: `ram` minus the VMM region and `used`
/// (the image), with used ranges widened to 4 KiB pages.
pub fn free_ranges(ram: &[GpaRange], used: &[GpaRange]) -> Vec<GpaRange> {
    let mut holes: Vec<GpaRange> = used
        .iter()
        .map(|r| GpaRange {
            start: r.start & !0xfff,
            end: (r.end + 0xfff) & !0xfff,
        })
        .collect();
    holes.push(GpaRange {
        start: 0,
        end: VMM_REGION_BYTES,
    });
    holes.sort_by_key(|r| r.start);
    let mut free = Vec::new();
    for region in ram {
        let mut cursor = region.start;
        for hole in &holes {
            if hole.end <= cursor || hole.start >= region.end {
                continue;
            }
            if hole.start > cursor {
                free.push(GpaRange {
                    start: cursor,
                    end: hole.start,
                });
            }
            cursor = cursor.max(hole.end);
        }
        if cursor < region.end {
            free.push(GpaRange {
                start: cursor,
                end: region.end,
            });
        }
    }
    free
}

/// A device window listed in version-2 boot info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioWindow {
    /// Guest-physical base.
    pub base: u64,
    /// Window size.
    pub size_bytes: u64,
    /// Interrupt line (informational: payloads run with interrupts off).
    pub irq: u32,
}

const MMIO_ENTRY_BYTES: u64 = 24;

/// Encodes the boot info for writing at [`BOOT_INFO_GPA`]. `version` 2
/// appends the device windows after the free ranges; the argument string
/// follows in the same block.
pub fn encode(
    version: u32,
    vcpu_count: u32,
    ram_bytes: u64,
    args: &[u8],
    free: &[GpaRange],
    mmio: &[MmioWindow],
) -> Result<Vec<u8>, BootInfoError> {
    let mmio_bytes = if version >= 2 {
        8 + MMIO_ENTRY_BYTES * mmio.len() as u64
    } else {
        0
    };
    let args_offset = HEADER_BYTES + RANGE_BYTES * free.len() as u64 + mmio_bytes;
    let limit_bytes = BOOT_INFO_BYTES.saturating_sub(args_offset) as usize;
    if args.len() > limit_bytes {
        return Err(BootInfoError::ArgsTooLong {
            len_bytes: args.len(),
            limit_bytes,
        });
    }
    let mut out = Vec::with_capacity(args_offset as usize + args.len());
    out.extend_from_slice(&BOOT_INFO_MAGIC.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&vcpu_count.to_le_bytes());
    out.extend_from_slice(&ram_bytes.to_le_bytes());
    out.extend_from_slice(&(BOOT_INFO_GPA + args_offset).to_le_bytes());
    out.extend_from_slice(&(args.len() as u64).to_le_bytes());
    out.extend_from_slice(&(free.len() as u64).to_le_bytes());
    for r in free {
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
    }
    if version >= 2 {
        out.extend_from_slice(&(mmio.len() as u64).to_le_bytes());
        for w in mmio {
            out.extend_from_slice(&w.base.to_le_bytes());
            out.extend_from_slice(&w.size_bytes.to_le_bytes());
            out.extend_from_slice(&w.irq.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
    }
    out.extend_from_slice(args);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> GpaRange {
        GpaRange { start, end }
    }

    #[test]
    fn free_ranges_skip_vmm_region_and_image() {
        let ram = [r(0, 3 << 30), r(4 << 30, 5 << 30)];
        let used = [r(0x200000, 0x200123), r(0x400000, 0x401000)];
        let free = free_ranges(&ram, &used);
        assert_eq!(
            free,
            vec![
                r(0x201000, 0x400000),
                r(0x401000, 3 << 30),
                r(4 << 30, 5 << 30)
            ]
        );
    }

    #[test]
    fn image_at_end_of_ram_leaves_nothing_after_it() {
        let free = free_ranges(&[r(0, 8 << 20)], &[r(6 << 20, 8 << 20)]);
        assert_eq!(free, vec![r(2 << 20, 6 << 20)]);
    }

    #[test]
    fn encoding_matches_protocol_offsets() {
        let free = [r(0x201000, 0x400000)];
        let bytes = encode(1, 4, 512 << 20, b"passes=3", &free, &[]).unwrap();
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(&bytes[..8], b"HVMMPAYL");
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 4);
        assert_eq!(u64_at(16), 512 << 20);
        assert_eq!(u64_at(24), BOOT_INFO_GPA + 64);
        assert_eq!(u64_at(32), 8);
        assert_eq!(u64_at(40), 1);
        assert_eq!(u64_at(48), 0x201000);
        assert_eq!(u64_at(56), 0x400000);
        assert_eq!(&bytes[64..], b"passes=3");
    }

    #[test]
    fn version_2_lists_device_windows_after_the_ranges() {
        let free = [r(0x201000, 0x400000)];
        let window = MmioWindow {
            base: 0xd000_0000,
            size_bytes: 0x1000,
            irq: 5,
        };
        let bytes = encode(2, 1, 512 << 20, b"x", &free, &[window]).unwrap();
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
        assert_eq!(u64_at(64), 1, "mmio_count");
        assert_eq!(u64_at(72), 0xd000_0000);
        assert_eq!(u64_at(80), 0x1000);
        assert_eq!(u32::from_le_bytes(bytes[88..92].try_into().unwrap()), 5);
        assert_eq!(u64_at(24), BOOT_INFO_GPA + 96, "args follow the windows");
        assert_eq!(&bytes[96..], b"x");
        let v1 = encode(1, 1, 512 << 20, b"x", &free, &[window]).unwrap();
        assert_eq!(v1.len(), 64 + 1, "version 1 has no device list");
    }

    #[test]
    fn overlong_args_are_refused() {
        let args = vec![b'x'; BOOT_INFO_BYTES as usize];
        assert!(matches!(
            encode(1, 1, 1 << 30, &args, &[], &[]),
            Err(BootInfoError::ArgsTooLong { .. })
        ));
    }
}
