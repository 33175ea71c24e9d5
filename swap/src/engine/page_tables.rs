//! Empty page tables under the chunks of THP guest RAM that are not in
//! memory, so that a guest write there does not make the kernel zero a
//! 2 MiB huge page for nothing.
//!
//! A write fault on a chunk whose PMD holds nothing, in an area advised
//! `MADV_HUGEPAGE`, makes the kernel allocate and zero a huge page before
//! it checks for a userfaultfd, and free it again when it finds one
//! (`__do_huge_pmd_anonymous_page` in Linux 6.18). The faulting vCPU pays
//! that zeroing on every 2 MiB fault: most of a vCPU's host time in the
//! seqwrite job (a profile of `hugevmm run --payload seqwrite`: 85 % of the
//! vCPU threads' samples in `clear_page_erms` under
//! `vma_alloc_anon_folio_pmd`). Over an empty page table the fault takes
//! the 4 KiB path instead, which zeroes one page at most before it hands
//! the fault over.
//!
//! So a chunk that leaves memory whole (evicted, or never touched at
//! start) gets an empty page table ([`Userfaults::prepare_page_table`]),
//! and the table goes again (`MADV_DONTNEED` of the chunk, which frees an
//! empty table here, `CONFIG_PT_RECLAIM`) just before a huge page is moved
//! onto the chunk: `UFFDIO_MOVE` of a huge page onto a page table splits
//! it into 512 pages. A flag per chunk says whether a table was prepared,
//! so that only those installs pay the `MADV_DONTNEED`.
//!
//! Only performance rides on this: a table that was not prepared costs the
//! zeroing again, and a table left in place costs the huge mapping (the
//! install still succeeds, mapped as pages). A kernel that keeps empty
//! tables after `MADV_DONTNEED` (no `CONFIG_PT_RECLAIM`, before 6.14)
//! would leave every one in place, so the engine probes that once at
//! start and prepares none there.
//!
//! What it costs: a 4 KiB page table per prepared chunk (1/512 of the
//! chunks that hold nothing), kernel memory that the engine's limit does
//! not count and the memory cgroup charges; and one `MADV_DONTNEED` per
//! huge install on a prepared chunk. That call also drops anything
//! mapped there, where a move onto a populated chunk failed with `EEXIST`
//! before: the installs it precedes own a `Loading` unit whose range the
//! state machine keeps empty.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use super::config::InstallMode;
use super::geometry::Geometry;
use crate::index::{UnitIndex, UnitRange};
use crate::uffd::Userfaults;

/// Warnings about a table that could not be prepared or removed: the
/// first few, then silence (each costs only performance).
const MAX_WARNINGS: u32 = 4;

/// The page tables prepared under chunks of guest RAM.
pub(crate) struct PageTables {
    uffd: Arc<dyn Userfaults>,
    geo: Arc<Geometry>,
    /// Per unit: an empty page table was prepared under it, to be removed
    /// before a huge page is moved in. Empty when not in use.
    prepared: Box<[AtomicBool]>,
    warnings: AtomicU32,
}

impl PageTables {
    /// Page tables for guest RAM installed in `mode`: in use only for THP
    /// (2 MiB units moved in as huge pages; hugetlb has no such zeroing
    /// and 4 KiB units are advised `MADV_NOHUGEPAGE`), and only where
    /// `MADV_DONTNEED` frees an empty table again (`freed`, probed at
    /// start: `start::empty_page_tables_are_freed`), or every THP moved
    /// onto a prepared chunk would be split.
    pub fn new(
        uffd: Arc<dyn Userfaults>,
        geo: Arc<Geometry>,
        mode: InstallMode,
        freed: bool,
    ) -> PageTables {
        let units = if matches!(mode, InstallMode::Thp) && freed {
            geo.units
        } else {
            0
        };
        PageTables {
            uffd,
            geo,
            prepared: (0..units).map(|_| AtomicBool::new(false)).collect(),
            warnings: AtomicU32::new(0),
        }
    }

    fn in_use(&self) -> bool {
        !self.prepared.is_empty()
    }

    fn warn(&self, what: &str, unit: UnitIndex, error: &dyn std::fmt::Display) {
        if self.warnings.fetch_add(1, Ordering::Relaxed) < MAX_WARNINGS {
            log::warn!(
                "swap engine: {what} the chunk at {} failed ({error}); its faults may cost more",
                self.geo.unit_name(unit)
            );
        }
    }

    /// Prepares an empty page table under `unit`, which holds nothing now:
    /// a chunk just moved out whole, or one not touched yet. The caller
    /// owns the unit or no one can have touched it.
    pub fn prepare(&self, unit: UnitIndex) {
        if !self.in_use() {
            return;
        }
        match self.uffd.prepare_page_table(self.geo.unit_addr(unit)) {
            Ok(()) => self.prepared[unit.get()].store(true, Ordering::Release),
            Err(e) => self.warn("preparing a page table under", unit, &e),
        }
    }

    /// Prepares a page table under every unit of `units` (at start: what
    /// is mapped already is left as it is; such a chunk's first huge
    /// install after its eviction then pays one `MADV_DONTNEED` of an
    /// empty range).
    pub fn prepare_all(&self, units: UnitRange) {
        for unit in units {
            self.prepare(unit);
        }
    }

