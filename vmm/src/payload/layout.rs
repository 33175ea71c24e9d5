//! Where the VMM keeps its own structures inside guest RAM `[0, 2 MiB)`.
//!
//! The payload protocol gives the VMM the first 2 MiB chunk. The VMM maps it
//! with a 4 KiB page table so that each structure gets its own permission:
//! page tables, descriptor tables and exception stacks are supervisor-only,
//! the boot info is user-readable, each vCPU's stack is user-writable with an
//! unmapped guard page below it, and page 0 stays unmapped to catch null
//! pointers.

/// Size of the VMM-owned region at the bottom of guest RAM.
pub const VMM_REGION_BYTES: u64 = 2 << 20;
/// Global descriptor table.
pub const GDT_GPA: u64 = 0x1000;
/// Interrupt descriptor table (256 gates of 16 bytes).
pub const IDT_GPA: u64 = 0x2000;
/// Exception entry stubs, 16 bytes per vector.
pub const EXCEPTION_STUBS_GPA: u64 = 0x3000;
/// Bytes per exception stub.
pub const EXCEPTION_STUB_BYTES: u64 = 16;
/// Per-vCPU task state segments.
pub const TSS_GPA: u64 = 0x4000;
/// Stride between the vCPUs' TSSs.
pub const TSS_STRIDE_BYTES: u64 = 128;
/// Per-vCPU supervisor stacks that exceptions switch to (TSS.RSP0).
pub const EXCEPTION_STACKS_GPA: u64 = 0x8000;
/// Bytes per supervisor exception stack.
pub const EXCEPTION_STACK_BYTES: u64 = 0x1000;
/// Top-level page table.
pub const PML4_GPA: u64 = 0x30000;
/// The single page-directory-pointer table (covers 512 GiB).
pub const PDPT_GPA: u64 = 0x31000;
/// The 4 KiB page table that maps the VMM region itself.
pub const VMM_PT_GPA: u64 = 0x32000;
/// Page directories, one per GiB of guest-physical address space.
pub const PD_BASE_GPA: u64 = 0x33000;
/// End of the page-directory area.
pub const PD_END_GPA: u64 = 0x100000;
/// Per-vCPU user stacks, each preceded by an unmapped guard page.
pub const USER_STACKS_GPA: u64 = 0x100000;
/// Bytes of one user stack.
pub const USER_STACK_BYTES: u64 = 24 << 10;
/// Stride between user stacks (guard page + stack).
pub const USER_STACK_STRIDE_BYTES: u64 = USER_STACK_BYTES + 0x1000;
/// Boot info header, free ranges and the argument string.
pub const BOOT_INFO_GPA: u64 = 0x1E0000;
/// Space reserved for the boot info.
pub const BOOT_INFO_BYTES: u64 = VMM_REGION_BYTES - BOOT_INFO_GPA;
/// Most vCPUs the VMM region has room for (stacks, TSSs, GDT slots).
pub const MAX_VCPUS: u32 = 32;
/// Highest guest-physical address (exclusive) the page directories cover.
pub const MAX_MAPPED_GPA: u64 = ((PD_END_GPA - PD_BASE_GPA) / 0x1000) << 30;

/// GDT selectors. User selectors carry RPL 3.
pub mod selector {
    /// 64-bit supervisor code.
    pub const KERNEL_CODE: u16 = 0x08;
    /// Supervisor data.
    pub const KERNEL_DATA: u16 = 0x10;
    /// User data, RPL 3.
    pub const USER_DATA: u16 = 0x18 | 3;
    /// 64-bit user code, RPL 3.
    pub const USER_CODE: u16 = 0x20 | 3;
    /// First TSS descriptor; vCPU `i` uses `FIRST_TSS + 16 * i`.
    pub const FIRST_TSS: u16 = 0x28;
}

/// I/O port a supervisor exception stub writes to report an exception.
pub const EXCEPTION_PORT: u16 = 0xf5;

/// Top of vCPU `index`'s user stack (16-byte aligned).
pub fn user_stack_top(index: u32) -> u64 {
    USER_STACKS_GPA + u64::from(index) * USER_STACK_STRIDE_BYTES + USER_STACK_STRIDE_BYTES
}

/// Top of vCPU `index`'s supervisor exception stack.
pub fn exception_stack_top(index: u32) -> u64 {
    EXCEPTION_STACKS_GPA + (u64::from(index) + 1) * EXCEPTION_STACK_BYTES
}

/// Guest address of vCPU `index`'s TSS.
pub fn tss_gpa(index: u32) -> u64 {
    TSS_GPA + u64::from(index) * TSS_STRIDE_BYTES
}

/// GDT selector of vCPU `index`'s TSS.
pub fn tss_selector(index: u32) -> u16 {
    selector::FIRST_TSS + 16 * index as u16
}

// The region's pieces must not overlap, checked when the VMM is compiled.
const _: () = {
    assert!(EXCEPTION_STUBS_GPA + 256 * EXCEPTION_STUB_BYTES <= TSS_GPA);
    assert!(TSS_GPA + MAX_VCPUS as u64 * TSS_STRIDE_BYTES <= EXCEPTION_STACKS_GPA);
    assert!(EXCEPTION_STACKS_GPA + MAX_VCPUS as u64 * EXCEPTION_STACK_BYTES <= PML4_GPA);
    assert!(USER_STACKS_GPA + MAX_VCPUS as u64 * USER_STACK_STRIDE_BYTES <= BOOT_INFO_GPA);
    assert!(USER_STACK_STRIDE_BYTES & 15 == 0);
    assert!(selector::FIRST_TSS as u64 + 16 * MAX_VCPUS as u64 <= 0x1000);
    assert!(MAX_MAPPED_GPA >= 193 << 30);
};
