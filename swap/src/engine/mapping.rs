//! Safe wrappers over the memory-management syscalls the engine uses:
//! anonymous mappings, madvise, mincore, hole punching, and the
//! `PAGEMAP_SCAN` query of how a range is mapped.
//!
//! Guest RAM, the parking area and the buffer pool are never accessed
//! through Rust references that outlive a call: the kernel moves pages in
//! and out of them behind our back (UFFDIO_MOVE, MADV_DONTNEED), so they
//! are described by [`RawRange`], whose constructor is where the caller
//! promises that.

use std::io;
use std::os::fd::RawFd;

/// 2 MiB, the PMD size on x86-64.
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;
/// The base page size.
pub const PAGE_BYTES: u64 = 4096;

/// An address range of this process managed through raw pointers only.
#[derive(Debug, Clone, Copy)]
pub struct RawRange {
    base: u64,
    len: u64,
}

impl RawRange {
    /// Describes `[base, base+len)`.
    ///
    /// # Safety
    ///
    /// The range must be mapped for as long as the value is used, and no
    /// Rust reference to it may be live while the kernel can change it
    /// (discard, move): the engine reads and writes it only via short-lived
    /// slices it creates itself while it owns the unit.
    pub unsafe fn new(base: u64, len: u64) -> RawRange {
        RawRange { base, len }
    }

    /// Start address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, len: u64) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset:#x}+{len:#x} outside {:#x}",
            self.len
        );
    }

    fn advise(&self, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
        self.check(offset, len);
        // SAFETY: the range lies inside memory the constructor's caller
        // vouched for; madvise changes page state, never Rust-visible
        // references (none are live, see `new`).
        let ret = unsafe {
            libc::madvise(
                (self.base + offset) as *mut libc::c_void,
                len as usize,
                advice,
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Frees the pages of a sub-range (anonymous memory reads as empty
    /// afterwards; in a userfaultfd range the next touch faults MISSING).
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_DONTNEED)
    }

    /// Asks for transparent huge pages on a sub-range.
    pub fn advise_hugepage(&self, offset: u64, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_HUGEPAGE)
    }

    /// Asks for small pages only on a sub-range.
    pub fn advise_nohugepage(&self, offset: u64, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_NOHUGEPAGE)
    }

    /// Synchronously collapses a fully populated 2 MiB sub-range into a
    /// huge page (succeeds at once if it already is one).
    pub fn collapse(&self, offset: u64, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_COLLAPSE)
    }

    /// Fills `out` with one byte per page of the sub-range, bit 0 set when
    /// the page is present. Never faults pages in.
    pub fn residency(&self, offset: u64, len: u64, out: &mut Vec<u8>) -> io::Result<()> {
        self.check(offset, len);
        let pages = len.div_ceil(PAGE_BYTES) as usize;
        out.clear();
        out.resize(pages, 0);
        // SAFETY: `out` has one byte per page of the range, as mincore
        // writes; the range is mapped (see `new`).
        let ret = unsafe {
            libc::mincore(
                (self.base + offset) as *mut libc::c_void,
                len as usize,
                out.as_mut_ptr(),
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Writes one byte into every page of a sub-range so that all of it is
    /// populated (a THP-eligible range gets a huge page on the first touch).
    ///
    /// Must only be called on ranges no userfaultfd is registered on, or
    /// the calling thread could fault into its own userfaultfd.
    pub fn touch(&self, offset: u64, len: u64) {
        self.check(offset, len);
        let mut addr = self.base + offset;
        while addr < self.base + offset + len {
            // SAFETY: the address lies in mapped, writable memory (see
            // `new`); a volatile write of a zero byte into memory that
            // nobody else uses at this time (the caller owns it).
            unsafe { std::ptr::write_volatile(addr as *mut u8, 0) };
            addr += PAGE_BYTES;
        }
    }

    /// Pointer to `offset` (for the few places that build short-lived
    /// slices while they own the memory).
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        self.check(offset, 0);
        (self.base + offset) as *mut u8
    }

    /// Copies `len` bytes at `src_offset` of `src` into `self` at
    /// `dst_offset`. Both must be populated (no userfaultfd faults).
    pub fn copy_from(&self, dst_offset: u64, src: &RawRange, src_offset: u64, len: u64) {
        self.check(dst_offset, len);
        src.check(src_offset, len);
        let (dst_start, src_start) = (self.base + dst_offset, src.base + src_offset);
        assert!(
            dst_start + len <= src_start || src_start + len <= dst_start,
            "copy_from: [{dst_start:#x}, +{len:#x}) overlaps the source [{src_start:#x}, +{len:#x})"
        );
        // SAFETY: both ranges are mapped and populated, owned by the caller
        // for the duration (raw pointers, no references), and do not
        // overlap (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(src.ptr(src_offset), self.ptr(dst_offset), len as usize)
        };
    }

    /// A shared view of a populated sub-range the caller owns.
    ///
    /// # Safety
    ///
    /// The sub-range must be populated (no holes in a userfaultfd range) and
    /// must not be moved, discarded or written until the slice is dropped.
    pub unsafe fn slice(&self, offset: u64, len: u64) -> &[u8] {
        self.check(offset, len);
        // SAFETY: the caller guarantees the bytes are mapped, populated and
        // unchanged while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr(offset), len as usize) }
    }

    /// A mutable view of a populated sub-range the caller owns exclusively.
    ///
    /// # Safety
    ///
    /// As for [`RawRange::slice`], and no other access may happen while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: the caller guarantees exclusive access to mapped memory.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(offset), len as usize) }
    }
}

