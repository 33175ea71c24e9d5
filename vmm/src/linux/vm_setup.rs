//! The VM-wide state a Linux guest needs before any vCPU exists: the
//! in-kernel interrupt controllers and timer, and the pages VMX hosts
//! reserve for real-mode emulation.

use kvm_bindings::{kvm_pit_config, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Cap, VmFd};

/// Three pages for KVM's real-mode TSS on VMX hosts, at the top of the
/// 3–4 GiB device gap where no RAM is and devices are not placed.
pub const KVM_TSS_GPA: u64 = 0xfffb_d000;
/// One page for KVM's real-mode identity page table on VMX hosts, just
/// below the TSS pages.
pub const KVM_IDENTITY_MAP_GPA: u64 = 0xfffb_c000;

/// A VM-wide setup step failed.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {error}; this host's KVM cannot run a Linux guest")]
pub struct VmSetupError {
    /// Which ioctl.
    pub step: &'static str,
    /// The KVM error.
    pub error: kvm_ioctls::Error,
}

/// Creates the irqchip (PIC, IOAPIC and a LAPIC per later vCPU) and the
/// PIT. Must run before the first vCPU is created: KVM gives a vCPU an
/// in-kernel LAPIC only if the irqchip already exists.
pub fn prepare_vm(vm: &VmFd) -> Result<(), VmSetupError> {
    let step = |step| move |error| VmSetupError { step, error };
    if vm.check_extension(Cap::SetIdentityMapAddr) {
        vm.set_identity_map_address(KVM_IDENTITY_MAP_GPA)
            .map_err(step("KVM_SET_IDENTITY_MAP_ADDR"))?;
    }
    // Only VMX needs it, and other hosts may refuse it: the guest starts
    // in long mode, so it is never used there.
    let _ = vm.set_tss_address(KVM_TSS_GPA as usize);
    vm.create_irq_chip().map_err(step("KVM_CREATE_IRQCHIP"))?;
    // The dummy speaker port keeps port 0x61 in the kernel, which Linux's
    // PIT calibration reads in a tight loop.
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(step("KVM_CREATE_PIT2"))?;
    Ok(())
}
