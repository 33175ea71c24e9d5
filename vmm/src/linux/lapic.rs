//! The local APIC's LINT pins as PC firmware leaves them: LINT0 takes the
//! 8259 PIC's interrupts (ExtINT), LINT1 is the NMI line. The kernel's
//! early interrupt setup (the PIC timer check, "through 8259A") relies on
//! this virtual wire mode.

use kvm_bindings::kvm_lapic_state;
use kvm_ioctls::VcpuFd;

const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const DELIVERY_MODE_MASK: u32 = 0x700;
const DELIVERY_MODE_NMI: u32 = 0x4 << 8;
const DELIVERY_MODE_EXTINT: u32 = 0x7 << 8;

fn read_register(state: &kvm_lapic_state, offset: usize) -> u32 {
    let bytes: [u8; 4] = std::array::from_fn(|i| state.regs[offset + i] as u8);
    u32::from_le_bytes(bytes)
}

fn write_register(state: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().into_iter().enumerate() {
        state.regs[offset + i] = byte as _;
    }
}

/// Sets LINT0 to ExtINT and LINT1 to NMI in a LAPIC state.
pub fn set_virtual_wire(state: &mut kvm_lapic_state) {
    let lint0 = read_register(state, APIC_LVT_LINT0);
    write_register(
        state,
        APIC_LVT_LINT0,
        (lint0 & !DELIVERY_MODE_MASK) | DELIVERY_MODE_EXTINT,
    );
    let lint1 = read_register(state, APIC_LVT_LINT1);
    write_register(
        state,
        APIC_LVT_LINT1,
        (lint1 & !DELIVERY_MODE_MASK) | DELIVERY_MODE_NMI,
    );
}

/// Applies [`set_virtual_wire`] to a vCPU's in-kernel LAPIC (which exists
/// only once the VM has an in-kernel irqchip).
pub fn configure(vcpu: &VcpuFd) -> Result<(), kvm_ioctls::Error> {
    let mut state = vcpu.get_lapic()?;
    set_virtual_wire(&mut state);
    vcpu.set_lapic(&state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lint_pins_get_their_delivery_modes() {
        let mut state = kvm_lapic_state::default();
        write_register(&mut state, APIC_LVT_LINT0, 0x1_0000);
        write_register(&mut state, APIC_LVT_LINT1, 0x1_0200);
        set_virtual_wire(&mut state);
        assert_eq!(read_register(&state, APIC_LVT_LINT0), 0x1_0700);
        assert_eq!(read_register(&state, APIC_LVT_LINT1), 0x1_0400);
    }
}
