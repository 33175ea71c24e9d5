//! Dropping guest memory the guest declared free (balloon inflation, free
//! page reporting): each unit becomes `Absent` without being written, its
//! store slot is released, and its next touch is a zero fill.
//!
//! Transitions taken here (see `chunk.rs`): `Resident → Evicting → Absent`
//! (this thread owns the unit while it zaps the memory, so a concurrent
//! guest touch waits and then sees zeros, never half-dropped content) and
//! `Stored(slot) → Absent` (one compare-and-swap). `Staged` units are in an
//! evictor's write batch: wait until the writer settles them. A split chunk
//! is merged back as absent ([`super::collapse::Collapser::discard_split`]).

use std::sync::Arc;

use super::collapse::Collapser;
use super::config::InstallMode;
use super::error::SwapError;
use super::geometry::Geometry;
use super::lifecycle::Lifecycle;
use super::limit::Limiter;
use super::page_tables::PageTables;
use crate::chunk::ChunkTable;
use crate::chunk::{Settled, Tag};
use crate::index::{UnitIndex, UnitRange};
use crate::store::SharedStore;
use guestmem::host::punch_hole;

use std::time::Duration;

/// What a discard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscardReport {
    /// Resident units whose memory was released.
    pub resident_units: u64,
    /// Stored units whose store slot was released.
    pub stored_units: u64,
    /// Units that were already absent.
    pub absent_units: u64,
    /// Pinned units left alone.
    pub pinned_units: u64,
    /// Split chunks dropped whole (their resident pages released, their
    /// slot freed).
    pub split_units: u64,
    /// Of `resident_units`, those that were clean (write-protected with
    /// their store copy kept), whose slot was released too.
    pub clean_resident_units: u64,
    /// Times the discard found a unit being restored (`Loading`) and
    /// waited for the restore to settle.
    pub waits_loading: u64,
    /// Times it found a unit being evicted (`Evicting`) and waited.
    pub waits_evicting: u64,
    /// Times it found a unit in an evictor's write batch (`Staged`) and
    /// waited for the write to settle it.
    pub waits_staged: u64,
}

/// Drops units the guest freed.
pub(crate) struct Discarder {
    pub geo: Arc<Geometry>,
    pub mode: InstallMode,
    pub table: Arc<ChunkTable>,
    pub store: SharedStore,
    pub limiter: Arc<Limiter>,
    pub life: Arc<Lifecycle>,
    /// Merges split chunks (where chunks split).
    pub collapser: Option<Arc<Collapser>>,
    /// Empty page tables under chunks that hold nothing.
    pub page_tables: Arc<PageTables>,
}

impl Discarder {
    /// Drops every unit in `units`.
    pub(crate) fn discard_units(&self, units: UnitRange) -> Result<DiscardReport, SwapError> {
        let s = self;
        let mut report = DiscardReport::default();
        for unit in units {
            s.discard_unit(unit, &mut report)?;
        }
        Ok(report)
    }

    fn discard_unit(&self, unit: UnitIndex, report: &mut DiscardReport) -> Result<(), SwapError> {
        let s = self;
        loop {
            if s.life.stopping() {
                return Err(SwapError::ShuttingDown);
            }
            if s.life.failed() {
                return Err(SwapError::Failed);
            }
            let state = s.table.load(unit);
            if state.pinned() {
                report.pinned_units += 1;
                return Ok(());
            }
            match state.tag() {
                Tag::Absent => {
                    report.absent_units += 1;
                    return Ok(());
                }
                Tag::Loading | Tag::Evicting => {
                    if state.tag() == Tag::Loading {
                        report.waits_loading += 1;
                    } else {
                        report.waits_evicting += 1;
                    }
                    s.table.wait_settled(unit, &|| s.life.giving_up());
                }
                Tag::Split => {
                    let merged = match &s.collapser {
                        Some(collapser) => collapser.discard_split(unit)?,
                        None => None,
                    };
                    if merged.is_some() {
                        report.split_units += 1;
                        return Ok(());
                    }
                }
                // Owned by an evictor's write batch until the write completes.
                Tag::Staged => {
                    report.waits_staged += 1;
                    crate::chunk::poll_pause(Duration::from_millis(1));
                }
                Tag::Stored => {
                    if s.table.discard_stored(unit.into(), state).is_ok() {
                        s.store.free(state.store_slot());
                        report.stored_units += 1;
                        return Ok(());
                    }
                }
                Tag::Resident => {
                    let Ok(evicting) = s.table.begin_evict(unit.into(), state) else {
                        continue;
                    };
                    let offset = s.geo.unit_offset(unit);
                    let zapped = match s.mode {
                        InstallMode::Thp | InstallMode::Small => {
                            s.geo.guest.discard(offset, s.geo.unit_bytes)
                        }
                        InstallMode::Hugetlb { memfd } => {
                            punch_hole(memfd, offset.get(), s.geo.unit_bytes)
                        }
                    };
                    if let Err(e) = zapped {
                        // Nothing was released: the unit keeps its content.
                        s.table.abort_evict(unit.into(), evicting, state);
                        return Err(SwapError::os(
                            format!("dropping the free chunk at {}", s.geo.unit_name(unit)),
                            e,
                        ));
                    }
                    if state.clean() {
                        s.store.free(state.store_slot());
                        report.clean_resident_units += 1;
                    }
                    // The chunk holds nothing now (the guest may use it
                    // again after a deflate): a table under it spares
                    // that write fault the kernel's zeroing of a huge page.
                    s.page_tables.prepare(unit);
                    s.table.settle(unit.into(), evicting, Settled::Discarded);
                    s.limiter.release(s.limiter.unit_pages());
                    report.resident_units += 1;
                    return Ok(());
                }
            }
        }
    }
}
