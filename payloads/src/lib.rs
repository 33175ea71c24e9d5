//! Guest payloads for hugevmm, built from source.
//!
//! A payload is a small static x86-64 ELF that hugevmm runs directly on
//! every vCPU in 64-bit user mode (see `docs/PAYLOAD_PROTOCOL.md`). This
//! crate ships:
//!
//! - the built-in payloads (`src/guest/*.c`), compiled by `build.rs` with the
//!   system C compiler and embedded in the crate: [`all`], [`find`];
//! - the payload SDK (`sdk/`: `hvmm.h`, `hvmm.c`, `virtio.h`, `virtio.c`,
//!   `start.S`, `hvmm.ld`) for writing other payloads: [`sdk_dir`],
//!   [`compile_command`], [`CFLAGS`], [`SDK_SOURCES`]. Every payload built
//!   with it carries the ELF note that opts in to protocol version 2
//!   (virtio-mmio devices).

#![deny(missing_docs)]

use std::path::Path;
use std::process::Command;

mod gcc;

pub use gcc::{CFLAGS, SDK_SOURCES};

/// A payload embedded in this crate.
#[derive(Debug)]
pub struct Builtin {
    /// Short name, as given to `hugevmm run --payload NAME`.
    pub name: &'static str,
    /// One line: what it does and its `key=value` arguments.
    pub description: &'static str,
    /// The ELF image.
    pub elf: &'static [u8],
}

macro_rules! builtin {
    ($name:literal, $description:literal) => {
        Builtin {
            name: $name,
            description: $description,
            elf: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".elf")),
        }
    };
}

