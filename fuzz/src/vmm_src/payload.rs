//! The parts of `vmm/src/payload/` that check payload images.

#[path = "../../../vmm/src/payload/elf.rs"]
pub mod elf;
#[path = "../../../vmm/src/payload/layout.rs"]
pub mod layout;