    /// Removes the table prepared under `unit`, if any, before a huge page
    /// is moved onto it. The caller owns the unit (`Loading`), whose range
    /// holds nothing.
    pub fn remove_before_huge_install(&self, unit: UnitIndex) {
        if !self.in_use() || !self.prepared[unit.get()].swap(false, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self
            .geo
            .guest
            .discard(self.geo.unit_offset(unit), self.geo.unit_bytes)
        {
            self.warn("removing the page table under", unit, &e);
        }
    }

    /// Whether a table was prepared under `unit` and not removed since.
    #[cfg(test)]
    fn is_prepared(&self, unit: UnitIndex) -> bool {
        self.in_use() && self.prepared[unit.get()].load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::{ManagedRegion, MemoryKind};
    use crate::index::Gpa;
    use crate::uffd::{CopyOptions, MoveOptions, UffdError};
    use guestmem::addr::{Hva, RegionOffset};
    use guestmem::host::AnonMapping;
    use std::sync::Mutex;

    /// Records the chunks it was asked to prepare; fails the third.
    #[derive(Default)]
    struct Kernel {
        prepared: Mutex<Vec<u64>>,
    }

    impl Userfaults for Kernel {
        fn prepare_page_table(&self, chunk: Hva) -> Result<(), UffdError> {
            let mut prepared = self.prepared.lock().unwrap();
            prepared.push(chunk.raw());
            if prepared.len() == 3 {
                return Err(UffdError::Read(std::io::Error::from_raw_os_error(
                    libc::ENOMEM,
                )));
            }
            Ok(())
        }
        fn wake(&self, _: Hva, _: u64) -> Result<(), UffdError> {
            unreachable!()
        }
        fn copy(&self, _: Hva, _: Hva, _: u64, _: CopyOptions) -> Result<(), UffdError> {
            unreachable!()
        }
        fn zeropage(&self, _: Hva, _: u64, _: bool) -> Result<(), UffdError> {
            unreachable!()
        }
        unsafe fn move_pages(
            &self,
            _: Hva,
            _: Hva,
            _: u64,
            _: MoveOptions,
        ) -> Result<(), UffdError> {
            unreachable!()
        }
        fn write_protect(&self, _: Hva, _: u64) -> Result<(), UffdError> {
            unreachable!()
        }
        fn write_unprotect(&self, _: Hva, _: u64, _: bool) -> Result<(), UffdError> {
            unreachable!()
        }
    }

    fn tables(mode: InstallMode) -> (PageTables, Arc<Kernel>, AnonMapping) {
        let chunk = 2 << 20;
        let ram = AnonMapping::new(4 * chunk).unwrap();
        let guest = *ram.range();
        let geo = Arc::new(Geometry {
            region: ManagedRegion {
                host_base: Hva::new(guest.base()),
                len_bytes: 4 * chunk,
                kind: MemoryKind::Anonymous,
                gpa_ranges: vec![(Gpa::new(0), RegionOffset::ZERO, 4 * chunk)],
            },
            guest,
            unit_bytes: chunk,
            units: 4,
        });
        let kernel = Arc::new(Kernel::default());
        (
            PageTables::new(kernel.clone(), geo, mode, true),
            kernel,
            ram,
        )
    }

    #[test]
    fn a_prepared_chunk_is_flagged_until_a_huge_install_removes_its_table() {
        let (t, kernel, ram) = tables(InstallMode::Thp);
        t.prepare_all(UnitRange::all(4));
        assert_eq!(kernel.prepared.lock().unwrap().len(), 4);
        let flagged: Vec<bool> = UnitRange::all(4).map(|u| t.is_prepared(u)).collect();
        assert_eq!(
            flagged,
            [true, true, false, true],
            "a failed preparation is not flagged"
        );
        // The removal discards the chunk: a page written there is gone.
        let unit = UnitIndex::new(1);
        ram.range().touch(RegionOffset::new(2 << 20), 4096);
        t.remove_before_huge_install(unit);
        assert!(!t.is_prepared(unit));
        let mut residency = Vec::new();
        ram.range()
            .residency(RegionOffset::new(2 << 20), 4096, &mut residency)
            .unwrap();
        assert_eq!(residency[0] & 1, 0, "the chunk was discarded");
        // Only once: a second install of the chunk discards nothing.
        ram.range().touch(RegionOffset::new(2 << 20), 4096);
        t.remove_before_huge_install(unit);
        ram.range()
            .residency(RegionOffset::new(2 << 20), 4096, &mut residency)
            .unwrap();
        assert_eq!(residency[0] & 1, 1, "nothing was prepared any more");
    }

    #[test]
    fn only_thp_backing_prepares_tables() {
        for mode in [InstallMode::Small, InstallMode::Hugetlb { memfd: -1 }] {
            let (t, kernel, _ram) = tables(mode);
            t.prepare_all(UnitRange::all(4));
            t.remove_before_huge_install(UnitIndex::new(0));
            assert!(kernel.prepared.lock().unwrap().is_empty(), "{mode:?}");
        }
    }

    #[test]
    fn a_kernel_that_keeps_empty_tables_gets_none_prepared() {
        let (t, kernel, _ram) = tables(InstallMode::Thp);
        let t = PageTables::new(kernel.clone(), t.geo.clone(), InstallMode::Thp, false);
        t.prepare_all(UnitRange::all(4));
        assert!(kernel.prepared.lock().unwrap().is_empty());
    }
}
