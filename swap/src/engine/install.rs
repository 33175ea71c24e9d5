//! The installer: puts a unit's content into guest RAM and wakes the
//! threads waiting on it. It owns nothing of the chunk state machine: its
//! callers hold the unit (`Loading`) and publish the new state; it only
//! moves or copies memory through the userfaultfd.
//!
//! Install paths by mode:
//! - THP (anonymous, 2 MiB): fill a THP buffer and UFFDIO_MOVE it onto the
//!   unit, so the host maps one PMD and KVM then maps 2 MiB. (UFFDIO_COPY on
//!   anonymous memory would install 4 KiB pages.)
//! - hugetlb (2 MiB): UFFDIO_COPY of 2 MiB installs one huge page; with
//!   clean tracking it is installed write-protected in the same call.
//! - small (4 KiB units): UFFDIO_COPY (write-protected when clean) or
//!   UFFDIO_ZEROPAGE of the page.
//!
//! Every install runs with DONTWAKE; [`Installer::wake`] comes after the
//! caller published the new state, so a woken thread (and anyone it talks
//! to) sees the state its fault produced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::InstallMode;
use super::error::SwapError;
use super::geometry::Geometry;
use super::hooks::EngineHooks;
use super::outcome::Outcome;
use super::page_tables::PageTables;
use super::parking::Parking;
use super::recycle::{RestoreBuffer, RestoreBuffers};
use super::stats::{bump, Counters, FaultSource};
use crate::chunk::PageRef;
use crate::index::{ParkingSlot, UnitIndex};
use crate::uffd::{CopyOptions, MoveOptions, UffdError, Userfaults};
use guestmem::addr::Hva;
use guestmem::addr::RegionOffset;
use guestmem::host::{AnonMapping, PAGE_BYTES};

/// Installs units into guest RAM.
pub(crate) struct Installer {
    /// The kernel's userfaultfd (the model checker's model of it under
    /// `--features model-check`).
    pub uffd: Arc<dyn Userfaults>,
    pub geo: Arc<Geometry>,
    pub mode: InstallMode,
    pub buffers: Arc<RestoreBuffers>,
    pub parking: Arc<Parking>,
    /// Empty page tables prepared under chunks, removed before a huge
    /// page is moved in.
    pub page_tables: Arc<PageTables>,
    /// A populated all-zero unit to copy from (hugetlb zero fill).
    pub zero_source: Option<AnonMapping>,
    pub hooks: Arc<dyn EngineHooks>,
    pub counters: Arc<Counters>,
}

fn page_of(address: u64) -> Hva {
    Hva::new(address & !(PAGE_BYTES - 1))
}

impl Installer {
    fn count_install(&self, huge: bool) {
        bump(if huge {
            &self.counters.restored_huge
        } else {
            &self.counters.restored_split
        });
    }

