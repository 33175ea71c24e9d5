//! Payload images as `hugevmm run --payload-file` checks them: what the
//! CLI takes the file for (`image_kind::recognize`) and the ELF checks
//! (`payload::elf::parse`) against a real guest RAM layout, then the
//! segment slicing the loader does with what the checks let through.

use guestmem::Layout;

use crate::input::Input;
use guestmem::GuestAddress;
use vmm::image_kind::recognize;
use vmm::payload::elf;

/// Guest RAM sizes the image is checked against: one region, one ending
/// at the 3 GiB hole, and two regions around it.
const RAM_SIZES: [u64; 4] = [4 << 20, 64 << 20, 3 << 30, (4 << 30) + (64 << 20)];

/// Runs one input: a byte choosing the RAM size, then the image.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let ram_bytes = RAM_SIZES[usize::from(input.u8()) % RAM_SIZES.len()];
    let image = input.rest();
    let layout = Layout::new(ram_bytes).expect("the RAM sizes are valid layouts");
    let _ = recognize(image);
    let Ok(payload) = elf::parse(
        image,
        |start, len| layout.contains(GuestAddress(start), len),
        "RAM",
    ) else {
        return;
    };
    assert!(!payload.segments.is_empty());
    assert!(payload
        .segments
        .iter()
        .any(|s| payload.entry >= s.gpa && payload.entry < s.end_gpa()));
    for segment in &payload.segments {
        assert!(segment.gpa >= 2 << 20, "{segment:?} in the VMM region");
        assert!(
            layout.contains(GuestAddress(segment.gpa), segment.mem_bytes),
            "{segment:?}"
        );
        assert!(segment.file_bytes <= segment.mem_bytes, "{segment:?}");
        // What vm.rs writes into guest RAM for the segment.
        let bytes = &image[segment.file_offset..segment.file_offset + segment.file_bytes as usize];
        assert_eq!(bytes.len() as u64, segment.file_bytes);
    }
}
