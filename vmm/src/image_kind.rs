//! Telling a Linux kernel from a hugevmm payload by its bytes, so that one
//! given where the other belongs is refused with what it is and the
//! option that runs it, instead of being booted as the wrong thing (a
//! payload booted as a vmlinux ignores its exit port and runs for ever).

/// What an image file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A Linux bzImage (the `HdrS` setup header signature).
    BzImage,
    /// An x86-64 ELF linked in the upper half of the address space, where
    /// x86-64 Linux links itself (`__START_KERNEL_map`): a vmlinux.
    Vmlinux,
    /// An x86-64 ELF executable (`ET_EXEC`) linked in the lower half: what
    /// hugevmm payloads are (identity-mapped user-mode programs).
    PayloadElf,
    /// Neither.
    Other,
}

/// Offset of the setup header's `HdrS` signature in a bzImage.
const BZIMAGE_MAGIC_OFFSET: usize = 0x202;
/// The lowest upper-half (kernel) virtual address on x86-64.
const UPPER_HALF_START: u64 = 0xffff_8000_0000_0000;
const PT_LOAD: u32 = 1;
const ET_EXEC: u16 = 2;

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Recognizes an image by its headers (anything malformed is `Other`:
/// the loaders say what is wrong with it).
pub fn recognize(bytes: &[u8]) -> ImageKind {
    if bytes.get(BZIMAGE_MAGIC_OFFSET..BZIMAGE_MAGIC_OFFSET + 4) == Some(b"HdrS") {
        return ImageKind::BzImage;
    }
    // ELF64, little-endian, x86-64.
    if bytes.get(..6) != Some(b"\x7fELF\x02\x01") || u16_at(bytes, 18) != Some(62) {
        return ImageKind::Other;
    }
    let is_executable = u16_at(bytes, 16) == Some(ET_EXEC);
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (u64_at(bytes, 32), u16_at(bytes, 54), u16_at(bytes, 56))
    else {
        return ImageKind::Other;
    };
    let mut any_load = false;
    for index in 0..usize::from(phnum) {
        let Some(at) = usize::try_from(phoff)
            .ok()
            .and_then(|o| o.checked_add(index * usize::from(phentsize)))
        else {
            return ImageKind::Other;
        };
        let (Some(kind), Some(vaddr)) = (
            u32_at(bytes, at),
            at.checked_add(16).and_then(|at| u64_at(bytes, at)),
        ) else {
            return ImageKind::Other;
        };
        if kind == PT_LOAD {
            any_load = true;
            if vaddr >= UPPER_HALF_START {
                return ImageKind::Vmlinux;
            }
        }
    }
    // Shared objects and PIE programs are neither (the loaders say why).
    if any_load && is_executable {
        ImageKind::PayloadElf
    } else {
        ImageKind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 x86-64 header with one PT_LOAD program header at `vaddr`.
    fn elf_with_segment_at(vaddr: u64) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[16..18].copy_from_slice(&2u16.to_le_bytes());
        elf[18..20].copy_from_slice(&62u16.to_le_bytes());
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&PT_LOAD.to_le_bytes());
        elf[64 + 16..64 + 24].copy_from_slice(&vaddr.to_le_bytes());
        elf
    }

    #[test]
    fn kernels_and_payloads_are_told_apart() {
        assert_eq!(
            recognize(&elf_with_segment_at(0xffff_ffff_8100_0000)),
            ImageKind::Vmlinux
        );
        assert_eq!(
            recognize(&elf_with_segment_at(0x20_0000)),
            ImageKind::PayloadElf
        );
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(recognize(&bz), ImageKind::BzImage);
        assert_eq!(recognize(b"#!/bin/sh\n"), ImageKind::Other);
        let mut truncated = elf_with_segment_at(0x20_0000);
        truncated.truncate(70);
        assert_eq!(recognize(&truncated), ImageKind::Other);
    }

    /// Found by the fuzzer (fuzz/regressions/payload_elf): a program
    /// header offset a few bytes below 2^64 overflowed the field reads,
    /// a panic in debug builds.
    #[test]
    fn a_program_header_table_at_the_end_of_the_address_space_is_other() {
        for phoff in [u64::MAX, u64::MAX - 3, u64::MAX - 15, u64::MAX - 0x0fff] {
            let mut elf = elf_with_segment_at(0x20_0000);
            elf[32..40].copy_from_slice(&phoff.to_le_bytes());
            assert_eq!(recognize(&elf), ImageKind::Other, "phoff {phoff:#x}");
        }
    }

    #[test]
    fn the_built_in_payloads_are_payloads() {
        for builtin in payloads::all() {
            assert_eq!(
                recognize(builtin.elf),
                ImageKind::PayloadElf,
                "{}",
                builtin.name
            );
        }
    }

    #[test]
    fn the_fetched_kernel_is_a_bzimage() {
        let kernel = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/linux-kernel/vmlinuz"
        );
        match std::fs::read(kernel) {
            Ok(bytes) => assert_eq!(recognize(&bytes), ImageKind::BzImage),
            Err(e) => test_resources::skip(
                "the_fetched_kernel_is_a_bzimage",
                test_resources::Resource::Kernel,
                format!("{kernel}: {e}; run .ci/fetch-kernel"),
            ),
        }
    }
}
