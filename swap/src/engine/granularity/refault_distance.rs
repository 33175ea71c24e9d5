//! The granularity policy of `--swap-unit auto`, by refault distance: which chunks to split
//! into pages and which split chunks to collapse, from what the engine
//! sees (docs/GRANULARITY.md has the signals and why these).
//!
//! This host's kernel gives no accessed bits the engine can read without
//! splitting huge mappings (no virtual-address DAMON, no idle page
//! tracking, no soft-dirty, PAGEMAP_SCAN without an accessed bit). What
//! the engine does see:
//! - **refault distance**: every eviction stamps the chunk with the
//!   engine's eviction count; when the chunk faults back, the evictions
//!   since tell how long it stayed out. A chunk that comes back after
//!   fewer evictions than the chunks the limit holds is in a working set
//!   at most twice the limit, cycling through it: it thrashes, and moving
//!   it whole each time costs 2 MiB per touch. A pass over a larger
//!   working set brings each chunk back only after the rest went through;
//! - **streams**: faults on consecutive chunks (a few streams at once,
//!   one per writer) are sequential work, which 2 MiB units serve best:
//!   never split a stream's chunk;
//! - **which pages of a split chunk fault back**: the resident pages of a
//!   split chunk are its density; many resident pages mean the chunk is
//!   used densely again.
//!
//! Rules: a chunk that faults back from the store (or the parking area)
//! with a short refault distance, not on a stream, for the second time in
//! a row, is split; its cold pages then leave one by one and its hot
//! pages come back alone. A split chunk with `DENSE_PAGES` resident pages
//! is collapsed (its stored pages read in one I/O).
//!
//! The cost of changing its mind is bounded per chunk, in the manner of
//! ski rental: a split costs nothing up front (one page installed) and is
//! never worse than the 4 KiB unit on that chunk, while a collapse bets
//! 2 MiB of memory and a 2 MiB read that the chunk is dense. So a chunk
//! the policy collapsed and then had to split again (a flip) needs twice
//! the resident pages before its next collapse: 8, 16, ... 512. After
//! `MAX_COLLAPSE_BACKOFF` flips it collapses only when every page is
//! resident already (in place, no I/O), so a chunk flips at most that many
//! times in its life, however its use alternates. Hysteresis on the split
//! side as well: a chunk collapsed once needs a refault distance four
//! times shorter to split again.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::{GranularityPolicy, Refault, RefaultEvent};
use crate::chunk::{PageRef, PageTable, PageTag, PAGES_PER_CHUNK};

/// Streams tracked at once (one per sequential writer; more are
/// forgotten round robin).
const STREAMS: usize = 8;

/// How far into a chunk a sequential pass's first fault may land (a
/// vCPU's write may start a few pages in).
const STREAM_ENTRY_PAGES: usize = 16;

/// Resident pages from which a split chunk is dense enough to collapse:
/// reading the rest of the chunk in one 2 MiB I/O then costs less than
/// the page faults still to come. Low, because a chunk split by mistake
/// (dense use whose refaults looked like thrashing: several vCPUs passing
/// over the same chunks at random times) pays a page fault per page until
/// then; a chunk with one or a few hot pages stays far below it.
pub(crate) const DENSE_PAGES: u32 = 8;

/// Flips after which a chunk collapses only with every page resident:
/// `DENSE_PAGES << MAX_COLLAPSE_BACKOFF` is a whole chunk.
pub(crate) const MAX_COLLAPSE_BACKOFF: u8 = 6;

const _: () = assert!((DENSE_PAGES as usize) << MAX_COLLAPSE_BACKOFF == PAGES_PER_CHUNK);

/// The policy's state: the streams seen, and each chunk's flips.
pub(crate) struct RefaultDistance {
    /// The last chunk of each stream (`u64::MAX`: none).
    streams: [AtomicU64; STREAMS],
    /// When each stream last moved on to a new chunk, in `faults_seen`.
    moved_at: [AtomicU64; STREAMS],
    next_stream: AtomicUsize,
    /// Faults [`RefaultDistance::note_fault`] has seen: the streams' clock.
    faults_seen: AtomicU64,
    /// CPUs this process may run on.
    cpus: usize,
    /// Per chunk: how many times the policy split it again after
    /// collapsing it, up to [`MAX_COLLAPSE_BACKOFF`]; each doubles the
    /// resident pages its next collapse needs.
    collapse_backoff: Box<[AtomicU8]>,
}

/// A stream is active while it moved on within this many faults: with
/// `STREAMS` streams taking turns, each moves on every few faults.
const ACTIVE_WINDOW_FAULTS: u64 = 4 * STREAMS as u64;

