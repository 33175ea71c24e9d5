//! The zero page (`struct boot_params`): the kernel's setup header with the
//! loader's fields filled in, the e820 map, and the pointers to the command
//! line and initrd.

use std::ops::Range;

use super::e820::E820Entry;
use super::le;
use super::setup_header::{field, SetupHeader, HEADER_OFFSET, LOADER_TYPE_UNDEFINED};

/// Size of the zero page.
pub const ZERO_PAGE_BYTES: usize = 4096;
/// Entries the zero page's e820 table holds (`E820_MAX_ENTRIES_ZEROPAGE`).
pub const E820_MAX_ENTRIES: usize = 128;

/// `boot_params` offsets outside the setup header
/// (Documentation/arch/x86/zero-page.rst).
mod offset {
    /// `acpi_rsdp_addr`: read by kernels of boot protocol 2.14 and later,
    /// which then skip scanning the BIOS area for the RSDP.
    pub const ACPI_RSDP_ADDR: usize = 0x070;
    pub const EXT_RAMDISK_IMAGE: usize = 0x0c0;
    pub const EXT_RAMDISK_SIZE: usize = 0x0c4;
    pub const EXT_CMD_LINE_PTR: usize = 0x0c8;
    pub const E820_ENTRIES: usize = 0x1e8;
    /// The setup header's room ends here; `edd_mbr_sig_buffer` follows.
    pub const HEADER_END: usize = 0x290;
    pub const E820_TABLE: usize = 0x2d0;
    pub const E820_ENTRY_BYTES: usize = 20;
}

/// Why a zero page cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZeroPageError {
    /// More e820 entries than the zero page holds.
    #[error("the memory map has {count} e820 entries, but the zero page holds {E820_MAX_ENTRIES}")]
    TooManyE820 {
        /// How many.
        count: usize,
    },
}

