//! Payload protocol v1: image checks, the VMM region and the boot info.

pub(crate) mod bootinfo;
pub mod elf;
pub(crate) mod layout;
pub(crate) mod port_trap;
pub(crate) mod tables;