static BUILTINS: &[Builtin] = &[
    builtin!(
        "hello",
        "every vCPU prints `hello from vcpu <i> of <n>` and exits 0 (no arguments)"
    ),
    builtin!(
        "seqwrite",
        "sequential 8-byte writes over each vCPU's share of the working set \
         (bytes=SIZE, default all free RAM; passes=N, 1 to 10^6, default 1)"
    ),
    builtin!(
        "randwrite",
        "random 8-byte writes, as many as seqwrite, within each vCPU's share \
         (bytes=SIZE; passes=N, 1 to 10^6, default 1; seed=N, default 1)"
    ),
    builtin!(
        "mixed",
        "scattered hot pages beside a stream: one hot 4 KiB page in each of \
         hot=N chunks (default 128) checked and rewritten every round, while \
         each round writes the next 2 MiB of a stream=SIZE stream (default \
         512M; passes=N over it, 1 to 10^6, default 2); hot chunks and stream \
         must fit in free RAM; exit 1 on a wrong hot word"
    ),
    builtin!(
        "kv",
        "key-value store under a YCSB-B-like load: a heap=SIZE heap (default \
         512M; with its version table of 4 bytes per object, within free RAM) \
         of object=BYTES objects (a power of two from 64 to 4096, default 1024) \
         placed by a hash permutation, so hot objects sit in every 2 MiB chunk; \
         a load writes them all, then ops=N operations per vCPU (0 to 10^12, \
         default 5000000) pick keys by Zipf-like popularity (theta=X, 0 to 2, \
         default 0.99: on 2 vCPUs with the defaults about 63 % of operations \
         touch the hottest 1 % of objects, 81 % the hottest 10 %); reads=PERCENT \
         (0 to 100, default 95) of them read and check the whole object, the \
         rest bump its version and rewrite it; check=0|1 (default 1) checks \
         every object at the end; exit 1 on a mismatch, naming key, slot and \
         expected and found version (lose=N, default 0: vCPU 0 loses its Nth \
         update, to see the checks fail; seed=N, default 1)"
    ),
    builtin!(
        "phases",
        "a hot set that moves and changes size: phases=N phases (1 to 10^6, \
         default 6) of ops=N random 4 KiB page touches per vCPU each (0 to \
         10^12, default 2000000) in a heap=SIZE heap (default 512M, at least \
         4M per vCPU; with its generation table of 4 bytes per page, within \
         free RAM); phase p's set, by p mod 6, in sixteenths of the heap: \
         small [0,1), large [0,4), moved [12,13), scattered (one page in 64 of \
         the whole heap, 8 in every 2 MiB chunk), small-again [0,1), \
         large-moved [8,12); every touch checks the page's last generation and \
         writes the next, each phase ends checking all its pages; exit 1 on a \
         mismatch (seed=N, default 1; warm=1: each vCPU first writes all its \
         pages of the heap once, so the phases' sets are the only memory in \
         use afterwards, default 0)"
    ),
    builtin!(
        "verify",
        "data integrity: vCPUs interleave 4 KiB pages inside 2 MiB chunks, write \
         and check generations in scrambled orders, exit 1 on a mismatch \
         (bytes=SIZE; passes=N, 0 to 10^6, default 2; seed=N, default 1; \
         cycles=N, default 0: keep writing generations past passes= until N \
         TSC cycles have passed, tsc_khz in --stats-json converts)"
    ),
    builtin!(
        "selftest",
        "VMM test helper (exit=N, 0 to 2^32-1; fault=ud|pf|gp|de; vcpu=K, 0 to \
         vCPUs-1: only that vCPU faults; print=TEXT; args=0|1)"
    ),
    builtin!(
        "blkcheck",
        "virtio-blk check (needs --disk): vCPU 0 writes patterns to the first, \
         last and random sectors in requests of 512 B to 1 MiB, some split over \
         descriptors, flushes, reads back and compares (twice); checks GET_ID and \
         IOERR past the end; prints `blkcheck ok sectors=<n> capacity=<c> id=<id>`, \
         exit 1 on a mismatch, 2 without a disk (sectors=N, 0 to 65536, default 4096; \
         seed=N, default 1). stream=R instead writes R rounds of a stream_mib=M \
         (1 to the free MiB, default 32) \
         buffer of self-describing sectors to the disk, printing `blkcheck stream \
         round=<r>` after each"
    ),
    builtin!(
        "balloon",
        "virtio-balloon check (needs --balloon): vCPU 0 reports whole 2 MiB chunks \
         and half a chunk free through free page reporting, checks the whole ones \
         read as zero (dropped; expect_drop=0 also accepts kept data) and the half \
         one kept its data, inflates and deflates pages; prints `balloon ok dropped_chunks=<n> \
         kept_partial=1`, exit 1 on a wrong result, 2 without a balloon \
         (chunks=N, 1 to 64, default 4; expect_drop=0|1, default 1; stats=0|1, \
         default 1). follow=1 instead waits for the host's target (--balloon-target, \
         `hugevmm ctl ... balloon SIZE`; at most wait_gcycles=N x 2^30 TSC cycles, \
         1 to 100000, default 300), \
         inflates that many pages, sets `actual` and checks whole inflated chunks were \
         dropped; prints `balloon follow ok target_pages=<t> dropped_chunks=<n>`"
    ),
    builtin!(
        "hostile",
        "attacks the VMM from inside: random ports and MMIO on every vCPU while \
         vCPUs 1.. churn memory (for the swap engine), vCPU 0 breaks every virtio \
         device (rings outside RAM or in the VMM region, looping and over-long \
         chains, resets mid-request, notification storms, balloon PFNs outside RAM) \
         and checks a disk still works after each reset; then every vCPU raises \
         an exception. Prints `hostile vcpu=<i> ok ...` and `hostile devices=<d> \
         attacks=<a> broken=<b> recovered=<r>` (ports=N, default 20000; mmio=N, \
         2000; notifies=N, 20000; each 0 to 10^9; bytes=SIZE, at most free RAM \
         less 4 MiB; passes=N, 1 to 10^6, 2; exceptions=0|1, 1; seed=N)"
    ),
];

/// All built-in payloads.
pub fn all() -> &'static [Builtin] {
    BUILTINS
}

/// The built-in payload called `name`.
pub fn find(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// Absolute path of the payload SDK directory (`payloads/sdk`).
pub fn sdk_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/sdk"))
}