/// An anonymous private mapping owned by the engine, aligned to 2 MiB.
#[derive(Debug)]
pub struct AnonMapping {
    range: RawRange,
    map_base: u64,
    map_len: u64,
}

impl AnonMapping {
    /// Maps `len` bytes (rounded up to 2 MiB) of anonymous memory aligned to
    /// 2 MiB.
    pub fn new(len: u64) -> io::Result<AnonMapping> {
        let len = len.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        let map_len = len + HUGE_PAGE_BYTES;
        // SAFETY: a fresh anonymous mapping chosen by the kernel; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map_base = ptr as u64;
        let base = map_base.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        // SAFETY: the mapping was just created and is owned by this value
        // until drop; nothing references it yet.
        let range = unsafe { RawRange::new(base, len) };
        Ok(AnonMapping {
            range,
            map_base,
            map_len,
        })
    }

    /// The aligned usable range.
    pub fn range(&self) -> &RawRange {
        &self.range
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, which no one
        // uses any more (the owner is being dropped).
        unsafe { libc::munmap(self.map_base as *mut libc::c_void, self.map_len as usize) };
    }
}

/// Punches a hole in a (hugetlbfs) file, keeping its size: the pages are
/// freed and the next touch of a mapping faults MISSING.
pub fn punch_hole(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a caller-provided fd only changes that file.
    let ret = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

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
        scanner.is_huge(probe.range(), 0, HUGE_PAGE_BYTES)?;
        Ok(scanner)
    }

    /// True when all of the sub-range is present and mapped by huge page
    /// table entries (for anonymous memory: PMD-mapped THPs), none of them
    /// the shared huge zero page (a write to it would allocate small
    /// pages).
    pub fn is_huge(&self, range: &RawRange, offset: u64, len: u64) -> io::Result<bool> {
        range.check(offset, len);
        let start = range.base() + offset;
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

    #[test]
    #[should_panic(expected = "overlaps the source")]
    fn copy_from_refuses_overlapping_ranges() {
        let mapping = AnonMapping::new(2 * PAGE_BYTES).unwrap();
        let range = *mapping.range();
        range.touch(0, 2 * PAGE_BYTES);
        range.copy_from(0, &range, 100, PAGE_BYTES);
    }

    #[test]
    fn pagemap_scan_tells_huge_pages_from_small_and_empty_ones() {
        let scanner = PagemapScanner::open().expect("PAGEMAP_SCAN (Linux >= 6.7)");
        let m = AnonMapping::new(3 * HUGE_PAGE_BYTES).unwrap();
        let r = m.range();
        assert!(!scanner.is_huge(r, 0, HUGE_PAGE_BYTES).unwrap(), "empty");

        r.advise_hugepage(0, HUGE_PAGE_BYTES).unwrap();
        r.touch(0, HUGE_PAGE_BYTES);
        // The machine may have no free huge page; only a confirmed THP must
        // be reported huge.
        if r.collapse(0, HUGE_PAGE_BYTES).is_ok() {
            assert!(scanner.is_huge(r, 0, HUGE_PAGE_BYTES).unwrap(), "THP");
        }

        r.advise_nohugepage(HUGE_PAGE_BYTES, HUGE_PAGE_BYTES)
            .unwrap();
        r.touch(HUGE_PAGE_BYTES, HUGE_PAGE_BYTES);
        assert!(
            !scanner
                .is_huge(r, HUGE_PAGE_BYTES, HUGE_PAGE_BYTES)
                .unwrap(),
            "small pages"
        );

        // Half populated: never huge.
        r.advise_nohugepage(2 * HUGE_PAGE_BYTES, HUGE_PAGE_BYTES)
            .unwrap();
        r.touch(2 * HUGE_PAGE_BYTES, HUGE_PAGE_BYTES / 2);
        assert!(!scanner
            .is_huge(r, 2 * HUGE_PAGE_BYTES, HUGE_PAGE_BYTES)
            .unwrap());
    }
}
