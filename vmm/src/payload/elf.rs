//! Parsing and checking payload images (ELF64 x86-64 `ET_EXEC`).
//!
//! Pure code: it turns bytes into a list of segments or an error that tells
//! the user what is wrong with the image. Loading into guest RAM is the
//! caller's job.

use super::layout::VMM_REGION_BYTES;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const ET_EXEC: u16 = 2;
const EM_X86_64: u16 = 62;
const EHDR_BYTES: usize = 64;
const PHDR_BYTES: usize = 56;

/// Why an image cannot be run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    /// Not an ELF file at all.
    #[error("not an ELF file (bad magic); a payload must be an ELF64 x86-64 static executable")]
    BadMagic,
    /// Wrong class, byte order, machine or type.
    #[error("unsupported ELF image: {0}; a payload must be an ELF64 little-endian x86-64 ET_EXEC static executable (link with -static -no-pie)")]
    Unsupported(String),
    /// A header or segment points outside the file.
    #[error("truncated ELF image: {0}")]
    Truncated(String),
    /// The image asks for a dynamic loader.
    #[error("the payload is dynamically linked (has {0}); link it with -static -nostdlib")]
    Dynamic(&'static str),
    /// No loadable segment.
    #[error("the payload has no PT_LOAD segment")]
    NoSegments,
    /// A segment would land below 2 MiB, which the VMM owns.
    #[error("segment {index} is loaded at {start:#x}, below 2 MiB ({limit:#x}); guest RAM below 2 MiB belongs to the VMM: link the payload at 0x200000 or higher (e.g. with payloads/sdk/hvmm.ld)")]
    BelowVmmRegion {
        /// Segment number among PT_LOAD segments.
        index: usize,
        /// Its load address.
        start: u64,
        /// The lowest allowed address.
        limit: u64,
    },
    /// A segment is not inside guest RAM.
    #[error("segment {index} [{start:#x}, {end:#x}) is not inside guest RAM ({ram}); give more memory with --mem or link the payload lower")]
    OutsideRam {
        /// Segment number.
        index: usize,
        /// Start address.
        start: u64,
        /// End address (exclusive).
        end: u64,
        /// Description of guest RAM.
        ram: String,
    },
    /// Two segments overlap.
    #[error("segments {first} and {second} overlap in guest memory")]
    Overlap {
        /// First segment.
        first: usize,
        /// Second segment.
        second: usize,
    },
    /// `p_filesz > p_memsz`.
    #[error("segment {0} has p_filesz larger than p_memsz")]
    FileLargerThanMemory(usize),
    /// The entry point is not inside a loaded segment.
    #[error("entry point {0:#x} is not inside any loaded segment")]
    EntryOutside(u64),
}

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical load address (`p_paddr`).
    pub gpa: u64,
    /// Offset of the segment's bytes in the file.
    pub file_offset: usize,
    /// Bytes copied from the file.
    pub file_bytes: u64,
    /// Bytes occupied in memory (the rest is zeroed bss).
    pub mem_bytes: u64,
}

impl Segment {
    /// End address (exclusive) in guest memory.
    pub fn end_gpa(&self) -> u64 {
        self.gpa + self.mem_bytes
    }
}

/// A checked payload image.
#[derive(Debug, Clone)]
pub struct PayloadImage {
    /// Entry point.
    pub entry: u64,
    /// Loadable segments in file order.
    pub segments: Vec<Segment>,
    /// Highest protocol version the image declares with its `HVMM` note
    /// (1 when it has none).
    pub max_protocol_version: u32,
}

const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
const HVMM_NOTE_NAME: &[u8] = b"HVMM\0";
const HVMM_NOTE_TYPE_VERSION: u32 = 1;

