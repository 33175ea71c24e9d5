//! Where the command line and the initrd go in guest RAM, and the checks
//! the boot protocol puts on them.

use std::ops::Range;

use guestmem::{Layout, CHUNK_BYTES, LOW_RAM_END};

use super::low_mem::{CMDLINE_MAX_BYTES, HIGH_MEMORY_GPA};
use vm_memory::Address;

/// Why the command line or initrd cannot be placed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// The command line is longer than the kernel accepts.
    #[error("the kernel command line is {len_bytes} bytes, but this kernel accepts at most {max_bytes}; shorten it")]
    CmdlineTooLong {
        /// Its length.
        len_bytes: usize,
        /// The kernel's `cmdline_size` (or hugevmm's room for it).
        max_bytes: u64,
    },
    /// The command line contains a NUL, which would end it early.
    #[error("the kernel command line contains a NUL byte at offset {offset}")]
    CmdlineNul {
        /// Where.
        offset: usize,
    },
    /// The initrd does not fit between the kernel and its address limit.
    #[error(
        "the initrd ({len_bytes} bytes) does not fit in guest RAM between the kernel's end {kernel_end_gpa:#x} and \
         {limit_gpa:#x} (the lowest of: end of RAM below 3 GiB, the kernel's initrd_addr_max + 1); \
         give the VM more memory (--mem) or use a smaller initrd"
    )]
    InitrdDoesNotFit {
        /// Its size.
        len_bytes: u64,
        /// End of the memory the kernel needs.
        kernel_end_gpa: u64,
        /// Highest end address allowed.
        limit_gpa: u64,
    },
}

/// The command line as the kernel reads it: the bytes and a NUL, checked
/// against the kernel's `cmdline_size` (which excludes the NUL).
pub fn cmdline_bytes(cmdline: &str, cmdline_size_bytes: u32) -> Result<Vec<u8>, PlacementError> {
    if let Some(offset) = cmdline.bytes().position(|b| b == 0) {
        return Err(PlacementError::CmdlineNul { offset });
    }
    let max_bytes = u64::from(cmdline_size_bytes).min(CMDLINE_MAX_BYTES - 1);
    if cmdline.len() as u64 > max_bytes {
        return Err(PlacementError::CmdlineTooLong {
            len_bytes: cmdline.len(),
            max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(cmdline.len() + 1);
    bytes.extend_from_slice(cmdline.as_bytes());
    bytes.push(0);
    Ok(bytes)
}

/// Places an initrd of `len_bytes` as high as allowed in the low RAM
/// region: below 3 GiB (the 32-bit `ramdisk_image` field and the device
/// hole), below `initrd_addr_max`, and above the kernel's memory
/// `[.., kernel_end_gpa)`. The start is 2 MiB aligned so the initrd fills
/// whole chunks, which the kernel frees as a unit after unpacking it.
pub fn place_initrd(
    layout: &Layout,
    len_bytes: u64,
    initrd_addr_max: u32,
    kernel_end_gpa: u64,
) -> Result<Range<u64>, PlacementError> {
    let low_end = layout.regions()[0].end_gpa().raw_value();
    let limit_gpa = low_end.min(LOW_RAM_END).min(u64::from(initrd_addr_max) + 1);
    let floor = kernel_end_gpa.max(HIGH_MEMORY_GPA);
    let does_not_fit = PlacementError::InitrdDoesNotFit {
        len_bytes,
        kernel_end_gpa,
        limit_gpa,
    };
    let start = limit_gpa
        .checked_sub(len_bytes)
        .ok_or(does_not_fit.clone())?
        / CHUNK_BYTES
        * CHUNK_BYTES;
    if start < floor {
        return Err(does_not_fit);
    }
    Ok(start..start + len_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn cmdline_is_nul_terminated_and_bounded() {
        assert_eq!(
            cmdline_bytes("console=ttyS0", 2047).unwrap(),
            b"console=ttyS0\0"
        );
        assert_eq!(cmdline_bytes("", 2047).unwrap(), b"\0");
        let exact = "x".repeat(2047);
        assert_eq!(cmdline_bytes(&exact, 2047).unwrap().len(), 2048);
        let err = cmdline_bytes(&"x".repeat(2048), 2047).unwrap_err();
        assert_eq!(
            err,
            PlacementError::CmdlineTooLong {
                len_bytes: 2048,
                max_bytes: 2047
            }
        );
        assert_eq!(
            cmdline_bytes("a\0b", 2047),
            Err(PlacementError::CmdlineNul { offset: 1 })
        );
        // A kernel claiming a huge cmdline_size is still held to hugevmm's room.
        assert!(cmdline_bytes(&"x".repeat(CMDLINE_MAX_BYTES as usize), u32::MAX).is_err());
    }

    #[test]
    fn initrd_goes_to_the_top_of_low_ram_chunk_aligned() {
        let layout = Layout::new(256 * MIB).unwrap();
        let range = place_initrd(&layout, 5 * MIB + 3, 0x7fff_ffff, 64 * MIB).unwrap();
        assert_eq!(range.start, 250 * MIB);
        assert_eq!(range.end, 255 * MIB + 3);
        assert_eq!(range.start % CHUNK_BYTES, 0);
    }

    #[test]
    fn initrd_stays_below_3g_and_initrd_addr_max() {
        let layout = Layout::new(8 * GIB).unwrap();
        let range = place_initrd(&layout, 10 * MIB, 0xffff_ffff, 64 * MIB).unwrap();
        assert!(range.end <= 3 * GIB && range.start >= 3 * GIB - 12 * MIB);
        let range = place_initrd(&layout, 10 * MIB, 0x37ff_ffff, 64 * MIB).unwrap();
        assert!(range.end <= 0x3800_0000);
        assert_eq!(range.start, 0x3760_0000);
    }

    #[test]
    fn initrd_never_overlaps_the_kernel() {
        let layout = Layout::new(128 * MIB).unwrap();
        let err = place_initrd(&layout, 70 * MIB, 0x7fff_ffff, 64 * MIB).unwrap_err();
        assert!(
            matches!(err, PlacementError::InitrdDoesNotFit { limit_gpa, .. } if limit_gpa == 128 * MIB)
        );
        assert!(place_initrd(&layout, 64 * MIB, 0x7fff_ffff, 64 * MIB).is_ok());
        assert!(place_initrd(&layout, u64::MAX, 0x7fff_ffff, 64 * MIB).is_err());
    }
}
