//! The machine as a Linux guest's firmware tables describe it (the ACPI
//! tables, `acpi/`; the MP table, `mptable.rs`; the command line's
//! `virtio_mmio.device=` words).

/// The parts of the machine the boot firmware tables describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// vCPUs; vCPU `i` has APIC ID `i` and vCPU 0 boots.
    pub vcpus: u32,
    /// The virtio-mmio devices, in window order.
    pub virtio: Vec<VirtioMmioDevice>,
    /// Whether the DSDT lists them ([`VirtioAnnounce::in_acpi`]).
    pub virtio_in_dsdt: bool,
}

/// One virtio-mmio device as the firmware tables describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioMmioDevice {
    /// Its register window.
    pub base_gpa: u64,
    /// The window's size.
    pub size_bytes: u64,
    /// Its interrupt line: a GSI, which is also an IOAPIC pin.
    pub irq: u32,
}
