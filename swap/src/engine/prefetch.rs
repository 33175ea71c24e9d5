//! Sequential prefetch (`--swap-unit auto`): a fault that continues a
//! stream (see `granularity`) offers the next chunk; a prefetch thread
//! reads it from the store into a restore buffer and installs it, so the
//! stream's next fault does not happen.
//!
//! Bounds: a prefetch runs only in the headroom the background evictor
//! keeps below the limit, leaving one unit of it for a fault (it never
//! evicts to make room),
//! and the queue keeps the last few offers only: offers of a stream that
//! stopped are dropped as newer ones arrive, which is how a prefetch is
//! cancelled. A prefetched chunk is installed write-protected (as any
//! clean restore) and marked: its first write, or a fault on it, counts as
//! a hit; an eviction of it still marked counts as waste (a chunk only
//! read after its prefetch leaves no trace, so it counts as waste too).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::lifecycle::Lifecycle;
use super::limit::Limiter;
use super::restore::Restorer;
use super::stats::{bump, Counters};
use super::working_set::WorkingSet;
use crate::chunk::{ChunkTable, Tag};
use crate::index::UnitIndex;

/// Offers kept: a few streams' next chunks.
const QUEUE_CHUNKS: usize = 4;

/// The queue of chunks to prefetch and the thread's work.
pub(crate) struct Prefetcher {
    queue: Mutex<VecDeque<UnitIndex>>,
    offered: Condvar,
    table: Arc<ChunkTable>,
    limiter: Arc<Limiter>,
    restorer: Arc<Restorer>,
    counters: Arc<Counters>,
    /// Working-set sampling, when on: a sampled unit is left to its fault,
    /// which is how the sample is seen to come back.
    working_set: Option<Arc<WorkingSet>>,
    life: Arc<Lifecycle>,
}

impl Prefetcher {
    /// A prefetcher restoring through `restorer`.
    pub fn new(
        table: Arc<ChunkTable>,
        limiter: Arc<Limiter>,
        restorer: Arc<Restorer>,
        counters: Arc<Counters>,
        working_set: Option<Arc<WorkingSet>>,
        life: Arc<Lifecycle>,
    ) -> Prefetcher {
        Prefetcher {
            queue: Mutex::new(VecDeque::new()),
            offered: Condvar::new(),
            table,
            limiter,
            restorer,
            counters,
            working_set,
            life,
        }
    }

    /// Offers `chunk` for prefetching (the oldest offer goes when full).
    pub fn offer(&self, chunk: UnitIndex) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.contains(&chunk) {
            return;
        }
        if queue.len() == QUEUE_CHUNKS {
            queue.pop_front();
        }
        queue.push_back(chunk);
        self.offered.notify_one();
    }

    fn next(&self, wait: Duration) -> Option<UnitIndex> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.is_empty() {
            queue = self
                .offered
                .wait_timeout(queue, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        queue.pop_front()
    }

    /// Body of the prefetch thread.
    pub(crate) fn run(&self) {
        let s = self;
        while !s.life.stopping() && !s.life.failed() {
            if let Some(chunk) = s.next(Duration::from_millis(50)) {
                s.prefetch_one(chunk);
            }
        }
    }

    fn prefetch_one(&self, chunk: UnitIndex) {
        let s = self;
        if chunk.get() >= s.table.units() {
            return;
        }
        let state = s.table.load(chunk);
        if state.tag() != Tag::Stored || state.pinned() {
            return;
        }
        if s.working_set.as_ref().is_some_and(|ws| ws.is_marked(chunk)) {
            return;
        }
        let unit_pages = s.limiter.unit_pages();
        let Some(limit) = s.limiter.limit_pages() else {
            return;
        };
        // Only the headroom the background evictor keeps below the limit, and
        // never its last unit: a fault must still find room without evicting.
        if s.limiter.held_pages() + 2 * unit_pages > limit {
            bump(&s.counters.prefetch.skipped);
            return;
        }
        if !s.limiter.try_reserve(unit_pages) {
            bump(&s.counters.prefetch.skipped);
            return;
        }
        let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
            s.limiter.release(unit_pages);
            return;
        };
        bump(&s.counters.prefetch.issued);
        if let Err(e) =
            s.restorer
                .restore_from_store(chunk, loading, state.store_slot(), false, true)
        {
            s.life.fatal(&e);
        }
    }
}
