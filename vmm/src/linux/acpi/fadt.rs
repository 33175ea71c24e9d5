//! The FADT ("FACP"): a hardware-reduced ACPI machine (no PM timer, no
//! SCI, no fixed-feature registers to emulate), the DSDT's address, the
//! reset register, and the sleep registers the guest powers off through.
//!
//! Hardware-reduced mode also tells Linux to leave the legacy PIC and the
//! PIT alone, which suits KVM's in-kernel LAPIC timer; the boot flags say
//! there is no VGA, no CMOS RTC and no MSI (no PCI), and no i8042 to probe
//! for a keyboard: the i8042 model only implements the reset command.

use super::sdt::Table;
use devices::i8042::I8042_PORT_BASE;
use devices::sleep_control::{SLEEP_CONTROL_PORT, SLEEP_STATUS_PORT};

/// FADT revision 6, minor 5: ACPI 6.5.
const REVISION: u8 = 6;
const MINOR_REVISION: u8 = 5;
/// The full revision-6 table.
pub const FADT_BYTES: usize = 276;

/// Field offsets (ACPI 6.5 table 5.9).
mod offset {
    pub const DSDT: usize = 40;
    pub const IAPC_BOOT_ARCH: usize = 109;
    pub const FLAGS: usize = 112;
    pub const RESET_REG: usize = 116;
    pub const RESET_VALUE: usize = 128;
    pub const MINOR_REVISION: usize = 131;
    pub const X_DSDT: usize = 140;
    pub const SLEEP_CONTROL_REG: usize = 244;
    pub const SLEEP_STATUS_REG: usize = 256;
    pub const HYPERVISOR_VENDOR: usize = 268;
}

/// IA-PC boot architecture flags.
const BOOT_VGA_NOT_PRESENT: u16 = 1 << 2;
const BOOT_MSI_NOT_SUPPORTED: u16 = 1 << 3;
const BOOT_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;

/// Fixed feature flags.
const FLAG_WBINVD: u32 = 1 << 0;
/// No fixed-feature power or sleep button.
const FLAG_PWR_BUTTON: u32 = 1 << 4;
const FLAG_SLP_BUTTON: u32 = 1 << 5;
const FLAG_RESET_REG_SUP: u32 = 1 << 10;
const FLAG_HW_REDUCED_ACPI: u32 = 1 << 20;

/// Generic address structure: address space, register width in bits,
/// bit offset, access size (1 = byte), address.
const SPACE_SYSTEM_IO: u8 = 1;
const ACCESS_BYTE: u8 = 1;

fn io_byte_register(port: u64) -> [u8; 12] {
    let mut gas = [0u8; 12];
    gas[..4].copy_from_slice(&[SPACE_SYSTEM_IO, 8, 0, ACCESS_BYTE]);
    gas[4..].copy_from_slice(&port.to_le_bytes());
    gas
}

/// The i8042 command port and the command that pulses the CPU reset line:
/// ACPI's reset register and Linux's keyboard-controller reboot then take
/// the same path.
const RESET_PORT: u64 = I8042_PORT_BASE + 4;
const RESET_VALUE: u8 = 0xfe;

/// The FADT pointing at the DSDT at `dsdt_gpa`.
pub fn build(dsdt_gpa: u64) -> Vec<u8> {
    let mut body = vec![0u8; FADT_BYTES - super::sdt::HEADER_BYTES];
    let mut put = |at: usize, bytes: &[u8]| {
        let at = at - super::sdt::HEADER_BYTES;
        body[at..at + bytes.len()].copy_from_slice(bytes);
    };
    let dsdt32 = u32::try_from(dsdt_gpa).expect("the DSDT lives below 4 GiB");
    put(offset::DSDT, &dsdt32.to_le_bytes());
    put(
        offset::IAPC_BOOT_ARCH,
        &(BOOT_VGA_NOT_PRESENT | BOOT_MSI_NOT_SUPPORTED | BOOT_CMOS_RTC_NOT_PRESENT).to_le_bytes(),
    );
    let flags =
        FLAG_WBINVD | FLAG_PWR_BUTTON | FLAG_SLP_BUTTON | FLAG_RESET_REG_SUP | FLAG_HW_REDUCED_ACPI;
    put(offset::FLAGS, &flags.to_le_bytes());
    put(offset::RESET_REG, &io_byte_register(RESET_PORT));
    put(offset::RESET_VALUE, &[RESET_VALUE]);
    put(offset::MINOR_REVISION, &[MINOR_REVISION]);
    put(offset::X_DSDT, &dsdt_gpa.to_le_bytes());
    put(
        offset::SLEEP_CONTROL_REG,
        &io_byte_register(SLEEP_CONTROL_PORT),
    );
    put(
        offset::SLEEP_STATUS_REG,
        &io_byte_register(SLEEP_STATUS_PORT),
    );
    put(offset::HYPERVISOR_VENDOR, b"HUGEVMM\0");
    let mut table = Table::new(b"FACP", REVISION);
    table.extend(&body);
    table.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn fields_land_where_the_specification_puts_them() {
        let fadt = build(0xe1000);
        assert_eq!(fadt.len(), FADT_BYTES);
        assert_eq!(&fadt[..4], b"FACP");
        assert_eq!(fadt[8], 6);
        assert_eq!(fadt.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        assert_eq!(u32_at(&fadt, offset::DSDT), 0xe1000);
        assert_eq!(
            u64::from_le_bytes(fadt[offset::X_DSDT..offset::X_DSDT + 8].try_into().unwrap()),
            0xe1000
        );
        assert_ne!(u32_at(&fadt, offset::FLAGS) & FLAG_HW_REDUCED_ACPI, 0);
        // SCI_INT (offset 46) stays 0: hardware-reduced, no SCI.
        assert_eq!(fadt[46..48], [0, 0]);
        assert_eq!(
            fadt[offset::RESET_REG..offset::RESET_REG + 6],
            [1, 8, 0, 1, 0x64, 0]
        );
        assert_eq!(fadt[offset::RESET_VALUE], 0xfe);
        assert_eq!(
            fadt[offset::SLEEP_CONTROL_REG..offset::SLEEP_CONTROL_REG + 6],
            [1, 8, 0, 1, 0x00, 0x06]
        );
        assert_eq!(
            fadt[offset::SLEEP_STATUS_REG..offset::SLEEP_STATUS_REG + 6],
            [1, 8, 0, 1, 0x01, 0x06]
        );
    }
}
