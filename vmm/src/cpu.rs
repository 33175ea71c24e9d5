//! Initial vCPU state for payload protocol v1: long mode at CPL 3.

use crate::payload::layout::{self, selector};
use crate::payload::tables::gdt_limit;
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs, CpuId};
use kvm_ioctls::VcpuFd;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_SCE: u64 = 1 << 0;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// IOPL 3 (port I/O allowed at CPL 3), reserved bit 1, interrupts off.
pub const ENTRY_RFLAGS: u64 = 0x3002;

/// What a vCPU starts with.
pub struct EntryState {
    /// vCPU index.
    pub index: u32,
    /// Number of vCPUs (sizes the GDT).
    pub vcpu_count: u32,
    /// Entry point.
    pub rip: u64,
    /// Boot info address passed in RSI.
    pub boot_info_gpa: u64,
}

fn flat_segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: (selector & 3) as u8,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// The flat 64-bit user code segment payloads run in.
pub fn user_code_segment() -> kvm_segment {
    flat_segment(selector::USER_CODE, true)
}

/// The flat user data segment payloads run with.
pub fn user_data_segment() -> kvm_segment {
    flat_segment(selector::USER_DATA, false)
}

/// Control and segment registers for CPL 3 long mode.
pub fn entry_sregs(mut sregs: kvm_sregs, index: u32, vcpu_count: u32) -> kvm_sregs {
    sregs.cs = user_code_segment();
    let data = user_data_segment();
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        base: layout::tss_gpa(index),
        limit: 103,
        selector: layout::tss_selector(index),
        type_: 0xb,
        present: 1,
        s: 0,
        ..Default::default()
    };
    sregs.ldt = kvm_segment {
        type_: 0x2,
        present: 1,
        unusable: 1,
        ..Default::default()
    };
    sregs.gdt.base = layout::GDT_GPA;
    sregs.gdt.limit = gdt_limit(vcpu_count);
    sregs.idt.base = layout::IDT_GPA;
    sregs.idt.limit = 256 * 16 - 1;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = layout::PML4_GPA;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_SCE | EFER_LME | EFER_LMA;
    sregs
}

/// General registers at entry.
pub fn entry_regs(state: &EntryState) -> kvm_regs {
    kvm_regs {
        rip: state.rip,
        rsp: layout::user_stack_top(state.index),
        rflags: ENTRY_RFLAGS,
        rdi: u64::from(state.index),
        rsi: state.boot_info_gpa,
        ..Default::default()
    }
}

/// Loads the complete entry state into a vCPU.
pub fn configure(
    vcpu: &VcpuFd,
    cpuid: &CpuId,
    state: &EntryState,
) -> Result<(), kvm_ioctls::Error> {
    let mut cpuid = cpuid.clone();
    for entry in cpuid.as_mut_slice() {
        // Leaf 1 EBX[31:24] and leaf 0xB EDX carry the APIC ID: make each
        // vCPU see its own index, as on real hardware.
        if entry.function == 1 {
            entry.ebx = (entry.ebx & 0x00ff_ffff) | (state.index << 24);
        }
        if entry.function == 0xb || entry.function == 0x1f {
            entry.edx = state.index;
        }
    }
    vcpu.set_cpuid2(&cpuid)?;
    let sregs = entry_sregs(vcpu.get_sregs()?, state.index, state.vcpu_count);
    vcpu.set_sregs(&sregs)?;
    vcpu.set_regs(&entry_regs(state))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_state_is_cpl3_long_mode() {
        let sregs = entry_sregs(kvm_sregs::default(), 3, 4);
        assert_eq!(sregs.cs.selector & 3, 3);
        assert_eq!(sregs.cs.dpl, 3);
        assert_eq!(sregs.cs.l, 1);
        assert_eq!(sregs.ss.dpl, 3);
        assert_eq!(
            sregs.efer & (EFER_LMA | EFER_LME | EFER_SCE),
            EFER_LMA | EFER_LME | EFER_SCE
        );
        assert_eq!(sregs.tr.base, layout::tss_gpa(3));
        let regs = entry_regs(&EntryState {
            index: 3,
            vcpu_count: 4,
            rip: 0x200000,
            boot_info_gpa: 0x1e0000,
        });
        assert_eq!(regs.rflags, 0x3002);
        assert_eq!(regs.rdi, 3);
        assert_eq!(regs.rsp % 16, 0);
    }
}
