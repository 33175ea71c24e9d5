//! The GDT and identity page tables the 64-bit boot protocol requires:
//! flat `__BOOT_CS` (0x10) and `__BOOT_DS` (0x18) segments, and the low
//! 4 GiB identity-mapped. The descriptors here are also the source of the
//! vCPU's hidden segment state (`cpu.rs`), so memory and registers agree.

use guestmem::host::{HUGE_PAGE_BYTES, PAGE_BYTES};

use super::low_mem::{PDPT_GPA, PD_COUNT, PD_GPA, PML4_GPA, TSS_GPA};

/// `__BOOT_CS`.
pub const BOOT_CS_SELECTOR: u16 = 0x10;
/// `__BOOT_DS`.
pub const BOOT_DS_SELECTOR: u16 = 0x18;
/// The boot TSS; a 16-byte system descriptor occupying slots 4 and 5.
pub const TSS_SELECTOR: u16 = 0x20;
/// Size of the boot TSS (the architectural minimum, 104 bytes).
pub const TSS_BYTES: u32 = 104;

/// Flat 64-bit code: present, DPL 0, execute/read, accessed; L and G set.
pub const BOOT_CS_DESCRIPTOR: u64 = descriptor(0, 0xf_ffff, 0x9b, 0xa);
/// Flat data: present, DPL 0, read/write, accessed; D/B and G set.
pub const BOOT_DS_DESCRIPTOR: u64 = descriptor(0, 0xf_ffff, 0x93, 0xc);
/// The TSS descriptor's low half: present, busy 64-bit TSS (type 0xb), as
/// TR must be when a vCPU enters the guest.
pub const TSS_DESCRIPTOR_LOW: u64 = descriptor(TSS_GPA as u32, TSS_BYTES - 1, 0x8b, 0);

/// Page-table entry bits.
const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const HUGE: u64 = 1 << 7;

/// Encodes a segment descriptor from base, 20-bit limit, access byte and
/// the 4-bit flags nibble (G, D/B, L, AVL).
pub const fn descriptor(base: u32, limit: u32, access: u8, flags: u8) -> u64 {
    let base = base as u64;
    let limit = limit as u64;
    (limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | ((access as u64) << 40)
        | (((limit >> 16) & 0xf) << 48)
        | (((flags as u64) & 0xf) << 52)
        | (((base >> 24) & 0xff) << 56)
}

/// The GDT bytes: null, unused, `__BOOT_CS`, `__BOOT_DS`, TSS (two slots).
pub fn gdt() -> Vec<u8> {
    // The TSS base is below 4 GiB, so the descriptor's upper half is zero.
    [
        0,
        0,
        BOOT_CS_DESCRIPTOR,
        BOOT_DS_DESCRIPTOR,
        TSS_DESCRIPTOR_LOW,
        0,
    ]
    .iter()
    .flat_map(|d: &u64| d.to_le_bytes())
    .collect()
}

/// The GDT limit register value.
pub fn gdt_limit() -> u16 {
    (gdt().len() - 1) as u16
}

/// The page tables, to be written at [`PML4_GPA`]: PML4, PDPT, then one
/// page directory of 2 MiB pages per GiB. 2 MiB pages need no CPUID
/// feature (1 GiB pages do) and cost only four pages for 4 GiB.
pub fn identity_page_tables() -> Vec<u8> {
    // The tables are contiguous: PML4, PDPT, then the directories.
    const _: () = assert!(PDPT_GPA == PML4_GPA + PAGE_BYTES && PD_GPA == PDPT_GPA + PAGE_BYTES);
    let entries_per_table = 512;
    let mut words = vec![0u64; (2 + PD_COUNT as usize) * entries_per_table];
    words[0] = PDPT_GPA | PRESENT | WRITABLE;
    for gib in 0..PD_COUNT as usize {
        words[entries_per_table + gib] = (PD_GPA + gib as u64 * PAGE_BYTES) | PRESENT | WRITABLE;
        let directory = (2 + gib) * entries_per_table;
        for entry in 0..entries_per_table {
            let gpa = (gib * entries_per_table + entry) as u64 * HUGE_PAGE_BYTES;
            words[directory + entry] = gpa | PRESENT | WRITABLE | HUGE;
        }
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::low_mem::IDENTITY_MAPPED_BYTES;

    #[test]
    fn descriptors_match_the_well_known_encodings() {
        assert_eq!(BOOT_CS_DESCRIPTOR, 0x00af_9b00_0000_ffff);
        assert_eq!(BOOT_DS_DESCRIPTOR, 0x00cf_9300_0000_ffff);
        assert_eq!(TSS_DESCRIPTOR_LOW, 0x0000_8b00_1800_0067);
        let gdt = gdt();
        let at = |selector: u16| {
            u64::from_le_bytes(
                gdt[selector as usize..selector as usize + 8]
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(at(BOOT_CS_SELECTOR), BOOT_CS_DESCRIPTOR);
        assert_eq!(at(BOOT_DS_SELECTOR), BOOT_DS_DESCRIPTOR);
        assert_eq!(gdt_limit(), 47);
    }

    /// Walks the tables as the CPU would.
    fn translate(tables: &[u8], va: u64) -> Option<u64> {
        let word = |gpa: u64, index: u64| {
            let at = (gpa - PML4_GPA + index * 8) as usize;
            u64::from_le_bytes(tables[at..at + 8].try_into().unwrap())
        };
        let pml4e = word(PML4_GPA, (va >> 39) & 511);
        if pml4e & PRESENT == 0 {
            return None;
        }
        let pdpte = word(pml4e & !0xfff, (va >> 30) & 511);
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pde = word(pdpte & !0xfff, (va >> 21) & 511);
        if pde & PRESENT == 0 || pde & HUGE == 0 {
            return None;
        }
        Some((pde & !0x1f_ffff & !(1 << 63)) | (va & 0x1f_ffff))
    }

    #[test]
    fn low_4g_is_identity_mapped() {
        let tables = identity_page_tables();
        assert_eq!(tables.len() as u64, (2 + PD_COUNT) * PAGE_BYTES);
        for va in [
            0,
            0x7000,
            0x100_0000 + 0x1234,
            0xbfff_ffff,
            IDENTITY_MAPPED_BYTES - 1,
        ] {
            assert_eq!(translate(&tables, va), Some(va), "{va:#x}");
        }
        assert_eq!(translate(&tables, IDENTITY_MAPPED_BYTES), None);
    }
}
