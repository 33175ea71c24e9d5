//! Loading a Linux kernel (bzImage or vmlinux), its command line and
//! initrd into guest RAM, with the zero page, GDT and page tables of the
//! 64-bit boot protocol.

use std::path::Path;
use std::time::Instant;

use guestmem::GuestRam;
use kvm_ioctls::{Kvm, VcpuFd};

use super::boot::{BootSetup, KernelKind, LinuxBootConfig, LinuxBootError};
use super::decompress::{self, PayloadFormat};
use super::e820::e820_map;
use super::low_mem::{ACPI_GPA, CMDLINE_GPA, GDT_GPA, MP_TABLE_GPA, PML4_GPA, ZERO_PAGE_GPA};
use super::machine::MachineInfo;
use super::setup_header::SetupHeader;
use super::{acpi, boot_tables, bzimage, cpu, elf_kernel, mptable, placement, zero_page};
use vm_memory::GuestAddress;

/// `kernel_alignment` claimed for a bare vmlinux: the x86-64 default
/// (CONFIG_PHYSICAL_ALIGN).
const VMLINUX_ALIGNMENT_BYTES: u32 = 2 << 20;
/// `cmdline_size` claimed for a bare vmlinux: x86's COMMAND_LINE_SIZE
/// (2048) without the NUL.
const VMLINUX_CMDLINE_SIZE_BYTES: u32 = 2047;
/// `initrd_addr_max` for a bare vmlinux: the protocol's value for modern
/// kernels.
const VMLINUX_INITRD_ADDR_MAX: u32 = 0x7fff_ffff;

/// Reads a kernel or initrd: a regular file no larger than guest RAM
/// (`ram_bytes`), which it must fit in.
fn read(what: &'static str, path: &Path, ram_bytes: u64) -> Result<Vec<u8>, LinuxBootError> {
    Ok(crate::input_file::read_bounded(
        what,
        path,
        ram_bytes,
        "guest RAM, which it is loaded into",
    )?)
}

/// The kernel file taken apart: the setup header for the zero page, the
/// vmlinux ELF, and what kind of file it was.
pub struct KernelFile {
    /// The bzImage's header, or one made up for a vmlinux.
    pub header: SetupHeader,
    /// The decompressed kernel.
    pub vmlinux: Vec<u8>,
    /// What the file was.
    pub kind: KernelKind,
}

/// Takes a bzImage or vmlinux apart.
/// `ram_bytes` bounds the decompressed kernel, which must fit in guest RAM.
pub fn open_kernel(
    image: Vec<u8>,
    path: &Path,
    ram_bytes: u64,
) -> Result<KernelFile, LinuxBootError> {
    if PayloadFormat::detect(&image) == Some(PayloadFormat::Uncompressed) {
        let header = SetupHeader::synthesize(
            VMLINUX_ALIGNMENT_BYTES,
            VMLINUX_CMDLINE_SIZE_BYTES,
            VMLINUX_INITRD_ADDR_MAX,
        );
        return Ok(KernelFile {
            header,
            vmlinux: image,
            kind: KernelKind::Vmlinux,
        });
    }
    let with_path = |source| LinuxBootError::BzImage {
        path: path.to_path_buf(),
        source,
    };
    let bz = bzimage::parse(&image).map_err(with_path)?;
    let started = Instant::now();
    let (format, vmlinux) =
        decompress::decompress_within(bz.payload, ram_bytes).map_err(|source| {
            LinuxBootError::Decompress {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let kind = KernelKind::BzImage {
        protocol_version: bz.header.version(),
        format,
        compressed_bytes: bz.payload.len() as u64,
        decompress_time: started.elapsed(),
    };
    Ok(KernelFile {
        header: bz.header,
        vmlinux,
        kind,
    })
}

/// Loads everything a Linux boot needs into guest RAM; `machine` is what
/// the ACPI tables and the MP table describe.
pub fn load(
    ram: &GuestRam,
    config: &LinuxBootConfig,
    machine: &MachineInfo,
) -> Result<BootSetup, LinuxBootError> {
    let layout = ram.layout();
    // Checked before the kernel is read and decompressed, which is the slow
    // part: a machine the table cannot describe fails fast.
    let virtio_irqs: Vec<u32> = machine.virtio.iter().map(|d| d.irq).collect();
    let mp_table = mptable::build(machine.vcpus, &virtio_irqs)?;
    let acpi = acpi::build(machine)?;
    let ram_bytes = layout.ram_bytes();
    let kernel = open_kernel(
        read("--kernel", &config.kernel, ram_bytes)?,
        &config.kernel,
        ram_bytes,
    )?;
    let elf_error = |source| LinuxBootError::Kernel {
        path: config.kernel.clone(),
        source,
    };
    let image = elf_kernel::parse(&kernel.vmlinux).map_err(elf_error)?;
    // init_size counts from the load address, which for a kernel run where
    // it was linked is its first segment.
    let kernel_end_gpa = image
        .check_fits(layout, u64::from(kernel.header.init_size_bytes()))
        .map_err(elf_error)?;
    let cmdline = placement::cmdline_bytes(&config.cmdline, kernel.header.cmdline_size_bytes())?;

    let write = |what: &'static str, gpa: u64, bytes: &[u8]| {
        ram.write_bytes(GuestAddress(gpa), bytes)
            .map_err(|error| LinuxBootError::Write { what, error })
    };
    image.load(&kernel.vmlinux, ram).map_err(elf_error)?;
    let initrd_gpa = match &config.initrd {
        Some(path) => {
            let initrd = read("--initrd", path, ram_bytes)?;
            let range = placement::place_initrd(
                layout,
                initrd.len() as u64,
                kernel.header.initrd_addr_max(),
                kernel_end_gpa,
            )?;
            write("initrd", range.start, &initrd)?;
            Some(range)
        }
        None => None,
    };
    let zero_page = zero_page::build(
        &kernel.header,
        CMDLINE_GPA,
        initrd_gpa.clone(),
        &e820_map(layout),
        acpi.rsdp_gpa,
    )?;
    write("zero page", ZERO_PAGE_GPA, &zero_page)?;
    write("command line", CMDLINE_GPA, &cmdline)?;
    write("boot GDT", GDT_GPA, &boot_tables::gdt())?;
    write(
        "boot page tables",
        PML4_GPA,
        &boot_tables::identity_page_tables(),
    )?;
    write("MP table", MP_TABLE_GPA, &mp_table)?;
    write("ACPI tables", ACPI_GPA, &acpi.image)?;
    Ok(BootSetup {
        entry_gpa: image.entry_gpa,
        zero_page_gpa: ZERO_PAGE_GPA,
        kernel_gpa: image.start_gpa()..kernel_end_gpa,
        initrd_gpa,
        kind: kernel.kind,
        rsdp_gpa: acpi.rsdp_gpa,
    })
}

/// Sets up vCPU `index` for the boot that `setup` describes: the boot
/// state on vCPU 0, firmware-like state on all.
pub fn configure_vcpu(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    index: u32,
    setup: &BootSetup,
) -> Result<(), LinuxBootError> {
    let entry = cpu::EntryPoint {
        entry_gpa: setup.entry_gpa,
        zero_page_gpa: setup.zero_page_gpa,
    };
    cpu::configure_vcpu(kvm, vcpu, index, entry)
        .map_err(|source| LinuxBootError::Vcpu { index, source })
}
