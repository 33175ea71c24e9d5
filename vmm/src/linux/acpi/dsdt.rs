//! The DSDT: the devices a kernel cannot discover by probing. Each
//! virtio-mmio window is a `LNRO0005` device (the ID Linux's virtio_mmio
//! driver matches) with its register window and edge-triggered interrupt,
//! so a stock kernel finds the disks and the balloon without
//! `virtio_mmio.device=` (which needs CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES).
//! `\_S5` gives the sleep type the FADT's sleep control register takes
//! for power-off.
//!
//! The console UART is listed too (`PNP0501`, COM1): in a hardware-reduced
//! machine Linux sets up no legacy PIC and so no ISA interrupts of its own;
//! IRQ 4 exists for the 8250 driver only if a device claims it. Without
//! this entry the kernel still prints through the port (polled), but
//! opening `/dev/console` fails to get the interrupt and every write from
//! user space returns EIO.

use super::aml::{self, AmlError, Resource};
use super::sdt::Table;
use crate::linux::machine::VirtioMmioDevice;
use devices::sleep_control::S5_SLEEP_TYPE;

/// The console UART the DSDT describes: where `machine_devices.rs` puts it.
const COM1_PORT: u16 = 0x3f8;
const COM1_PORTS: u8 = 8;
const COM1_IRQ: u8 = 4;

/// Revision 2: integers are 64 bits.
const REVISION: u8 = 2;
/// The ACPI ID of a virtio-mmio device.
const VIRTIO_MMIO_HID: &str = "LNRO0005";

/// The DSDT for these virtio-mmio devices.
pub fn build(virtio: &[VirtioMmioDevice]) -> Result<Vec<u8>, AmlError> {
    let com1 = [
        aml::name("_HID", &aml::eisa_id("PNP0501"))?,
        aml::name("_UID", &aml::integer(0))?,
        aml::name(
            "_CRS",
            &aml::resource_template(&[
                Resource::IoPorts {
                    port: COM1_PORT,
                    count: COM1_PORTS,
                },
                Resource::IsaIrq { irq: COM1_IRQ },
            ]),
        )?,
    ]
    .concat();
    let mut devices = aml::device("COM1", &com1)?;
    for (index, dev) in virtio.iter().enumerate() {
        let base = u32::try_from(dev.base_gpa).expect("virtio-mmio windows are below 4 GiB");
        let len_bytes = u32::try_from(dev.size_bytes).expect("virtio-mmio windows are small");
        let resources = aml::resource_template(&[
            Resource::Memory32Fixed { base, len_bytes },
            Resource::EdgeInterrupt { gsi: dev.irq },
        ]);
        let body = [
            aml::name("_HID", &aml::string(VIRTIO_MMIO_HID))?,
            aml::name("_UID", &aml::integer(index as u64))?,
            aml::name("_CRS", &resources)?,
        ]
        .concat();
        devices.extend(aml::device(&format!("V{index:03X}"), &body)?);
    }
    let s5 = aml::package(&[
        aml::integer(S5_SLEEP_TYPE.into()),
        aml::integer(0),
        aml::integer(0),
        aml::integer(0),
    ]);
    let mut table = Table::new(b"DSDT", REVISION);
    table.extend(&aml::scope("\\_SB", &devices)?);
    table.extend(&aml::name("\\_S5", &s5)?);
    Ok(table.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn every_window_is_a_device_with_its_resources() {
        let windows = [
            VirtioMmioDevice {
                base_gpa: 0xd000_0000,
                size_bytes: 0x1000,
                irq: 5,
            },
            VirtioMmioDevice {
                base_gpa: 0xd000_1000,
                size_bytes: 0x1000,
                irq: 6,
            },
        ];
        let dsdt = build(&windows).unwrap();
        assert_eq!(&dsdt[..4], b"DSDT");
        assert_eq!(dsdt.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        assert!(contains(&dsdt, b"V000"));
        assert!(contains(&dsdt, b"V001"));
        assert_eq!(dsdt.windows(9).filter(|w| *w == b"LNRO0005\0").count(), 2);
        // The second window's Memory32Fixed and interrupt descriptors.
        assert!(contains(
            &dsdt,
            &[0x86, 9, 0, 1, 0x00, 0x10, 0x00, 0xd0, 0x00, 0x10, 0, 0]
        ));
        assert!(contains(&dsdt, &[0x89, 6, 0, 0x03, 1, 6, 0, 0, 0]));
        // Name(\_S5, Package(4) { 5, 0, 0, 0 }).
        assert!(contains(
            &dsdt,
            &[0x08, b'\\', b'_', b'S', b'5', b'_', 0x12, 7, 4, 0x0a, 5, 0, 0, 0]
        ));
    }

    #[test]
    fn no_devices_still_makes_a_valid_table_with_the_console() {
        let dsdt = build(&[]).unwrap();
        assert_eq!(dsdt.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        assert!(contains(&dsdt, b"_S5_"));
        assert!(contains(&dsdt, b"COM1"));
        // PNP0501 and IRQNoFlags() {4}.
        assert!(contains(&dsdt, &[0x0c, 0x41, 0xd0, 0x05, 0x01]));
        assert!(contains(&dsdt, &[0x22, 0x10, 0x00]));
    }
}
