//! The decompressed kernel, a vmlinux ELF: its loadable segments at their
//! physical addresses (`p_paddr`) and its 64-bit entry point.
//!
//! This parser is deliberately separate from `payload/elf.rs`: payloads
//! follow hugevmm's own strict rules, a kernel follows the kernel's. An
//! x86-64 vmlinux links `ENTRY(phys_startup_64)`, so `e_entry` is the
//! physical address of `startup_64`, the 64-bit boot protocol's entry for
//! an already decompressed kernel.

use guestmem::{GuestMemError, GuestRam, Layout};

use super::le;
use super::low_mem::HIGH_MEMORY_GPA;
use vm_memory::{Address, GuestAddress};

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ET_EXEC: u16 = 2;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const EHDR_BYTES: usize = 64;
const PHDR_BYTES: usize = 56;

/// Why a vmlinux cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ElfKernelError {
    /// The ELF header is missing or not x86-64 little-endian.
    #[error(
        "the kernel is not an x86-64 ELF executable ({what}); pass a bzImage or an x86-64 vmlinux"
    )]
    NotX86_64Elf {
        /// What did not match.
        what: String,
    },
    /// A program header or segment lies outside the file.
    #[error("the kernel ELF is truncated: {what}")]
    Truncated {
        /// What is missing.
        what: String,
    },
    /// No loadable segment.
    #[error("the kernel ELF has no loadable (PT_LOAD) segment")]
    NoSegments,
    /// The entry point is in no segment.
    #[error(
        "the kernel's entry point {entry:#x} lies in no loadable segment, physical or virtual"
    )]
    EntryOutside {
        /// e_entry.
        entry: u64,
    },
    /// Two segments overlap in physical memory.
    #[error("kernel segments overlap at physical {gpa:#x}")]
    Overlap {
        /// Where the later one starts.
        gpa: u64,
    },
    /// The kernel wants to sit in the low 1 MiB, where the VMM's boot
    /// structures are.
    #[error(
        "the kernel starts at physical {start_gpa:#x}, inside the low 1 MiB that hugevmm uses for boot \
         structures; boot a kernel linked at 1 MiB or above (any x86-64 Linux is)"
    )]
    InLowMemory {
        /// Lowest address of the kernel.
        start_gpa: u64,
    },
    /// A segment lies outside guest RAM.
    #[error(
        "the kernel needs guest RAM at [{start_gpa:#x}, {end_gpa:#x}), which is not inside RAM ({ram}); \
         give the VM more memory (--mem)"
    )]
    OutsideRam {
        /// Start of the kernel's range.
        start_gpa: u64,
        /// End of the kernel's range.
        end_gpa: u64,
        /// The RAM ranges.
        ram: String,
    },
    /// Writing to guest RAM failed.
    #[error("cannot write the kernel into guest RAM: {0}")]
    Write(#[from] GuestMemError),
}

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSegment {
    /// Physical load address.
    pub gpa: u64,
    /// Where its bytes are in the file.
    pub file_offset: usize,
    /// Bytes taken from the file.
    pub file_bytes: usize,
    /// Bytes in memory (the rest is zero).
    pub mem_bytes: u64,
}

/// A parsed vmlinux.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmlinuxImage {
    /// Physical address of `startup_64`.
    pub entry_gpa: u64,
    /// The loadable segments, by ascending address.
    pub segments: Vec<KernelSegment>,
}

impl VmlinuxImage {
    /// Lowest physical address the kernel occupies.
    pub fn start_gpa(&self) -> u64 {
        self.segments[0].gpa
    }

    /// One past the highest physical address the kernel's segments occupy.
    pub fn end_gpa(&self) -> u64 {
        self.segments
            .iter()
            // Saturating: a segment claiming to run past 2^64 then fails
            // check_fits as lying outside RAM.
            .map(|s| s.gpa.saturating_add(s.mem_bytes))
            .max()
            .unwrap_or(0)
    }

