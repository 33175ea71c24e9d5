//! Fault service: read userfaultfd messages and restore the faulting unit
//! whole, from the store, from the parking area, or as zero.
//!
//! Install paths by backing:
//! - THP (anonymous, 2 MiB): fill a THP buffer and UFFDIO_MOVE it onto the
//!   unit, so the host maps one PMD and KVM then maps 2 MiB. (UFFDIO_COPY on
//!   anonymous memory would install 4 KiB pages.)
//! - hugetlb (2 MiB): UFFDIO_COPY of 2 MiB installs one huge page; with
//!   clean tracking it is installed write-protected in the same call.
//! - small (4 KiB units): UFFDIO_COPY (write-protected when clean) or
//!   UFFDIO_ZEROPAGE of the page.
//!
//! A fault thread never reads or writes an empty page of a registered range
//! (guest RAM or the parking area): it would fault into its own
//! userfaultfd and deadlock. It reads only buffers (unregistered) and
//! parked units (populated by construction, see `evict`).
//!
//! Several messages for one unit (several vCPUs, or a write-protect and a
//! missing fault) are resolved once: the first thread claims the unit
//! (`Loading`), later ones wait for it and then find it resident; the
//! install already woke every thread blocked on the unit's range.

use std::time::Instant;

use super::granularity::{CollapseReason, Refault, SplitReason};
use super::recycle::RestoreBuffer;
use super::stats::{add, bump, FaultSource};
use super::{collapse, limit, split, Backing, Shared, SwapError};
use crate::chunk::{Restored, Tag, UnitState};
use crate::store::SlotId;
use crate::uffd::{CopyOptions, FaultKind, MoveOptions, UffdError, UffdEvent};
use guestmem::host::PAGE_BYTES;

/// Outcome of handling one fault message.
pub(crate) enum Outcome {
    /// The faulting thread was woken; `Some` names what served the fault,
    /// `None` means nothing had to be restored (a message for a unit
    /// already resident, or an address outside guest RAM).
    Woken(Option<FaultSource>),
    /// The faulting thread stays blocked (fatal store error, or shutdown).
    Blocked,
}

/// Body of a fault-service thread.
pub(crate) fn run(s: &Shared) {
    let mut events = Vec::with_capacity(8);
    while !s.stopping() {
        match s.uffd.poll_readable(100) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                s.fatal(&SwapError::uffd(
                    "reading fault messages (the fault service stopped)",
                    e,
                ));
                return;
            }
        }
        events.clear();
        if let Err(e) = s.uffd.read_events(&mut events, 8) {
            s.fatal(&SwapError::uffd(
                "reading fault messages (the fault service stopped)",
                e,
            ));
            return;
        }
        let read_at = Instant::now();
        for event in events.drain(..) {
            // Other events (fork, remap, remove, unmap) are not enabled in
            // the handshake; if one shows up there is nothing to resolve.
            let UffdEvent::PageFault {
                address,
                kind,
                write,
                ..
            } = event
            else {
                continue;
            };
            bump(&s.counters.faults_total);
            // Service time starts here, not at `read_at`: messages later in
            // the batch waited for the earlier ones, which is queueing, not
            // the cost of their own restore.
            let started = Instant::now();
            match handle(s, address, kind, write) {
                Ok(Outcome::Woken(source)) => {
                    s.counters
                        .record_latency_us(read_at.elapsed().as_micros() as u64);
                    if let Some(source) = source {
                        s.counters
                            .record_source_latency_us(source, started.elapsed().as_micros() as u64);
                    }
                }
                Ok(Outcome::Blocked) => {}
                Err(e) => s.fatal(&e),
            }
        }
    }
}

fn page_of(address: u64) -> u64 {
    address & !(PAGE_BYTES - 1)
}

