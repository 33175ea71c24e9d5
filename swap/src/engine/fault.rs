//! Fault service: read userfaultfd messages, decide per message what the
//! unit needs (the granularity policy and the test hooks are asked here,
//! and only here), and hand the work to the layer that does it: the
//! [`Splitter`] for split chunks and for splits, the [`Collapser`] for
//! collapses, the [`Restorer`] for whole units. Dependencies point down
//! from here: nothing below calls the fault service.
//!
//! Several messages for one unit (several vCPUs, or a write-protect and a
//! missing fault) are resolved once: the first thread claims the unit
//! (`Loading`), later ones wait for it and then find it resident; the
//! install already woke every thread blocked on the unit's range.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::access;
use super::collapse::Collapser;
use super::error::SwapError;
use super::geometry::Geometry;
use super::granularity::{CollapseReason, GranularityPolicy, Refault, RefaultEvent, SplitReason};
use super::hooks::EngineHooks;
use super::lifecycle::Lifecycle;
use super::limit::{Limiter, MakeRoom};
use super::outcome::Outcome;
use super::prefetch::Prefetcher;
use super::restore::Restorer;
use super::split::Splitter;
use super::stall::{StallClock, StallSource};
use super::stats::{bump, Counters, FaultSource};
use super::working_set::WorkingSet;
use crate::chunk::{ChunkTable, Tag, UnitState};
use crate::index::UnitIndex;
use crate::uffd::{FaultKind, Uffd, UffdEvent};
use guestmem::addr::Hva;

/// Serves guest faults.
pub(crate) struct FaultService {
    pub geo: Arc<Geometry>,
    pub table: Arc<ChunkTable>,
    pub restorer: Arc<Restorer>,
    /// Where chunks split.
    pub splitter: Option<Arc<Splitter>>,
    /// Where chunks split.
    pub collapser: Option<Arc<Collapser>>,
    /// Sequential prefetch (the auto unit with prefetch on).
    pub prefetcher: Option<Arc<Prefetcher>>,
    pub granularity: Arc<dyn GranularityPolicy>,
    pub hooks: Arc<dyn EngineHooks>,
    pub limiter: Arc<Limiter>,
    pub room: Arc<dyn MakeRoom>,
    pub counters: Arc<Counters>,
    /// How long faulting threads wait ([`super::stall`]).
    pub stall: Arc<StallClock>,
    /// Working-set sampling ([`super::working_set`]), when on.
    pub working_set: Option<Arc<WorkingSet>>,
    pub life: Arc<Lifecycle>,
}

/// What [`FaultService::handle`] saw on the way, for the stall clock.
#[derive(Default)]
struct Served {
    /// A page of a split chunk was restored.
    page: bool,
    /// The message waited for another thread's work on the unit.
    waited: bool,
    /// The unit was a working-set sample: its wait is the sampling's cost.
    sample: bool,
    /// When the faulting thread was woken, where work went on after it
    /// (a collapse after a page fault); otherwise when `handle` returned.
    woken_at: Option<Instant>,
    /// The faulting thread (0: the kernel did not say).
    thread_id: u32,
}

impl Served {
    fn source(&self, outcome: &Outcome) -> StallSource {
        match outcome {
            Outcome::Woken(Some(_)) if self.page => StallSource::Page,
            Outcome::Woken(Some(FaultSource::Store)) => StallSource::Store,
            Outcome::Woken(Some(FaultSource::Staging)) => StallSource::Parking,
            Outcome::Woken(Some(FaultSource::Zero)) => StallSource::Zero,
            Outcome::Woken(Some(FaultSource::WriteProtect)) => StallSource::WriteProtect,
            _ if self.waited => StallSource::InFlight,
            _ => StallSource::Other,
        }
    }
}

