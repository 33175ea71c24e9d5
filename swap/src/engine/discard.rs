//! Dropping guest memory the guest declared free (balloon inflation, free
//! page reporting): each unit becomes `Absent` without being written, its
//! store slot is released, and its next touch is a zero fill.
//!
//! Transitions taken here (see `chunk.rs`): `Resident → Evicting → Absent`
//! (this thread owns the unit while it zaps the memory, so a concurrent
//! guest touch waits and then sees zeros, never half-dropped content) and
//! `Stored(slot) → Absent` (one compare-and-swap). `Staged` units are in an
//! evictor's write batch: wait until the writer settles them. A split chunk
//! is merged back as absent (`collapse::discard_split`).

use super::{Backing, Shared, SwapError};
use crate::chunk::{Settled, Tag};
use guestmem::host::punch_hole;
use std::ops::Range;
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

/// Drops every unit in `units`.
pub(crate) fn discard_units(s: &Shared, units: Range<usize>) -> Result<DiscardReport, SwapError> {
    let mut report = DiscardReport::default();
    for unit in units {
        discard_unit(s, unit, &mut report)?;
    }
    Ok(report)
}

fn discard_unit(s: &Shared, unit: usize, report: &mut DiscardReport) -> Result<(), SwapError> {
    loop {
        if s.stopping() {
            return Err(SwapError::ShuttingDown);
        }
        if s.failed() {
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
                s.table.wait_settled(unit, &|| s.stopping() || s.failed());
            }
            Tag::Split => {
                if super::collapse::discard_split(s, unit)?.is_some() {
                    report.split_units += 1;
                    return Ok(());
                }
            }
            // Owned by an evictor's write batch until the write completes.
            Tag::Staged => {
                report.waits_staged += 1;
                std::thread::sleep(Duration::from_millis(1));
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
                let offset = unit as u64 * s.unit_bytes;
                let zapped = match s.backing {
                    Backing::Thp | Backing::Small => s.guest.discard(offset, s.unit_bytes),
                    Backing::Hugetlb { memfd } => punch_hole(memfd, offset, s.unit_bytes),
                };
                if let Err(e) = zapped {
                    // Nothing was released: the unit keeps its content.
                    s.table.abort_evict(unit.into(), evicting, state);
                    return Err(SwapError::os(
                        format!("dropping the free chunk at {}", s.unit_name(unit)),
                        e,
                    ));
                }
                if state.clean() {
                    s.store.free(state.store_slot());
                    report.clean_resident_units += 1;
                }
                s.table.settle(unit.into(), evicting, Settled::Discarded);
                s.limiter.release(s.limiter.unit_pages());
                report.resident_units += 1;
                return Ok(());
            }
        }
    }
}
