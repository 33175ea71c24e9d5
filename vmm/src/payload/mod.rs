//! Payload protocol v1: image checks, the VMM region and the boot info.

pub mod bootinfo;
pub mod elf;
pub mod layout;
pub mod port_trap;
pub mod tables;