/// A command that builds a payload from C (or assembly) `sources` into the
/// ELF `output`, exactly as the built-in payloads are built: `$CC` (default
/// `gcc`) with [`CFLAGS`], the SDK's include directory, linker script,
/// `start.S` and [`SDK_SOURCES`]. Run it and check its status.
pub fn compile_command(sources: &[&Path], output: &Path) -> Command {
    gcc::command(&gcc::cc(), sdk_dir(), sources, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    /// Checks the ELF header and program headers against the protocol.
    fn check_elf(name: &str, elf: &[u8]) {
        assert!(elf.len() > 64, "{name}: too short");
        assert_eq!(&elf[..4], b"\x7fELF", "{name}: ELF magic");
        assert_eq!(elf[4], 2, "{name}: ELFCLASS64");
        assert_eq!(elf[5], 1, "{name}: little endian");
        assert_eq!(u16_at(elf, 16), 2, "{name}: ET_EXEC");
        assert_eq!(u16_at(elf, 18), 62, "{name}: EM_X86_64");
        let entry = u64_at(elf, 24);
        let phoff = u64_at(elf, 32) as usize;
        let phentsize = u16_at(elf, 54) as usize;
        let phnum = u16_at(elf, 56) as usize;
        assert_eq!(phentsize, 56, "{name}: phentsize");
        let mut loads = Vec::new();
        for i in 0..phnum {
            let ph = &elf[phoff + i * phentsize..][..phentsize];
            let p_type = u32_at(ph, 0);
            let (offset, vaddr, paddr) = (u64_at(ph, 8), u64_at(ph, 16), u64_at(ph, 24));
            let (filesz, memsz) = (u64_at(ph, 32), u64_at(ph, 40));
            assert_ne!(p_type, 2, "{name}: PT_DYNAMIC");
            assert_ne!(p_type, 3, "{name}: PT_INTERP");
            if p_type == 1 {
                assert!(paddr >= 0x20_0000, "{name}: PT_LOAD at {paddr:#x}");
                assert_eq!(paddr, vaddr, "{name}: p_paddr != p_vaddr");
                assert!(filesz <= memsz, "{name}: filesz > memsz");
                assert!(
                    offset + filesz <= elf.len() as u64,
                    "{name}: segment past EOF"
                );
                loads.push((paddr, paddr + memsz));
            }
        }
        assert!(!loads.is_empty(), "{name}: no PT_LOAD");
        loads.sort();
        for pair in loads.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "{name}: overlapping segments");
        }
        assert!(
            loads
                .iter()
                .any(|&(start, end)| (start..end).contains(&entry)),
            "{name}: entry {entry:#x} outside the segments"
        );
    }

    /// The HVMM notes (name "HVMM", type 1) in a run of ELF notes: their
    /// descriptors. Other notes are skipped; a malformed note fails.
    fn hvmm_notes_in(name: &str, notes: &[u8]) -> Vec<Vec<u8>> {
        let align4 = |n: usize| (n + 3) & !3;
        let mut found = Vec::new();
        let mut at = 0;
        while at < notes.len() {
            assert!(at + 12 <= notes.len(), "{name}: truncated note header");
            let namesz = u32_at(notes, at) as usize;
            let descsz = u32_at(notes, at + 4) as usize;
            let n_type = u32_at(notes, at + 8);
            let name_at = at + 12;
            let desc_at = name_at + align4(namesz);
            let end = desc_at + align4(descsz);
            assert!(end <= notes.len(), "{name}: note past its section");
            if &notes[name_at..name_at + namesz] == b"HVMM\0" && n_type == 1 {
                found.push(notes[desc_at..desc_at + descsz].to_vec());
            }
            at = end;
        }
        found
    }

    /// The HVMM notes of `elf`: descriptors found in PT_NOTE segments, and
    /// (section name, SHF_ALLOC, address, descriptor) found in SHT_NOTE
    /// sections.
    #[allow(clippy::type_complexity)]
    fn hvmm_notes(name: &str, elf: &[u8]) -> (Vec<Vec<u8>>, Vec<(String, bool, u64, Vec<u8>)>) {
        let (phoff, phnum) = (u64_at(elf, 32) as usize, u16_at(elf, 56) as usize);
        let mut in_segments = Vec::new();
        for i in 0..phnum {
            let ph = &elf[phoff + i * 56..][..56];
            if u32_at(ph, 0) == 4 {
                let (offset, filesz) = (u64_at(ph, 8) as usize, u64_at(ph, 32) as usize);
                in_segments.extend(hvmm_notes_in(name, &elf[offset..offset + filesz]));
            }
        }
        let (shoff, shentsize) = (u64_at(elf, 40) as usize, u16_at(elf, 58) as usize);
        let (shnum, shstrndx) = (u16_at(elf, 60) as usize, u16_at(elf, 62) as usize);
        assert_eq!(shentsize, 64, "{name}: shentsize");
        let section = |i: usize| &elf[shoff + i * 64..][..64];
        let strtab_off = u64_at(section(shstrndx), 24) as usize;
        let mut in_sections = Vec::new();
        for i in 0..shnum {
            let sh = section(i);
            if u32_at(sh, 4) != 7 {
                continue; // not SHT_NOTE
            }
            let name_off = strtab_off + u32_at(sh, 0) as usize;
            let len = elf[name_off..].iter().position(|&b| b == 0).unwrap();
            let section_name = String::from_utf8(elf[name_off..name_off + len].to_vec()).unwrap();
            let (offset, size) = (u64_at(sh, 24) as usize, u64_at(sh, 32) as usize);
            let alloc = u64_at(sh, 8) & 2 != 0;
            for desc in hvmm_notes_in(name, &elf[offset..offset + size]) {
                in_sections.push((section_name.clone(), alloc, u64_at(sh, 16), desc));
            }
        }
        (in_segments, in_sections)
    }

    /// Checks that `elf` opts in to protocol version 2: one HVMM note
    /// (type 1, 4-byte descriptor = 2), in a PT_NOTE segment and in the
    /// allocated SHT_NOTE section `.note.hvmm` above 2 MiB.
    fn check_hvmm_note(name: &str, elf: &[u8]) {
        let (segments, sections) = hvmm_notes(name, elf);
        assert_eq!(segments, [vec![2u8, 0, 0, 0]], "{name}: PT_NOTE");
        assert_eq!(sections.len(), 1, "{name}: SHT_NOTE");
        let (section, alloc, addr, desc) = &sections[0];
        assert_eq!(section, ".note.hvmm", "{name}");
        assert!(
            *alloc && *addr >= 0x20_0000,
            "{name}: .note.hvmm at {addr:#x}"
        );
        assert_eq!(desc, &[2, 0, 0, 0], "{name}");
    }

    #[test]
    fn builtins_carry_the_protocol_2_note() {
        for b in all() {
            check_hvmm_note(b.name, b.elf);
        }
    }

    #[test]
    fn a_note_of_another_type_does_not_count() {
        // hello with its note's type changed from 1 to 9.
        let mut elf = find("hello").unwrap().elf.to_vec();
        let at = elf
            .windows(8)
            .position(|w| w == b"HVMM\0\0\0\0")
            .expect("note name in hello");
        assert_eq!(u32_at(&elf, at - 4), 1);
        elf[at - 4] = 9;
        let (segments, sections) = hvmm_notes("hello", &elf);
        assert!(segments.is_empty() && sections.is_empty());
    }

    #[test]
    fn builtins_are_valid_payload_elfs() {
        for b in all() {
            check_elf(b.name, b.elf);
            // _start is placed first.
            assert_eq!(u64_at(b.elf, 24), 0x20_0000, "{}: entry", b.name);
        }
    }

    #[test]
    fn find_by_name() {
        for b in all() {
            assert!(std::ptr::eq(find(b.name).unwrap(), b));
        }
        assert!(find("nonexistent").is_none());
        let mut names: Vec<_> = all().iter().map(|b| b.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all().len(), "duplicate names");
    }

    #[test]
    fn every_guest_source_is_a_builtin() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guest");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "c") {
                let name = path.file_stem().unwrap().to_str().unwrap();
                assert!(
                    find(name).is_some(),
                    "{name}.c is built but not listed in BUILTINS"
                );
            }
        }
    }

    /// The keys of a payload's argument table (`{ "key", HVMM_ARG_...`).
    fn argument_keys(source: &str) -> Vec<String> {
        source
            .split("{ \"")
            .skip(1)
            .filter_map(|rest| {
                let (key, after) = rest.split_once('"')?;
                after
                    .trim_start_matches([',', ' '])
                    .starts_with("HVMM_ARG_")
                    .then(|| key.to_string())
            })
            .collect()
    }

    /// `hugevmm payloads` prints the descriptions: every argument a
    /// payload parses is named there (verify's cycles= was not).
    #[test]
    fn every_argument_is_in_the_description() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guest");
        for builtin in all() {
            let source = std::fs::read_to_string(dir.join(format!("{}.c", builtin.name))).unwrap();
            let keys = argument_keys(&source);
            assert!(
                !keys.is_empty() || builtin.name == "hello",
                "{}: no argument table found",
                builtin.name
            );
            for key in keys {
                assert!(
                    builtin.description.contains(&format!("{key}=")),
                    "{}: {key}= is not in its description: {}",
                    builtin.name,
                    builtin.description
                );
            }
        }
    }

    #[test]
    fn sdk_dir_has_the_sdk() {
        for file in ["hvmm.h", "virtio.h", "start.S", "hvmm.ld"]
            .into_iter()
            .chain(SDK_SOURCES.iter().copied())
        {
            assert!(sdk_dir().join(file).is_file(), "{file} missing");
        }
        assert!(sdk_dir().is_absolute());
    }

    /// Disassembles every built-in and rejects instructions that cannot run
    /// (or must not be used) at CPL 3 in a hugevmm guest. Skipped when
    /// objdump is not installed.
    #[test]
    fn builtins_use_only_user_mode_instructions() {
        let dir = std::env::temp_dir().join(format!("payloads-objdump-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for b in all() {
            let path = dir.join(b.name);
            std::fs::write(&path, b.elf).unwrap();
            let out = match Command::new("objdump").arg("-d").arg(&path).output() {
                Ok(out) if out.status.success() => out,
                // Installed but failing on our own ELF: that is a finding.
                Ok(out) => panic!(
                    "objdump -d {} failed ({}): {}",
                    path.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => {
                    test_resources::skip(
                        "builtins_use_only_user_mode_instructions",
                        test_resources::Resource::Objdump,
                        format!("cannot run objdump ({e}); apt-get install binutils"),
                    );
                    return;
                }
            };
            let text = String::from_utf8(out.stdout).unwrap();
            for line in text.lines() {
                // "  addr:\tbytes\tmnemonic operands"
                let Some(insn) = line.split('\t').nth(2) else {
                    continue;
                };
                let mnemonic = insn.split_whitespace().next().unwrap_or("");
                let forbidden = insn.contains("%fs:")
                    || insn.contains("%gs:")
                    || insn.contains("%ymm")
                    || insn.contains("%zmm")
                    || matches!(
                        mnemonic,
                        "syscall" | "sysenter" | "int" | "int3" | "into" | "hlt" | "cli" | "sti"
                    );
                // selftest's fault=ud and fault=gp, and hostile's
                // exceptions, do this on purpose.
                let deliberate = matches!(b.name, "selftest" | "hostile")
                    && (mnemonic == "ud2" || insn.contains("%cr0"));
                let trap = mnemonic == "ud2" || insn.contains("%cr");
                assert!(
                    deliberate || !(forbidden || trap),
                    "{}: forbidden instruction: {line}",
                    b.name
                );
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn compile_command_builds_an_external_payload() {
        let dir = std::env::temp_dir().join(format!("payloads-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("mine.c");
        std::fs::write(
            &src,
            "#include \"hvmm.h\"\n\
             int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info)\n\
             { hvmm_printf(\"mine %u/%u\\n\", vcpu, info->vcpu_count); return 7; }\n",
        )
        .unwrap();
        let elf = dir.join("mine");
        let out = compile_command(&[&src], &elf).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "warnings: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let image = std::fs::read(&elf).unwrap();
        check_elf("mine", &image);
        check_hvmm_note("mine", &image);
        std::fs::remove_dir_all(&dir).ok();
    }
}
