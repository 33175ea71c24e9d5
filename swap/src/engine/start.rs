//! The phases of [`super::SwapEngine::start`], in the order it takes them:
//! what memory this is, whether the region fits the unit and the store,
//! what the kernel's userfaultfd offers, registering guest RAM, the
//! staging area (parking slots and restore buffers), and the unit table.

use super::buffers::{BufferPool, PoolMode};
use super::config::InstallMode;
use super::config::{EngineConfig, ManagedRegion, MemoryKind, SwapUnit};
use super::error::SwapError;
use super::parking::Parking;
use crate::chunk::ChunkTable;
use crate::index::UnitIndex;
use crate::store::SharedStore;
use crate::uffd::{feature, mode, MoveOptions, Uffd, Userfaults};
use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{AnonMapping, PagemapScanner, RawRange, HUGE_PAGE_BYTES};
use std::sync::Arc;

/// How guest RAM of `kind` is swapped in `unit`s.
pub(super) fn backing_for(kind: MemoryKind, unit: SwapUnit) -> Result<InstallMode, SwapError> {
    match (kind, unit) {
        (MemoryKind::Anonymous, SwapUnit::Huge2M | SwapUnit::Auto) => Ok(InstallMode::Thp),
        (MemoryKind::Anonymous, SwapUnit::Small4K) => Ok(InstallMode::Small),
        (MemoryKind::Hugetlb { memfd }, SwapUnit::Huge2M | SwapUnit::Auto) => {
            Ok(InstallMode::Hugetlb { memfd })
        }
        (MemoryKind::Hugetlb { .. }, SwapUnit::Small4K) => Err(SwapError::Config(
            "hugetlb guest memory has 2 MiB pages; use --swap-unit 2m or anonymous (THP) memory for 4k units".into(),
        )),
    }
}

/// Checks that the region is whole units and the store has slots of the
/// unit; returns the number of units.
pub(super) fn check_region(
    region: &ManagedRegion,
    store: &SharedStore,
    unit: SwapUnit,
) -> Result<usize, SwapError> {
    let unit_bytes = unit.bytes();
    if region.host_base.raw() & (unit_bytes - 1) != 0
        || region.len_bytes & (unit_bytes - 1) != 0
        || region.len_bytes == 0
    {
        return Err(SwapError::Config(format!(
            "region {:#x}+{:#x} is not aligned to the {} unit; align guest RAM and its size to {unit_bytes} bytes",
            region.host_base.raw(),
            region.len_bytes,
            unit
        )));
    }
    if store.unit_bytes() as u64 != unit_bytes {
        return Err(SwapError::Config(format!(
            "store {} has {}-byte slots but the swap unit is {unit_bytes} bytes; create the store with the same unit",
            store.describe(),
            store.unit_bytes()
        )));
    }
    let units = (region.len_bytes / unit_bytes) as usize;
    if units > u32::MAX as usize {
        return Err(SwapError::Config(
            "more than 2^32 units; use 2m units".into(),
        ));
    }
    Ok(units)
}

/// What the engine does with write-protection, from the kernel's features.
pub(super) struct WpFeatures {
    /// Clean units are tracked (write-protected after a restore from the
    /// store, dropped without a write when still clean).
    pub track_clean: bool,
    /// Guest RAM is registered in WP mode too.
    pub wp_registered: bool,
}

