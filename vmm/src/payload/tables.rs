//! The VMM region image: page tables, GDT, IDT, TSSs and exception stubs.
//!
//! Built as one byte image of the first 2 MiB chunk so it can be written to
//! guest RAM in one go and checked in unit tests without a VM.

use super::bootinfo::GpaRange;
use super::layout::*;

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_HUGE: u64 = 1 << 7;
const TWO_MIB: u64 = 2 << 20;
const ONE_GIB: u64 = 1 << 30;

/// Vectors for which the CPU pushes an error code.
const VECTORS_WITH_ERROR_CODE: [u8; 9] = [8, 10, 11, 12, 13, 14, 17, 21, 30];

/// Why the VMM region cannot describe this configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TablesError {
    /// Too many vCPUs for the region's stacks and descriptors.
    #[error("{0} vCPUs requested; at most {MAX_VCPUS} are supported")]
    TooManyVcpus(u32),
    /// Guest RAM reaches beyond what the page directories cover.
    #[error("guest RAM ends at {0:#x}; the payload page tables cover up to {MAX_MAPPED_GPA:#x}: use a smaller --mem")]
    RamTooHigh(u64),
}

fn put_u64(image: &mut [u8], gpa: u64, value: u64) {
    let at = gpa as usize;
    image[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Builds the image of `[0, BOOT_INFO_GPA)`. `mmio` lists device windows
/// to map for user access, uncached (protocol version 2).
pub fn build_vmm_region(
    vcpu_count: u32,
    ram: &[GpaRange],
    mmio: &[GpaRange],
) -> Result<Vec<u8>, TablesError> {
    if vcpu_count == 0 || vcpu_count > MAX_VCPUS {
        return Err(TablesError::TooManyVcpus(vcpu_count));
    }
    let ram_end = ram.iter().map(|r| r.end).max().unwrap_or(0);
    if ram_end > MAX_MAPPED_GPA {
        return Err(TablesError::RamTooHigh(ram_end));
    }
    let mut image = vec![0u8; BOOT_INFO_GPA as usize];
    write_page_tables(&mut image, vcpu_count, ram);
    map_mmio(&mut image, mmio);
    write_gdt(&mut image, vcpu_count);
    write_idt_and_stubs(&mut image);
    write_tsss(&mut image, vcpu_count);
    Ok(image)
}

fn write_page_tables(image: &mut [u8], vcpu_count: u32, ram: &[GpaRange]) {
    let table = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    put_u64(image, PML4_GPA, PDPT_GPA | table);
    for region in ram {
        let mut gpa = region.start;
        while gpa < region.end {
            let gib = gpa / ONE_GIB;
            let pd = PD_BASE_GPA + gib * 0x1000;
            put_u64(image, PDPT_GPA + gib * 8, pd | table);
            let pde = pd + ((gpa % ONE_GIB) / TWO_MIB) * 8;
            if gpa < VMM_REGION_BYTES {
                // The VMM region gets a 4 KiB table so each structure can
                // carry its own permission (user access only where needed).
                put_u64(image, pde, VMM_PT_GPA | table);
            } else {
                put_u64(
                    image,
                    pde,
                    gpa | PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_HUGE,
                );
            }
            gpa += TWO_MIB;
        }
    }
    let mut map_4k = |gpa: u64, flags: u64| {
        put_u64(image, VMM_PT_GPA + (gpa / 0x1000) * 8, gpa | flags);
    };
    let supervisor = PTE_PRESENT | PTE_WRITABLE;
    for page in (GDT_GPA..USER_STACKS_GPA).step_by(0x1000) {
        map_4k(page, supervisor);
    }
    for index in 0..vcpu_count {
        let top = user_stack_top(index);
        for page in (top - USER_STACK_BYTES..top).step_by(0x1000) {
            map_4k(page, PTE_PRESENT | PTE_WRITABLE | PTE_USER);
        }
    }
    for page in (BOOT_INFO_GPA..VMM_REGION_BYTES).step_by(0x1000) {
        map_4k(page, PTE_PRESENT | PTE_USER);
    }
}

/// Device windows get 2 MiB pages with caching disabled (PCD | PWT):
/// every access must reach the device.
fn map_mmio(image: &mut [u8], mmio: &[GpaRange]) {
    const PTE_PWT: u64 = 1 << 3;
    const PTE_PCD: u64 = 1 << 4;
    let table = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    for window in mmio {
        let mut page = window.start & !(TWO_MIB - 1);
        while page < window.end {
            let gib = page / ONE_GIB;
            let pd = PD_BASE_GPA + gib * 0x1000;
            put_u64(image, PDPT_GPA + gib * 8, pd | table);
            let flags = PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_HUGE | PTE_PCD | PTE_PWT;
            put_u64(image, pd + ((page % ONE_GIB) / TWO_MIB) * 8, page | flags);
            page += TWO_MIB;
        }
    }
}

fn segment_descriptor(access: u64, flags: u64) -> u64 {
    // Flat: base 0, limit 0xfffff pages; long-mode code ignores both.
    0xffff | (0xf << 48) | (access << 40) | (flags << 52)
}

fn write_gdt(image: &mut [u8], vcpu_count: u32) {
    // access: P | DPL | S | type (accessed bit preset so the CPU never writes it)
    put_u64(
        image,
        GDT_GPA + u64::from(selector::KERNEL_CODE),
        segment_descriptor(0x9b, 0xa),
    );
    put_u64(
        image,
        GDT_GPA + u64::from(selector::KERNEL_DATA),
        segment_descriptor(0x93, 0xc),
    );
    put_u64(
        image,
        GDT_GPA + u64::from(selector::USER_DATA & !3),
        segment_descriptor(0xf3, 0xc),
    );
    put_u64(
        image,
        GDT_GPA + u64::from(selector::USER_CODE & !3),
        segment_descriptor(0xfb, 0xa),
    );
    for index in 0..vcpu_count {
        let base = tss_gpa(index);
        let limit = 103u64;
        let low = (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (0x8b << 40) // present, busy 64-bit TSS
            | (((base >> 24) & 0xff) << 56);
        let at = GDT_GPA + u64::from(tss_selector(index));
        put_u64(image, at, low);
        put_u64(image, at + 8, base >> 32);
    }
}

/// Limit of the GDT for `vcpu_count` vCPUs.
pub fn gdt_limit(vcpu_count: u32) -> u16 {
    tss_selector(vcpu_count) - 1
}

fn write_idt_and_stubs(image: &mut [u8]) {
    for vector in 0..=255u8 {
        let stub = EXCEPTION_STUBS_GPA + u64::from(vector) * EXCEPTION_STUB_BYTES;
        let mut code = Vec::with_capacity(EXCEPTION_STUB_BYTES as usize);
        if !VECTORS_WITH_ERROR_CODE.contains(&vector) {
            code.extend_from_slice(&[0x6a, 0x00]); // push $0: uniform frame
        }
        code.push(0x68); // push $vector
        code.extend_from_slice(&u32::from(vector).to_le_bytes());
        code.extend_from_slice(&[0xe6, EXCEPTION_PORT as u8]); // out %al, $EXCEPTION_PORT
        code.extend_from_slice(&[0xeb, 0xfe]); // jmp . (the VMM never resumes it)
        code.resize(EXCEPTION_STUB_BYTES as usize, 0xcc);
        let at = stub as usize;
        image[at..at + code.len()].copy_from_slice(&code);

        // 64-bit interrupt gate, DPL 0: `int N` from user mode raises #GP.
        let low = (stub & 0xffff)
            | (u64::from(selector::KERNEL_CODE) << 16)
            | (0x8e << 40)
            | (((stub >> 16) & 0xffff) << 48);
        let gate = IDT_GPA + u64::from(vector) * 16;
        put_u64(image, gate, low);
        put_u64(image, gate + 8, stub >> 32);
    }
}

fn write_tsss(image: &mut [u8], vcpu_count: u32) {
    for index in 0..vcpu_count {
        let tss = tss_gpa(index);
        put_u64(image, tss + 4, exception_stack_top(index)); // RSP0
                                                             // I/O map base beyond the limit: no bitmap; IOPL 3 grants port access.
        let iomap = (tss + 102) as usize;
        image[iomap..iomap + 2].copy_from_slice(&104u16.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(image: &[u8], gpa: u64) -> u64 {
        u64::from_le_bytes(image[gpa as usize..gpa as usize + 8].try_into().unwrap())
    }

    /// Walks the tables like the MMU does; returns (physical, user, writable, huge).
    fn translate(image: &[u8], va: u64) -> Option<(u64, bool, bool, bool)> {
        let pml4e = get(image, PML4_GPA + ((va >> 39) & 511) * 8);
        if pml4e & PTE_PRESENT == 0 {
            return None;
        }
        let pdpte = get(image, (pml4e & !0xfff) + ((va >> 30) & 511) * 8);
        if pdpte & PTE_PRESENT == 0 {
            return None;
        }
        let pde = get(image, (pdpte & !0xfff) + ((va >> 21) & 511) * 8);
        if pde & PTE_PRESENT == 0 {
            return None;
        }
        if pde & PTE_HUGE != 0 {
            let user = pml4e & pdpte & pde & PTE_USER != 0;
            let write = pml4e & pdpte & pde & PTE_WRITABLE != 0;
            return Some(((pde & !0x1f_ffff) | (va & 0x1f_ffff), user, write, true));
        }
        let pte = get(image, (pde & !0xfff) + ((va >> 12) & 511) * 8);
        if pte & PTE_PRESENT == 0 {
            return None;
        }
        let user = pml4e & pdpte & pde & pte & PTE_USER != 0;
        let write = pml4e & pdpte & pde & pte & PTE_WRITABLE != 0;
        Some(((pte & !0xfff) | (va & 0xfff), user, write, false))
    }

    #[test]
    fn ram_is_identity_mapped_huge_and_user_accessible() {
        let ram = [
            GpaRange {
                start: 0,
                end: 3 << 30,
            },
            GpaRange {
                start: 4 << 30,
                end: 6 << 30,
            },
        ];
        let image = build_vmm_region(2, &ram, &[]).unwrap();
        for va in [
            0x200000u64,
            0x3fff_fff8,
            (3 << 30) - 8,
            4 << 30,
            (6 << 30) - 8,
        ] {
            assert_eq!(
                translate(&image, va),
                Some((va, true, true, true)),
                "{va:#x}"
            );
        }
        assert_eq!(
            translate(&image, 3 << 30),
            None,
            "the device hole is unmapped"
        );
        assert_eq!(translate(&image, 6 << 30), None, "beyond RAM is unmapped");
    }

    #[test]
    fn vmm_region_permissions() {
        let image = build_vmm_region(
            2,
            &[GpaRange {
                start: 0,
                end: 64 << 20,
            }],
            &[],
        )
        .unwrap();
        assert_eq!(translate(&image, 0), None, "null page");
        assert_eq!(
            translate(&image, PML4_GPA),
            Some((PML4_GPA, false, true, false))
        );
        assert_eq!(
            translate(&image, IDT_GPA),
            Some((IDT_GPA, false, true, false))
        );
        let top = user_stack_top(1);
        assert_eq!(
            translate(&image, top - 8),
            Some((top - 8, true, true, false))
        );
        let guard = top - USER_STACK_STRIDE_BYTES;
        assert_eq!(translate(&image, guard), None, "guard page below stack 1");
        assert_eq!(
            translate(&image, user_stack_top(2) - 8),
            None,
            "no stack for vCPU 2"
        );
        assert_eq!(
            translate(&image, BOOT_INFO_GPA),
            Some((BOOT_INFO_GPA, true, false, false))
        );
    }

    #[test]
    fn idt_gates_point_at_stubs() {
        let image = build_vmm_region(
            1,
            &[GpaRange {
                start: 0,
                end: 8 << 20,
            }],
            &[],
        )
        .unwrap();
        for vector in [0u64, 13, 14, 255] {
            let low = get(&image, IDT_GPA + vector * 16);
            let target = (low & 0xffff) | ((low >> 48) << 16);
            assert_eq!(target, EXCEPTION_STUBS_GPA + vector * EXCEPTION_STUB_BYTES);
            assert_eq!((low >> 40) & 0xff, 0x8e);
        }
        // #PF pushes its own error code: the stub starts with `push $14`.
        let pf = (EXCEPTION_STUBS_GPA + 14 * EXCEPTION_STUB_BYTES) as usize;
        assert_eq!(&image[pf..pf + 5], &[0x68, 14, 0, 0, 0]);
        let de = EXCEPTION_STUBS_GPA as usize;
        assert_eq!(&image[de..de + 3], &[0x6a, 0, 0x68]);
    }

    #[test]
    fn limits_are_enforced() {
        assert_eq!(
            build_vmm_region(0, &[], &[]).unwrap_err(),
            TablesError::TooManyVcpus(0)
        );
        assert_eq!(
            build_vmm_region(MAX_VCPUS + 1, &[], &[]).unwrap_err(),
            TablesError::TooManyVcpus(33)
        );
        let huge = [GpaRange {
            start: 4 << 30,
            end: MAX_MAPPED_GPA + (2 << 20),
        }];
        assert!(matches!(
            build_vmm_region(1, &huge, &[]),
            Err(TablesError::RamTooHigh(_))
        ));
    }
}
