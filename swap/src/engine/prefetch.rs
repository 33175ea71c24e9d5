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
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::fault::restore_from_store;
use super::stats::bump;
use super::Shared;
use crate::chunk::Tag;

/// Offers kept: a few streams' next chunks.
const QUEUE_CHUNKS: usize = 4;

/// The queue of chunks to prefetch.
#[derive(Default)]
pub(crate) struct Prefetcher {
    queue: Mutex<VecDeque<usize>>,
    offered: Condvar,
}

impl Prefetcher {
    /// Offers `chunk` for prefetching (the oldest offer goes when full).
    pub fn offer(&self, chunk: usize) {
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

    fn next(&self, wait: Duration) -> Option<usize> {
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
}

/// Body of the prefetch thread.
pub(crate) fn run(s: &Shared) {
    while !s.stopping() && !s.failed() {
        if let Some(chunk) = s.prefetch.next(Duration::from_millis(50)) {
            prefetch_one(s, chunk);
        }
    }
}

fn prefetch_one(s: &Shared, chunk: usize) {
    if chunk >= s.table.units() {
        return;
    }
    let state = s.table.load(chunk);
    if state.tag() != Tag::Stored || state.pinned() {
        return;
    }
    let unit_pages = s.limiter.unit_pages();
    let Some(limit) = s.limiter.limit_pages() else {
        return;
    };
    // Only the headroom the background evictor keeps below the limit, and
    // never its last unit: a fault must still find room without evicting.
    if s.limiter.held_pages() + 2 * unit_pages > limit {
        bump(&s.counters.prefetch_skipped);
        return;
    }
    if !s.limiter.try_reserve(unit_pages) {
        bump(&s.counters.prefetch_skipped);
        return;
    }
    let Ok(loading) = s.table.begin_fault(chunk.into(), state) else {
        s.limiter.release(unit_pages);
        return;
    };
    bump(&s.counters.prefetches);
    if let Err(e) = restore_from_store(s, chunk, loading, state.store_slot(), false, true) {
        s.fatal(&e);
    }
}
