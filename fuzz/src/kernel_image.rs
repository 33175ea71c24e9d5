//! A `--kernel` file as `linux::load` takes it apart: a vmlinux ELF or a
//! bzImage (setup header, payload location, decompression bounded by guest
//! RAM), then the vmlinux checks, its fit in guest RAM with the header's
//! `init_size`, the command line and initrd placement the header bounds,
//! and the zero page built from the header.
//!
//! The sequence is `linux/load.rs`'s (`open_kernel`, then the first part
//! of `load`), which cannot be called without a VM; every step is vmm's
//! own code.

use guestmem::Layout;

use crate::input::Input;
use guestmem::GuestAddress;
use vmm::image_kind::recognize;
use vmm::linux::decompress::{decompress_within, PayloadFormat};
use vmm::linux::e820::e820_map;
use vmm::linux::low_mem::CMDLINE_GPA;
use vmm::linux::setup_header::SetupHeader;
use vmm::linux::{bzimage, elf_kernel, placement, zero_page};

/// Guest RAM sizes: small ones keep the decompression bound (guest RAM)
/// low, so that a claimed size costs little to allocate.
const RAM_SIZES: [u64; 4] = [4 << 20, 16 << 20, 64 << 20, (4 << 30) + (2 << 20)];

/// Runs one input: a byte choosing the RAM size, a `u32` initrd size, a
/// command line (length-prefixed), then the kernel file.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let ram_bytes = RAM_SIZES[usize::from(input.u8()) % RAM_SIZES.len()];
    let initrd_bytes = u64::from(input.u32());
    let cmdline = String::from_utf8_lossy(input.short_bytes()).into_owned();
    let image = input.rest();
    let _ = load_sequence(image, ram_bytes, initrd_bytes, &cmdline);
}

/// Whether `image` gets through the whole sequence (to a zero page) with
/// `ram_bytes` of guest RAM: for tests of the seeds.
pub fn boots(image: &[u8], ram_bytes: u64) -> bool {
    load_sequence(image, ram_bytes, 8192, "console=ttyS0").is_some()
}

/// The sequence; `None` where vmm would refuse the kernel.
fn load_sequence(image: &[u8], ram_bytes: u64, initrd_bytes: u64, cmdline: &str) -> Option<()> {
    let layout = Layout::new(ram_bytes).expect("the RAM sizes are valid layouts");
    let _ = recognize(image);

    // open_kernel
    let (header, decompressed);
    let vmlinux: &[u8] = if PayloadFormat::detect(image) == Some(PayloadFormat::Uncompressed) {
        header = SetupHeader::synthesize(2 << 20, 2047, 0x7fff_ffff);
        image
    } else {
        let bz = bzimage::parse(image).ok()?;
        let protected_mode_start = (u64::from(bz.header.setup_sects()) + 1) * 512;
        let payload_start = bz.payload.as_ptr() as u64 - image.as_ptr() as u64;
        assert_eq!(
            payload_start,
            protected_mode_start + u64::from(bz.header.payload_offset())
        );
        assert_eq!(
            bz.payload.len() as u64,
            u64::from(bz.header.payload_length_bytes())
        );
        header = bz.header;
        match decompress_within(bz.payload, ram_bytes) {
            Ok((_, out)) => {
                assert!(out.len() as u64 <= ram_bytes, "{} bytes", out.len());
                decompressed = out;
                &decompressed
            }
            Err(_) => return None,
        }
    };

    // load, up to the writes into guest RAM
    let kernel = elf_kernel::parse(vmlinux).ok()?;
    let kernel_end_gpa = kernel
        .check_fits(&layout, u64::from(header.init_size_bytes()))
        .ok()?;
    assert!(layout.contains(
        GuestAddress(kernel.start_gpa()),
        kernel_end_gpa - kernel.start_gpa()
    ));
    for segment in &kernel.segments {
        // What `VmlinuxImage::load` writes.
        let bytes = &vmlinux[segment.file_offset..segment.file_offset + segment.file_bytes];
        assert!(
            layout.contains(GuestAddress(segment.gpa), bytes.len() as u64),
            "{segment:?}"
        );
    }
    let line = placement::cmdline_bytes(cmdline, header.cmdline_size_bytes()).ok()?;
    assert!(line.len() as u64 <= u64::from(header.cmdline_size_bytes()) + 1);
    let initrd = placement::place_initrd(
        &layout,
        initrd_bytes,
        header.initrd_addr_max(),
        kernel_end_gpa,
    )
    .ok();
    if let Some(range) = &initrd {
        assert!(range.start >= kernel_end_gpa || range.end <= kernel.start_gpa());
        assert!(
            layout.contains(GuestAddress(range.start), range.end - range.start),
            "{range:?}"
        );
    }
    zero_page::build(&header, CMDLINE_GPA, initrd, &e820_map(&layout), 0xe0000).ok()?;
    Some(())
}
