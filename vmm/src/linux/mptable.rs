//! The Intel MultiProcessor table (MP specification 1.4): how a kernel
//! without ACPI finds the application processors, the IOAPIC and the
//! interrupt routing.
//!
//! Kernels read it when they find no ACPI MADT (booted with `acpi=off`, or
//! built without ACPI; they also need CONFIG_X86_MPPARSE, else they run on
//! the boot CPU only); others take the same facts from the MADT
//! (`acpi/madt.rs`).
//! The table describes KVM's in-kernel irqchip: one LAPIC per vCPU with the
//! vCPU index as its APIC ID, the IOAPIC at its default address, and ISA
//! IRQ `n` wired to IOAPIC pin `n`, which is KVM's default GSI routing.
//!
//! Layout in guest memory: the floating pointer structure at
//! [`MP_TABLE_GPA`], the configuration table right after it; both inside the
//! last KiB of base memory, which the e820 map reserves and where the kernel
//! scans for the floating pointer.

use super::board::{checksum, ioapic_id, IOAPIC_GPA, IOAPIC_PINS, LAPIC_GPA, MAX_VCPUS};
use super::low_mem::{MP_TABLE_GPA, MP_TABLE_MAX_BYTES};

/// ISA interrupt lines, all routed to the IOAPIC pin of the same number.
const ISA_IRQS: u32 = 16;
/// The LAPIC version register KVM's in-kernel LAPIC reports (an integrated
/// xAPIC); the kernel checks IOAPIC IDs only for older, discrete APICs.
const LAPIC_VERSION: u8 = 0x14;
/// The version register of KVM's in-kernel IOAPIC.
const IOAPIC_VERSION: u8 = 0x11;
/// MP specification revision 1.4.
const SPEC_REV: u8 = 4;
/// CPU signature of the processor entries (family 6); the kernel only
/// prints it.
const CPU_SIGNATURE: u32 = 0x600;
/// CPUID.1:EDX feature bits claimed in the processor entries: FPU and APIC.
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

/// The single bus: ISA, id 0.
const ISA_BUS_ID: u8 = 0;

/// Entry types, which are also their required order in the table.
const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;

/// Interrupt types of the interrupt entries.
const INT_VECTORED: u8 = 0;
const INT_NMI: u8 = 1;
const INT_EXTINT: u8 = 3;

/// Interrupt entry flags: polarity and trigger "conform to the bus" (ISA:
/// active high, edge) ...
const FLAGS_CONFORMING: u16 = 0;
/// ... or stated explicitly: active high (bits 0-1 = 01), edge (bits 2-3 =
/// 01), which is what virtio-mmio's irqfd lines deliver.
const FLAGS_EDGE_HIGH: u16 = 0b0101;

/// Processor entry flags.
const CPU_ENABLED: u8 = 1 << 0;
const CPU_BOOTSTRAP: u8 = 1 << 1;
/// IOAPIC entry flag.
const IOAPIC_ENABLED: u8 = 1 << 0;

/// Destination "all local APICs" in a local interrupt entry.
const ALL_LAPICS: u8 = 0xff;

/// Sizes fixed by the specification.
pub const FLOATING_POINTER_BYTES: usize = 16;
const HEADER_BYTES: usize = 44;
#[cfg(test)]
const PROCESSOR_ENTRY_BYTES: usize = 20;
#[cfg(test)]
const SMALL_ENTRY_BYTES: usize = 8;

/// Offsets of the checksummed fields.
const FPS_CHECKSUM: usize = 10;
const HEADER_LENGTH: usize = 4;
const HEADER_CHECKSUM: usize = 7;
const HEADER_ENTRY_COUNT: usize = 34;

/// Why the MP table cannot describe this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpTableError {
    /// No vCPUs, or more than 8-bit APIC IDs (minus the IOAPIC's) allow.
    #[error("the MP table describes 1 to 254 vCPUs, not {vcpus}")]
    VcpuCount {
        /// How many were asked for.
        vcpus: u32,
    },
    /// A device interrupt beyond the IOAPIC's pins.
    #[error("interrupt {irq} is beyond the IOAPIC's {IOAPIC_PINS} pins; use fewer devices")]
    IrqOutOfRange {
        /// The interrupt line.
        irq: u32,
    },
    /// The table does not fit its place in low memory.
    #[error("the MP table for {vcpus} vCPUs is {len_bytes} bytes, more than the {MP_TABLE_MAX_BYTES} bytes reserved for it; use fewer vCPUs")]
    TooLarge {
        /// vCPUs described.
        vcpus: u32,
        /// The table's size.
        len_bytes: usize,
    },
}

/// An interrupt entry (I/O or local): both have the same layout.
fn interrupt_entry(
    kind: u8,
    int_type: u8,
    flags: u16,
    bus_irq: u8,
    dest_id: u8,
    dest_pin: u8,
) -> [u8; 8] {
    let f = flags.to_le_bytes();
    [
        kind, int_type, f[0], f[1], ISA_BUS_ID, bus_irq, dest_id, dest_pin,
    ]
}

