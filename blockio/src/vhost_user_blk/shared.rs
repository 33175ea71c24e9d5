//! Memory shared with the backend: one memfd mapped here and, through
//! `VHOST_USER_SET_MEM_TABLE`, in the backend. It holds this client's rings,
//! request headers and status bytes, and the data buffers requests move
//! through; never guest RAM or the swap engine's own memory.
//!
//! Why a copy into this area rather than sharing the callers' buffers: a
//! backend can only map memory that has a file behind it (a memfd, a
//! hugetlbfs file), and the swap engine's parking area and restore
//! buffers must be private anonymous memory, because `UFFDIO_MOVE` moves
//! only anonymous pages (it fails with `EINVAL` on a shared mapping). So a
//! unit crosses this area by one `memcpy` each way.
//!
//! The area is "guest physical" address 0 onwards for the backend: a
//! descriptor's address is an offset into the memfd.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

/// Bytes of one allocation page of the data area.
pub(crate) const DATA_PAGE_BYTES: usize = 4096;

/// Bytes of a 2 MiB hugetlb page, the area's page where the host has them.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A memfd and its shared mapping; unmapped when dropped (the backend's
/// own mapping keeps the pages until it lets go too).
///
/// In 2 MiB hugetlb pages where the host's pool can reserve them, else in
/// 4 KiB pages. Why: the backend reads and writes these pages with
/// O_DIRECT, and a 2 MiB unit in 4 KiB pages is 512 pages to pin and 512
/// segments, more than one request of a disk takes (128 segments on this
/// host's virtio disk), where in one huge page it is one segment. Measured
/// (seqwrite `bytes=768M passes=3`, 2 vCPUs, `--mem-limit 256M`,
/// qemu-storage-daemon on an O_DIRECT file, alternated runs): 2.09 and
/// 2.18 s with huge pages against 2.77 and 2.92 s without, the file store
/// on the same file 1.56-1.79 s. Shared memory cannot have transparent
/// huge pages unless the host enables them for shmem (`never` by
/// default), so hugetlb is the way; SPDK's backends need a hugetlb pool
/// anyway.
pub(crate) struct SharedArea {
    file: File,
    base: *mut u8,
    len_bytes: usize,
    /// Why the area is in 4 KiB pages, when it is.
    small_pages_why: Option<String>,
}

// SAFETY: the mapping is plain shared memory; every access goes through
// raw pointers under the owner's locking (the client's state mutex), and
// the backend's concurrent accesses are to memory it was handed by the
// rings' protocol.
unsafe impl Send for SharedArea {}
// SAFETY: as above.
unsafe impl Sync for SharedArea {}

impl SharedArea {
    /// A new zeroed area of at least `len_bytes` (a multiple of 4 KiB):
    /// in 2 MiB hugetlb pages (the length rounded up to them) if the
    /// host's pool can reserve them, else in 4 KiB pages.
    pub(crate) fn new(len_bytes: usize) -> io::Result<SharedArea> {
        let huge_len_bytes = len_bytes.next_multiple_of(HUGE_PAGE_BYTES);
        match SharedArea::with_pages(huge_len_bytes, true) {
            Ok(area) => Ok(area),
            Err(huge_error) => {
                let mut area = SharedArea::with_pages(len_bytes, false)?;
                area.small_pages_why = Some(format!(
                    "the host's pool could not reserve {} free 2 MiB hugetlb pages for it ({huge_error}); as root, `echo $(( $(cat /proc/sys/vm/nr_hugepages) + {} )) > /proc/sys/vm/nr_hugepages` adds them",
                    huge_len_bytes / HUGE_PAGE_BYTES,
                    huge_len_bytes / HUGE_PAGE_BYTES
                ));
                Ok(area)
            }
        }
    }

