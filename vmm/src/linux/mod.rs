//! Booting a Linux kernel: the 64-bit boot protocol.
//!
//! The kernel file is a bzImage or a vmlinux ELF. A bzImage's payload is
//! decompressed on the host and its vmlinux loaded at its physical link
//! address; the vCPU enters `startup_64` directly in long mode, skipping
//! the real-mode setup and the in-guest decompressor (which is very slow on
//! hosts that emulate guest CPL 0).
//!
//! Order of use: [`prepare_vm`] (before creating vCPUs), [`load`] (after the
//! memslots exist), then [`configure_vcpu`] for each vCPU.
//!
//! Low memory: see `low_mem.rs`; the e820 map: `e820.rs`; how the
//! kernel finds the vCPUs, the interrupt routing and the devices: the ACPI
//! tables ([`acpi`]), and for kernels without ACPI the MP table
//! (`mptable.rs`) and the command line's `virtio_mmio.device=` words.

pub(crate) mod acpi;
mod board;
mod boot;
mod boot_tables;
pub mod bzimage;
mod cpu;
mod cpuid;
pub mod decompress;
pub mod e820;
pub mod elf_kernel;
mod lapic;
mod le;
mod load;
pub mod low_mem;
pub mod lz4_legacy;
mod machine;
mod mptable;
mod msrs;
pub mod placement;
pub mod setup_header;
// A minimal boot loop of its own, for the tests' stock-kernel boots.
#[cfg(test)]
pub(crate) mod smoke;
#[cfg(test)]
mod smoke_uart;
mod vm_setup;
pub mod zero_page;

pub use boot::{BootSetup, KernelKind, LinuxBootConfig, LinuxBootError, VirtioAnnounce};
pub use cpu::VcpuSetupError;
pub use decompress::PayloadFormat;
pub use load::{configure_vcpu, load};
pub use machine::{MachineInfo, VirtioMmioDevice};
pub use mptable::MpTableError;
pub use vm_setup::prepare_vm;