/// Resolves one fault. Errors are fatal messages for the VMM.
/// `write`: the faulting access was a write (a unit restored for a write
/// is dirty at once, so it is not installed write-protected).
fn handle(s: &Shared, address: u64, kind: FaultKind, write: bool) -> Result<Outcome, SwapError> {
    let guest = &s.guest;
    if address < guest.base() || address >= guest.base() + guest.len() {
        let parking = s.parking.raw();
        if address >= parking.base() && address < parking.base() + parking.len() {
            // Only an engine bug touches an empty parking page; map zero so
            // the toucher does not hang.
            let _ = s.uffd.zeropage(page_of(address), PAGE_BYTES, false);
        } else {
            let _ = s.uffd.wake(page_of(address), PAGE_BYTES);
        }
        return Ok(Outcome::Woken(None));
    }
    let unit = ((address - guest.base()) / s.unit_bytes) as usize;
    let page_in_unit = ((address - guest.base()) % s.unit_bytes / PAGE_BYTES) as usize;
    let stream = s.granularity.auto && s.granularity.note_fault(unit, page_in_unit);
    loop {
        let state = s.table.load(unit);
        match state.tag() {
            Tag::Loading | Tag::Evicting => {
                let settled = s.table.wait_settled(unit, &|| s.stopping());
                if settled.tag().in_flight() {
                    return Ok(Outcome::Blocked);
                }
            }
            Tag::Split => {
                if let Some(outcome) = split::page_fault(s, unit, address, kind)? {
                    if matches!(outcome, Outcome::Woken(Some(_))) {
                        if s.split.collapse_after_this_fault() {
                            collapse::try_collapse(s, unit, CollapseReason::Forced)?;
                        } else if s.granularity.dense(s, unit) {
                            collapse::try_collapse(s, unit, CollapseReason::Dense)?;
                        }
                    }
                    return Ok(outcome);
                }
            }
            Tag::Absent | Tag::Stored => {
                // One verdict per restore: the knob first, then what the
                // refault tells the policy (it also marks the chunk).
                let forced = !state.pinned() && s.split.split_this_restore();
                let refault = if forced || state.tag() != Tag::Stored {
                    Refault::Keep
                } else {
                    s.granularity.refault(s, state, stream)
                };
                let split = match (forced, refault) {
                    (true, _) => Some(SplitReason::Forced),
                    (false, Refault::Split) => Some(SplitReason::Thrashing),
                    _ => None,
                };
                if let Some(reason) = split {
                    let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                        continue;
                    };
                    if !split::split_on_restore(s, unit, loading, state, reason)? {
                        return Ok(Outcome::Blocked);
                    }
                    continue;
                }
                limit::claim_memory(s, s.limiter.unit_pages());
                let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                    s.limiter.release(s.limiter.unit_pages());
                    continue;
                };
                let outcome = if state.tag() == Tag::Absent {
                    restore_zero(s, unit, loading)
                } else {
                    restore_from_store(
                        s,
                        unit,
                        refault.mark(loading),
                        state.store_slot(),
                        write,
                        false,
                    )
                };
                if stream && s.prefetch_on {
                    if s.granularity.prefetch_pays() {
                        s.prefetch.offer(unit + 1);
                    } else {
                        bump(&s.counters.prefetch_withheld);
                    }
                }
                return outcome;
            }
            Tag::Staged => {
                let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                    continue;
                };
                let refault = s.granularity.refault(s, state, stream);
                let outcome = hand_back(s, unit, refault.mark(loading))?;
                if s.split.split_this_restore() {
                    split::split_resident(s, unit, Tag::Staged, SplitReason::Forced)?;
                } else if refault == Refault::Split {
                    split::split_resident(s, unit, Tag::Staged, SplitReason::Thrashing)?;
                }
                return Ok(outcome);
            }
            Tag::Resident => {
                let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                    continue;
                };
                return resident_fault(s, unit, loading, state, kind, address);
            }
        }
    }
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

fn count_install(s: &Shared, huge: bool) {
    bump(if huge {
        &s.counters.restored_huge
    } else {
        &s.counters.restored_split
    });
}

