//! Host-side addresses, as types: a host virtual address and a byte offset
//! into a host mapping are both `u64`s, and passing one where the other is
//! meant reaches the wrong memory without any error. Guest-physical
//! addresses are `vm_memory::GuestAddress` in this crate.
//!
//! The raw integer comes out (`.raw()`, `.get()`) only where it meets the
//! kernel (a syscall argument, a pointer) or a message.

use std::fmt;

/// A host virtual address in this process, in bytes (a pointer value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hva(u64);

impl Hva {
    /// The address `address` (as the kernel or a mapping reported it).
    pub const fn new(address: u64) -> Hva {
        Hva(address)
    }

    /// The address `bytes` further on.
    pub const fn offset_by(self, bytes: u64) -> Hva {
        Hva(self.0 + bytes)
    }

    /// The bytes from `base` up to this address (`None` below `base`).
    pub const fn offset_from(self, base: Hva) -> Option<u64> {
        self.0.checked_sub(base.0)
    }

    /// The address as the kernel takes it.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::LowerHex for Hva {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A byte offset from the start of one host mapping (of guest RAM, of a
/// parking area): where in the mapping, independent of where the mapping
/// sits in the address space or in guest-physical space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionOffset(u64);

impl RegionOffset {
    /// The start of the mapping.
    pub const ZERO: RegionOffset = RegionOffset(0);

    /// Offset `bytes` from the start of the mapping.
    pub const fn new(bytes: u64) -> RegionOffset {
        RegionOffset(bytes)
    }

    /// The offset `bytes` further on.
    pub const fn offset_by(self, bytes: u64) -> RegionOffset {
        RegionOffset(self.0 + bytes)
    }

    /// The offset in bytes, for arithmetic on sizes and for syscalls.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::LowerHex for RegionOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_addresses_move_by_bytes() {
        let base = Hva::new(0x7f00_0000_0000);
        let at = base.offset_by(4096);
        assert_eq!(at.offset_from(base), Some(4096));
        assert_eq!(base.offset_from(at), None);
        assert_eq!(RegionOffset::ZERO.offset_by(8).get(), 8);
        assert_eq!(format!("{:#x}", at), "0x7f0000001000");
    }
}
