//! Restoring a whole unit a fault thread holds (`Loading`): from the
//! store, from the parking area, or as zero; and resolving a fault on a
//! unit that is resident already. Used by the fault service and by the
//! prefetcher; below the split layer, above the installer.
//!
//! A restore never reads or writes an empty page of a registered range
//! (guest RAM or the parking area): it would fault into its own
//! userfaultfd and deadlock. It reads only buffers (unregistered) and
//! parked units (populated by construction, see `evict`).

use std::sync::Arc;

use super::error::SwapError;
use super::geometry::Geometry;
use super::install::Installer;
use super::lifecycle::Lifecycle;
use super::outcome::Outcome;
use super::recycle::RestoreBuffers;
use super::stats::{add, bump, Counters, FaultSource};
use crate::chunk::{ChunkTable, Restored, UnitState};
use crate::index::UnitIndex;
use crate::store::{SharedStore, SlotId};
use crate::uffd::FaultKind;

/// Restores whole units.
pub(crate) struct Restorer {
    pub geo: Arc<Geometry>,
    pub table: Arc<ChunkTable>,
    pub store: SharedStore,
    pub installer: Arc<Installer>,
    pub buffers: Arc<RestoreBuffers>,
    pub counters: Arc<Counters>,
    pub life: Arc<Lifecycle>,
    /// Restored units are installed write-protected and keep their store
    /// slot until written (`EngineConfig::track_clean`, where the kernel
    /// supports it).
    pub track_clean: bool,
}

/// How a unit restored without a store copy was installed.
fn restored(huge: bool) -> Restored {
    Restored {
        huge,
        clean_slot: None,
        write_protected: false,
        prefetched: false,
    }
}

impl Restorer {
    /// Zero-fills an absent unit.
    pub fn restore_zero(&self, unit: UnitIndex, loading: UnitState) -> Result<Outcome, SwapError> {
        let huge = self.installer.zero_fill(unit)?;
        bump(&self.counters.faults.zero);
        self.table
            .finish_restore(unit.into(), loading, restored(huge));
        self.installer.wake(unit, Some(FaultSource::Zero))
    }

    /// Reads a stored unit back. Clean tracking (install write-protected,
    /// keep the store slot) is skipped when the fault is a write: the write
    /// that is waiting would un-protect the unit and free the slot at once,
    /// at the cost of one more fault round trip per restore (through KVM, a
    /// vCPU exit). `prefetch`: no fault asked for it (see `prefetch`); the
    /// unit is marked and counted as a prefetch, not a fault.
    pub fn restore_from_store(
        &self,
        unit: UnitIndex,
        loading: UnitState,
        slot: SlotId,
        write: bool,
        prefetch: bool,
    ) -> Result<Outcome, SwapError> {
        let s = self;
        let buf = s.buffers.for_overwrite();
        let (range, offset) = s.buffers.place(&buf);
        // SAFETY: the buffer is this thread's until given back, is populated
        // (a pool buffer, or a recycled page checked whole), so writing it
        // never faults into the userfaultfd, and nothing else accesses it.
        let data = unsafe { range.slice_mut(offset, s.geo.unit_bytes) };
        if let Err(e) = s.store.read(slot, s.geo.unit_store_key(unit), data) {
            s.buffers.give_back_populated(buf);
            // Never zero-fill: the unit stays Loading, its faulting threads
            // stay blocked, and the VMM exits.
            s.life.fatal(&SwapError::unit_store(
                format!("restore the swapped-out chunk at {}", s.geo.unit_name(unit)),
                e,
            ));
            return Ok(Outcome::Blocked);
        }
        add(&s.counters.bytes_read, s.geo.unit_bytes);
        if !prefetch {
            bump(&s.counters.faults.store);
        }
        let clean = s.track_clean && !write;
        let huge = s.installer.install_read_back(unit, buf, clean)?;
        let slot_kept = if clean {
            Some(slot)
        } else {
            s.store.free(slot);
            None
        };
        s.table.finish_restore(
            unit.into(),
            loading,
            Restored {
                huge,
                clean_slot: slot_kept,
                write_protected: clean,
                prefetched: prefetch,
            },
        );
        s.installer.wake(unit, Some(FaultSource::Store))
    }

    /// Gives a staged unit back to the guest without I/O (see
    /// [`Installer::hand_back`]); if its store write is in flight, the
    /// writer releases the parking slot once this unit is no longer
    /// `Loading`.
    pub fn hand_back(&self, unit: UnitIndex, loading: UnitState) -> Result<Outcome, SwapError> {
        let writing = loading.writing();
        let huge =
            self.installer
                .hand_back(unit, loading.parking_slot(), writing, loading.huge())?;
        bump(&self.counters.faults.staging);
        if writing {
            bump(&self.counters.faults.staging_writing);
        }
        self.table
            .finish_restore(unit.into(), loading, restored(huge));
        self.installer.wake(unit, Some(FaultSource::Staging))
    }

    /// A fault on a unit that is already resident (now claimed as `Loading`
    /// by this thread so no evictor moves it meanwhile).
    pub fn resident_fault(
        &self,
        unit: UnitIndex,
        loading: UnitState,
        resident: UnitState,
        kind: FaultKind,
        address: u64,
    ) -> Result<Outcome, SwapError> {
        let s = self;
        let mut first_write = false;
        let source = (kind == FaultKind::WriteProtect).then_some(FaultSource::WriteProtect);
        if resident.prefetched() {
            bump(&s.counters.prefetch.hits);
        }
        let result = match kind {
            FaultKind::WriteProtect => {
                bump(&s.counters.wp_faults);
                if resident.wp() {
                    // First write since the restore: the store copy goes
                    // stale. Unprotecting the whole unit keeps its PMD.
                    if resident.clean() {
                        s.store.free(resident.store_slot());
                    }
                    first_write = true;
                }
                s.installer.unprotect(unit)
            }
            FaultKind::Missing => match s.installer.mode {
                super::config::InstallMode::Thp | super::config::InstallMode::Small => {
                    // Usually a message for a unit another thread already
                    // restored (EEXIST). It can also be a real hole, left by
                    // someone discarding guest pages: those read as zero.
                    s.installer.zero_hole(address).map(|filled| {
                        if !filled {
                            bump(&s.counters.stale_faults);
                        }
                    })
                }
                super::config::InstallMode::Hugetlb { .. } => {
                    bump(&s.counters.stale_faults);
                    Ok(())
                }
            },
            FaultKind::Minor => Ok(()),
        };
        s.table
            .end_resident_fault(unit.into(), loading, resident, first_write);
        result.map_err(|e| {
            SwapError::unit_uffd(
                format!(
                    "resolve a fault on the resident chunk at {}",
                    s.geo.unit_name(unit)
                ),
                e,
            )
        })?;
        s.installer.wake(unit, source)
    }
}