/// Scans an ELF note area for the `HVMM` version note.
fn hvmm_note_version(notes: &[u8]) -> Option<u32> {
    let mut at = 0usize;
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while at + 12 <= notes.len() {
        let name_bytes = u32_at(notes, at) as usize;
        let desc_bytes = u32_at(notes, at + 4) as usize;
        let note_type = u32_at(notes, at + 8);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align4(name_bytes)?)?;
        let next = desc_at.checked_add(align4(desc_bytes)?)?;
        if next > notes.len() {
            return None;
        }
        if &notes[name_at..name_at + name_bytes] == HVMM_NOTE_NAME
            && note_type == HVMM_NOTE_TYPE_VERSION
            && desc_bytes == 4
        {
            return Some(u32_at(notes, desc_at));
        }
        at = next;
    }
    None
}

/// The protocol version declared by the image's notes, from `PT_NOTE`
/// segments or, failing that, `SHT_NOTE` sections.
fn declared_version(bytes: &[u8], phoff: usize, phentsize: usize, phnum: usize) -> u32 {
    let area = |offset: u64, len: u64| -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        bytes.get(start..end)
    };
    for i in 0..phnum {
        let ph = &bytes[phoff + i * phentsize..phoff + i * phentsize + PHDR_BYTES];
        if u32_at(ph, 0) == PT_NOTE {
            if let Some(v) = area(u64_at(ph, 8), u64_at(ph, 32)).and_then(hvmm_note_version) {
                return v;
            }
        }
    }
    let shoff = u64_at(bytes, 40) as usize;
    let shentsize = u16_at(bytes, 58) as usize;
    let shnum = u16_at(bytes, 60) as usize;
    for i in 0..shnum {
        let Some(sh) = shoff
            .checked_add(i * shentsize)
            .and_then(|at| bytes.get(at..at.checked_add(64)?))
        else {
            break;
        };
        if shentsize >= 64 && u32_at(sh, 4) == SHT_NOTE {
            if let Some(v) = area(u64_at(sh, 24), u64_at(sh, 32)).and_then(hvmm_note_version) {
                return v;
            }
        }
    }
    1
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Parses and checks an image. `ram_contains(start, len)` says whether a
/// guest range lies inside guest RAM; `ram` describes RAM for messages.
pub fn parse(
    bytes: &[u8],
    ram_contains: impl Fn(u64, u64) -> bool,
    ram: &str,
) -> Result<PayloadImage, ElfError> {
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfError::BadMagic);
    }
    if bytes.len() < EHDR_BYTES {
        return Err(ElfError::Truncated(format!(
            "{} bytes, shorter than an ELF64 header",
            bytes.len()
        )));
    }
    if bytes[4] != 2 {
        return Err(ElfError::Unsupported("not ELF64 (32-bit class)".into()));
    }
    if bytes[5] != 1 {
        return Err(ElfError::Unsupported("big-endian".into()));
    }
    let e_type = u16_at(bytes, 16);
    let e_machine = u16_at(bytes, 18);
    if e_machine != EM_X86_64 {
        return Err(ElfError::Unsupported(format!(
            "machine {e_machine}, not x86-64 (62)"
        )));
    }
    if e_type != ET_EXEC {
        let what = if e_type == 3 {
            "ET_DYN (position-independent; link with -no-pie -static)".to_string()
        } else {
            format!("type {e_type}, not ET_EXEC")
        };
        return Err(ElfError::Unsupported(what));
    }
    let entry = u64_at(bytes, 24);
    let phoff = u64_at(bytes, 32) as usize;
    let phentsize = u16_at(bytes, 54) as usize;
    let phnum = u16_at(bytes, 56) as usize;
    if phnum > 0 && phentsize < PHDR_BYTES {
        return Err(ElfError::Unsupported(format!(
            "program header entries of {phentsize} bytes"
        )));
    }
    let table_end = phoff
        .checked_add(phnum.saturating_mul(phentsize))
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| ElfError::Truncated("program header table beyond end of file".into()))?;
    debug_assert!(table_end <= bytes.len());

    let mut segments = Vec::new();
    for i in 0..phnum {
        let ph = &bytes[phoff + i * phentsize..phoff + i * phentsize + PHDR_BYTES];
        let p_type = u32_at(ph, 0);
        match p_type {
            PT_INTERP => return Err(ElfError::Dynamic("PT_INTERP")),
            PT_DYNAMIC => return Err(ElfError::Dynamic("PT_DYNAMIC")),
            PT_LOAD => {}
            _ => continue,
        }
        let index = segments.len();
        let file_offset = u64_at(ph, 8);
        let gpa = u64_at(ph, 24);
        let file_bytes = u64_at(ph, 32);
        let mem_bytes = u64_at(ph, 40);
        if mem_bytes == 0 {
            continue;
        }
        if file_bytes > mem_bytes {
            return Err(ElfError::FileLargerThanMemory(index));
        }
        if file_offset
            .checked_add(file_bytes)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(ElfError::Truncated(format!(
                "segment {index} data beyond end of file"
            )));
        }
        if gpa < VMM_REGION_BYTES {
            return Err(ElfError::BelowVmmRegion {
                index,
                start: gpa,
                limit: VMM_REGION_BYTES,
            });
        }
        let end = gpa.saturating_add(mem_bytes);
        if !ram_contains(gpa, mem_bytes) {
            return Err(ElfError::OutsideRam {
                index,
                start: gpa,
                end,
                ram: ram.to_string(),
            });
        }
        segments.push(Segment {
            gpa,
            file_offset: file_offset as usize,
            file_bytes,
            mem_bytes,
        });
    }
    if segments.is_empty() {
        return Err(ElfError::NoSegments);
    }
    for (i, a) in segments.iter().enumerate() {
        for (j, b) in segments.iter().enumerate().skip(i + 1) {
            if a.gpa < b.end_gpa() && b.gpa < a.end_gpa() {
                return Err(ElfError::Overlap {
                    first: i,
                    second: j,
                });
            }
        }
    }
    if !segments
        .iter()
        .any(|s| entry >= s.gpa && entry < s.end_gpa())
    {
        return Err(ElfError::EntryOutside(entry));
    }
    let max_protocol_version = declared_version(bytes, phoff, phentsize, phnum);
    Ok(PayloadImage {
        entry,
        segments,
        max_protocol_version,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a minimal ELF with the given (paddr, filesz, memsz) segments.
    pub(crate) fn build_elf(e_type: u16, entry: u64, segs: &[(u64, u64, u64)]) -> Vec<u8> {
        let phoff = EHDR_BYTES;
        let data_off = phoff + segs.len() * PHDR_BYTES;
        let mut out = vec![0u8; data_off];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[16..18].copy_from_slice(&e_type.to_le_bytes());
        out[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        out[24..32].copy_from_slice(&entry.to_le_bytes());
        out[32..40].copy_from_slice(&(phoff as u64).to_le_bytes());
        out[52..54].copy_from_slice(&(EHDR_BYTES as u16).to_le_bytes());
        out[54..56].copy_from_slice(&(PHDR_BYTES as u16).to_le_bytes());
        out[56..58].copy_from_slice(&(segs.len() as u16).to_le_bytes());
        let mut file_off = data_off as u64;
        for (i, (paddr, filesz, memsz)) in segs.iter().enumerate() {
            let ph = phoff + i * PHDR_BYTES;
            out[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
            out[ph + 8..ph + 16].copy_from_slice(&file_off.to_le_bytes());
            out[ph + 16..ph + 24].copy_from_slice(&paddr.to_le_bytes());
            out[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
            out[ph + 32..ph + 40].copy_from_slice(&filesz.to_le_bytes());
            out[ph + 40..ph + 48].copy_from_slice(&memsz.to_le_bytes());
            file_off += filesz;
        }
        for (i, (_, filesz, _)) in segs.iter().enumerate() {
            out.extend(std::iter::repeat_n(0x90u8 + i as u8, *filesz as usize));
        }
        out
    }

    fn ram_512m(start: u64, len: u64) -> bool {
        start.checked_add(len).is_some_and(|end| end <= 512 << 20)
    }

    #[test]
    fn accepts_a_good_image() {
        let elf = build_elf(
            ET_EXEC,
            0x200010,
            &[(0x200000, 0x100, 0x2000), (0x400000, 8, 8)],
        );
        let img = parse(&elf, ram_512m, "512 MiB").unwrap();
        assert_eq!(img.entry, 0x200010);
        assert_eq!(img.segments.len(), 2);
        assert_eq!(img.segments[0].mem_bytes, 0x2000);
        assert_eq!(img.segments[1].gpa, 0x400000);
    }

    #[test]
    fn the_hvmm_note_declares_the_protocol_version() {
        let mut elf = build_elf(ET_EXEC, 0x200000, &[(0x200000, 16, 16)]);
        assert_eq!(parse(&elf, ram_512m, "").unwrap().max_protocol_version, 1);
        // Append a note segment: name "HVMM\0" padded to 8, type 1, desc 2.
        let note_off = elf.len() as u64;
        let mut note = Vec::new();
        for word in [5u32, 4, 1] {
            note.extend_from_slice(&word.to_le_bytes());
        }
        note.extend_from_slice(b"HVMM\0\0\0\0");
        note.extend_from_slice(&2u32.to_le_bytes());
        elf.extend_from_slice(&note);
        // Turn the (only) program header into two: keep PT_LOAD, add PT_NOTE
        // by rewriting the table at the end of the file.
        let phoff = elf.len();
        let load: Vec<u8> = elf[EHDR_BYTES..EHDR_BYTES + PHDR_BYTES].to_vec();
        elf.extend_from_slice(&load);
        let mut ph = vec![0u8; PHDR_BYTES];
        ph[..4].copy_from_slice(&PT_NOTE.to_le_bytes());
        ph[8..16].copy_from_slice(&note_off.to_le_bytes());
        ph[32..40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        elf.extend_from_slice(&ph);
        elf[32..40].copy_from_slice(&(phoff as u64).to_le_bytes());
        elf[56..58].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(parse(&elf, ram_512m, "").unwrap().max_protocol_version, 2);
    }

    #[test]
    fn refuses_bad_images_with_reasons() {
        assert_eq!(
            parse(b"hello world", ram_512m, "").unwrap_err(),
            ElfError::BadMagic
        );
        let dynamic = build_elf(3, 0x200000, &[(0x200000, 16, 16)]);
        let err = parse(&dynamic, ram_512m, "").unwrap_err();
        assert!(err.to_string().contains("-no-pie"), "{err}");
        let low = build_elf(ET_EXEC, 0x100000, &[(0x100000, 16, 16)]);
        assert!(matches!(
            parse(&low, ram_512m, "").unwrap_err(),
            ElfError::BelowVmmRegion { .. }
        ));
        let high = build_elf(ET_EXEC, 0x2000_0000, &[(0x2000_0000, 16, 16)]);
        let err = parse(&high, ram_512m, "512 MiB").unwrap_err();
        assert!(err.to_string().contains("--mem"), "{err}");
        let overlap = build_elf(
            ET_EXEC,
            0x200000,
            &[(0x200000, 16, 0x1000), (0x200800, 16, 16)],
        );
        assert!(matches!(
            parse(&overlap, ram_512m, "").unwrap_err(),
            ElfError::Overlap { .. }
        ));
        let entry = build_elf(ET_EXEC, 0x300000, &[(0x200000, 16, 16)]);
        assert_eq!(
            parse(&entry, ram_512m, "").unwrap_err(),
            ElfError::EntryOutside(0x300000)
        );
        let mut truncated = build_elf(ET_EXEC, 0x200000, &[(0x200000, 64, 64)]);
        truncated.truncate(truncated.len() - 10);
        assert!(matches!(
            parse(&truncated, ram_512m, "").unwrap_err(),
            ElfError::Truncated(_)
        ));
        let mut wrong_machine = build_elf(ET_EXEC, 0x200000, &[(0x200000, 16, 16)]);
        wrong_machine[18] = 40;
        assert!(matches!(
            parse(&wrong_machine, ram_512m, "").unwrap_err(),
            ElfError::Unsupported(_)
        ));
        let short = &build_elf(ET_EXEC, 0x200000, &[(0x200000, 16, 16)])[..40];
        assert!(matches!(
            parse(short, ram_512m, "").unwrap_err(),
            ElfError::Truncated(_)
        ));
    }
}