/// Opens the userfaultfd and checks the features `backing` needs.
pub(super) fn open_userfaultfd(
    backing: InstallMode,
    track_clean_wanted: bool,
) -> Result<(Uffd, WpFeatures), SwapError> {
    // Thread ids tell the stall clock which messages are one vCPU's
    // (`engine::stall`); every kernel with the engine's other features has
    // them (Linux 4.14).
    let uffd = Uffd::open(feature::THREAD_ID)
        .map_err(|e| SwapError::uffd("opening the userfaultfd", e))?;
    let is_hugetlb = matches!(backing, InstallMode::Hugetlb { .. });
    let wp_ok = if is_hugetlb {
        uffd.features() & feature::WP_HUGETLBFS_SHMEM != 0
    } else {
        uffd.features() & feature::PAGEFAULT_FLAG_WP != 0
    };
    if is_hugetlb && !wp_ok {
        return Err(SwapError::Config(
            "this kernel's userfaultfd cannot write-protect hugetlbfs (UFFD_FEATURE_WP_HUGETLBFS_SHMEM); hugetlb guest memory cannot be evicted safely, use THP memory".into(),
        ));
    }
    if !is_hugetlb && !uffd.has_move() {
        return Err(SwapError::Config(
            "this kernel's userfaultfd lacks UFFDIO_MOVE (Linux >= 6.8 needed)".into(),
        ));
    }
    let track_clean = track_clean_wanted && wp_ok;
    let features = WpFeatures {
        track_clean,
        // Hugetlb eviction write-protects the unit while copying it out.
        wp_registered: track_clean || is_hugetlb,
    };
    Ok((uffd, features))
}

/// Advises guest RAM for its backing and registers it with `uffd`.
pub(super) fn register_guest(
    uffd: &Uffd,
    region: &ManagedRegion,
    backing: InstallMode,
    wp_registered: bool,
) -> Result<RawRange, SwapError> {
    // SAFETY: the VMM hands us this mapping for the engine's lifetime
    // and accesses it only as guest memory (raw pointers, KVM).
    let guest = unsafe { RawRange::new(region.host_base.raw(), region.len_bytes) };
    match backing {
        InstallMode::Thp => guest
            .advise_hugepage(RegionOffset::ZERO, guest.len())
            .map_err(|e| SwapError::os("madvise(MADV_HUGEPAGE) on guest RAM", e))?,
        // The 4 KiB baseline must not be rescued by khugepaged.
        InstallMode::Small => guest
            .advise_nohugepage(RegionOffset::ZERO, guest.len())
            .map_err(|e| SwapError::os("madvise(MADV_NOHUGEPAGE) on guest RAM", e))?,
        InstallMode::Hugetlb { .. } => {}
    }
    let modes = mode::MISSING | if wp_registered { mode::WP } else { 0 };
    // SAFETY: the VMM hands this mapping to the engine for its lifetime
    // and reaches it only as guest memory (raw pointers, KVM, devices
    // through vm-memory); the fault threads started after this serve its
    // faults until shutdown, and they never touch guest RAM themselves.
    unsafe { uffd.register(guest.addr(RegionOffset::ZERO), guest.len(), modes) }
        .map_err(|e| SwapError::uffd("registering guest RAM", e))?;
    Ok(guest)
}

/// Where evicted units wait for their write and restores are filled.
pub(super) struct StagingArea {
    pub parking: Parking,
    pub parking_registered: bool,
    pub buffers: BufferPool,
    pub pool_mode: PoolMode,
}

/// Maps the parking area and the restore buffers (the parking area is
/// registered by [`register_parking`] where `parking_registered`).
pub(super) fn staging_area(
    backing: InstallMode,
    config: &EngineConfig,
) -> Result<StagingArea, SwapError> {
    let unit_bytes = config.unit.bytes();
    let fault_threads = config.fault_threads.max(1);
    let buffer_count = config.buffer_count.unwrap_or(2 * fault_threads + 4).max(1);
    // Recycled pages stay in their parking slots (see `recycle`): one
    // extra slot per buffer, so they never take slots from evictors.
    let recycle_slots = if backing == InstallMode::Thp {
        buffer_count
    } else {
        0
    };
    let parking = Parking::new(
        config.parking_units_or_default() + recycle_slots,
        unit_bytes,
    )
    .map_err(|e| SwapError::os("mapping the parking area", e))?;
    // Units move in and out of it with UFFDIO_MOVE, whose destination
    // must be registered; hugetlb units are copied instead.
    let parking_registered = !matches!(backing, InstallMode::Hugetlb { .. });
    let pool_mode = if backing == InstallMode::Thp {
        PoolMode::Thp
    } else {
        PoolMode::Reusable
    };
    let buffers = BufferPool::new(buffer_count, unit_bytes, pool_mode)
        .and_then(|pool| {
            if config.hooks.small_restore_buffers() {
                pool.refuse_huge_pages()?;
            }
            Ok(pool)
        })
        .map_err(|e| SwapError::os("mapping restore buffers", e))?;
    Ok(StagingArea {
        parking,
        parking_registered,
        buffers,
        pool_mode,
    })
}