    /// Installs a filled THP buffer (fresh or recycled) on the unit, leaving
    /// the faulting threads asleep (see [`Installer::wake`]); true when the
    /// buffer was one huge page. An EEXIST means the unit was populated by
    /// someone else: the caller's data would be lost, which the state
    /// machine rules out, so it is reported as an error.
    pub fn install_thp_buffer(
        &self,
        unit: UnitIndex,
        buf: RestoreBuffer,
    ) -> Result<bool, SwapError> {
        let s = self;
        let unit_bytes = s.geo.unit_bytes;
        let dst = s.geo.unit_addr(unit);
        let huge = buf.huge;
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: true,
        };
        // A buffer an O_DIRECT read just filled can still be pinned for a
        // moment after the read completed: the block layer marks the pages
        // dirty and unpins them from a workqueue when they were clean
        // (anonymous pages are), and UFFDIO_MOVE refuses pinned pages with
        // EBUSY. Wait for the unpin and move the rest rather than fail the
        // VM; give up only after a second, which no deferred unpin takes. (A
        // recycled buffer may also still be pinned by the store write of the
        // unit it held.)
        s.page_tables.remove_before_huge_install(unit);
        let started = Instant::now();
        // The pinned-page test hook: pinned now, unpinned once the retries
        // below have run for the hook's time, as a deferred unpin would.
        let mut test_pin = match s.hooks.pin_restore_buffer_for() {
            Some(hold) => match blockio::pin::PinnedPages::pin(buf.addr.raw(), unit_bytes as usize)
            {
                Ok(pin) => Some((pin, hold)),
                Err(e) => {
                    s.buffers.give_back_populated(buf);
                    return Err(SwapError::os(
                        "pinning a restore buffer (pin_restore_buffer_for test hook)",
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
            // SAFETY: the caller owns the unit (Loading) and this thread the
            // buffer; the unit's range is missing and nothing holds a
            // reference into it or into the buffer (raw addresses only).
            match unsafe {
                s.uffd.move_all(
                    dst.offset_by(done),
                    buf.addr.offset_by(done),
                    unit_bytes - done,
                    options,
                )
            } {
                Err(e)
                    if e.errno() == Some(libc::EBUSY)
                        && started.elapsed() < Duration::from_secs(1) =>
                {
                    done += e.done_bytes();
                    bump(&s.counters.install_busy_retries);
                    std::thread::sleep(Duration::from_micros(20));
                }
                other => break other,
            }
        };
        match result {
            Ok(()) => {
                s.buffers.give_back_moved(buf);
                Ok(huge)
            }
            Err(e) => {
                s.buffers.give_back_populated(buf);
                Err(SwapError::unit_uffd(
                    format!("install the chunk at {}", s.geo.unit_name(unit)),
                    e,
                ))
            }
        }
    }

    /// Fills the unit with zeros, not waking; true when it is mapped huge.
    pub fn zero_fill(&self, unit: UnitIndex) -> Result<bool, SwapError> {
        let s = self;
        let dst = s.geo.unit_addr(unit);
        let unit_bytes = s.geo.unit_bytes;
        let huge = match s.mode {
            InstallMode::Thp => s.install_thp_buffer(unit, s.buffers.zeroed())?,
            InstallMode::Hugetlb { .. } => {
                let zero = s
                    .zero_source
                    .as_ref()
                    .map_or(Hva::new(0), |z| z.range().addr(RegionOffset::ZERO));
                s.uffd
                    .copy_all(
                        dst,
                        zero,
                        unit_bytes,
                        CopyOptions {
                            write_protect: false,
                            dont_wake: true,
                        },
                    )
                    .map_err(|e| {
                        SwapError::unit_uffd(
                            format!("zero-fill the chunk at {}", s.geo.unit_name(unit)),
                            e,
                        )
                    })?;
                true
            }
            InstallMode::Small => {
                s.uffd.zeropage(dst, unit_bytes, true).map_err(|e| {
                    SwapError::unit_uffd(
                        format!("zero-fill the page at {}", s.geo.unit_name(unit)),
                        e,
                    )
                })?;
                false
            }
        };
        s.count_install(huge);
        Ok(huge)
    }

    /// Installs a buffer holding the unit's content read back from the
    /// store, not waking; `write_protect`: the unit stays clean (installed
    /// write-protected). True when the unit is mapped huge.
    pub fn install_read_back(
        &self,
        unit: UnitIndex,
        buf: RestoreBuffer,
        write_protect: bool,
    ) -> Result<bool, SwapError> {
        let s = self;
        let dst = s.geo.unit_addr(unit);
        let unit_bytes = s.geo.unit_bytes;
        let huge = match s.mode {
            InstallMode::Thp => {
                // MOVE cannot install write-protected (it clears uffd-wp),
                // so the faulting threads stay asleep until the unit is
                // protected. A vCPU touching the unit for the first time
                // inside this window is caught by the content hash (see
                // `hash`).
                let huge = s.install_thp_buffer(unit, buf)?;
                if write_protect {
                    s.uffd.write_protect(dst, unit_bytes).map_err(|e| {
                        SwapError::unit_uffd(
                            format!("write-protect the chunk at {}", s.geo.unit_name(unit)),
                            e,
                        )
                    })?;
                }
                huge
            }
            InstallMode::Hugetlb { .. } | InstallMode::Small => {
                let result = s.uffd.copy_all(
                    dst,
                    buf.addr,
                    unit_bytes,
                    CopyOptions {
                        write_protect,
                        dont_wake: true,
                    },
                );
                s.buffers.give_back_populated(buf);
                result.map_err(|e| {
                    SwapError::unit_uffd(
                        format!("install the chunk at {}", s.geo.unit_name(unit)),
                        e,
                    )
                })?;
                matches!(s.mode, InstallMode::Hugetlb { .. })
            }
        };
        s.count_install(huge);
        Ok(huge)
    }

    /// Moves a parked unit back into guest RAM without waking. `Ok(false)`:
    /// the pages are pinned (e.g. by device I/O) and nothing moved; the
    /// caller copies instead.
    fn move_back(&self, dst: Hva, src: Hva) -> Result<bool, UffdError> {
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: true,
        };
        // SAFETY: the caller owns the unit (Loading) and so its parking
        // slot; both are reached through raw addresses only.
        match unsafe { self.uffd.move_all(dst, src, self.geo.unit_bytes, options) } {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::EBUSY) && e.done_bytes() == 0 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the unit parked in slot `p` back to guest RAM without I/O, not
    /// waking; true when it is mapped huge (`parked_huge`: what it was when
    /// evicted). With `writing` (its store write is in flight) the parked
    /// pages may be pinned by O_DIRECT and the writer owns the slot, so the
    /// content is copied and the slot left to the writer; otherwise the
    /// slot is released here.
    pub fn hand_back(
        &self,
        unit: UnitIndex,
        p: ParkingSlot,
        writing: bool,
        parked_huge: bool,
    ) -> Result<bool, SwapError> {
        let s = self;
        let unit_bytes = s.geo.unit_bytes;
        let dst = s.geo.unit_addr(unit);
        let src = s.parking.addr(p);
        let fail = |e: UffdError| {
            SwapError::unit_uffd(
                format!("hand back the staged chunk at {}", s.geo.unit_name(unit)),
                e,
            )
        };
        // A copy of the parked content, leaving it in place.
        let copy_in = || {
            let options = CopyOptions {
                write_protect: false,
                dont_wake: true,
            };
            s.uffd.copy_all(dst, src, unit_bytes, options)
        };
        let huge = match s.mode {
            InstallMode::Thp => {
                if !writing {
                    s.page_tables.remove_before_huge_install(unit);
                }
                let moved = !writing && s.move_back(dst, src).map_err(fail)?;
                if moved {
                    parked_huge
                } else {
                    let buf = s.buffers.for_overwrite();
                    s.buffers.copy_from_parked(&buf, p);
                    s.install_thp_buffer(unit, buf)?
                }
            }
            InstallMode::Small => {
                let moved = !writing && s.move_back(dst, src).map_err(fail)?;
                if !moved {
                    copy_in().map_err(fail)?;
                }
                false
            }
            InstallMode::Hugetlb { .. } => {
                copy_in().map_err(fail)?;
                true
            }
        };
        if !writing {
            // Moved back (empty now), or pinned by device I/O and copied:
            // the slot may not be recycled, its page may be still in use.
            s.parking.release(p);
        }
        s.count_install(huge);
        Ok(huge)
    }

    /// Removes the write protection of a whole unit (whole, so that a huge
    /// mapping keeps its PMD) without waking anyone: the write-protect
    /// fault that called it wakes the writer once the unit's word is
    /// settled.
    pub fn unprotect(&self, unit: UnitIndex) -> Result<(), UffdError> {
        self.uffd
            .write_unprotect(self.geo.unit_addr(unit), self.geo.unit_bytes, true)
    }

    /// Removes the write protection of a whole unit and wakes the writers
    /// blocked on it at once: a split of a resident chunk moves no page,
    /// so they may write on while it is published (their queued messages
    /// then find the page writable).
    pub fn unprotect_and_wake(&self, unit: UnitIndex) -> Result<(), UffdError> {
        self.uffd
            .write_unprotect(self.geo.unit_addr(unit), self.geo.unit_bytes, false)
    }

    /// Maps the zero page at a hole in a resident unit, not waking; false
    /// when the page was there already (a message for a unit another
    /// thread restored: EEXIST).
    pub fn zero_hole(&self, address: u64) -> Result<bool, UffdError> {
        match self.uffd.zeropage(page_of(address), PAGE_BYTES, true) {
            Err(e) if e.is_eexist() => Ok(false),
            Err(e) => Err(e),
            Ok(()) => Ok(true),
        }
    }

    /// Resolves a fault outside guest RAM by thread `thread_id` (0: the
    /// kernel did not say). Only an engine bug touches an empty parking
    /// page: it is logged with the thread and the page (a page evictor
    /// once found such a zero page where it moved to, and which thread
    /// left it is not known), and zero is mapped so the toucher does not
    /// hang; if the page was filled meanwhile by a fill that wakes nobody,
    /// the toucher is woken instead. Anything else is woken.
    pub fn resolve_stray(&self, address: u64, thread_id: u32) {
        let page = page_of(address);
        let parking = self.parking.raw();
        if address < parking.base() || address >= parking.base() + parking.len() {
            let _ = self.uffd.wake(page, PAGE_BYTES);
            return;
        }
        let result = self.uffd.zeropage(page, PAGE_BYTES, false);
        if STRAY_PARKING_WARNINGS.fetch_add(1, Ordering::Relaxed) < MAX_STRAY_PARKING_WARNINGS {
            let place = match self.parking.locate(address) {
                Some((slot, index)) => format!("page {index} of parking slot {slot}"),
                None => format!("{address:#x}, in the parking area past its slots"),
            };
            log::warn!(
                "swap engine: thread {thread_id} ({}) faulted on {place}, which was empty: an engine bug; {}",
                thread_name(thread_id),
                match &result {
                    Ok(()) => "mapped the zero page there".to_string(),
                    Err(e) if e.is_eexist() => {
                        "the page was filled meanwhile; woke the thread".to_string()
                    }
                    Err(e) => format!("mapping the zero page failed: {e}"),
                }
            );
        }
        if result.as_ref().is_err_and(|e| e.is_eexist()) {
            let _ = self.uffd.wake(page, PAGE_BYTES);
        }
    }

    /// Wakes every thread blocked on the unit, once its new state is
    /// published.
    pub fn wake(&self, unit: UnitIndex, source: Option<FaultSource>) -> Result<Outcome, SwapError> {
        self.uffd
            .wake(self.geo.unit_addr(unit), self.geo.unit_bytes)
            .map_err(|e| {
                SwapError::unit_uffd(
                    format!("wake the threads faulting on {}", self.geo.unit_name(unit)),
                    e,
                )
            })?;
        Ok(Outcome::Woken(source))
    }

    /// Copies one page from `src` (an unregistered buffer) onto a page of
    /// a split chunk, not waking. EEXIST is returned as is: the caller
    /// knows whether the page may be there already.
    pub fn install_page(&self, at: PageRef, src: Hva) -> Result<(), UffdError> {
        let options = CopyOptions {
            write_protect: false,
            dont_wake: true,
        };
        self.uffd
            .copy_all(self.geo.page_addr(at), src, PAGE_BYTES, options)
    }

    /// Removes the write protection of one page of a split chunk and wakes
    /// its writers.
    pub fn unprotect_page(&self, at: PageRef) -> Result<(), UffdError> {
        self.uffd
            .write_unprotect(self.geo.page_addr(at), PAGE_BYTES, true)
    }

    /// Wakes every thread blocked on one page of a split chunk.
    pub fn wake_page(
        &self,
        at: PageRef,
        source: Option<FaultSource>,
    ) -> Result<Outcome, SwapError> {
        self.uffd
            .wake(self.geo.page_addr(at), PAGE_BYTES)
            .map_err(|e| {
                SwapError::unit_uffd(
                    format!(
                        "wake the threads faulting on guest address {:#x}",
                        self.geo.page_store_key(at)
                    ),
                    e,
                )
            })?;
        Ok(Outcome::Woken(source))
    }
}

/// Stray parking faults logged so far (each is an engine bug; the first
/// few say enough).
static STRAY_PARKING_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Stray parking faults logged one by one.
const MAX_STRAY_PARKING_WARNINGS: u64 = 8;

/// The name of thread `thread_id` of this process, or "?" where it cannot
/// be read (under the VMM's seccomp filters `openat` is refused).
fn thread_name(thread_id: u32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{thread_id}/comm"))
        .map_or_else(|_| "?".to_string(), |name| name.trim_end().to_string())
}
