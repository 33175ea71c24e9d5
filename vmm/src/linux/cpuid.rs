//! The CPUID a Linux guest sees: KVM's supported set, marked as running on
//! KVM, with each vCPU's own APIC ID.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

/// Leaf 1 ECX bit 31: running under a hypervisor. The kernel looks for
/// hypervisor leaves (and enables paravirt features) only when it is set.
const HYPERVISOR_BIT: u32 = 1 << 31;
/// The hypervisor signature leaf.
pub const KVM_SIGNATURE_LEAF: u32 = 0x4000_0000;
/// The KVM features leaf (the highest hypervisor leaf KVM defines).
const KVM_FEATURES_LEAF: u32 = 0x4000_0001;
/// "KVMKVMKVM\0\0\0" as EBX, ECX, EDX.
pub const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

/// The CPUID could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    /// No room to add the hypervisor leaf.
    #[error("cannot add the KVM signature leaf to the CPUID table: {0}")]
    Full(vmm_sys_util::fam::Error),
}

/// CPUID for the vCPU whose APIC ID is `apic_id`.
pub fn vcpu_cpuid(supported: &CpuId, apic_id: u32) -> Result<CpuId, CpuidError> {
    let mut cpuid = supported.clone();
    let mut has_signature = false;
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                // EBX[31:24]: the initial APIC ID, which the kernel compares
                // with the LAPIC's; KVM's LAPIC ID is the vCPU id.
                entry.ebx = (entry.ebx & 0x00ff_ffff) | (apic_id << 24);
                entry.ecx |= HYPERVISOR_BIT;
            }
            // The x2APIC ID of the topology leaves.
            0xb | 0x1f => entry.edx = apic_id,
            KVM_SIGNATURE_LEAF => {
                has_signature = true;
                entry.eax = entry.eax.max(KVM_FEATURES_LEAF);
                [entry.ebx, entry.ecx, entry.edx] = KVM_SIGNATURE;
            }
            _ => {}
        }
    }
    if !has_signature {
        cpuid
            .push(kvm_cpuid_entry2 {
                function: KVM_SIGNATURE_LEAF,
                eax: KVM_FEATURES_LEAF,
                ebx: KVM_SIGNATURE[0],
                ecx: KVM_SIGNATURE[1],
                edx: KVM_SIGNATURE[2],
                ..Default::default()
            })
            .map_err(CpuidError::Full)?;
    }
    Ok(cpuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, ebx: u32, ecx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            ebx,
            ecx,
            ..Default::default()
        }
    }

    fn find(cpuid: &CpuId, function: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function)
            .unwrap()
    }

    #[test]
    fn signature_spells_kvm() {
        let bytes: Vec<u8> = KVM_SIGNATURE.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bytes, b"KVMKVMKVM\0\0\0");
    }

    #[test]
    fn sets_apic_id_hypervisor_bit_and_signature() {
        let supported =
            CpuId::from_entries(&[entry(0, 0, 0), entry(1, 0x0012_3456, 0x1), entry(0xb, 0, 0)])
                .unwrap();
        let cpuid = vcpu_cpuid(&supported, 3).unwrap();
        let leaf1 = find(&cpuid, 1);
        assert_eq!(leaf1.ebx, 0x0312_3456);
        assert_eq!(leaf1.ecx, 0x8000_0001);
        assert_eq!(find(&cpuid, 0xb).edx, 3);
        let signature = find(&cpuid, KVM_SIGNATURE_LEAF);
        assert_eq!([signature.ebx, signature.ecx, signature.edx], KVM_SIGNATURE);
        assert_eq!(signature.eax, KVM_FEATURES_LEAF);
    }

    #[test]
    fn overwrites_an_existing_signature_leaf() {
        let supported = CpuId::from_entries(&[entry(KVM_SIGNATURE_LEAF, 1, 2)]).unwrap();
        let cpuid = vcpu_cpuid(&supported, 0).unwrap();
        assert_eq!(cpuid.as_slice().len(), 1);
        assert_eq!(find(&cpuid, KVM_SIGNATURE_LEAF).ebx, KVM_SIGNATURE[0]);
    }
}
