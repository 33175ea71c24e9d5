//! The model-specific registers a kernel expects a boot loader (or the
//! firmware before it) to have set.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

/// IA32_MISC_ENABLE bit 0: fast string operations, which firmware enables
/// and the kernel's `rep movs` paths assume.
const MISC_ENABLE_FAST_STRING: u64 = 1 << 0;
/// MTRRs enabled (bit 11) with write-back as the default type (6): without
/// it the kernel would treat all RAM as uncached.
const MTRR_DEF_TYPE_ENABLED_WB: u64 = (1 << 11) | 6;

/// Why the MSRs could not be set.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// The fam wrapper could not hold the list.
    #[error("cannot build the MSR list: {0}")]
    Build(vmm_sys_util::fam::Error),
    /// KVM_SET_MSRS failed.
    #[error("KVM_SET_MSRS failed: {0}")]
    Kvm(kvm_ioctls::Error),
    /// KVM stopped at an MSR it does not accept.
    #[error("KVM refused MSR {index:#x} ({name}) = {value:#x}; this host's KVM lacks an MSR a Linux guest needs")]
    Refused {
        /// The MSR.
        index: u32,
        /// Its name.
        name: &'static str,
        /// The value offered.
        value: u64,
    },
}

/// The MSRs and values of a vCPU at kernel entry.
pub fn boot_msrs() -> Vec<(u32, &'static str, u64)> {
    vec![
        (MSR_IA32_TSC, "IA32_TSC", 0),
        (
            MSR_IA32_MISC_ENABLE,
            "IA32_MISC_ENABLE",
            MISC_ENABLE_FAST_STRING,
        ),
        (MSR_IA32_SYSENTER_CS, "IA32_SYSENTER_CS", 0),
        (MSR_IA32_SYSENTER_ESP, "IA32_SYSENTER_ESP", 0),
        (MSR_IA32_SYSENTER_EIP, "IA32_SYSENTER_EIP", 0),
        (MSR_STAR, "STAR", 0),
        (MSR_LSTAR, "LSTAR", 0),
        (MSR_CSTAR, "CSTAR", 0),
        (MSR_SYSCALL_MASK, "SFMASK", 0),
        (MSR_KERNEL_GS_BASE, "KERNEL_GS_BASE", 0),
        (MSR_MTRR_DEF_TYPE, "MTRRdefType", MTRR_DEF_TYPE_ENABLED_WB),
    ]
}

/// Sets [`boot_msrs`] on a vCPU.
pub fn set_boot_msrs(vcpu: &VcpuFd) -> Result<(), MsrError> {
    let wanted = boot_msrs();
    let entries: Vec<kvm_msr_entry> = wanted
        .iter()
        .map(|&(index, _, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&entries).map_err(MsrError::Build)?;
    let set = vcpu.set_msrs(&msrs).map_err(MsrError::Kvm)?;
    // KVM_SET_MSRS stops at the first MSR it refuses and returns how many
    // it set before it.
    if let Some(&(index, name, value)) = wanted.get(set) {
        return Err(MsrError::Refused { index, name, value });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtrr_default_is_enabled_write_back() {
        let msrs = boot_msrs();
        let mtrr = msrs.iter().find(|m| m.0 == 0x2ff).unwrap();
        assert_eq!(mtrr.2, 0x806);
        let misc = msrs.iter().find(|m| m.0 == 0x1a0).unwrap();
        assert_eq!(misc.2 & 1, 1);
    }
}
