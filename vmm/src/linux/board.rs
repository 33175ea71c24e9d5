//! The interrupt controllers of a Linux guest's board, as both firmware
//! tables describe them (the ACPI MADT, `acpi/madt.rs`, and the MP table,
//! `mptable.rs`): KVM's in-kernel LAPICs and IOAPIC, where they decode
//! their registers and how they are numbered; and the checksum both kinds
//! of table carry. One place, so that the two descriptions cannot drift
//! apart.

/// Where the kernel's LAPIC registers are (the architectural default).
pub const LAPIC_GPA: u32 = 0xfee0_0000;
/// Where KVM's in-kernel IOAPIC decodes its registers.
pub const IOAPIC_GPA: u32 = 0xfec0_0000;
/// Input pins of KVM's in-kernel IOAPIC (`KVM_IOAPIC_NUM_PINS`).
pub const IOAPIC_PINS: u32 = 24;
/// The most vCPUs the tables describe: APIC IDs are 8 bits, 0xff is the
/// broadcast ID, and the IOAPIC takes the ID after the last vCPU.
pub const MAX_VCPUS: u32 = 254;

/// The IOAPIC's ID on a board of `vcpus` vCPUs (1..=[`MAX_VCPUS`]): the
/// one after the last vCPU's, vCPU `i` having APIC ID `i`.
pub fn ioapic_id(vcpus: u32) -> u8 {
    debug_assert!((1..=MAX_VCPUS).contains(&vcpus));
    vcpus as u8
}

/// The byte that makes `bytes` sum to zero when stored in a field that
/// was zero while summing: the checksum of ACPI tables and of the MP
/// table alike.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, b| sum.wrapping_add(*b))
        .wrapping_neg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_makes_the_bytes_sum_to_zero() {
        let mut bytes = vec![0x12, 0xff, 0x80, 0];
        bytes[3] = checksum(&bytes);
        assert_eq!(bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        assert_eq!(checksum(&[]), 0);
    }

    #[test]
    fn the_ioapic_takes_the_id_after_the_last_vcpu() {
        assert_eq!(ioapic_id(1), 1);
        assert_eq!(ioapic_id(MAX_VCPUS), 254);
    }
}
