//! Where a Linux boot puts the VMM's own structures: all below 1 MiB, in
//! RAM the e820 map calls usable, so nothing the kernel is told about
//! overlaps them; only the MP table and the ACPI tables live in the
//! reserved legacy area, where the kernel looks for them and leaves them
//! alone.
//!
//! The kernel copies the zero page and the command line early, replaces the
//! page tables and the GDT before it allocates memory, and keeps the first
//! 1 MiB reserved, so these pages need no protection after the entry.

/// Start of the legacy EBDA/BIOS area that the e820 map marks reserved
/// up to [`HIGH_MEMORY_GPA`].
pub const EBDA_GPA: u64 = 0x9_fc00;
/// The first byte above the legacy low-memory area.
pub const HIGH_MEMORY_GPA: u64 = 0x10_0000;

/// Boot GDT (one page, shared by all its descriptors and the TSS).
pub const GDT_GPA: u64 = 0x1000;
/// The dummy TSS the boot TR points at (inside the GDT page).
pub const TSS_GPA: u64 = 0x1800;
/// The zero page (`struct boot_params`).
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// Initial stack pointer: `startup_64` switches to its own stack at once,
/// but an exception before that needs a valid one to triple-fault cleanly
/// instead of corrupting the zero page.
pub const BOOT_STACK_TOP_GPA: u64 = 0x8ff0;
/// Identity page tables: PML4, PDPT and one page directory per GiB.
pub const PML4_GPA: u64 = 0x9000;
/// The page directory pointer table.
pub const PDPT_GPA: u64 = 0xa000;
/// First of the page directories, one page per GiB mapped.
pub const PD_GPA: u64 = 0xb000;
/// How much the boot page tables identity-map: the boot protocol needs the
/// kernel, zero page and command line mapped, all of which sit below 4 GiB.
pub const IDENTITY_MAPPED_BYTES: u64 = 4 << 30;
/// The kernel command line.
pub const CMDLINE_GPA: u64 = 0x2_0000;
/// Room for the command line, including its terminating NUL.
pub const CMDLINE_MAX_BYTES: u64 = 0x1_0000;

/// The MP table (floating pointer, then configuration table): at the start
/// of the last KiB of base memory, one of the places the kernel scans for
/// the floating pointer, and inside the range the e820 map reserves.
pub const MP_TABLE_GPA: u64 = EBDA_GPA;
/// Room for the MP table: that last KiB of base memory.
pub const MP_TABLE_MAX_BYTES: u64 = 0x400;

// The MP table stays in the reserved area, in the KiB the kernel scans for
// the floating pointer ([639 KiB, 640 KiB)), on the 16-byte boundary the
// scan steps by.
const _: () = assert!(
    MP_TABLE_GPA >= EBDA_GPA
        && MP_TABLE_GPA + MP_TABLE_MAX_BYTES <= HIGH_MEMORY_GPA
        && MP_TABLE_GPA == 639 << 10
        && MP_TABLE_GPA & 0xf == 0
);

/// The ACPI tables, RSDP first: the BIOS read-only area the kernel scans
/// for the RSDP, up to the end of low memory (reserved in the e820 map).
pub const ACPI_GPA: u64 = 0xe_0000;
/// Room for the ACPI tables.
pub const ACPI_MAX_BYTES: u64 = HIGH_MEMORY_GPA - ACPI_GPA;

// The RSDP scan covers [0xE0000, 0x100000) in 16-byte steps; the MP table
// is below it.
const _: () = assert!(
    ACPI_GPA >= MP_TABLE_GPA + MP_TABLE_MAX_BYTES && ACPI_GPA & 0xf == 0 && ACPI_GPA == 0xe_0000
);

/// Number of page directories needed for [`IDENTITY_MAPPED_BYTES`].
pub const PD_COUNT: u64 = IDENTITY_MAPPED_BYTES >> 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_are_disjoint_and_below_the_ebda() {
        let page = 0x1000;
        let mut ranges = [
            (GDT_GPA, TSS_GPA),
            (TSS_GPA, GDT_GPA + page),
            (ZERO_PAGE_GPA, ZERO_PAGE_GPA + page),
            (BOOT_STACK_TOP_GPA - page + 0x10, BOOT_STACK_TOP_GPA),
            (PML4_GPA, PML4_GPA + page),
            (PDPT_GPA, PDPT_GPA + page),
            (PD_GPA, PD_GPA + PD_COUNT * page),
            (CMDLINE_GPA, CMDLINE_GPA + CMDLINE_MAX_BYTES),
        ];
        ranges.sort();
        for pair in ranges.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "{:x?} overlaps {:x?}",
                pair[0],
                pair[1]
            );
        }
        assert!(ranges.iter().all(|r| r.1 <= EBDA_GPA));
        assert_eq!(BOOT_STACK_TOP_GPA % 16, 0);
    }
}