impl FaultService {
    /// Body of a fault-service thread: reads `uffd`'s messages until the
    /// engine stops.
    pub(crate) fn run(&self, uffd: &Uffd) {
        let s = self;
        let mut events = Vec::with_capacity(8);
        while !s.life.stopping() {
            match uffd.poll_readable(100) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    s.life.fatal(&SwapError::uffd(
                        "reading fault messages (the fault service stopped)",
                        e,
                    ));
                    return;
                }
            }
            events.clear();
            if let Err(e) = uffd.read_events(&mut events, 8) {
                s.life.fatal(&SwapError::uffd(
                    "reading fault messages (the fault service stopped)",
                    e,
                ));
                return;
            }
            let read_at = Instant::now();
            // Every message of the batch waits from now: those behind the
            // first wait for it, which is part of their stall.
            for event in &events {
                if let UffdEvent::PageFault { thread_id, .. } = event {
                    s.stall.begin(*thread_id, read_at);
                }
            }
            for event in events.drain(..) {
                // Other events (fork, remap, remove, unmap) are not enabled in
                // the handshake; if one shows up there is nothing to resolve.
                let UffdEvent::PageFault {
                    address,
                    kind,
                    write,
                    thread_id,
                } = event
                else {
                    continue;
                };
                bump(&s.counters.faults.total);
                // Service time starts here, not at `read_at`: messages later in
                // the batch waited for the earlier ones, which is queueing, not
                // the cost of their own restore.
                let started = Instant::now();
                let mut served = Served {
                    thread_id,
                    ..Served::default()
                };
                let handled = s.handle(address, kind, write, &mut served);
                let woken_at = served.woken_at.unwrap_or_else(Instant::now);
                let stall_source = match &handled {
                    Ok(outcome) => served.source(outcome),
                    Err(_) => StallSource::Other,
                };
                s.stall.end(thread_id, read_at, woken_at, stall_source);
                if let (true, Some(ws)) = (served.sample, &s.working_set) {
                    ws.add_wait(woken_at.saturating_duration_since(read_at));
                }
                match handled {
                    Ok(Outcome::Woken(source)) => {
                        s.counters
                            .record_latency_us(read_at.elapsed().as_micros() as u64);
                        if let Some(source) = source {
                            s.counters.record_source_latency_us(
                                source,
                                started.elapsed().as_micros() as u64,
                            );
                        }
                    }
                    Ok(Outcome::Blocked) => {}
                    Err(e) => s.life.fatal(&e),
                }
            }
        }
    }

    /// Resolves one fault as a fault-service thread does, without its
    /// clocks: the model checker's guest threads fault through this.
    #[cfg(feature = "model-check")]
    pub(crate) fn serve(
        &self,
        address: u64,
        kind: FaultKind,
        write: bool,
    ) -> Result<Outcome, SwapError> {
        self.handle(address, kind, write, &mut Served::default())
    }

    /// What the policy makes of a chunk faulting back in `state` (stored or
    /// staged): the refault distance is the evictions since the chunk's.
    fn refault(&self, chunk: UnitIndex, state: UnitState, stream: bool) -> Refault {
        if !self.granularity.active() {
            return Refault::Keep;
        }
        let now = self.counters.evictions.load(Ordering::Relaxed) as u16;
        let verdict = self.granularity.on_refault(RefaultEvent {
            chunk,
            state,
            stream,
            distance_evictions: u64::from(now.wrapping_sub(state.evict_epoch())),
            limit_chunks: self.limit_units(),
        });
        if verdict == Refault::Split && state.collapsed() {
            bump(&self.counters.split.flips);
        }
        verdict
    }

    /// The restored unit's word (`loading`, taken from `state`: stored or
    /// staged) with the CLOCK passes its refault earned ([`access`]).
    /// Under a policy that splits chunks none: there a short refault is
    /// the policy's, which marks the chunk and splits it at the next one,
    /// and its hot pages then earn their passes alone; protecting the
    /// whole chunk would hold 2 MiB for what may be one hot page (measured
    /// on the mixed workload: 128 hot chunks with one hot page each held
    /// whole pushed its stream out, 918 store faults against 349).
    fn activated(&self, state: UnitState, loading: UnitState) -> UnitState {
        if self.granularity.active() {
            return loading;
        }
        let now = self.counters.evictions.load(Ordering::Relaxed) as u16;
        let chances = access::unit_chances(
            u64::from(now.wrapping_sub(state.evict_epoch())),
            self.limit_units(),
        );
        if chances > 0 {
            bump(&self.counters.activations);
        }
        loading.with_chances(chances)
    }

    /// The memory limit in whole units, if there is one.
    fn limit_units(&self) -> Option<u64> {
        self.limiter
            .limit_pages()
            .map(|pages| pages / self.limiter.unit_pages())
    }

    /// Resolves one fault. Errors are fatal messages for the VMM.
    /// `write`: the faulting access was a write (a unit restored for a write
    /// is dirty at once, so it is not installed write-protected).
    fn handle(
        &self,
        address: u64,
        kind: FaultKind,
        write: bool,
        served: &mut Served,
    ) -> Result<Outcome, SwapError> {
        let s = self;
        let Some((unit, page_in_unit)) = s.geo.locate(Hva::new(address)) else {
            s.restorer
                .installer
                .resolve_stray(address, served.thread_id);
            return Ok(Outcome::Woken(None));
        };
        let stream = s.granularity.active() && s.granularity.on_fault(unit, page_in_unit);
        // Any fault on a sampled unit is a touch, a write-protect fault
        // before the sampler took it away included.
        served.sample = s.working_set.as_ref().is_some_and(|ws| ws.on_return(unit));
        loop {
            let state = s.table.load(unit);
            match state.tag() {
                Tag::Loading | Tag::Evicting => {
                    served.waited = true;
                    let settled = s.table.wait_settled(unit, &|| s.life.stopping());
                    if settled.tag().in_flight() {
                        return Ok(Outcome::Blocked);
                    }
                }
                Tag::Split => {
                    let (Some(splitter), Some(collapser)) = (&s.splitter, &s.collapser) else {
                        unreachable!("a split chunk where chunks cannot split");
                    };
                    if let Some(outcome) = splitter.page_fault(unit, address, kind)? {
                        served.page = true;
                        served.woken_at = Some(Instant::now());
                        if matches!(outcome, Outcome::Woken(Some(_))) {
                            if s.hooks.collapse_after_this_page_fault() {
                                collapser.try_collapse(unit, CollapseReason::Forced)?;
                            } else if s.granularity.should_collapse(
                                unit,
                                page_in_unit,
                                &splitter.pages,
                            ) {
                                collapser.try_collapse(unit, CollapseReason::Dense)?;
                            }
                        }
                        return Ok(outcome);
                    }
                }
                Tag::Absent | Tag::Stored => {
                    // One verdict per restore: the knob first, then what the
                    // refault tells the policy (it also marks the chunk).
                    let forced =
                        s.splitter.is_some() && !state.pinned() && s.hooks.split_this_restore();
                    let refault = if forced || state.tag() != Tag::Stored {
                        Refault::Keep
                    } else {
                        s.refault(unit, state, stream)
                    };
                    let split = match (forced, refault) {
                        (true, _) => Some(SplitReason::Forced),
                        (false, Refault::Split) => Some(SplitReason::Thrashing),
                        _ => None,
                    };
                    if let (Some(reason), Some(splitter)) = (split, &s.splitter) {
                        let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                            continue;
                        };
                        if !splitter.split_on_restore(unit, loading, state, reason)? {
                            return Ok(Outcome::Blocked);
                        }
                        continue;
                    }
                    s.limiter.claim(s.limiter.unit_pages(), &*s.room);
                    let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                        s.limiter.release(s.limiter.unit_pages());
                        continue;
                    };
                    let outcome = if state.tag() == Tag::Absent {
                        s.restorer.restore_zero(unit, loading)
                    } else {
                        s.restorer.restore_from_store(
                            unit,
                            s.activated(state, refault.mark(loading)),
                            state.store_slot(),
                            write,
                            false,
                        )
                    };
                    if let (true, Some(prefetcher)) = (stream, &s.prefetcher) {
                        if s.granularity.prefetch_pays() {
                            prefetcher.offer(unit.next());
                        } else {
                            bump(&s.counters.prefetch.withheld);
                        }
                    }
                    return outcome;
                }
                Tag::Staged => {
                    let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                        continue;
                    };
                    let refault = s.refault(unit, state, stream);
                    let outcome = s
                        .restorer
                        .hand_back(unit, s.activated(state, refault.mark(loading)))?;
                    if let Some(splitter) = &s.splitter {
                        if s.hooks.split_this_restore() {
                            splitter.split_resident(unit, Tag::Staged, SplitReason::Forced)?;
                        } else if refault == Refault::Split {
                            splitter.split_resident(unit, Tag::Staged, SplitReason::Thrashing)?;
                        }
                    }
                    return Ok(outcome);
                }
                Tag::Resident => {
                    let Ok(loading) = s.table.begin_fault(unit.into(), state) else {
                        continue;
                    };
                    return s
                        .restorer
                        .resident_fault(unit, loading, state, kind, address);
                }
            }
        }
    }
}
