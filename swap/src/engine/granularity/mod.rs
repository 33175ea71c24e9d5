//! The granularity policy: which chunks to split into pages and which
//! split chunks to collapse back huge. The engine tells a policy what it
//! sees (each fault, each refault with its distance) and asks it for
//! decisions; a policy sees nothing else of the engine, so a new one is
//! one file implementing [`GranularityPolicy`].
//!
//! Policies: [`Fixed`] (the fixed units: never split) and
//! [`refault_distance::RefaultDistance`] (`--swap-unit auto`).

pub(crate) mod refault_distance;

use crate::chunk::{PageTable, UnitState};
use crate::index::{PageIndex, UnitIndex};

/// A chunk faulting back from the store or the parking area.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RefaultEvent {
    /// The chunk.
    pub chunk: UnitIndex,
    /// The chunk's word before the fault took it (stored or staged).
    pub state: UnitState,
    /// The fault continues a stream ([`GranularityPolicy::on_fault`]).
    pub stream: bool,
    /// Evictions since the chunk was evicted (modulo 2^16, the stamp's
    /// width).
    pub distance_evictions: u64,
    /// The memory limit in whole chunks, if there is one.
    pub limit_chunks: Option<u64>,
}

/// Decides the granularity of chunks from what the engine sees.
pub(crate) trait GranularityPolicy: Send + Sync {
    /// The policy may split chunks (otherwise the engine skips asking).
    fn active(&self) -> bool;
    /// Notes a fault on page `page` of `chunk`; true when it continues a
    /// sequential stream.
    fn on_fault(&self, chunk: UnitIndex, page: PageIndex) -> bool;
    /// What a refault tells: keep, mark, or split the chunk.
    fn on_refault(&self, event: RefaultEvent) -> Refault;
    /// Whether the split chunk `chunk` (its pages in `pages`) should be
    /// collapsed back into one huge mapping now, after a fault restored
    /// its page `page`.
    fn should_collapse(&self, chunk: UnitIndex, page: PageIndex, pages: &PageTable) -> bool;
    /// Whether prefetching a stream's next chunk pays now.
    fn prefetch_pays(&self) -> bool;
}

/// The fixed units: chunks never split, nothing is prefetched.
pub(crate) struct Fixed;

impl GranularityPolicy for Fixed {
    fn active(&self) -> bool {
        false
    }

    fn on_fault(&self, _chunk: UnitIndex, _page: PageIndex) -> bool {
        false
    }

    fn on_refault(&self, _event: RefaultEvent) -> Refault {
        Refault::Keep
    }

    fn should_collapse(&self, _chunk: UnitIndex, _page: PageIndex, _pages: &PageTable) -> bool {
        false
    }

    fn prefetch_pays(&self) -> bool {
        false
    }
}

/// Why a chunk was split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitReason {
    /// `--force-split-every`.
    Forced = 0,
    /// Faulted back soon after its eviction, not on a stream.
    Thrashing = 1,
    /// `SwapEngine::split_range`.
    Requested = 2,
}

/// Why a collapse was tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollapseReason {
    /// `--force-split-every`.
    Forced = 0,
    /// A burst of page faults on the chunk
    /// (`refault_distance::DENSE_BURST_FAULTS`, doubled per flip).
    Dense = 1,
    /// `SwapEngine::collapse_range`.
    Requested = 2,
}

/// What a refault means for a chunk ([`GranularityPolicy::on_refault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refault {
    /// Nothing to note: the policy is off, the chunk pinned, or the
    /// refault is one of a run at a medium distance not yet long enough to
    /// split it (its short mark stays as it was).
    Keep,
    /// Back after a long time, or on a stream: clear the short mark.
    Long,
    /// Back soon after its eviction, the first time in a row: mark it.
    Short,
    /// Back soon again: split it.
    Split,
}

impl Refault {
    /// The restored chunk's word with the short-refault mark this verdict
    /// leaves on it.
    pub fn mark(self, loading: UnitState) -> UnitState {
        match self {
            Refault::Keep => loading,
            Refault::Long | Refault::Split => loading.with_short_refault(false),
            Refault::Short => loading.with_short_refault(true),
        }
    }
}