/// Installs a filled THP buffer (fresh or recycled) on the unit, leaving the
/// faulting threads asleep (see [`wake_unit`]). An EEXIST means the unit was populated by someone else: the
/// caller's data would be lost, which the state machine rules out, so it is
/// reported as an error.
pub(super) fn install_thp_buffer(
    s: &Shared,
    unit: usize,
    buf: RestoreBuffer,
) -> Result<bool, SwapError> {
    let dst = s.unit_addr(unit);
    let huge = buf.huge;
    let options = MoveOptions {
        allow_src_holes: false,
        dont_wake: true,
    };
    // A buffer an O_DIRECT read just filled can still be pinned for a
    // moment after the read completed: the block layer marks the pages
    // dirty and unpins them from a workqueue when they were clean (anonymous
    // pages are), and UFFDIO_MOVE refuses pinned pages with EBUSY. Wait for
    // the unpin and move the rest rather than fail the VM; give up only
    // after a second, which no deferred unpin takes. (A recycled buffer may
    // also still be pinned by the store write of the unit it held.)
    let started = std::time::Instant::now();
    // The pinned-page test knob: pinned now, unpinned once the retries
    // below have run for the knob's time, as a deferred unpin would.
    let mut test_pin = match s.pin_restore_buffers_us {
        Some(us) => match blockio::pin::PinnedPages::pin(buf.addr, s.unit_bytes as usize) {
            Ok(pin) => Some((pin, std::time::Duration::from_micros(us))),
            Err(e) => {
                buf.give_back_populated(s);
                return Err(SwapError::os(
                    "pinning a restore buffer (pin_restore_buffers_us test knob)",
                    e,
                ));
            }
        },
        None => None,
    };
    let mut done = 0;
    let result = loop {
        if test_pin
            .as_ref()
            .is_some_and(|(_, hold)| started.elapsed() >= *hold)
        {
            test_pin = None;
        }
        // SAFETY: this thread owns the unit (Loading) and the buffer; the
        // unit's range is missing and nothing holds a reference into it
        // or into the buffer (raw addresses only).
        match unsafe {
            s.uffd
                .move_all(dst + done, buf.addr + done, s.unit_bytes - done, options)
        } {
            Err(e)
                if e.errno() == Some(libc::EBUSY)
                    && started.elapsed() < std::time::Duration::from_secs(1) =>
            {
                done += e.done_bytes();
                bump(&s.counters.install_busy_retries);
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            other => break other,
        }
    };
    match result {
        Ok(()) => {
            buf.give_back_moved(s);
            Ok(huge)
        }
        Err(e) => {
            buf.give_back_populated(s);
            Err(SwapError::unit_uffd(
                format!("install the chunk at {}", s.unit_name(unit)),
                e,
            ))
        }
    }
}

fn restore_zero(s: &Shared, unit: usize, loading: UnitState) -> Result<Outcome, SwapError> {
    let dst = s.unit_addr(unit);
    let huge = match s.backing {
        Backing::Thp => install_thp_buffer(s, unit, RestoreBuffer::zeroed(s))?,
        Backing::Hugetlb { .. } => {
            let zero = s.zero_source.as_ref().map_or(0, |z| z.range().base());
            s.uffd
                .copy_all(
                    dst,
                    zero,
                    s.unit_bytes,
                    CopyOptions {
                        write_protect: false,
                        dont_wake: true,
                    },
                )
                .map_err(|e| {
                    SwapError::unit_uffd(format!("zero-fill the chunk at {}", s.unit_name(unit)), e)
                })?;
            true
        }
        Backing::Small => {
            s.uffd.zeropage(dst, s.unit_bytes, true).map_err(|e| {
                SwapError::unit_uffd(format!("zero-fill the page at {}", s.unit_name(unit)), e)
            })?;
            false
        }
    };
    count_install(s, huge);
    bump(&s.counters.faults_zero);
    s.table.finish_restore(unit.into(), loading, restored(huge));
    wake_unit(s, unit, Some(FaultSource::Zero))
}

/// Reads a stored unit back. Clean tracking (install write-protected, keep
/// the store slot) is skipped when the fault is a write: the write that is
/// waiting would un-protect the unit and free the slot at once, at the cost
/// of one more fault round trip per restore (through KVM, a vCPU exit).
/// `prefetch`: no fault asked for it (see `prefetch`); the unit is marked
/// and counted as a prefetch, not a fault.
pub(super) fn restore_from_store(
    s: &Shared,
    unit: usize,
    loading: UnitState,
    slot: SlotId,
    write: bool,
    prefetch: bool,
) -> Result<Outcome, SwapError> {
    let buf = RestoreBuffer::for_overwrite(s);
    let (range, offset) = buf.place(s);
    // SAFETY: the buffer is ours until given back, is populated (a pool
    // buffer, or a recycled page checked whole), so writing it never faults
    // into the userfaultfd, and nothing else accesses it.
    let data = unsafe { range.slice_mut(offset, s.unit_bytes) };
    if let Err(e) = s.store.read(slot, s.unit_gpa(unit), data) {
        buf.give_back_populated(s);
        // Never zero-fill: the unit stays Loading, its faulting threads stay
        // blocked, and the VMM exits.
        s.fatal(&SwapError::unit_store(
            format!("restore the swapped-out chunk at {}", s.unit_name(unit)),
            e,
        ));
        return Ok(Outcome::Blocked);
    }
    add(&s.counters.bytes_read, s.unit_bytes);
    if !prefetch {
        bump(&s.counters.faults_store);
    }
    let dst = s.unit_addr(unit);
    let clean = s.track_clean && !write;
    let huge = match s.backing {
        Backing::Thp => {
            // MOVE cannot install write-protected (it clears uffd-wp), so
            // keep the faulting threads asleep until the unit is protected.
            // A vCPU touching the unit for the first time inside this
            // window is caught by the content hash (see `hash`).
            let huge = install_thp_buffer(s, unit, buf)?;
            if clean {
                s.uffd.write_protect(dst, s.unit_bytes).map_err(|e| {
                    SwapError::unit_uffd(
                        format!("write-protect the chunk at {}", s.unit_name(unit)),
                        e,
                    )
                })?;
            }
            huge
        }
        Backing::Hugetlb { .. } | Backing::Small => {
            let result = s.uffd.copy_all(
                dst,
                buf.addr,
                s.unit_bytes,
                CopyOptions {
                    write_protect: clean,
                    dont_wake: true,
                },
            );
            buf.give_back_populated(s);
            result.map_err(|e| {
                SwapError::unit_uffd(format!("install the chunk at {}", s.unit_name(unit)), e)
            })?;
            matches!(s.backing, Backing::Hugetlb { .. })
        }
    };
    count_install(s, huge);
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
    wake_unit(s, unit, Some(FaultSource::Store))
}

/// Moves a parked unit back into guest RAM without waking. `Ok(false)`:
/// the pages are pinned (e.g. by device I/O) and nothing moved; the caller
/// copies instead.
fn move_back(s: &Shared, dst: u64, src: u64) -> Result<bool, UffdError> {
    let options = MoveOptions {
        allow_src_holes: false,
        dont_wake: true,
    };
    // SAFETY: this thread owns the unit (Loading) and so its parking slot;
    // both are reached through raw addresses only.
    match unsafe { s.uffd.move_all(dst, src, s.unit_bytes, options) } {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(libc::EBUSY) && e.done_bytes() == 0 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives a staged unit back to the guest without I/O. If its store write is
/// in flight (`WRITING`), the parked pages may be pinned by O_DIRECT and
/// the writer still owns the parking slot, so the content is copied into a
/// fresh buffer instead of moved; the writer releases the slot once this
/// unit is no longer `Loading`.
fn hand_back(s: &Shared, unit: usize, loading: UnitState) -> Result<Outcome, SwapError> {
    let p = loading.parking_slot();
    let writing = loading.writing();
    let dst = s.unit_addr(unit);
    let src = s.parking.addr(p);
    let fail = |e: UffdError| {
        SwapError::unit_uffd(
            format!("hand back the staged chunk at {}", s.unit_name(unit)),
            e,
        )
    };
    // A copy of the parked content, leaving it in place.
    let copy_in = || {
        let options = CopyOptions {
            write_protect: false,
            dont_wake: true,
        };
        s.uffd.copy_all(dst, src, s.unit_bytes, options)
    };
    let huge = match s.backing {
        Backing::Thp => {
            let moved = !writing && move_back(s, dst, src).map_err(fail)?;
            if moved {
                loading.huge()
            } else {
                let buf = RestoreBuffer::for_overwrite(s);
                buf.copy_from_parked(s, p);
                install_thp_buffer(s, unit, buf)?
            }
        }
        Backing::Small => {
            let moved = !writing && move_back(s, dst, src).map_err(fail)?;
            if !moved {
                copy_in().map_err(fail)?;
            }
            false
        }
        Backing::Hugetlb { .. } => {
            copy_in().map_err(fail)?;
            true
        }
    };
    if !writing {
        // Moved back (empty now), or pinned by device I/O and copied: the
        // slot may not be recycled, its page may be still in use.
        s.parking.release(p);
    }
    count_install(s, huge);
    bump(&s.counters.faults_staging);
    if writing {
        bump(&s.counters.faults_staging_writing);
    }
    s.table.finish_restore(unit.into(), loading, restored(huge));
    wake_unit(s, unit, Some(FaultSource::Staging))
}

/// A fault on a unit that is already resident (now claimed as `Loading`
/// by this thread so no evictor moves it meanwhile).
fn resident_fault(
    s: &Shared,
    unit: usize,
    loading: UnitState,
    resident: UnitState,
    kind: FaultKind,
    address: u64,
) -> Result<Outcome, SwapError> {
    let dst = s.unit_addr(unit);
    let mut first_write = false;
    let source = (kind == FaultKind::WriteProtect).then_some(FaultSource::WriteProtect);
    if resident.prefetched() {
        bump(&s.counters.prefetch_hits);
    }
    let result = match kind {
        FaultKind::WriteProtect => {
            bump(&s.counters.wp_faults);
            if resident.wp() {
                // First write since the restore: the store copy goes stale.
                // Unprotecting the whole unit keeps its PMD.
                if resident.clean() {
                    s.store.free(resident.store_slot());
                }
                first_write = true;
            }
            s.uffd.write_unprotect(dst, s.unit_bytes, true)
        }
        FaultKind::Missing => match s.backing {
            Backing::Thp | Backing::Small => {
                // Usually a message for a unit another thread already
                // restored (EEXIST). It can also be a real hole, left by
                // someone discarding guest pages: those read as zero.
                match s.uffd.zeropage(page_of(address), PAGE_BYTES, true) {
                    Err(e) if e.is_eexist() => {
                        bump(&s.counters.stale_faults);
                        Ok(())
                    }
                    other => other,
                }
            }
            Backing::Hugetlb { .. } => {
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
                s.unit_name(unit)
            ),
            e,
        )
    })?;
    wake_unit(s, unit, source)
}

/// Wakes every thread blocked on the unit. Installs run with DONTWAKE and
/// the wake comes after the new state is published, so a woken thread
/// (and anyone it talks to) sees the state its fault produced.
pub(super) fn wake_unit(
    s: &Shared,
    unit: usize,
    source: Option<FaultSource>,
) -> Result<Outcome, SwapError> {
    s.uffd.wake(s.unit_addr(unit), s.unit_bytes).map_err(|e| {
        SwapError::unit_uffd(
            format!("wake the threads faulting on {}", s.unit_name(unit)),
            e,
        )
    })?;
    Ok(Outcome::Woken(source))
}