/// Registers the parking area with `uffd` (MISSING mode).
pub(super) fn register_parking(uffd: &Uffd, parking: &Parking) -> Result<(), SwapError> {
    // SAFETY: the parking area is the engine's own mapping, reached
    // through raw addresses only; its holes are filled before any
    // thread reads them (see `parking`).
    unsafe {
        uffd.register(
            parking.raw().addr(RegionOffset::ZERO),
            parking.raw().len(),
            mode::MISSING,
        )
    }
    .map_err(|e| SwapError::uffd("registering the parking area", e))?;
    Ok(())
}

/// What the engine's components get from the kernel side: the calls that
/// move memory in registered ranges, guest RAM, and what the kernel
/// offers for it.
pub(super) struct KernelParts {
    /// The userfaultfd's range calls (the kernel's, or the model's).
    pub userfaults: Arc<dyn Userfaults>,
    /// Guest RAM, registered with `userfaults`.
    pub guest: RawRange,
    /// Clean units are tracked ([`WpFeatures::track_clean`]).
    pub track_clean: bool,
    /// Tells huge restore buffers from split ones ([`pagemap_scanner`]).
    pub pagemap: Option<PagemapScanner>,
    /// `MADV_DONTNEED` frees an empty page table here
    /// ([`empty_page_tables_are_freed`]): the engine may prepare them.
    pub page_tables_freed: bool,
}

