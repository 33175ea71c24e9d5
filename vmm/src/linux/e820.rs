//! The BIOS-e820 memory map a Linux guest is given: guestmem's RAM layout
//! with the legacy hole below 1 MiB carved out, exactly what the kernel
//! prints as its `BIOS-e820:` lines.

use guestmem::Layout;

use super::low_mem::{EBDA_GPA, HIGH_MEMORY_GPA};
use vm_memory::Address;

/// The kind of an e820 range, as the kernel numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM (type 1).
    Ram,
    /// Reserved (type 2).
    Reserved,
}

impl E820Kind {
    /// The type number in `struct boot_e820_entry`.
    pub fn type_code(self) -> u32 {
        match self {
            E820Kind::Ram => 1,
            E820Kind::Reserved => 2,
        }
    }

    /// The word the kernel prints for this type.
    #[cfg(test)]
    pub fn kernel_name(self) -> &'static str {
        match self {
            E820Kind::Ram => "usable",
            E820Kind::Reserved => "reserved",
        }
    }
}

/// One e820 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// Guest-physical start.
    pub gpa: u64,
    /// Length of the range.
    pub len_bytes: u64,
    /// What the range is.
    pub kind: E820Kind,
}

impl E820Entry {
    /// The line the kernel prints for this entry (without the printk time
    /// prefix), e.g.
    /// `BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable`.
    #[cfg(test)]
    pub fn kernel_log_line(&self) -> String {
        format!(
            "BIOS-e820: [mem {:#018x}-{:#018x}] {}",
            self.gpa,
            self.gpa + self.len_bytes - 1,
            self.kind.kernel_name()
        )
    }
}

/// The e820 map for a RAM layout: the low region split around the legacy
/// area `[EBDA_GPA, 1 MiB)`, which real firmware owns and the kernel expects
/// to be reserved, then every other region as usable RAM. The 3–4 GiB gap
/// is left out: it holds devices, not RAM.
pub fn e820_map(layout: &Layout) -> Vec<E820Entry> {
    let mut map = Vec::new();
    for region in layout.regions() {
        let (gpa, end) = (region.gpa.raw_value(), region.end_gpa().raw_value());
        if gpa == 0 && end > HIGH_MEMORY_GPA {
            map.push(E820Entry {
                gpa: 0,
                len_bytes: EBDA_GPA,
                kind: E820Kind::Ram,
            });
            map.push(E820Entry {
                gpa: EBDA_GPA,
                len_bytes: HIGH_MEMORY_GPA - EBDA_GPA,
                kind: E820Kind::Reserved,
            });
            map.push(E820Entry {
                gpa: HIGH_MEMORY_GPA,
                len_bytes: end - HIGH_MEMORY_GPA,
                kind: E820Kind::Ram,
            });
        } else {
            // Layouts start at 4 MiB, so only a region not at 0 gets here.
            map.push(E820Entry {
                gpa,
                len_bytes: region.len_bytes,
                kind: E820Kind::Ram,
            });
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn small_ram_has_the_legacy_hole() {
        let map = e820_map(&Layout::new(256 * MIB).unwrap());
        let lines: Vec<String> = map.iter().map(E820Entry::kernel_log_line).collect();
        assert_eq!(
            lines,
            [
                "BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable",
                "BIOS-e820: [mem 0x000000000009fc00-0x00000000000fffff] reserved",
                "BIOS-e820: [mem 0x0000000000100000-0x000000000fffffff] usable",
            ]
        );
    }

    #[test]
    fn ram_above_3g_continues_at_4g() {
        let map = e820_map(&Layout::new(5 * GIB).unwrap());
        assert_eq!(map.len(), 4);
        assert_eq!(
            map[2],
            E820Entry {
                gpa: MIB,
                len_bytes: 3 * GIB - MIB,
                kind: E820Kind::Ram
            }
        );
        assert_eq!(
            map[3],
            E820Entry {
                gpa: 4 * GIB,
                len_bytes: 2 * GIB,
                kind: E820Kind::Ram
            }
        );
        assert_eq!(
            map[3].kernel_log_line(),
            "BIOS-e820: [mem 0x0000000100000000-0x000000017fffffff] usable"
        );
        let usable: u64 = map
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.len_bytes)
            .sum();
        assert_eq!(usable, 5 * GIB - (MIB - EBDA_GPA));
    }

    #[test]
    fn type_codes_match_the_kernel() {
        assert_eq!(E820Kind::Ram.type_code(), 1);
        assert_eq!(E820Kind::Reserved.type_code(), 2);
    }
}
