//! The MADT ("APIC" table): the interrupt controllers KVM's in-kernel
//! irqchip provides, as the MP table describes them for kernels without
//! ACPI (`mptable.rs`): one LAPIC per vCPU with APIC ID = vCPU index, the
//! IOAPIC after them with GSIs 0-23, ISA IRQ `n` on GSI `n` (KVM's default
//! routing, also ACPI's default, so no source overrides), and NMI on every
//! LAPIC's LINT1.

use super::sdt::Table;
use crate::linux::board::{ioapic_id, IOAPIC_GPA, LAPIC_GPA, MAX_VCPUS};

/// MADT revision 5 (ACPI 6.2 and later).
const REVISION: u8 = 5;
/// Flags: PCAT_COMPAT, the machine also has the dual 8259s (KVM's PIC),
/// which the kernel then masks.
const PCAT_COMPAT: u32 = 1;

const TYPE_LOCAL_APIC: u8 = 0;
const TYPE_IO_APIC: u8 = 1;
const TYPE_LOCAL_APIC_NMI: u8 = 4;
const LOCAL_APIC_ENABLED: u32 = 1;
/// Processor UID meaning "all processors" in an NMI entry.
const ALL_PROCESSORS: u8 = 0xff;
/// MPS INTI flags: polarity and trigger as the bus defines them.
const INTI_CONFORMING: u16 = 0;
/// LINT1, where the LAPICs take NMI (see `lapic.rs`).
const NMI_LINT: u8 = 1;

/// The MADT for `vcpus` vCPUs (1..=[`MAX_VCPUS`], checked by the caller).
pub fn build(vcpus: u32) -> Vec<u8> {
    assert!((1..=MAX_VCPUS).contains(&vcpus));
    let mut table = Table::new(b"APIC", REVISION);
    table.extend(&LAPIC_GPA.to_le_bytes());
    table.extend(&PCAT_COMPAT.to_le_bytes());
    for index in 0..vcpus {
        // The processor UID matches the APIC ID; the DSDT declares no
        // processor objects, so the kernel takes the UIDs from here.
        table.extend(&[TYPE_LOCAL_APIC, 8, index as u8, index as u8]);
        table.extend(&LOCAL_APIC_ENABLED.to_le_bytes());
    }
    table.extend(&[TYPE_IO_APIC, 12, ioapic_id(vcpus), 0]);
    table.extend(&IOAPIC_GPA.to_le_bytes());
    // The first GSI the IOAPIC serves.
    table.extend(&0u32.to_le_bytes());
    table.extend(&[TYPE_LOCAL_APIC_NMI, 6, ALL_PROCESSORS]);
    table.extend(&INTI_CONFORMING.to_le_bytes());
    table.extend(&[NMI_LINT]);
    table.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::acpi::sdt::HEADER_BYTES;

    /// (type, bytes) of each entry after the MADT's fixed fields.
    fn entries(madt: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut at = HEADER_BYTES + 8;
        let mut out = Vec::new();
        while at < madt.len() {
            let len = madt[at + 1] as usize;
            assert!(len >= 2 && at + len <= madt.len(), "bad entry at {at}");
            out.push((madt[at], madt[at..at + len].to_vec()));
            at += len;
        }
        out
    }

    #[test]
    fn one_enabled_lapic_per_vcpu_then_the_ioapic_and_nmi() {
        let madt = build(3);
        assert_eq!(&madt[..4], b"APIC");
        assert_eq!(madt.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        assert_eq!(
            u32::from_le_bytes(madt[36..40].try_into().unwrap()),
            0xfee0_0000
        );
        let entries = entries(&madt);
        assert_eq!(entries.len(), 5);
        for (i, (kind, bytes)) in entries[..3].iter().enumerate() {
            assert_eq!(*kind, TYPE_LOCAL_APIC);
            assert_eq!(bytes[2..4], [i as u8, i as u8]);
            assert_eq!(bytes[4] & 1, 1, "enabled");
        }
        let (kind, ioapic) = &entries[3];
        assert_eq!(*kind, TYPE_IO_APIC);
        assert_eq!(ioapic[2], 3, "IOAPIC ID after the vCPUs'");
        assert_eq!(
            u32::from_le_bytes(ioapic[4..8].try_into().unwrap()),
            0xfec0_0000
        );
        assert_eq!(entries[4].1, [TYPE_LOCAL_APIC_NMI, 6, 0xff, 0, 0, 1]);
    }

    #[test]
    fn the_largest_machine_fits_in_8_bit_ids() {
        let madt = build(MAX_VCPUS);
        let entries = entries(&madt);
        assert_eq!(entries[MAX_VCPUS as usize].1[2], 254);
    }
}