/// Whether this kernel frees an empty page table on `MADV_DONTNEED` of its
/// 2 MiB (`CONFIG_PT_RECLAIM`, x86-64 since Linux 6.14), tried once on a
/// scratch chunk registered with `uffd`: prepare a table, discard the
/// chunk, move a THP in, and ask `PAGEMAP_SCAN` whether it maps huge.
/// Without it a prepared table would stay and split every THP moved onto
/// the chunk ([`super::page_tables`]), so the engine prepares none; any
/// failure of the probe answers no.
pub(super) fn empty_page_tables_are_freed(uffd: &Uffd, pagemap: Option<&PagemapScanner>) -> bool {
    let Some(pagemap) = pagemap else {
        return false;
    };
    let probe = || -> Result<bool, String> {
        let chunk = AnonMapping::new(HUGE_PAGE_BYTES).map_err(|e| e.to_string())?;
        let source = AnonMapping::new(HUGE_PAGE_BYTES).map_err(|e| e.to_string())?;
        for m in [&chunk, &source] {
            m.range()
                .advise_hugepage(RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .map_err(|e| e.to_string())?;
        }
        source.range().touch(RegionOffset::ZERO, HUGE_PAGE_BYTES);
        if !pagemap
            .is_huge(source.range(), RegionOffset::ZERO, HUGE_PAGE_BYTES)
            .map_err(|e| e.to_string())?
        {
            return Err("no huge page to move".to_string());
        }
        let at = Hva::new(chunk.range().base());
        // SAFETY: the engine's own fresh mapping, never reached but through
        // raw addresses here, and unregistered below before it is unmapped.
        unsafe { uffd.register(at, HUGE_PAGE_BYTES, mode::MISSING) }.map_err(|e| e.to_string())?;
        let moved = (|| -> Result<bool, String> {
            uffd.prepare_page_table(at).map_err(|e| e.to_string())?;
            chunk
                .range()
                .discard(RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .map_err(|e| e.to_string())?;
            // SAFETY: both mappings are this function's own, the chunk
            // empty, and neither is referenced but by raw address.
            unsafe {
                uffd.move_all(
                    at,
                    Hva::new(source.range().base()),
                    HUGE_PAGE_BYTES,
                    MoveOptions::default(),
                )
            }
            .map_err(|e| e.to_string())?;
            pagemap
                .is_huge(chunk.range(), RegionOffset::ZERO, HUGE_PAGE_BYTES)
                .map_err(|e| e.to_string())
        })();
        let _ = uffd.unregister(at, HUGE_PAGE_BYTES);
        moved
    };
    match probe() {
        Ok(true) => true,
        Ok(false) => {
            log::info!(
                "swap engine: this kernel keeps an empty page table after MADV_DONTNEED (no CONFIG_PT_RECLAIM): a guest write over an evicted chunk costs the kernel's zeroing of a huge page"
            );
            false
        }
        Err(e) => {
            log::info!(
                "swap engine: could not check whether MADV_DONTNEED frees an empty page table ({e}): page tables are not prepared under evicted chunks"
            );
            false
        }
    }
}

/// The scanner that tells huge restore buffers from split ones (THP only;
/// without it evicted pages are not reused as buffers).
pub(super) fn pagemap_scanner(backing: InstallMode) -> Option<PagemapScanner> {
    if backing != InstallMode::Thp {
        return None;
    }
    match PagemapScanner::open() {
        Ok(scanner) => Some(scanner),
        Err(e) => {
            log::warn!(
                "swap engine: PAGEMAP_SCAN on /proc/self/pagemap failed ({e}); evicted huge pages are not reused as restore buffers"
            );
            None
        }
    }
}

/// A populated zero chunk to copy from (hugetlb has no zero-page install).
pub(super) fn zero_source(backing: InstallMode) -> Result<Option<AnonMapping>, SwapError> {
    match backing {
        InstallMode::Hugetlb { .. } => {
            let zero = AnonMapping::new(HUGE_PAGE_BYTES)
                .map_err(|e| SwapError::os("mapping the zero buffer", e))?;
            zero.range().touch(RegionOffset::ZERO, HUGE_PAGE_BYTES);
            Ok(Some(zero))
        }
        _ => Ok(None),
    }
}

/// Whether chunks split here: only 2 MiB chunks of anonymous (THP) memory
/// on a store that keeps pages. `--force-split-every` on anything else is
/// a configuration error (it would test nothing).
pub(super) fn chunks_split(
    backing: InstallMode,
    store: &SharedStore,
    config: &EngineConfig,
) -> Result<bool, SwapError> {
    let enabled = backing == InstallMode::Thp && store.supports_pages();
    if config.force_split_every.is_some() && !enabled {
        let why = match backing {
            InstallMode::Thp => format!("the store {} keeps no pages", store.describe()),
            InstallMode::Hugetlb { .. } => "hugetlb pages cannot be mapped in parts".to_string(),
            InstallMode::Small => "4 KiB units are pages already".to_string(),
        };
        return Err(SwapError::Config(format!(
            "--force-split-every needs 2 MiB swap units of anonymous (THP) memory on a file or mem store: {why}"
        )));
    }
    if config.force_split_every == Some(0) {
        return Err(SwapError::Config(
            "--force-split-every must be at least 1 (1 splits every restore)".into(),
        ));
    }
    Ok(enabled)
}

/// The unit table, with the configured ranges pinned.
pub(super) fn unit_table(
    units: usize,
    config: &EngineConfig,
    backing: InstallMode,
    track_clean: bool,
) -> ChunkTable {
    let unit_bytes = config.unit.bytes();
    let table = ChunkTable::new(
        units,
        unit_bytes,
        backing == InstallMode::Thp && track_clean,
    );
    for &(offset, len) in &config.pinned_offsets {
        let offset = offset.get();
        let first = offset / unit_bytes;
        let end = (offset + len).div_ceil(unit_bytes).min(units as u64);
        for unit in first..end {
            // Nothing else runs yet: the word cannot change under us.
            let _ = table.pin(UnitIndex::new(unit as usize).into());
        }
    }
    table
}
