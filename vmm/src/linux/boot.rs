//! What a Linux boot is given and what it gives back: the kernel, initrd
//! and command line to boot, where [`load`](super::load) put them, and
//! why a boot could not be prepared.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use super::cpu::VcpuSetupError;
use super::decompress::PayloadFormat;
use super::mptable::MpTableError;
use super::{acpi, bzimage, decompress, elf_kernel, placement, zero_page};

/// What to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxBootConfig {
    /// A bzImage or vmlinux ELF.
    pub kernel: PathBuf,
    /// An initrd/initramfs image, placed at the top of RAM below 3 GiB.
    pub initrd: Option<PathBuf>,
    /// The kernel command line.
    pub cmdline: String,
    /// How the kernel learns about the virtio-mmio devices.
    pub virtio_announce: VirtioAnnounce,
}

/// Where the virtio-mmio devices are announced to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum VirtioAnnounce {
    /// Both: any kernel finds them. A kernel that reads both (ACPI plus
    /// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES) probes each device twice and
    /// logs the second probe's -EBUSY, harmlessly.
    #[default]
    Both,
    /// DSDT entries only: stock distribution kernels.
    Acpi,
    /// `virtio_mmio.device=` words only: kernels without ACPI.
    Cmdline,
}

impl VirtioAnnounce {
    /// Whether the DSDT lists the devices.
    pub fn in_acpi(self) -> bool {
        self != VirtioAnnounce::Cmdline
    }

    /// Whether the command line names the devices.
    pub fn in_cmdline(self) -> bool {
        self != VirtioAnnounce::Acpi
    }
}

/// What kind of kernel file was booted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelKind {
    /// A bare vmlinux ELF.
    Vmlinux,
    /// A bzImage, decompressed on the host.
    BzImage {
        /// Its boot protocol version (0x020f is 2.15).
        protocol_version: u16,
        /// The payload's compression.
        format: PayloadFormat,
        /// The payload's size.
        compressed_bytes: u64,
        /// How long decompression took.
        decompress_time: Duration,
    },
}

/// The result of [`load`]: where things went, for the vCPUs and for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSetup {
    /// Physical address of `startup_64`.
    pub entry_gpa: u64,
    /// Physical address of the zero page.
    pub zero_page_gpa: u64,
    /// Memory the kernel occupies (its image, or `init_size` if larger).
    pub kernel_gpa: Range<u64>,
    /// Where the initrd is, if there is one.
    pub initrd_gpa: Option<Range<u64>>,
    /// What the kernel file was.
    pub kind: KernelKind,
    /// Where the ACPI RSDP is.
    pub rsdp_gpa: u64,
}

/// Why a Linux boot could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LinuxBootError {
    /// A file could not be read, or is no regular file of a size that
    /// fits in guest RAM.
    #[error(transparent)]
    Read(#[from] crate::input_file::InputFileError),
    /// The kernel is neither a usable bzImage nor a vmlinux.
    #[error("kernel {}: {source}", path.display())]
    BzImage {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: bzimage::BzImageError,
    },
    /// The bzImage payload did not decompress.
    #[error("kernel {}: {source}", path.display())]
    Decompress {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: decompress::DecompressError,
    },
    /// The vmlinux is unusable or does not fit.
    #[error("kernel {}: {source}", path.display())]
    Kernel {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: elf_kernel::ElfKernelError,
    },
    /// The command line or initrd cannot be placed.
    #[error(transparent)]
    Placement(#[from] placement::PlacementError),
    /// The zero page cannot be built.
    #[error(transparent)]
    ZeroPage(#[from] zero_page::ZeroPageError),
    /// The MP table cannot describe the machine.
    #[error(transparent)]
    MpTable(#[from] MpTableError),
    /// The ACPI tables cannot describe the machine.
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    /// Writing boot data to guest RAM failed.
    #[error("cannot write the {what} into guest RAM: {error}")]
    Write {
        /// What was written.
        what: &'static str,
        /// The guest memory error.
        error: guestmem::GuestMemError,
    },
    /// A vCPU could not be set up.
    #[error("cannot set up vCPU {index} for Linux: {source}")]
    Vcpu {
        /// The vCPU.
        index: u32,
        /// What failed.
        source: VcpuSetupError,
    },
}