impl RefaultDistance {
    /// The policy for a table of `chunks` chunks.
    pub fn new(chunks: usize) -> RefaultDistance {
        RefaultDistance {
            streams: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            moved_at: std::array::from_fn(|_| AtomicU64::new(0)),
            next_stream: AtomicUsize::new(0),
            faults_seen: AtomicU64::new(0),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            collapse_backoff: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Resident pages from which the split chunk `chunk` is collapsed.
    pub fn dense_pages(&self, chunk: usize) -> u32 {
        let backoff = self
            .collapse_backoff
            .get(chunk)
            .map_or(0, |b| b.load(Ordering::Relaxed));
        DENSE_PAGES << backoff.min(MAX_COLLAPSE_BACKOFF)
    }

    /// Notes that the policy splits `chunk` again after collapsing it.
    fn note_flip(&self, chunk: usize) {
        if let Some(backoff) = self.collapse_backoff.get(chunk) {
            // Races between fault threads on one chunk cannot happen: the
            // thread that splits it holds the chunk.
            let flips = backoff.load(Ordering::Relaxed);
            backoff.store((flips + 1).min(MAX_COLLAPSE_BACKOFF), Ordering::Relaxed);
        }
    }

    /// Streams that moved on to a new chunk within the last
    /// [`ACTIVE_WINDOW_FAULTS`] faults.
    pub fn active_streams(&self) -> usize {
        let now = self.faults_seen.load(Ordering::Relaxed);
        self.moved_at
            .iter()
            .zip(&self.streams)
            .filter(|(at, last)| {
                last.load(Ordering::Relaxed) != u64::MAX
                    && now.saturating_sub(at.load(Ordering::Relaxed)) < ACTIVE_WINDOW_FAULTS
                    && at.load(Ordering::Relaxed) > 0
            })
            .count()
    }

    /// Whether a stream's next chunk is worth prefetching now: not while
    /// more streams run than there are CPUs. Then the streams' threads
    /// take turns, memory holds part of every stream, and each prefetched
    /// chunk displaces the next chunk of a stream that is waiting for a
    /// CPU: measured on seed 000's shape (4 vCPUs on 2 CPUs), prefetching
    /// added about one store read and one write per prefetch and saved no
    /// fault (docs/GRANULARITY.md).
    pub fn prefetch_pays(&self) -> bool {
        self.active_streams() <= self.cpus
    }

    /// Records a fault on page `page` of `chunk`; true when it continues a
    /// stream: the stream's last chunk was this one, or the one before and
    /// the fault is in the chunk's first pages (a sequential pass enters
    /// each chunk at its start; a scattered hot page in the next chunk is
    /// no stream), or the one after and the fault is in its last pages (a
    /// pass downwards). Races between fault threads only lose a sample.
    pub fn note_fault(&self, chunk: usize, page: usize) -> bool {
        let chunk = chunk as u64;
        let now = self.faults_seen.fetch_add(1, Ordering::Relaxed) + 1;
        for (stream, moved_at) in self.streams.iter().zip(&self.moved_at) {
            let last = stream.load(Ordering::Relaxed);
            if last == chunk {
                return true;
            }
            let up = last != u64::MAX && last + 1 == chunk && page < STREAM_ENTRY_PAGES;
            let down = last == chunk + 1 && page >= PAGES_PER_CHUNK - STREAM_ENTRY_PAGES;
            if up || down {
                stream.store(chunk, Ordering::Relaxed);
                moved_at.store(now, Ordering::Relaxed);
                return true;
            }
        }
        let i = self.next_stream.fetch_add(1, Ordering::Relaxed) % STREAMS;
        self.streams[i].store(chunk, Ordering::Relaxed);
        // A new stream has not moved yet.
        self.moved_at[i].store(0, Ordering::Relaxed);
        false
    }
}

impl GranularityPolicy for RefaultDistance {
    fn active(&self) -> bool {
        true
    }

    fn on_fault(&self, chunk: usize, page: usize) -> bool {
        self.note_fault(chunk, page)
    }

    /// Splits a chunk on its second short refault in a row, so that a
    /// chunk that happened to come back soon once (several vCPUs passing
    /// over it one after another) stays huge.
    fn on_refault(&self, event: RefaultEvent) -> Refault {
        let state = event.state;
        if state.pinned() {
            return Refault::Keep;
        }
        let Some(limit_chunks) = event.limit_chunks else {
            return Refault::Keep;
        };
        if event.stream {
            return Refault::Long;
        }
        let mut threshold = limit_chunks.max(4);
        if state.collapsed() {
            threshold /= 4;
        }
        if event.distance_evictions >= threshold {
            Refault::Long
        } else if state.short_refault() {
            if state.collapsed() {
                self.note_flip(event.chunk);
            }
            Refault::Split
        } else {
            Refault::Short
        }
    }

    /// Dense: [`RefaultDistance::dense_pages`] resident pages.
    fn should_collapse(&self, chunk: usize, pages: &PageTable) -> bool {
        let dense = self.dense_pages(chunk);
        let mut resident = 0;
        for page in 0..PAGES_PER_CHUNK {
            if pages.load(PageRef { chunk, page }).tag() == PageTag::Resident {
                resident += 1;
                if resident >= dense {
                    return true;
                }
            }
        }
        false
    }

    fn prefetch_pays(&self) -> bool {
        RefaultDistance::prefetch_pays(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::UnitState;

    #[test]
    fn consecutive_chunks_are_streams_and_scattered_ones_are_not() {
        let g = RefaultDistance::new(0);
        assert!(!g.note_fault(10, 0), "a first fault starts a stream");
        assert!(g.note_fault(11, 0));
        assert!(g.note_fault(12, 3));
        assert!(g.note_fault(12, 300), "again on the same chunk");
        assert!(!g.note_fault(500, 0), "a second stream starts");
        assert!(g.note_fault(13, 0), "the first goes on");
        assert!(g.note_fault(501, 1));
        assert!(
            !g.note_fault(502, 200),
            "the next chunk, but not at its start"
        );
        assert!(g.note_fault(501, 511), "downwards: entered at its end");
        for chunk in [7000, 3, 99, 4242, 17, 808, 61, 2024] {
            assert!(!g.note_fault(chunk, 0), "{chunk} continues nothing");
        }
        assert!(
            !g.note_fault(14, 0),
            "eight scattered faults pushed the stream out"
        );
    }

    #[test]
    fn prefetch_pays_while_no_more_streams_move_than_cpus() {
        let g = RefaultDistance {
            cpus: 2,
            ..RefaultDistance::new(0)
        };
        // Scattered faults start streams that never move: none active.
        for chunk in [100, 300, 500, 700] {
            g.note_fault(chunk, 0);
        }
        assert_eq!(g.active_streams(), 0);
        assert!(g.prefetch_pays());
        // Two streams taking turns.
        for step in 1..10 {
            g.note_fault(100 + step, 0);
            g.note_fault(300 + step, 0);
        }
        assert_eq!(g.active_streams(), 2);
        assert!(g.prefetch_pays());
        // Four streams taking turns on two CPUs: no prefetch.
        for step in 10..20 {
            for base in [100, 300, 500, 700] {
                g.note_fault(base + step, 0);
            }
        }
        assert_eq!(g.active_streams(), 4);
        assert!(!g.prefetch_pays());
        // One stream goes on alone: the others go quiet.
        for step in 20..20 + ACTIVE_WINDOW_FAULTS as usize {
            g.note_fault(100 + step, 0);
        }
        assert_eq!(g.active_streams(), 1);
        assert!(g.prefetch_pays());
    }

    fn stored(collapsed: bool, short: bool) -> UnitState {
        UnitState::ABSENT
            .to(crate::chunk::Tag::Stored, 0)
            .with_collapsed(collapsed)
            .with_short_refault(short)
    }

    fn short_refault(chunk: usize, state: UnitState) -> RefaultEvent {
        RefaultEvent {
            chunk,
            state,
            stream: false,
            distance_evictions: 1,
            limit_chunks: Some(64),
        }
    }

    #[test]
    fn each_flip_doubles_the_density_a_collapse_needs_up_to_a_whole_chunk() {
        let g = RefaultDistance::new(4);
        assert_eq!(g.dense_pages(1), DENSE_PAGES);
        // A first split (the chunk was never collapsed) is no flip.
        assert_eq!(
            g.on_refault(short_refault(1, stored(false, true))),
            Refault::Split
        );
        assert_eq!(g.dense_pages(1), DENSE_PAGES);
        let mut seen = vec![g.dense_pages(1)];
        for _ in 0..10 {
            assert_eq!(
                g.on_refault(short_refault(1, stored(true, true))),
                Refault::Split
            );
            seen.push(g.dense_pages(1));
        }
        assert_eq!(seen, [8, 16, 32, 64, 128, 256, 512, 512, 512, 512, 512]);
        assert_eq!(
            g.dense_pages(0),
            DENSE_PAGES,
            "other chunks keep their own count"
        );
        // Only a split verdict on a collapsed chunk is a flip.
        assert_eq!(
            g.on_refault(short_refault(2, stored(true, false))),
            Refault::Short
        );
        assert_eq!(g.dense_pages(2), DENSE_PAGES);
    }
}
