//! vCPU state for the 64-bit Linux boot protocol.
//!
//! The boot vCPU (index 0) starts at `startup_64` in long mode at CPL 0,
//! with the boot GDT and identity page tables, `rsi` pointing at the zero
//! page and interrupts off. The others keep KVM's reset state: with the
//! in-kernel irqchip they wait for the kernel's INIT/SIPI
//! (KVM_MP_STATE_UNINITIALIZED is KVM's default for them). All of them get
//! the CPUID, MSRs, FPU and LAPIC setup firmware would have left.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};

use super::boot_tables::{
    gdt_limit, BOOT_CS_DESCRIPTOR, BOOT_CS_SELECTOR, BOOT_DS_DESCRIPTOR, BOOT_DS_SELECTOR,
    TSS_DESCRIPTOR_LOW, TSS_SELECTOR,
};
use super::cpuid::{self, CpuidError};
use super::lapic;
use super::low_mem::{BOOT_STACK_TOP_GPA, GDT_GPA, PML4_GPA};
use super::msrs::{self, MsrError};

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// Only the reserved bit 1: interrupts off, as the protocol requires.
const BOOT_RFLAGS: u64 = 0x2;
/// x87 control word after FNINIT.
const FCW_DEFAULT: u16 = 0x37f;
/// MXCSR after reset: all SIMD exceptions masked.
const MXCSR_DEFAULT: u32 = 0x1f80;

/// Where the boot vCPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    /// Physical address of `startup_64`.
    pub entry_gpa: u64,
    /// Physical address of the zero page.
    pub zero_page_gpa: u64,
}

/// Why a vCPU could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VcpuSetupError {
    /// An ioctl failed.
    #[error("{step} failed: {error}")]
    Kvm {
        /// Which ioctl.
        step: &'static str,
        /// The KVM error.
        error: kvm_ioctls::Error,
    },
    /// The CPUID table could not be built.
    #[error(transparent)]
    Cpuid(#[from] CpuidError),
    /// The MSRs could not be set.
    #[error(transparent)]
    Msrs(#[from] MsrError),
}

fn kvm_step(step: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuSetupError {
    move |error| VcpuSetupError::Kvm { step, error }
}

/// The hidden segment state a CPU would load from `descriptor`.
pub fn segment_from_descriptor(selector: u16, descriptor: u64) -> kvm_segment {
    let bit = |n: u32| ((descriptor >> n) & 1) as u8;
    let raw_limit = (descriptor & 0xffff) | ((descriptor >> 32) & 0xf_0000);
    let granular = bit(55);
    kvm_segment {
        base: ((descriptor >> 16) & 0xff_ffff) | ((descriptor >> 32) & 0xff00_0000),
        limit: if granular == 1 {
            ((raw_limit << 12) | 0xfff) as u32
        } else {
            raw_limit as u32
        },
        selector,
        type_: ((descriptor >> 40) & 0xf) as u8,
        s: bit(44),
        dpl: ((descriptor >> 45) & 3) as u8,
        present: bit(47),
        avl: bit(52),
        l: bit(53),
        db: bit(54),
        g: granular,
        unusable: 0,
        padding: 0,
    }
}

/// Control and segment registers of the boot vCPU. CR0 and CR4 hold only
/// what long mode needs: `startup_64` loads its own values right away.
pub fn boot_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    sregs.cs = segment_from_descriptor(BOOT_CS_SELECTOR, BOOT_CS_DESCRIPTOR);
    let data = segment_from_descriptor(BOOT_DS_SELECTOR, BOOT_DS_DESCRIPTOR);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_descriptor(TSS_SELECTOR, TSS_DESCRIPTOR_LOW);
    sregs.ldt = kvm_segment {
        type_: 0x2,
        present: 1,
        unusable: 1,
        ..Default::default()
    };
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = gdt_limit();
    // No IDT: the kernel installs its early one before it can fault.
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

/// General registers of the boot vCPU.
pub fn boot_regs(entry: EntryPoint) -> kvm_regs {
    kvm_regs {
        rip: entry.entry_gpa,
        rsi: entry.zero_page_gpa,
        rsp: BOOT_STACK_TOP_GPA,
        rbp: BOOT_STACK_TOP_GPA,
        rflags: BOOT_RFLAGS,
        ..Default::default()
    }
}

/// Sets up vCPU `index` (its APIC ID) for a Linux boot; `entry` is used by
/// vCPU 0 only. The VM must already have its in-kernel irqchip.
pub fn configure_vcpu(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    index: u32,
    entry: EntryPoint,
) -> Result<(), VcpuSetupError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_step("KVM_GET_SUPPORTED_CPUID"))?;
    let cpuid = cpuid::vcpu_cpuid(&supported, index)?;
    vcpu.set_cpuid2(&cpuid)
        .map_err(kvm_step("KVM_SET_CPUID2"))?;
    msrs::set_boot_msrs(vcpu)?;
    let fpu = kvm_fpu {
        fcw: FCW_DEFAULT,
        mxcsr: MXCSR_DEFAULT,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_step("KVM_SET_FPU"))?;
    lapic::configure(vcpu).map_err(kvm_step("KVM_GET_LAPIC/KVM_SET_LAPIC"))?;
    if index == 0 {
        let sregs = vcpu.get_sregs().map_err(kvm_step("KVM_GET_SREGS"))?;
        vcpu.set_sregs(&boot_sregs(sregs))
            .map_err(kvm_step("KVM_SET_SREGS"))?;
        vcpu.set_regs(&boot_regs(entry))
            .map_err(kvm_step("KVM_SET_REGS"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::low_mem::TSS_GPA;

    #[test]
    fn boot_segments_are_flat_ring0_long_mode() {
        let sregs = boot_sregs(kvm_sregs::default());
        assert_eq!(sregs.cs.selector, 0x10);
        assert_eq!(
            (sregs.cs.l, sregs.cs.db, sregs.cs.dpl, sregs.cs.type_),
            (1, 0, 0, 0xb)
        );
        assert_eq!(sregs.cs.limit, 0xffff_ffff);
        assert_eq!(sregs.ds.selector, 0x18);
        assert_eq!(
            (sregs.ss.db, sregs.ss.type_, sregs.ss.present, sregs.ss.s),
            (1, 0x3, 1, 1)
        );
        assert_eq!(
            (sregs.tr.base, sregs.tr.limit, sregs.tr.type_, sregs.tr.s),
            (TSS_GPA, 103, 0xb, 0)
        );
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_ne!(sregs.cr0 & CR0_PG, 0);
        assert_eq!(sregs.cr3, PML4_GPA);
    }

    #[test]
    fn boot_registers_point_at_entry_and_zero_page() {
        let regs = boot_regs(EntryPoint {
            entry_gpa: 0x100_0000,
            zero_page_gpa: 0x7000,
        });
        assert_eq!(regs.rip, 0x100_0000);
        assert_eq!(regs.rsi, 0x7000);
        assert_eq!(regs.rflags & (1 << 9), 0, "interrupts off");
    }
}