    /// Checks that `[start_gpa, max(end_gpa, start_gpa + reserve_bytes))`
    /// is inside one RAM region: `reserve_bytes` is the header's
    /// `init_size`, the room the kernel uses beyond its image early on.
    pub fn check_fits(&self, layout: &Layout, reserve_bytes: u64) -> Result<u64, ElfKernelError> {
        let start_gpa = self.start_gpa();
        if start_gpa < HIGH_MEMORY_GPA {
            return Err(ElfKernelError::InLowMemory { start_gpa });
        }
        let end_gpa = self.end_gpa().max(start_gpa.saturating_add(reserve_bytes));
        if !layout.contains(GuestAddress(start_gpa), end_gpa - start_gpa) {
            let ram = layout
                .regions()
                .iter()
                .map(|r| format!("[{:#x}, {:#x})", r.gpa.raw_value(), r.end_gpa().raw_value()))
                .collect::<Vec<_>>()
                .join(" and ");
            return Err(ElfKernelError::OutsideRam {
                start_gpa,
                end_gpa,
                ram,
            });
        }
        Ok(end_gpa)
    }

    /// Writes the segments' file bytes into guest RAM. The zero-filled
    /// parts are not written: the kernel clears its bss itself, and fresh
    /// guest RAM reads as zero anyway.
    pub fn load(&self, elf: &[u8], ram: &GuestRam) -> Result<(), ElfKernelError> {
        for segment in &self.segments {
            let bytes = &elf[segment.file_offset..segment.file_offset + segment.file_bytes];
            ram.write_bytes(GuestAddress(segment.gpa), bytes)?;
        }
        Ok(())
    }
}

struct ProgramHeader {
    kind: u32,
    offset: u64,
    vaddr: u64,
    paddr: u64,
    file_bytes: u64,
    mem_bytes: u64,
}

fn program_header(elf: &[u8], at: usize) -> Option<ProgramHeader> {
    Some(ProgramHeader {
        kind: le::u32_at(elf, at)?,
        offset: le::u64_at(elf, at + 8)?,
        vaddr: le::u64_at(elf, at + 16)?,
        paddr: le::u64_at(elf, at + 24)?,
        file_bytes: le::u64_at(elf, at + 32)?,
        mem_bytes: le::u64_at(elf, at + 40)?,
    })
}

