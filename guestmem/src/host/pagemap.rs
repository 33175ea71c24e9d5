//! `PAGEMAP_SCAN`: how this process's own memory is mapped.

use std::io;

use super::{AnonMapping, RawRange, HUGE_PAGE_BYTES};
use crate::addr::RegionOffset;

/// `struct page_region` of `PAGEMAP_SCAN` (linux/fs.h).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg` of `PAGEMAP_SCAN` (linux/fs.h).
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// Page categories of `PAGEMAP_SCAN` (linux/fs.h).
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
const PAGE_IS_HUGE: u64 = 1 << 6;

// `_IOWR('f', 16, struct pm_scan_arg)`; module-private like uffd's.
mod nr {
    vmm_sys_util::ioctl_iowr_nr!(pagemap_scan, b'f' as u32, 16, super::PmScanArg);
}

/// Asks the kernel how this process's own memory is mapped, through the
/// `PAGEMAP_SCAN` ioctl on `/proc/self/pagemap` (Linux 6.7; needs no
/// privilege, unlike `kpageflags`). Used to tell whether a 2 MiB range is
/// one huge page before the engine reuses it as a restore buffer: a page
/// table walk, a few microseconds, and exact (unlike `MADV_COLLAPSE`,
/// which would also try to build a huge page, copying 2 MiB).
#[derive(Debug)]
pub struct PagemapScanner {
    file: std::fs::File,
}

impl PagemapScanner {
    /// Opens `/proc/self/pagemap` and checks that the kernel answers
    /// `PAGEMAP_SCAN` (older kernels: `ENOTTY`).
    pub fn open() -> io::Result<PagemapScanner> {
        let file = std::fs::File::open("/proc/self/pagemap")?;
        let scanner = PagemapScanner { file };
        // One scan of an empty range proves the ioctl exists.
        let probe = AnonMapping::new(HUGE_PAGE_BYTES)?;
        scanner.is_huge(probe.range(), RegionOffset::ZERO, HUGE_PAGE_BYTES)?;
        Ok(scanner)
    }

    /// True when all of the sub-range is present and mapped by huge page
    /// table entries (for anonymous memory: PMD-mapped THPs), none of them
    /// the shared huge zero page (a write to it would allocate small
    /// pages).
    pub fn is_huge(&self, range: &RawRange, offset: RegionOffset, len: u64) -> io::Result<bool> {
        range.check(offset, len);
        let start = range.base() + offset.get();
        // Adjacent pages with equal categories are merged into one region,
        // so a wholly huge range comes back as exactly one region; a second
        // one already means "not all huge".
        let mut regions = [PageRegion::default(); 2];
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start,
            end: start + len,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_HUGE | PAGE_IS_PFNZERO,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` is a live `struct pm_scan_arg` whose `vec` points at
        // `regions`, `vec_len` entries the kernel may write; the scan only
        // reads this process's page tables (no WP flag is set), and the
        // range is mapped (see `RawRange::new`).
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(&self.file, nr::pagemap_scan(), &mut arg)
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let whole = PAGE_IS_PRESENT | PAGE_IS_HUGE;
        Ok(ret == 1
            && regions[0].start == start
            && regions[0].end == start + len
            && regions[0].categories == whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AnonHugePages` of the mapping that starts at `base`, from
    /// `/proc/self/smaps`: the kernel's own account, independent of
    /// PAGEMAP_SCAN.
    fn smaps_anon_huge_kib(base: u64) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_vma = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((start, _)) = range.split_once('-') {
                if let Ok(start) = u64::from_str_radix(start, 16) {
                    in_vma = start == base;
                    continue;
                }
            }
            if in_vma {
                if let Some(kib) = line.strip_prefix("AnonHugePages:") {
                    return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
                }
            }
        }
        panic!("no mapping at {base:#x} in /proc/self/smaps");
    }

    /// A mapping of 3 huge pages whose first one the kernel confirms is a
    /// THP (smaps). A fault in a `MADV_HUGEPAGE` range takes a THP when
    /// one is free, `MADV_COLLAPSE` compacts for one; a few attempts ride
    /// out a moment without a free huge page.
    fn mapping_with_a_huge_first_page() -> AnonMapping {
        for _ in 0..20 {
            let m = AnonMapping::new(3 * HUGE_PAGE_BYTES).unwrap();
            let r = m.range();
            r.advise_hugepage(RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .unwrap();
            r.touch(RegionOffset::ZERO, HUGE_PAGE_BYTES);
            if smaps_anon_huge_kib(r.base()) < HUGE_PAGE_BYTES / 1024 {
                let _ = r.collapse(RegionOffset::ZERO, HUGE_PAGE_BYTES);
            }
            if smaps_anon_huge_kib(r.base()) == HUGE_PAGE_BYTES / 1024 {
                return m;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no transparent huge page after 20 faults and MADV_COLLAPSEs (THP disabled, or host memory too fragmented)");
    }

    #[test]
    fn pagemap_scan_tells_huge_pages_from_small_and_empty_ones() {
        let scanner = PagemapScanner::open().expect("PAGEMAP_SCAN (Linux >= 6.7)");
        let empty = AnonMapping::new(HUGE_PAGE_BYTES).unwrap();
        assert!(
            !scanner
                .is_huge(empty.range(), RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .unwrap(),
            "empty"
        );

        let m = mapping_with_a_huge_first_page();
        let r = m.range();
        assert!(
            scanner
                .is_huge(r, RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .unwrap(),
            "THP"
        );

        r.advise_nohugepage(RegionOffset::new(HUGE_PAGE_BYTES), HUGE_PAGE_BYTES)
            .unwrap();
        r.touch(RegionOffset::new(HUGE_PAGE_BYTES), HUGE_PAGE_BYTES);
        assert!(
            !scanner
                .is_huge(r, RegionOffset::new(HUGE_PAGE_BYTES), HUGE_PAGE_BYTES)
                .unwrap(),
            "small pages"
        );

        // Half populated: never huge.
        r.advise_nohugepage(RegionOffset::new(2 * HUGE_PAGE_BYTES), HUGE_PAGE_BYTES)
            .unwrap();
        r.touch(RegionOffset::new(2 * HUGE_PAGE_BYTES), HUGE_PAGE_BYTES / 2);
        assert!(!scanner
            .is_huge(r, RegionOffset::new(2 * HUGE_PAGE_BYTES), HUGE_PAGE_BYTES)
            .unwrap());
    }
}