/// Builds the floating pointer structure and the configuration table for
/// `vcpus` vCPUs (APIC IDs 0.., vCPU 0 the bootstrap processor) and the
/// virtio devices' interrupt lines, as one image to write at
/// [`MP_TABLE_GPA`].
pub fn build(vcpus: u32, virtio_irqs: &[u32]) -> Result<Vec<u8>, MpTableError> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(MpTableError::VcpuCount { vcpus });
    }
    if let Some(&irq) = virtio_irqs.iter().find(|irq| **irq >= IOAPIC_PINS) {
        return Err(MpTableError::IrqOutOfRange { irq });
    }
    let ioapic_id = ioapic_id(vcpus);

    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for apic_id in 0..vcpus {
        let flags = if apic_id == 0 {
            CPU_ENABLED | CPU_BOOTSTRAP
        } else {
            CPU_ENABLED
        };
        entries.extend_from_slice(&[ENTRY_PROCESSOR, apic_id as u8, LAPIC_VERSION, flags]);
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[ENTRY_BUS, ISA_BUS_ID]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, IOAPIC_ENABLED]);
    entries.extend_from_slice(&IOAPIC_GPA.to_le_bytes());
    count += 1;
    // One entry per line, in pin order: the ISA lines with the bus's
    // defaults, the virtio lines (some of which are ISA line numbers too)
    // stated as edge/high so the kernel does not guess.
    for irq in 0..IOAPIC_PINS {
        let virtio = virtio_irqs.contains(&irq);
        if irq >= ISA_IRQS && !virtio {
            continue;
        }
        let flags = if virtio {
            FLAGS_EDGE_HIGH
        } else {
            FLAGS_CONFORMING
        };
        entries.extend_from_slice(&interrupt_entry(
            ENTRY_IO_INTERRUPT,
            INT_VECTORED,
            flags,
            irq as u8,
            ioapic_id,
            irq as u8,
        ));
        count += 1;
    }
    // Virtual wire mode, as `lapic.rs` programs the LAPICs: the 8259's
    // output on the boot CPU's LINT0, NMI on every CPU's LINT1.
    entries.extend_from_slice(&interrupt_entry(
        ENTRY_LOCAL_INTERRUPT,
        INT_EXTINT,
        FLAGS_CONFORMING,
        0,
        0,
        0,
    ));
    entries.extend_from_slice(&interrupt_entry(
        ENTRY_LOCAL_INTERRUPT,
        INT_NMI,
        FLAGS_CONFORMING,
        0,
        ALL_LAPICS,
        1,
    ));
    count += 2;

    let table_bytes = HEADER_BYTES + entries.len();
    let len_bytes = FLOATING_POINTER_BYTES + table_bytes;
    if len_bytes as u64 > MP_TABLE_MAX_BYTES {
        return Err(MpTableError::TooLarge { vcpus, len_bytes });
    }
    let table_gpa = MP_TABLE_GPA + FLOATING_POINTER_BYTES as u64;

    let mut image = vec![0u8; len_bytes];
    let fps = &mut image[..FLOATING_POINTER_BYTES];
    fps[0..4].copy_from_slice(b"_MP_");
    fps[4..8].copy_from_slice(&(table_gpa as u32).to_le_bytes());
    fps[8] = 1; // length in 16-byte paragraphs
    fps[9] = SPEC_REV;
    // Feature bytes 11..16 stay zero: "a configuration table is present"
    // (no default configuration), no IMCR (virtual wire, not PIC mode).
    fps[FPS_CHECKSUM] = checksum(fps);

    let table = &mut image[FLOATING_POINTER_BYTES..];
    table[0..4].copy_from_slice(b"PCMP");
    table[HEADER_LENGTH..HEADER_LENGTH + 2].copy_from_slice(&(table_bytes as u16).to_le_bytes());
    table[6] = SPEC_REV;
    table[8..16].copy_from_slice(b"HUGEVMM ");
    table[16..28].copy_from_slice(b"KVM VM      ");
    table[HEADER_ENTRY_COUNT..HEADER_ENTRY_COUNT + 2].copy_from_slice(&count.to_le_bytes());
    table[36..40].copy_from_slice(&LAPIC_GPA.to_le_bytes());
    // The extended table (length, checksum at 40..43) is empty.
    table[HEADER_BYTES..].copy_from_slice(&entries);
    table[HEADER_CHECKSUM] = checksum(table);
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::le;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    /// The configuration table's entries, as (type, bytes).
    fn entries(table: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = HEADER_BYTES;
        while at < table.len() {
            let len = if table[at] == ENTRY_PROCESSOR {
                PROCESSOR_ENTRY_BYTES
            } else {
                SMALL_ENTRY_BYTES
            };
            out.push((table[at], table[at..at + len].to_vec()));
            at += len;
        }
        assert_eq!(at, table.len(), "entries end exactly at the table's end");
        out
    }

    #[test]
    fn checksums_make_both_structures_sum_to_zero() {
        for vcpus in [1, 2, 7, 32] {
            let image = build(vcpus, &[5, 6, 17]).unwrap();
            assert_eq!(sum(&image[..FLOATING_POINTER_BYTES]), 0);
            let table = &image[FLOATING_POINTER_BYTES..];
            assert_eq!(le::u16_at(table, HEADER_LENGTH), Some(table.len() as u16));
            assert_eq!(sum(table), 0, "{vcpus} vCPUs");
        }
    }

    #[test]
    fn floating_pointer_points_at_the_table_right_after_it() {
        let image = build(2, &[]).unwrap();
        assert_eq!(&image[0..4], b"_MP_");
        assert_eq!(le::u32_at(&image, 4), Some((MP_TABLE_GPA + 16) as u32));
        assert_eq!((image[8], image[9]), (1, 4));
        assert_eq!(&image[11..16], &[0; 5], "no default configuration");
        assert_eq!(&image[16..20], b"PCMP");
        assert_eq!(le::u32_at(&image, 16 + 36), Some(LAPIC_GPA));
    }

    #[test]
    fn entries_describe_cpus_bus_ioapic_and_routing_in_type_order() {
        let image = build(3, &[5, 6, 20]).unwrap();
        let table = &image[FLOATING_POINTER_BYTES..];
        let entries = entries(table);
        assert_eq!(
            le::u16_at(table, HEADER_ENTRY_COUNT),
            Some(entries.len() as u16)
        );
        let types: Vec<u8> = entries.iter().map(|e| e.0).collect();
        assert!(
            types.windows(2).all(|w| w[0] <= w[1]),
            "sorted by type: {types:?}"
        );

        let cpus: Vec<&Vec<u8>> = entries
            .iter()
            .filter(|e| e.0 == ENTRY_PROCESSOR)
            .map(|e| &e.1)
            .collect();
        assert_eq!(cpus.len(), 3);
        for (id, cpu) in cpus.iter().enumerate() {
            assert_eq!(cpu[1], id as u8, "APIC ID = vCPU index");
            let flags = if id == 0 {
                CPU_ENABLED | CPU_BOOTSTRAP
            } else {
                CPU_ENABLED
            };
            assert_eq!(cpu[3], flags);
        }
        let bus = &entries.iter().find(|e| e.0 == ENTRY_BUS).unwrap().1;
        assert_eq!(&bus[2..8], b"ISA   ");
        let ioapic = &entries.iter().find(|e| e.0 == ENTRY_IOAPIC).unwrap().1;
        assert_eq!(
            (ioapic[1], ioapic[3]),
            (3, IOAPIC_ENABLED),
            "IOAPIC id after the last vCPU"
        );
        assert_eq!(le::u32_at(ioapic, 4), Some(0xfec0_0000));

        let io: Vec<&Vec<u8>> = entries
            .iter()
            .filter(|e| e.0 == ENTRY_IO_INTERRUPT)
            .map(|e| &e.1)
            .collect();
        let pins: Vec<u8> = io.iter().map(|e| e[7]).collect();
        let mut want: Vec<u8> = (0..16).collect();
        want.push(20);
        assert_eq!(
            pins, want,
            "ISA lines 0-15 and the virtio line 20, each once"
        );
        for e in &io {
            assert_eq!(
                (e[1], e[4], e[5], e[6]),
                (INT_VECTORED, ISA_BUS_ID, e[7], 3),
                "line n to pin n"
            );
            let flags = le::u16_at(e, 2).unwrap();
            let virtio = [5, 6, 20].contains(&e[7]);
            assert_eq!(
                flags,
                if virtio {
                    FLAGS_EDGE_HIGH
                } else {
                    FLAGS_CONFORMING
                }
            );
        }
        let local: Vec<&Vec<u8>> = entries
            .iter()
            .filter(|e| e.0 == ENTRY_LOCAL_INTERRUPT)
            .map(|e| &e.1)
            .collect();
        assert_eq!(local.len(), 2);
        assert_eq!(
            (local[0][1], local[0][6], local[0][7]),
            (INT_EXTINT, 0, 0),
            "ExtINT to the BSP's LINT0"
        );
        assert_eq!(
            (local[1][1], local[1][6], local[1][7]),
            (INT_NMI, 0xff, 1),
            "NMI to every LINT1"
        );
    }

    #[test]
    fn the_largest_machine_fits_its_reserved_kib() {
        let all_pins: Vec<u32> = (0..IOAPIC_PINS).collect();
        let image = build(crate::payload::layout::MAX_VCPUS, &all_pins).unwrap();
        assert!(image.len() as u64 <= MP_TABLE_MAX_BYTES);
    }

    #[test]
    fn refuses_what_it_cannot_describe() {
        assert_eq!(build(0, &[]), Err(MpTableError::VcpuCount { vcpus: 0 }));
        assert_eq!(build(255, &[]), Err(MpTableError::VcpuCount { vcpus: 255 }));
        assert_eq!(
            build(1, &[5, 24]),
            Err(MpTableError::IrqOutOfRange { irq: 24 })
        );
        assert!(matches!(
            build(200, &[]),
            Err(MpTableError::TooLarge { vcpus: 200, .. })
        ));
    }
}