/// Builds the zero page for a 64-bit boot.
pub fn build(
    header: &SetupHeader,
    cmdline_gpa: u64,
    initrd: Option<Range<u64>>,
    e820: &[E820Entry],
    rsdp_gpa: u64,
) -> Result<Vec<u8>, ZeroPageError> {
    if e820.len() > E820_MAX_ENTRIES {
        return Err(ZeroPageError::TooManyE820 { count: e820.len() });
    }
    let mut page = vec![0u8; ZERO_PAGE_BYTES];
    // The protocol says: copy the header, then modify it as a loader.
    // Everything else starts zero, including `sentinel`, which must stay 0
    // or the kernel discards fields it then believes a broken loader left.
    let raw = header.raw();
    let copied = raw.len().min(offset::HEADER_END - HEADER_OFFSET);
    page[HEADER_OFFSET..HEADER_OFFSET + copied].copy_from_slice(&raw[..copied]);

    page[field::TYPE_OF_LOADER] = LOADER_TYPE_UNDEFINED;
    le::put(
        &mut page,
        field::CMD_LINE_PTR,
        &(cmdline_gpa as u32).to_le_bytes(),
    );
    le::put(
        &mut page,
        offset::EXT_CMD_LINE_PTR,
        &((cmdline_gpa >> 32) as u32).to_le_bytes(),
    );
    let (initrd_gpa, initrd_bytes) = initrd.map_or((0, 0), |r| (r.start, r.end - r.start));
    le::put(
        &mut page,
        field::RAMDISK_IMAGE,
        &(initrd_gpa as u32).to_le_bytes(),
    );
    le::put(
        &mut page,
        field::RAMDISK_SIZE,
        &(initrd_bytes as u32).to_le_bytes(),
    );
    le::put(
        &mut page,
        offset::EXT_RAMDISK_IMAGE,
        &((initrd_gpa >> 32) as u32).to_le_bytes(),
    );
    le::put(
        &mut page,
        offset::EXT_RAMDISK_SIZE,
        &((initrd_bytes >> 32) as u32).to_le_bytes(),
    );

    le::put(&mut page, offset::ACPI_RSDP_ADDR, &rsdp_gpa.to_le_bytes());
    page[offset::E820_ENTRIES] = e820.len() as u8;
    for (index, entry) in e820.iter().enumerate() {
        let at = offset::E820_TABLE + index * offset::E820_ENTRY_BYTES;
        le::put(&mut page, at, &entry.gpa.to_le_bytes());
        le::put(&mut page, at + 8, &entry.len_bytes.to_le_bytes());
        le::put(&mut page, at + 16, &entry.kind.type_code().to_le_bytes());
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use guestmem::Layout;

    use super::*;
    use crate::linux::e820::{e820_map, E820Kind};

    const MIB: u64 = 1 << 20;

    #[test]
    fn fills_loader_fields_and_the_e820_table() {
        let header = SetupHeader::synthesize(2 * MIB as u32, 2047, 0x7fff_ffff);
        let map = e820_map(&Layout::new(6 << 30).unwrap());
        let page = build(
            &header,
            0x2_0000,
            Some(0x1_1000_0000..0x1_1000_0123),
            &map,
            0xe_0000,
        )
        .unwrap();
        assert_eq!(le::u64_at(&page, offset::ACPI_RSDP_ADDR), Some(0xe_0000));
        assert_eq!(le::u16_at(&page, field::BOOT_FLAG), Some(0xaa55));
        assert_eq!(&page[field::HEADER..field::HEADER + 4], b"HdrS");
        assert_eq!(page[field::TYPE_OF_LOADER], 0xff);
        assert_eq!(page[0x1ef], 0, "sentinel");
        assert_eq!(le::u32_at(&page, field::CMD_LINE_PTR), Some(0x2_0000));
        assert_eq!(le::u32_at(&page, offset::EXT_CMD_LINE_PTR), Some(0));
        assert_eq!(le::u32_at(&page, field::RAMDISK_IMAGE), Some(0x1000_0000));
        assert_eq!(le::u32_at(&page, offset::EXT_RAMDISK_IMAGE), Some(1));
        assert_eq!(le::u32_at(&page, field::RAMDISK_SIZE), Some(0x123));
        assert_eq!(usize::from(page[offset::E820_ENTRIES]), map.len());
        let second = offset::E820_TABLE + offset::E820_ENTRY_BYTES;
        assert_eq!(le::u64_at(&page, second), Some(0x9_fc00));
        assert_eq!(le::u64_at(&page, second + 8), Some(0x6_0400));
        assert_eq!(
            le::u32_at(&page, second + 16),
            Some(E820Kind::Reserved.type_code())
        );
        let last = offset::E820_TABLE + 3 * offset::E820_ENTRY_BYTES;
        assert_eq!(le::u64_at(&page, last), Some(4 << 30));
        assert_eq!(le::u64_at(&page, last + 8), Some(3 << 30));
    }

    #[test]
    fn without_initrd_the_ramdisk_fields_are_zero() {
        let header = SetupHeader::synthesize(2 * MIB as u32, 2047, 0x7fff_ffff);
        let page = build(&header, 0x2_0000, None, &[], 0xe_0000).unwrap();
        assert_eq!(le::u32_at(&page, field::RAMDISK_IMAGE), Some(0));
        assert_eq!(le::u32_at(&page, field::RAMDISK_SIZE), Some(0));
        assert_eq!(page[offset::E820_ENTRIES], 0);
    }

    #[test]
    fn too_many_e820_entries_is_an_error() {
        let header = SetupHeader::synthesize(2 * MIB as u32, 2047, 0x7fff_ffff);
        let entry = E820Entry {
            gpa: 0,
            len_bytes: 1,
            kind: E820Kind::Ram,
        };
        let err = build(&header, 0, None, &vec![entry; 129], 0xe_0000).unwrap_err();
        assert_eq!(err, ZeroPageError::TooManyE820 { count: 129 });
    }
}
