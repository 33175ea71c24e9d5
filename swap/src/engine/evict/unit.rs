//! Whole-unit eviction: take a resident unit away (moved into a parking
//! slot, or copied for hugetlb), decide whether it is clean, zero or
//! dirty, and write the dirty ones in batches.

use std::time::Duration;

use super::Evictor;
use crate::chunk::{Settled, Tag, UnitState};
use crate::engine::config::InstallMode;
use crate::engine::error::SwapError;
use crate::engine::hash::scan;
use crate::engine::stats::{add, bump};
use crate::index::{ParkingSlot, UnitIndex};
use crate::store::{SlotId, WriteRequest};
use crate::uffd::MoveOptions;
use guestmem::host::{punch_hole, PAGE_BYTES};

impl Evictor<'_> {
    /// Evicts one unit if it is resident and not pinned.
    pub(super) fn evict(&mut self, unit: UnitIndex) -> Result<(), SwapError> {
        let s = self.s;
        let (resident, evicting) = loop {
            let state = s.table.load(unit);
            if state.tag() == Tag::Split {
                return self.evict_split(unit);
            }
            if state.tag() != Tag::Resident || state.pinned() {
                return Ok(());
            }
            let epoch = s
                .counters
                .evictions
                .load(std::sync::atomic::Ordering::Relaxed) as u16;
            if let Ok(evicting) = s.table.begin_evict_at(unit.into(), state, epoch) {
                if state.prefetched() {
                    bump(&s.counters.prefetch.waste);
                }
                break (state, evicting);
            }
        };
        bump(&s.counters.evictions);
        let p = match self.parking_slot() {
            Ok(p) => p,
            Err(e) => {
                s.table.abort_evict(unit.into(), evicting, resident);
                return Err(e);
            }
        };
        match self.take_away(unit, evicting, p) {
            Ok(true) => {}
            Ok(false) => {
                s.parking.release(p);
                s.table.abort_evict(unit.into(), evicting, resident);
                self.report.busy_units += 1;
                bump(&s.counters.evict_busy);
                return Ok(());
            }
            Err(e) => {
                // The unit may be half moved: leave it Evicting (faults on it
                // block) and let the VMM exit.
                s.life.fatal(&e);
                return Err(e);
            }
        }
        self.classify(unit, evicting, p)
    }

    /// Moves or copies the unit into parking slot `p`. `Ok(false)`: the
    /// kernel refused (pinned pages); nothing was taken.
    pub(super) fn take_away(
        &mut self,
        unit: UnitIndex,
        resident: UnitState,
        p: ParkingSlot,
    ) -> Result<bool, SwapError> {
        let s = self.s;
        let src = s.geo.unit_addr(unit);
        let dst = s.parking.addr(p);
        let len = s.geo.unit_bytes;
        match s.mode {
            InstallMode::Thp | InstallMode::Small => {
                let options = MoveOptions {
                    allow_src_holes: true,
                    dont_wake: false,
                };
                let mut tries = 0;
                let mut stray_checked = false;
                loop {
                    // SAFETY: this evictor owns the unit (Evicting) and the
                    // parking slot; both are reached through raw addresses.
                    match unsafe { s.uffd.move_all(dst, src, len, options) } {
                        Ok(()) => break,
                        // The slot was taken free, so it should be empty:
                        // stray zero pages are dropped and the move tried
                        // again (nothing moved: the first page found in
                        // the way ends a move, and one that moved part is
                        // put back first).
                        Err(e) if e.is_eexist() && !stray_checked => {
                            stray_checked = true;
                            let moved = e.done_bytes();
                            if moved > 0 {
                                // SAFETY: as for the move above, reversed.
                                unsafe { s.uffd.move_all(src, dst, moved, options) }.map_err(
                                    |e| {
                                        SwapError::uffd(
                                            format!(
                                                "putting back the partly moved chunk at {}",
                                                s.geo.unit_name(unit)
                                            ),
                                            e,
                                        )
                                    },
                                )?;
                            }
                            let what =
                                format!("an eviction of the chunk at {}", s.geo.unit_name(unit));
                            // SAFETY: this evictor owns slot `p` (taken for
                            // this unit, not yet released).
                            if let Err(held) = unsafe { s.parking.clear_strays_for_move(p, &what) }
                            {
                                return Err(SwapError::uffd(
                                    format!(
                                        "moving out the chunk at {}: {held}",
                                        s.geo.unit_name(unit)
                                    ),
                                    e,
                                ));
                            }
                        }
                        Err(e)
                            if e.errno() == Some(libc::EBUSY)
                                && e.done_bytes() == 0
                                && tries < 3 =>
                        {
                            tries += 1;
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        Err(e) if e.errno() == Some(libc::EBUSY) => {
                            // Put back what moved, if anything, and give up.
                            let moved = e.done_bytes();
                            if moved > 0 {
                                let back = MoveOptions {
                                    allow_src_holes: true,
                                    dont_wake: false,
                                };
                                // SAFETY: as for the move above, reversed.
                                unsafe { s.uffd.move_all(src, dst, moved, back) }.map_err(|e| {
                                    SwapError::uffd(
                                        format!(
                                            "putting back the partly moved chunk at {}",
                                            s.geo.unit_name(unit)
                                        ),
                                        e,
                                    )
                                })?;
                            }
                            return Ok(false);
                        }
                        Err(e) => {
                            let why = if e.is_eexist() {
                                format!(
                                    " into parking slot {p}, which was not empty again after its stray zero pages were dropped (an engine bug)"
                                )
                            } else {
                                String::new()
                            };
                            return Err(SwapError::uffd(
                                format!("moving out the chunk at {}{why}", s.geo.unit_name(unit)),
                                e,
                            ));
                        }
                    }
                }
                // The chunk holds nothing now: a table under it spares the
                // next write fault there the kernel's zeroing of a huge page.
                s.page_tables.prepare(unit);
                self.fill_holes(p)?;
            }
            InstallMode::Hugetlb { memfd } => {
                if !resident.wp() {
                    s.uffd.write_protect(src, len).map_err(|e| {
                        SwapError::uffd(
                            format!("write-protecting the chunk at {}", s.geo.unit_name(unit)),
                            e,
                        )
                    })?;
                }
                let offset = s.geo.unit_offset(unit);
                s.parking
                    .raw()
                    .copy_from(s.parking.offset(p), &s.geo.guest, offset, len);
                punch_hole(memfd, offset.get(), len).map_err(|e| {
                    SwapError::os(
                        format!("punching the hugetlb chunk at {}", s.geo.unit_name(unit)),
                        e,
                    )
                })?;
            }
        }
        Ok(true)
    }

    /// Maps the zero page over every page of parking slot `p` that the
    /// move left empty (the unit had holes).
    pub(super) fn fill_holes(&mut self, p: ParkingSlot) -> Result<(), SwapError> {
        let s = self.s;
        s.parking
            .raw()
            .residency(s.parking.offset(p), s.geo.unit_bytes, &mut self.residency)
            .map_err(|e| SwapError::os("mincore on the parking area", e))?;
        for (i, &present) in self.residency.iter().enumerate() {
            if present & 1 == 0 {
                let page = s.parking.addr(p).offset_by(i as u64 * PAGE_BYTES);
                match s.uffd.zeropage(page, PAGE_BYTES, true) {
                    Ok(()) => {}
                    // Present after all (mincore reports swapped-out pages as
                    // absent).
                    Err(e) if e.is_eexist() => {}
                    Err(e) => return Err(SwapError::uffd("filling a hole in the parking area", e)),
                }
            }
        }
        Ok(())
    }

    /// Decides the fate of a unit parked in `p`.
    pub(super) fn classify(
        &mut self,
        unit: UnitIndex,
        evicting: UnitState,
        p: ParkingSlot,
    ) -> Result<(), SwapError> {
        let s = self.s;
        // SAFETY: slot `p` is populated (moved in and holes filled, or
        // copied) and owned by this thread until released or staged.
        let data = unsafe { s.parking.raw().slice(s.parking.offset(p), s.geo.unit_bytes) };
        // Without a recorded hash the write-protection is exact (the unit
        // was installed write-protected by UFFDIO_COPY): skip the scan.
        let recorded = s.table.hash(unit);
        let content = if evicting.clean() && recorded.is_none() {
            None
        } else {
            Some(scan(data))
        };
        if evicting.clean() {
            let slot = evicting.store_slot();
            let unchanged = match (recorded, content) {
                (Some(hash), Some(content)) => hash == content.hash,
                _ => true,
            };
            if unchanged {
                s.buffers.release_parked(p);
                s.table.settle(unit.into(), evicting, Settled::Clean);
                s.limiter.release(s.limiter.unit_pages());
                self.report.clean_dropped_units += 1;
                bump(&s.counters.clean_drops);
                return Ok(());
            }
            bump(&s.counters.clean_hash_mismatches);
            s.store.free(slot);
        }
        let content = content.unwrap_or_else(|| scan(data));
        if content.zero {
            s.buffers.release_parked(p);
            s.table.settle(unit.into(), evicting, Settled::Zero);
            s.limiter.release(s.limiter.unit_pages());
            self.report.zero_units += 1;
            bump(&s.counters.zero_chunks);
            return Ok(());
        }
        s.table.set_hash(unit, content.hash);
        s.table
            .settle(unit.into(), evicting, Settled::Dirty { parking: p });
        self.units.batch.push((unit, p));
        if self.units.batch.len() >= s.batch_units {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the unit batch and settles its units.
    pub(super) fn flush_units(&mut self) -> Result<(), SwapError> {
        let s = self.s;
        let mut batch = std::mem::take(&mut self.units.batch);
        // Claim the staged units for writing; a unit handed back before this
        // point had its slot released by the fault thread.
        batch.retain(|&(unit, p)| loop {
            let state = s.table.load(unit);
            if state.tag() != Tag::Staged || state.parking_slot() != p || state.writing() {
                return false;
            }
            if s.table.begin_write(unit.into(), state).is_ok() {
                return true;
            }
        });
        if batch.is_empty() {
            return Ok(());
        }
        let requests: Vec<WriteRequest<'_>> = batch
            .iter()
            .map(|&(unit, p)| WriteRequest {
                gpa: s.geo.unit_store_key(unit),
                // SAFETY: slot `p` is populated and stays in place while
                // WRITING is set: the fault path only copies out of it then.
                data: unsafe { s.parking.raw().slice(s.parking.offset(p), s.geo.unit_bytes) },
            })
            .collect();
        let results = s.store.write_batch(&requests);
        drop(requests);
        let mut first_error = None;
        let mut results = results.into_iter();
        for &(unit, p) in &batch {
            match results.next() {
                Some(Ok(slot)) => self.complete(unit, p, Some(slot)),
                Some(Err(e)) => {
                    let error = SwapError::unit_store(
                        format!("swap out the chunk at {}", s.geo.unit_name(unit)),
                        e,
                    );
                    s.life.fatal(&error);
                    self.complete(unit, p, None);
                    first_error.get_or_insert(error);
                }
                None => {
                    s.life.fatal(&SwapError::StoreContract(format!(
                        "store {} returned no result for the chunk at {}",
                        s.store.describe(),
                        s.geo.unit_name(unit)
                    )));
                    self.complete(unit, p, None);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Settles a written unit (`slot`), or keeps it staged after a failed
    /// write (`None`).
    pub(super) fn complete(&mut self, unit: UnitIndex, p: ParkingSlot, slot: Option<SlotId>) {
        let s = self.s;
        loop {
            let state = s.table.load(unit);
            let ours = state.tag() == Tag::Staged && state.parking_slot() == p && state.writing();
            if ours {
                let settled = match slot {
                    Some(slot) => s.table.finish_write(unit.into(), state, slot),
                    None => s.table.fail_write(unit.into(), state),
                };
                if settled.is_err() {
                    continue;
                }
                if slot.is_some() {
                    s.buffers.release_parked(p);
                    s.limiter.release(s.limiter.unit_pages());
                    self.report.written_units += 1;
                    self.report.written_bytes += s.geo.unit_bytes;
                    bump(&s.counters.units_written);
                    add(&s.counters.bytes_written, s.geo.unit_bytes);
                }
                return;
            }
            // Handed back during the write: the stored copy is not needed.
            // Wait until the fault thread finished copying out of `p`.
            if let Some(slot) = slot {
                s.store.free(slot);
            }
            // A fault that failed fatally can stay `Loading` for good, so
            // waiting stops on a failure as on shutdown.
            let state = s
                .table
                .wait_while(unit, &|st| st.tag() == Tag::Loading, &|| {
                    s.life.stopping() || s.life.failed()
                });
            if state.tag() != Tag::Loading {
                // The fault thread has finished copying out of `p`.
                s.buffers.release_parked(p);
            }
            // else: stopping or failed while a fault thread may still copy
            // out of `p`; leave the slot allocated.
            return;
        }
    }
}