/// Parses a vmlinux ELF.
pub fn parse(elf: &[u8]) -> Result<VmlinuxImage, ElfKernelError> {
    let not_x86 = |what: &str| ElfKernelError::NotX86_64Elf {
        what: what.to_string(),
    };
    if elf.len() < EHDR_BYTES || &elf[..4] != ELF_MAGIC {
        return Err(not_x86("no ELF magic"));
    }
    if elf[4] != ELFCLASS64 || elf[5] != ELFDATA2LSB {
        return Err(not_x86("not ELF64 little-endian"));
    }
    let e_type = le::u16_at(elf, 16).unwrap_or(0);
    let e_machine = le::u16_at(elf, 18).unwrap_or(0);
    if e_type != ET_EXEC || e_machine != EM_X86_64 {
        return Err(not_x86(&format!("e_type {e_type}, e_machine {e_machine}")));
    }
    let entry = le::u64_at(elf, 24).unwrap_or(0);
    let phoff = le::u64_at(elf, 32).unwrap_or(0);
    let phentsize = usize::from(le::u16_at(elf, 54).unwrap_or(0));
    let phnum = usize::from(le::u16_at(elf, 56).unwrap_or(0));
    if phentsize < PHDR_BYTES {
        return Err(not_x86(&format!("program header size {phentsize}")));
    }

    let mut segments = Vec::new();
    // (vaddr, paddr, mem_bytes) of each segment, to translate a virtual
    // entry point (some linkers' vmlinux) to its physical address.
    let mut spans = Vec::new();
    for index in 0..phnum {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|o| o.checked_add(index * phentsize));
        let header =
            at.and_then(|at| program_header(elf, at))
                .ok_or_else(|| ElfKernelError::Truncated {
                    what: format!("program header {index} is past the end"),
                })?;
        if header.kind != PT_LOAD || header.mem_bytes == 0 {
            continue;
        }
        let file_end = header.offset.checked_add(header.file_bytes);
        if header.file_bytes > header.mem_bytes || file_end.is_none_or(|end| end > elf.len() as u64)
        {
            return Err(ElfKernelError::Truncated {
                what: format!(
                    "segment {index} ({} bytes at file offset {:#x})",
                    header.file_bytes, header.offset
                ),
            });
        }
        segments.push(KernelSegment {
            gpa: header.paddr,
            file_offset: header.offset as usize,
            file_bytes: header.file_bytes as usize,
            mem_bytes: header.mem_bytes,
        });
        spans.push((header.vaddr, header.paddr, header.mem_bytes));
    }
    if segments.is_empty() {
        return Err(ElfKernelError::NoSegments);
    }
    segments.sort_by_key(|s| s.gpa);
    for pair in segments.windows(2) {
        if pair[0].gpa.saturating_add(pair[0].mem_bytes) > pair[1].gpa {
            return Err(ElfKernelError::Overlap { gpa: pair[1].gpa });
        }
    }
    let inside = |start: u64, len: u64, addr: u64| addr >= start && addr - start < len;
    let entry_gpa = if spans
        .iter()
        .any(|&(_, paddr, len)| inside(paddr, len, entry))
    {
        entry
    } else {
        spans
            .iter()
            .find(|&&(vaddr, _, len)| inside(vaddr, len, entry))
            .and_then(|&(vaddr, paddr, _)| paddr.checked_add(entry - vaddr))
            .ok_or(ElfKernelError::EntryOutside { entry })?
    };
    Ok(VmlinuxImage {
        entry_gpa,
        segments,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal vmlinux-like ELF: segments given as (vaddr, paddr, bytes,
    /// extra bss bytes).
    pub(crate) fn build_elf(entry: u64, segments: &[(u64, u64, &[u8], u64)]) -> Vec<u8> {
        let mut elf = vec![0u8; EHDR_BYTES];
        elf[..4].copy_from_slice(ELF_MAGIC);
        elf[4] = ELFCLASS64;
        elf[5] = ELFDATA2LSB;
        elf[6] = 1;
        le::put(&mut elf, 16, &ET_EXEC.to_le_bytes());
        le::put(&mut elf, 18, &EM_X86_64.to_le_bytes());
        le::put(&mut elf, 24, &entry.to_le_bytes());
        le::put(&mut elf, 32, &(EHDR_BYTES as u64).to_le_bytes());
        le::put(&mut elf, 54, &(PHDR_BYTES as u16).to_le_bytes());
        le::put(&mut elf, 56, &(segments.len() as u16).to_le_bytes());
        let mut data_offset = EHDR_BYTES + PHDR_BYTES * segments.len();
        let mut phdrs = Vec::new();
        for (vaddr, paddr, bytes, bss) in segments {
            let mut ph = vec![0u8; PHDR_BYTES];
            le::put(&mut ph, 0, &PT_LOAD.to_le_bytes());
            le::put(&mut ph, 8, &(data_offset as u64).to_le_bytes());
            le::put(&mut ph, 16, &vaddr.to_le_bytes());
            le::put(&mut ph, 24, &paddr.to_le_bytes());
            le::put(&mut ph, 32, &(bytes.len() as u64).to_le_bytes());
            le::put(&mut ph, 40, &(bytes.len() as u64 + bss).to_le_bytes());
            phdrs.extend(ph);
            data_offset += bytes.len();
        }
        elf.extend(phdrs);
        for (_, _, bytes, _) in segments {
            elf.extend_from_slice(bytes);
        }
        elf
    }

    const KERNEL_VA: u64 = 0xffff_ffff_8100_0000;

    #[test]
    fn physical_entry_and_segments() {
        let elf = build_elf(
            0x100_0000,
            &[
                (KERNEL_VA, 0x100_0000, &[0x90; 32], 0),
                (KERNEL_VA + 0x20_0000, 0x120_0000, &[1, 2, 3], 0x1000),
            ],
        );
        let image = parse(&elf).unwrap();
        assert_eq!(image.entry_gpa, 0x100_0000);
        assert_eq!(image.start_gpa(), 0x100_0000);
        assert_eq!(image.end_gpa(), 0x120_1003);
        assert_eq!(image.segments[1].file_bytes, 3);
    }

    /// Found by the fuzzer (fuzz/regressions/kernel_image): a segment
    /// whose physical range runs past 2^64 overflowed `end_gpa` (and a
    /// virtual entry in it the translation), panics in debug builds.
    #[test]
    fn a_segment_running_past_the_end_of_the_address_space_does_not_fit() {
        let top = u64::MAX - 0xf;
        let elf = build_elf(KERNEL_VA + 0x18, &[(KERNEL_VA, top, &[0x90; 16], 0x1000)]);
        assert!(matches!(
            parse(&elf),
            Err(ElfKernelError::EntryOutside { .. })
        ));
        let elf = build_elf(top, &[(KERNEL_VA, top, &[0x90; 16], 0x1000)]);
        let image = parse(&elf).unwrap();
        assert_eq!(image.end_gpa(), u64::MAX);
        let layout = Layout::new(64 << 20).unwrap();
        assert!(matches!(
            image.check_fits(&layout, 0),
            Err(ElfKernelError::OutsideRam { .. })
        ));
    }

    #[test]
    fn virtual_entry_is_translated() {
        let elf = build_elf(KERNEL_VA + 0x10, &[(KERNEL_VA, 0x100_0000, &[0x90; 32], 0)]);
        assert_eq!(parse(&elf).unwrap().entry_gpa, 0x100_0010);
        let elf = build_elf(0x5000, &[(KERNEL_VA, 0x100_0000, &[0x90; 32], 0)]);
        assert!(matches!(
            parse(&elf),
            Err(ElfKernelError::EntryOutside { entry: 0x5000 })
        ));
    }

    #[test]
    fn rejects_broken_images() {
        let mut elf = build_elf(0x100_0000, &[(KERNEL_VA, 0x100_0000, &[0x90; 32], 0)]);
        elf[18] = 3;
        assert!(matches!(
            parse(&elf),
            Err(ElfKernelError::NotX86_64Elf { .. })
        ));
        let elf = build_elf(0x100_0000, &[(KERNEL_VA, 0x100_0000, &[0x90; 32], 0)]);
        assert!(matches!(
            parse(&elf[..elf.len() - 1]),
            Err(ElfKernelError::Truncated { .. })
        ));
        let elf = build_elf(
            0x100_0000,
            &[(0, 0x100_0000, &[0; 32], 0), (0, 0x100_0010, &[0; 32], 0)],
        );
        assert!(matches!(
            parse(&elf),
            Err(ElfKernelError::Overlap { gpa: 0x100_0010 })
        ));
        assert!(matches!(
            parse(b"MZ"),
            Err(ElfKernelError::NotX86_64Elf { .. })
        ));
    }

    #[test]
    fn fit_check_counts_init_size() {
        let elf = build_elf(0x100_0000, &[(KERNEL_VA, 0x100_0000, &[0x90; 32], 0)]);
        let image = parse(&elf).unwrap();
        let layout = Layout::new(32 << 20).unwrap();
        assert_eq!(image.check_fits(&layout, 0x80_0000).unwrap(), 0x180_0000);
        let err = image.check_fits(&layout, 0x100_0001).unwrap_err();
        assert!(err.to_string().contains("[0x1000000, 0x2000001)"), "{err}");
        let low = parse(&build_elf(0x8_0000, &[(0, 0x8_0000, &[0x90; 32], 0)])).unwrap();
        assert!(matches!(
            low.check_fits(&layout, 0),
            Err(ElfKernelError::InLowMemory {
                start_gpa: 0x8_0000
            })
        ));
    }
}
