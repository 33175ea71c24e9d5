//! ACPI tables for a Linux guest: how a stock distribution kernel learns
//! the vCPUs and interrupt controllers (MADT), finds the virtio-mmio
//! devices (DSDT) and powers off or resets (FADT). Kernels booted with
//! `acpi=off`, or built without ACPI, fall back to the MP table and the
//! command line's `virtio_mmio.device=` words.
//!
//! All tables sit together in the BIOS area at [`ACPI_GPA`], which the
//! e820 map reserves: the RSDP first (the kernel scans `0xE0000..0x100000`
//! on 16-byte boundaries, and the zero page's `acpi_rsdp_addr` points at
//! it too), then DSDT, FADT, MADT and the root tables.

pub mod aml;
mod dsdt;
mod fadt;
mod madt;
mod sdt;

use super::board::MAX_VCPUS;
use super::low_mem::{ACPI_GPA, ACPI_MAX_BYTES};
use super::machine::MachineInfo;

/// Why the tables cannot describe the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcpiError {
    /// More vCPUs than 8-bit APIC IDs allow.
    #[error("the ACPI tables describe 1 to {MAX_VCPUS} vCPUs, not {vcpus}")]
    VcpuCount {
        /// How many were asked for.
        vcpus: u32,
    },
    /// A DSDT name could not be encoded (a bug, reported rather than
    /// panicking).
    #[error("cannot encode the DSDT: {0}")]
    Aml(#[from] aml::AmlError),
    /// The tables outgrew their area.
    #[error("the ACPI tables take {len_bytes} bytes, more than the {ACPI_MAX_BYTES} reserved for them; use fewer vCPUs or devices")]
    TooLarge {
        /// Their size.
        len_bytes: usize,
    },
}

/// One table in the image, for logs and for dumping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTable {
    /// Its signature ("RSD PTR " is shortened to "RSDP").
    pub signature: String,
    /// Where it is.
    pub gpa: u64,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The tables laid out for guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpiTables {
    /// The image to write at [`ACPI_GPA`].
    pub image: Vec<u8>,
    /// Where the RSDP is.
    pub rsdp_gpa: u64,
    /// Each table and its place.
    pub tables: Vec<PlacedTable>,
}

/// Tables are placed on 16-byte boundaries: the RSDP must be, and the
/// others then never straddle a cache line needlessly.
const ALIGN_BYTES: usize = 16;

/// Builds the tables for `machine`, placed from [`ACPI_GPA`].
pub fn build(machine: &MachineInfo) -> Result<AcpiTables, AcpiError> {
    if machine.vcpus == 0 || machine.vcpus > MAX_VCPUS {
        return Err(AcpiError::VcpuCount {
            vcpus: machine.vcpus,
        });
    }
    let mut layout = Layout::default();
    let rsdp_at = layout.reserve(sdt::RSDP_BYTES);
    let listed_virtio = match machine.virtio_in_dsdt {
        true => &machine.virtio[..],
        false => &[],
    };
    let dsdt_gpa = layout.place("DSDT", dsdt::build(listed_virtio)?);
    let fadt_gpa = layout.place("FACP", fadt::build(dsdt_gpa));
    let madt_gpa = layout.place("APIC", madt::build(machine.vcpus));
    let listed = [fadt_gpa, madt_gpa];
    let xsdt_gpa = layout.place("XSDT", sdt::xsdt(&listed));
    let rsdt_gpa = layout.place("RSDT", sdt::rsdt(&listed));
    layout.fill(rsdp_at, "RSDP", sdt::rsdp(rsdt_gpa, xsdt_gpa));
    if layout.image.len() as u64 > ACPI_MAX_BYTES {
        return Err(AcpiError::TooLarge {
            len_bytes: layout.image.len(),
        });
    }
    layout.tables.sort_by_key(|t| t.gpa);
    Ok(AcpiTables {
        image: layout.image,
        rsdp_gpa: ACPI_GPA + rsdp_at as u64,
        tables: layout.tables,
    })
}

#[derive(Default)]
struct Layout {
    image: Vec<u8>,
    tables: Vec<PlacedTable>,
}

impl Layout {
    /// Reserves `len` bytes at the next boundary; returns their offset.
    fn reserve(&mut self, len: usize) -> usize {
        let at = self.image.len().next_multiple_of(ALIGN_BYTES);
        self.image.resize(at + len, 0);
        at
    }

    /// Fills a reserved range with a table.
    fn fill(&mut self, at: usize, signature: &str, bytes: Vec<u8>) {
        self.image[at..at + bytes.len()].copy_from_slice(&bytes);
        self.tables.push(PlacedTable {
            signature: signature.to_string(),
            gpa: ACPI_GPA + at as u64,
            bytes,
        });
    }

    /// Appends a table; returns its guest address.
    fn place(&mut self, signature: &str, bytes: Vec<u8>) -> u64 {
        let at = self.reserve(bytes.len());
        self.fill(at, signature, bytes);
        ACPI_GPA + at as u64
    }
}

#[cfg(test)]
mod tests;
