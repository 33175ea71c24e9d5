//! The parts of `vmm/src/linux/` that read kernel images.

#[path = "../../../vmm/src/linux/bzimage.rs"]
pub mod bzimage;
#[path = "../../../vmm/src/linux/decompress.rs"]
pub mod decompress;
#[path = "../../../vmm/src/linux/e820.rs"]
pub mod e820;
#[path = "../../../vmm/src/linux/elf_kernel.rs"]
pub mod elf_kernel;
#[path = "../../../vmm/src/linux/le.rs"]
pub mod le;
#[path = "../../../vmm/src/linux/low_mem.rs"]
pub mod low_mem;
#[path = "../../../vmm/src/linux/lz4_legacy.rs"]
pub mod lz4_legacy;
#[path = "../../../vmm/src/linux/placement.rs"]
pub mod placement;
#[path = "../../../vmm/src/linux/setup_header.rs"]
pub mod setup_header;
#[path = "../../../vmm/src/linux/zero_page.rs"]
pub mod zero_page;