    /// A new zeroed area of exactly `len_bytes`, in hugetlb pages or not.
    /// A hugetlb mapping reserves its pages at `mmap` (it fails with
    /// `ENOMEM` when the pool is short), so a later touch cannot fail.
    fn with_pages(len_bytes: usize, huge: bool) -> io::Result<SharedArea> {
        let flags = if huge {
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB
        } else {
            libc::MFD_CLOEXEC
        };
        // SAFETY: memfd_create reads a NUL-terminated name we own and
        // returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"hugevmm-vhost-user-blk".as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned to us and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len_bytes as u64)?;
        // SAFETY: a new shared mapping of a file we own, at an address the
        // kernel picks; it aliases no Rust object.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedArea {
            file,
            base: base.cast(),
            len_bytes,
            small_pages_why: None,
        })
    }

    /// Why the area is in 4 KiB pages rather than 2 MiB ones; `None` when
    /// it is in 2 MiB pages.
    pub(crate) fn small_pages_why(&self) -> Option<&str> {
        self.small_pages_why.as_deref()
    }

    /// The memfd, for `SET_MEM_TABLE`.
    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The mapping's address here.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Bytes of the area.
    pub(crate) fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The address of `offset` here.
    ///
    /// # Panics
    ///
    /// If `offset` is past the end.
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        assert!(
            offset <= self.len_bytes,
            "offset {offset} past the shared area"
        );
        // wrapping_add: inside the mapping (checked above).
        self.base.wrapping_add(offset)
    }
}

impl Drop for SharedArea {
    fn drop(&mut self) {
        // SAFETY: our own mapping, whose pointers die with self.
        unsafe { libc::munmap(self.base.cast(), self.len_bytes) };
    }
}

/// First-fit allocation of runs of pages in the data part of the area.
///
/// Hand-written: a few dozen requests are in flight at most, so a bitmap
/// scan is cheap, and no allocator crate manages offsets in foreign memory.
#[derive(Debug)]
pub(crate) struct DataPages {
    used: Vec<bool>,
    free_pages: usize,
}

impl DataPages {
    /// `pages` free pages.
    pub(crate) fn new(pages: usize) -> DataPages {
        DataPages {
            used: vec![false; pages],
            free_pages: pages,
        }
    }

    /// Pages in all.
    pub(crate) fn pages(&self) -> usize {
        self.used.len()
    }

    /// Takes `count` consecutive pages; the first page's index, or `None`
    /// when no run that long is free now.
    pub(crate) fn take(&mut self, count: usize) -> Option<usize> {
        if count == 0 || count > self.free_pages {
            return None;
        }
        let mut run = 0;
        for i in 0..self.used.len() {
            run = if self.used[i] { 0 } else { run + 1 };
            if run == count {
                let first = i + 1 - count;
                self.used[first..=i].fill(true);
                self.free_pages -= count;
                return Some(first);
            }
        }
        None
    }

    /// Gives back what [`Self::take`] returned.
    ///
    /// # Panics
    ///
    /// If a page of the run is free already (a double release would give
    /// one buffer to two requests).
    pub(crate) fn give_back(&mut self, first: usize, count: usize) {
        for page in &mut self.used[first..first + count] {
            assert!(*page, "data page released twice");
            *page = false;
        }
        self.free_pages += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_taken_first_fit_and_given_back() {
        let mut d = DataPages::new(8);
        assert_eq!(d.take(3), Some(0));
        assert_eq!(d.take(3), Some(3));
        assert_eq!(d.take(3), None, "2 pages left");
        d.give_back(0, 3);
        assert_eq!(d.take(2), Some(0));
        assert_eq!(d.take(2), Some(6));
        assert_eq!(d.take(1), Some(2));
        assert_eq!(d.take(1), None);
        assert_eq!(d.take(0), None);
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn a_double_release_is_caught() {
        let mut d = DataPages::new(4);
        let first = d.take(2).unwrap();
        d.give_back(first, 2);
        d.give_back(first, 2);
    }

    #[test]
    fn the_area_is_shared_through_its_memfd() {
        let any = SharedArea::new(2 * DATA_PAGE_BYTES).unwrap();
        match any.small_pages_why() {
            None => assert_eq!(any.len_bytes(), HUGE_PAGE_BYTES),
            Some(why) => {
                assert!(why.contains("nr_hugepages"), "{why}");
                assert_eq!(any.len_bytes(), 2 * DATA_PAGE_BYTES);
            }
        }
        let small = SharedArea::with_pages(2 * DATA_PAGE_BYTES, false).unwrap();
        assert_eq!(small.len_bytes(), 2 * DATA_PAGE_BYTES);
        for area in [any, small] {
            // SAFETY: inside our own mapping; nothing else uses it.
            unsafe { area.at(DATA_PAGE_BYTES).write(7) };
            let mut byte = [0u8; 1];
            let copy = area.file.try_clone().unwrap();
            std::os::unix::fs::FileExt::read_exact_at(&copy, &mut byte, DATA_PAGE_BYTES as u64)
                .unwrap();
            assert_eq!(byte[0], 7);
        }
    }
}
