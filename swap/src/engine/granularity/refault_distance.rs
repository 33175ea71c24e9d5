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
//! - **how a split chunk's page faults arrive**: a burst of faults on
//!   one chunk, more of them than one in [`BURST_DRAIN_FAULTS`] of all
//!   faults for a while, means the chunk is used densely again (a pass
//!   over it, in any order, or a dense hot set filling in); faults on a
//!   chunk that arrive among faults on many other chunks (a few hot
//!   objects in each of many chunks, touched at random) mean it is not,
//!   however many of its pages are resident.
//!
//! Rules: a chunk that faults back from the store (or the parking area)
//! with a short refault distance, not on a stream, for the second time in
//! a row (or at a medium one, up to twice the short threshold, twice in a
//! row or beside a short one: [`MEDIUM_REFAULTS_TO_SPLIT`]), is split;
//! its cold pages then leave one by one and its hot pages come back
//! alone. A split chunk whose page faults make a burst of
//! `DENSE_BURST_FAULTS` is collapsed (its stored pages read in one I/O),
//! and so is one whose last `FAST_RUN_FAULTS` page faults (a quarter of
//! its burst) came back to back, one vCPU's alone (a pass over it).
//!
//! The cost of changing its mind is bounded per chunk, in the manner of
//! ski rental: a split costs nothing up front (one page installed) and is
//! never worse than the 4 KiB unit on that chunk, while a collapse bets
//! 2 MiB of memory and a 2 MiB read that the chunk is dense. So a chunk
//! the policy collapsed and then had to split again (a flip) needs a burst
//! twice as long before its next collapse: 16, 32, ... 512 (and a run
//! twice as long: 4, 8, ... 128). Past `MAX_COLLAPSE_BACKOFF` flips a
//! collapse needs a burst of a whole chunk's worth of page faults or a run
//! of a quarter of it, so every later flip follows at least 127 page
//! faults on that chunk and costs no more than a share of them (about 1.4
//! times their time here, docs/GRANULARITY.md), however its use
//! alternates. Hysteresis on the split side as well: a
//! chunk collapsed once needs a refault distance four times shorter to
//! split again.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::{GranularityPolicy, Refault, RefaultEvent};
use crate::chunk::{PageTable, PAGES_PER_CHUNK};
use crate::index::{PageIndex, UnitIndex};

/// Streams tracked at once (one per sequential writer; more are
/// forgotten round robin).
const STREAMS: usize = 8;

/// How far into a chunk a sequential pass's first fault may land (a
/// vCPU's write may start a few pages in).
const STREAM_ENTRY_PAGES: usize = 16;

/// The burst of page faults on one split chunk from which it is dense
/// enough to collapse, in the manner of ski rental: the page faults of a
/// burst have then cost about what one 2 MiB restore costs (measured on
/// this host, quick workloads suite: a page's store fault is served in
/// 50-80 µs at the median, plus a userfault round trip of about 110 µs;
/// a chunk's store fault in 2.5-3 ms), so reading the rest of the chunk in
/// one I/O costs at most about twice what the best choice in hindsight
/// would have. A burst, not
/// a count of resident pages: a chunk holding a few hot objects (the
/// key-value workload: about 20 hot pages in every chunk, touched at
/// random among all the others) reaches any count while its use stays
/// sparse, and a collapse then only moves its cold pages in and out whole
/// (measured: 784 collapses and as many flips in one 300,000-operation
/// key-value run with a count of 8). A run of neighbouring resident pages
/// fails the other way: a pass that visits a chunk's pages in a permuted
/// order (the verify job) forms runs only late, and pays a page fault per
/// page until then (measured: 5,931 page faults against 215).
pub(crate) const DENSE_BURST_FAULTS: u64 = 16;

/// A chunk's burst drains by one page fault per this many faults on any
/// chunk (a leaky bucket filled by the chunk's own page faults): a chunk
/// whose page faults are more than one in `BURST_DRAIN_FAULTS` of all
/// faults fills it and collapses; one among more chunks than that drains
/// it and stays split. A bucket, not a run of faults each within a fixed
/// gap of the one before: with four vCPUs writing at random over their
/// own 12 chunks each (the randwrite report's shape, 48 chunks faulting
/// at once, about one fault in 48 each), gaps under 16 came 15 times in a
/// row too rarely, the chunks that thrashing split stayed split, and the
/// run thrashed page by page at 3 to 10 times the 4k unit's page faults
/// (1 run in 3). Key-value's hot objects, scattered over 128 or 256
/// chunks, take one fault in 128 or fewer each and drain it. A pass over
/// one chunk (gaps of 1 or 2, one per vCPU passing) fills it at nearly one
/// page fault per fault, so the backoff's 512 is still about a chunk's
/// worth of page faults.
const BURST_DRAIN_FAULTS: u64 = 64;

/// A run of page faults on one split chunk, each following the chunk's
/// previous one with no more faults between than the guest has other
/// vCPUs, from which it is collapsed at once, before its burst reaches
/// [`DENSE_BURST_FAULTS`]: 4 on a chunk that never flipped, and a quarter
/// of the chunk's burst after flips (8, 16, ... 128: the same ladder). Such
/// a run means one vCPU works on the chunk back to back while the others
/// each fault at most once meanwhile: a pass over it (the verify job's
/// vCPUs each take a chunk in turn, in a permuted order of its pages). A
/// leaky bucket alone made every such chunk pay 16 page faults and more
/// before its collapse: measured on the workloads suite's verify (2 vCPUs,
/// 256 MiB under 128 MiB), 2,760-3,360 faults a run against 820 for the
/// 2m unit, about 16 page faults on each of its 130 splits, and 0.4-0.6 s
/// of page stall. With the run before the first flip only: 1,620-2,050
/// faults; with the run on the ladder too (verify's ~20 flipped chunks are
/// passed over again): 1,180-1,210 faults, 0.21-0.25 s
/// (docs/GRANULARITY.md).
///
/// Why no wider gap: with one more fault allowed between per vCPU (gap 4
/// on 2 vCPUs), the key-value workload's freshly split chunks, whose hot
/// pages come back one after another while only a few chunks fault,
/// formed runs too and collapsed only to be split again: 9-98 flips a run
/// at 96 MiB (median 23) against 3-26 (median 6) without the rule. With
/// the gap at the other vCPUs' count, 4-75 (median 7; key-value's flips
/// are bimodal, the late ones in its final check over the whole heap).
///
/// What a wrong call costs: a 2 MiB read and the memory of its cold pages
/// until the chunk is split again, which doubles the run its next collapse
/// needs, as it doubles the burst.
pub(crate) const FAST_RUN_FAULTS: u8 = 4;

/// Refaults in a row at a medium distance (between the short threshold
/// and twice it: a working set of two to three times the limit, cycling
/// through it) after which a chunk is split; a short refault and a medium
/// one next to each other split it too. Each such refault read the whole
/// chunk; a split risks about two such reads on a chunk that turns out
/// dense (16 page faults, then a collapse), so two strikes keep either
/// mistake within a small factor of the other, in the manner of ski
/// rental. Why: the mixed workload's 128 hot chunks of one hot page each,
/// beside a stream, come back every round at about 66 evictions under a
/// 64-chunk limit, just past the short threshold; they split late or
/// never, and the run took 0.97-6.25 s (store faults 350-4,113) against
/// 0.75-0.90 s (239-255) with medium refaults counted. What it costs: a
/// chunk that two vCPUs pass over one after another (the verify job) also
/// comes back at about the limit's distance, a few times in all, and is
/// dense: verify 1.10-1.60 s against 0.85-1.16 s (131-139 splits against
/// 64-77), docs/GRANULARITY.md. Three medium strikes instead of two gave
/// verify 0.95-1.37 s and mixed 1.16-1.50 s: both costs, neither gain.
pub(crate) const MEDIUM_REFAULTS_TO_SPLIT: u8 = 2;

/// Flips after which a collapse needs a burst of a whole chunk's worth of
/// page faults: `DENSE_BURST_FAULTS << MAX_COLLAPSE_BACKOFF` is a chunk.
pub(crate) const MAX_COLLAPSE_BACKOFF: u8 = 5;

const _: () = assert!(DENSE_BURST_FAULTS << MAX_COLLAPSE_BACKOFF == PAGES_PER_CHUNK as u64);

/// A chunk's burst in one word: the `faults_seen` tick of its last page
/// fault above, the bucket's level in the low [`BURST_LEVEL_BITS`], in
/// 1/[`BURST_DRAIN_FAULTS`] of a page fault (so a fault's tick is one unit
/// of drain, and the level of a whole chunk's worth, 512 page faults, fits).
const BURST_LEVEL_BITS: u32 = 16;

const _: () = assert!((PAGES_PER_CHUNK as u64 + 1) * BURST_DRAIN_FAULTS < 1 << BURST_LEVEL_BITS);

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
    /// burst its next collapse needs.
    collapse_backoff: Box<[AtomicU8]>,
    /// Per chunk: its refaults in a row at a medium distance (see
    /// [`MEDIUM_REFAULTS_TO_SPLIT`]).
    medium_refaults: Box<[AtomicU8]>,
    /// Per chunk: its current burst of page faults (see
    /// [`BURST_LEVEL_BITS`]).
    bursts: Box<[AtomicU64]>,
    /// Per chunk: its current run of close page faults (see
    /// [`FAST_RUN_FAULTS`]).
    runs: Box<[AtomicU8]>,
    /// Faults on other chunks that may come between two of a run's (see
    /// [`FAST_RUN_FAULTS`]): one per other vCPU.
    run_gap_faults: u64,
}

/// A stream is active while it moved on within this many faults: with
/// `STREAMS` streams taking turns, each moves on every few faults.
const ACTIVE_WINDOW_FAULTS: u64 = 4 * STREAMS as u64;

impl RefaultDistance {
    /// The policy for a table of `chunks` chunks, faulted on by `vcpus`
    /// vCPUs.
    pub fn new(chunks: usize, vcpus: u32) -> RefaultDistance {
        RefaultDistance {
            streams: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            moved_at: std::array::from_fn(|_| AtomicU64::new(0)),
            next_stream: AtomicUsize::new(0),
            faults_seen: AtomicU64::new(0),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            collapse_backoff: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
            medium_refaults: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
            bursts: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
            runs: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
            run_gap_faults: u64::from(vcpus.saturating_sub(1)),
        }
    }

    /// The burst of page faults from which the split chunk `chunk` is
    /// collapsed.
    pub fn dense_burst_faults(&self, chunk: UnitIndex) -> u64 {
        let backoff = self
            .collapse_backoff
            .get(chunk.get())
            .map_or(0, |b| b.load(Ordering::Relaxed));
        DENSE_BURST_FAULTS << backoff.min(MAX_COLLAPSE_BACKOFF)
    }

    /// Adds a page fault on `chunk`, seen now, to its burst, drained by
    /// the faults since its previous one, and to its run (see
    /// [`FAST_RUN_FAULTS`]), and returns the burst's length in whole page
    /// faults. Call after [`RefaultDistance::note_fault`]
    /// for the same fault, which ticks the clock.
    fn note_burst(&self, chunk: UnitIndex) -> u64 {
        let Some(burst) = self.bursts.get(chunk.get()) else {
            return 0;
        };
        let now = self.faults_seen.load(Ordering::Relaxed);
        let level_mask = (1u64 << BURST_LEVEL_BITS) - 1;
        let full = PAGES_PER_CHUNK as u64 * BURST_DRAIN_FAULTS;
        let mut level = 0;
        let mut close = false;
        // Only the chunk's own page faults update its word; a lost race
        // between two of them would only lose a sample, but the update is
        // cheap enough to make exact.
        let _ = burst.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
            let last = word >> BURST_LEVEL_BITS;
            close = word != 0 && now.saturating_sub(last) <= self.run_gap_faults + 1;
            let drained = if word == 0 {
                0
            } else {
                (word & level_mask).saturating_sub(now.saturating_sub(last))
            };
            level = (drained + BURST_DRAIN_FAULTS).min(full);
            Some((now << BURST_LEVEL_BITS) | level)
        });
        if let Some(run) = self.runs.get(chunk.get()) {
            // Two vCPUs faulting on one chunk at once may lose one of
            // their updates: a run one fault shorter, a sample lost.
            let length = if close {
                run.load(Ordering::Relaxed).saturating_add(1)
            } else {
                1
            };
            run.store(length, Ordering::Relaxed);
        }
        level.div_ceil(BURST_DRAIN_FAULTS)
    }

    /// Whether `chunk` is in a run of close page faults long enough to
    /// collapse it: a quarter of the burst it would need (see
    /// [`FAST_RUN_FAULTS`]).
    /// `burst_needed` is the chunk's [`RefaultDistance::dense_burst_faults`],
    /// which the caller has already read.
    fn in_fast_run(&self, chunk: UnitIndex, burst_needed: u64) -> bool {
        let needed = burst_needed * u64::from(FAST_RUN_FAULTS) / DENSE_BURST_FAULTS;
        self.runs
            .get(chunk.get())
            .is_some_and(|run| u64::from(run.load(Ordering::Relaxed)) >= needed)
    }

    /// Notes that the policy splits `chunk` again after collapsing it.
    fn note_flip(&self, chunk: UnitIndex) {
        if let Some(backoff) = self.collapse_backoff.get(chunk.get()) {
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
    /// stream: the stream's last chunk was this one and the stream moved
    /// within [`ACTIVE_WINDOW_FAULTS`] faults, or the one before and
    /// the fault is in the chunk's first pages (a sequential pass enters
    /// each chunk at its start; a scattered hot page in the next chunk is
    /// no stream), or the one after and the fault is in its last pages (a
    /// pass downwards). Races between fault threads only lose a sample.
    pub fn note_fault(&self, chunk: UnitIndex, page: PageIndex) -> bool {
        let chunk = chunk.get() as u64;
        let page = page.get();
        let now = self.faults_seen.fetch_add(1, Ordering::Relaxed) + 1;
        for (stream, moved_at) in self.streams.iter().zip(&self.moved_at) {
            let last = stream.load(Ordering::Relaxed);
            if last == chunk {
                // Only a stream that moved lately owns its chunk. A slot
                // that a scattered fault took holds a chunk that merely
                // faulted: a second delivery of one fault (woken before
                // its chunk was mapped, it comes back) or a hot chunk's
                // quick refault would read as a stream, and a thrashing
                // chunk stayed huge on the timing of those deliveries
                // (the fuzz target's `auto-retry-split-pages` split no
                // chunk in about 1 replay of 25).
                let at = moved_at.load(Ordering::Relaxed);
                return at > 0 && now.saturating_sub(at) < ACTIVE_WINDOW_FAULTS;
            }
            let up = last != u64::MAX && last + 1 == chunk && page < STREAM_ENTRY_PAGES;
            let down = last == chunk + 1 && page >= PAGES_PER_CHUNK - STREAM_ENTRY_PAGES;
            if up || down {
                stream.store(chunk, Ordering::Relaxed);
                moved_at.store(now, Ordering::Relaxed);
                return true;
            }
        }
        // A fault that continues nothing may start a stream, in the slot
        // that moved least recently: a slot that never moved (a scattered
        // fault's) goes first, so scattered faults take turns among
        // themselves and leave the streams that move alone, where round
        // robin over all slots let any 8 scattered faults push out a
        // stream that was still going.
        let start = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let i = (0..STREAMS)
            .map(|k| (start + k) % STREAMS)
            .min_by_key(|&i| self.moved_at[i].load(Ordering::Relaxed))
            .unwrap_or(start % STREAMS);
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

    fn on_fault(&self, chunk: UnitIndex, page: PageIndex) -> bool {
        self.note_fault(chunk, page)
    }

    /// Splits a chunk on its second short refault in a row, so that a
    /// chunk that happened to come back soon once (several vCPUs passing
    /// over it one after another) stays huge; or on its
    /// [`MEDIUM_REFAULTS_TO_SPLIT`]th in a row at a medium distance, or on
    /// a short and a medium one next to each other.
    fn on_refault(&self, event: RefaultEvent) -> Refault {
        let state = event.state;
        if state.pinned() {
            return Refault::Keep;
        }
        let Some(limit_chunks) = event.limit_chunks else {
            return Refault::Keep;
        };
        // Only the thread that holds the chunk for its restore decides
        // on it, so plain loads and stores of its count cannot race.
        let medium = self.medium_refaults.get(event.chunk.get());
        let medium_so_far = medium.map_or(0, |m| m.load(Ordering::Relaxed));
        let set_medium = |count: u8| {
            if let Some(m) = medium {
                m.store(count, Ordering::Relaxed);
            }
        };
        if event.stream {
            set_medium(0);
            return Refault::Long;
        }
        let mut threshold = limit_chunks.max(4);
        if state.collapsed() {
            threshold /= 4;
        }
        let split = || {
            set_medium(0);
            if state.collapsed() {
                self.note_flip(event.chunk);
            }
            Refault::Split
        };
        if event.distance_evictions >= 2 * threshold {
            set_medium(0);
            Refault::Long
        } else if event.distance_evictions >= threshold {
            let count = medium_so_far + 1;
            if count >= MEDIUM_REFAULTS_TO_SPLIT || state.short_refault() {
                split()
            } else {
                // The short mark stays as it was: a medium refault neither
                // confirms nor clears it.
                set_medium(count);
                Refault::Keep
            }
        } else if state.short_refault() || medium_so_far > 0 {
            split()
        } else {
            Refault::Short
        }
    }

    /// Dense: the chunk's page faults made a burst of
    /// [`RefaultDistance::dense_burst_faults`], or a run of a quarter of
    /// that (see [`FAST_RUN_FAULTS`]).
    fn should_collapse(&self, chunk: UnitIndex, _page: PageIndex, _pages: &PageTable) -> bool {
        let burst_needed = self.dense_burst_faults(chunk);
        self.note_burst(chunk) >= burst_needed || self.in_fast_run(chunk, burst_needed)
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
        let g = RefaultDistance::new(0, 2);
        assert!(
            !g.note_fault(UnitIndex::new(10), PageIndex::new(0)),
            "a first fault starts a stream"
        );
        assert!(g.note_fault(UnitIndex::new(11), PageIndex::new(0)));
        assert!(g.note_fault(UnitIndex::new(12), PageIndex::new(3)));
        assert!(
            g.note_fault(UnitIndex::new(12), PageIndex::new(300)),
            "again on the same chunk"
        );
        assert!(
            !g.note_fault(UnitIndex::new(500), PageIndex::new(0)),
            "a second stream starts"
        );
        assert!(
            !g.note_fault(UnitIndex::new(500), PageIndex::new(40)),
            "a chunk that faulted again before its stream moved is no stream"
        );
        assert!(
            g.note_fault(UnitIndex::new(13), PageIndex::new(0)),
            "the first goes on"
        );
        assert!(g.note_fault(UnitIndex::new(501), PageIndex::new(1)));
        assert!(
            !g.note_fault(UnitIndex::new(502), PageIndex::new(200)),
            "the next chunk, but not at its start"
        );
        assert!(
            g.note_fault(UnitIndex::new(501), PageIndex::new(511)),
            "downwards: entered at its end"
        );
        for chunk in [7000, 3, 99, 4242, 1700, 808, 61, 2024] {
            assert!(
                !g.note_fault(UnitIndex::new(chunk), PageIndex::new(0)),
                "{chunk} continues nothing"
            );
        }
        assert!(
            g.note_fault(UnitIndex::new(14), PageIndex::new(0)),
            "scattered faults take the slots that never moved, not the stream's"
        );
        let fault = |chunk: usize| g.note_fault(UnitIndex::new(chunk), PageIndex::new(0));
        for round in 0..100 {
            assert!(!fault(10_000 + 37 * round));
            assert!(!fault(20_000 + 53 * round));
        }
        assert!(
            fault(15),
            "a stream goes on among any number of scattered faults"
        );
    }

    #[test]
    fn a_stream_that_stopped_no_longer_owns_its_last_chunk() {
        let g = RefaultDistance::new(0, 2);
        let fault =
            |chunk: usize, page: usize| g.note_fault(UnitIndex::new(chunk), PageIndex::new(page));
        fault(40, 0);
        assert!(fault(41, 0));
        assert!(fault(41, 200), "the stream is in its chunk");
        for round in 0..ACTIVE_WINDOW_FAULTS as usize {
            fault(9_000 + 13 * round, 100);
        }
        assert!(
            !fault(41, 300),
            "its chunk refaulting after the stream stopped is a refault, not a stream"
        );
        assert!(fault(42, 0), "the stream may still go on");
    }

    #[test]
    fn the_slot_that_moved_least_recently_is_the_one_taken() {
        let g = RefaultDistance::new(0, 2);
        let fault = |chunk: usize| g.note_fault(UnitIndex::new(chunk), PageIndex::new(0));
        // Eight streams, each moved once, stream 0 first.
        for s in 0..STREAMS {
            fault(s * 1000);
            fault(s * 1000 + 1);
        }
        assert_eq!(g.active_streams(), STREAMS);
        // A new fault takes stream 0's slot (moved longest ago).
        assert!(!fault(50_000));
        assert!(!fault(2), "stream 0 was pushed out");
        assert!(fault(7002), "the newest stream goes on");
    }

    #[test]
    fn prefetch_pays_while_no_more_streams_move_than_cpus() {
        let g = RefaultDistance {
            cpus: 2,
            ..RefaultDistance::new(0, 2)
        };
        // Scattered faults start streams that never move: none active.
        for chunk in [100, 300, 500, 700] {
            g.note_fault(UnitIndex::new(chunk), PageIndex::new(0));
        }
        assert_eq!(g.active_streams(), 0);
        assert!(g.prefetch_pays());
        // Two streams taking turns.
        for step in 1..10 {
            g.note_fault(UnitIndex::new(100 + step), PageIndex::new(0));
            g.note_fault(UnitIndex::new(300 + step), PageIndex::new(0));
        }
        assert_eq!(g.active_streams(), 2);
        assert!(g.prefetch_pays());
        // Four streams taking turns on two CPUs: no prefetch.
        for step in 10..20 {
            for base in [100, 300, 500, 700] {
                g.note_fault(UnitIndex::new(base + step), PageIndex::new(0));
            }
        }
        assert_eq!(g.active_streams(), 4);
        assert!(!g.prefetch_pays());
        // One stream goes on alone: the others go quiet.
        for step in 20..20 + ACTIVE_WINDOW_FAULTS as usize {
            g.note_fault(UnitIndex::new(100 + step), PageIndex::new(0));
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

    fn short_refault(chunk: UnitIndex, state: UnitState) -> RefaultEvent {
        RefaultEvent {
            chunk,
            state,
            stream: false,
            distance_evictions: 1,
            limit_chunks: Some(64),
        }
    }

    #[test]
    fn a_burst_of_faults_on_one_chunk_is_dense_and_faults_among_many_chunks_are_not() {
        let g = RefaultDistance::new(300, 2);
        let fault = |chunk: usize| {
            let chunk = UnitIndex::new(chunk);
            g.note_fault(chunk, PageIndex::new(7));
            g.note_burst(chunk)
        };
        // A pass over chunk 5, in any order, with two other vCPUs' faults
        // interleaved.
        let mut lengths = Vec::new();
        for _ in 0..DENSE_BURST_FAULTS {
            lengths.push(fault(5));
            fault(200);
            fault(201);
        }
        assert_eq!(lengths, (1..=DENSE_BURST_FAULTS).collect::<Vec<_>>());
        // A chunk touched now and then among faults on 64 others: its
        // bucket drains between faults, however many there are.
        for round in 0..100 {
            assert_eq!(fault(7), 1, "round {round}");
            for other in 0..64 {
                fault(100 + other);
            }
        }
        // Key-value's shape: 128 chunks faulting in turn. None fills.
        let mut longest = 0;
        for _ in 0..1000 {
            for chunk in 0..128 {
                longest = longest.max(fault(chunk));
            }
        }
        assert_eq!(longest, 1, "one fault in 128 is sparse");
        // Randwrite's: 48 chunks faulting in turn, each more than one
        // fault in 64, fill their buckets (by 16 faults' worth a round).
        let mut rounds = 0;
        'fill: for round in 1..=100 {
            for chunk in 0..48 {
                if fault(chunk) >= DENSE_BURST_FAULTS {
                    rounds = round;
                    break 'fill;
                }
            }
        }
        assert!((50..=60).contains(&rounds), "filled after {rounds} rounds");
        // A burst drains by a page fault per BURST_DRAIN_FAULTS faults.
        for _ in 0..10 {
            fault(250);
        }
        for other in 0..5 * BURST_DRAIN_FAULTS {
            fault(130 + (other % 100) as usize);
        }
        assert_eq!(fault(250), 10 - 5 + 1);
    }

    /// A page fault on `unit` as the fault service reports it to the
    /// policy: whether it collapses the chunk.
    fn page_fault(g: &RefaultDistance, pages: &PageTable, unit: usize) -> bool {
        let unit = UnitIndex::new(unit);
        g.note_fault(unit, PageIndex::new(7));
        g.should_collapse(unit, PageIndex::new(7), pages)
    }

    #[test]
    fn a_pass_by_one_vcpu_collapses_a_chunk_at_once_and_hot_pages_coming_back_do_not() {
        let pages = PageTable::new(300);
        let g = RefaultDistance::new(300, 2);
        // A pass over chunk 5 while the other vCPU faults elsewhere: one
        // fault of the other between each two of its own.
        let verdicts: Vec<bool> = (0..FAST_RUN_FAULTS)
            .map(|_| {
                let collapse = page_fault(&g, &pages, 5);
                page_fault(&g, &pages, 100);
                collapse
            })
            .collect();
        assert_eq!(verdicts, [false, false, false, true]);
        // Hot pages of three freshly split chunks coming back in turn: two
        // faults between each of a chunk's own, never a run.
        let g = RefaultDistance::new(300, 2);
        for _ in 0..(DENSE_BURST_FAULTS - 1) {
            for unit in [10, 11, 12] {
                assert!(!page_fault(&g, &pages, unit));
            }
        }
        // A chunk that flipped needs a run twice as long, as it needs a
        // burst twice as long.
        let g = RefaultDistance::new(300, 2);
        assert_eq!(
            g.on_refault(short_refault(UnitIndex::new(5), stored(true, true))),
            Refault::Split
        );
        let first = (1..=2 * DENSE_BURST_FAULTS).find(|_| {
            let collapse = page_fault(&g, &pages, 5);
            page_fault(&g, &pages, 100);
            collapse
        });
        assert_eq!(first, Some(2 * u64::from(FAST_RUN_FAULTS)));
        // With four vCPUs a run may have three other faults between each
        // two of its own.
        let g = RefaultDistance::new(300, 4);
        let collapsed_after = (1..=DENSE_BURST_FAULTS).find(|_| {
            let collapse = page_fault(&g, &pages, 5);
            for other in 200..203 {
                g.note_fault(UnitIndex::new(other), PageIndex::new(1));
            }
            collapse
        });
        assert_eq!(collapsed_after, Some(u64::from(FAST_RUN_FAULTS)));
    }

    #[test]
    fn a_run_of_medium_refaults_splits_a_chunk_and_a_long_one_ends_the_run() {
        let g = RefaultDistance::new(4, 2);
        let refault = |chunk: usize, distance_evictions: u64, stream: bool| {
            g.on_refault(RefaultEvent {
                chunk: UnitIndex::new(chunk),
                state: stored(false, false),
                stream,
                distance_evictions,
                limit_chunks: Some(64),
            })
        };
        // Between the limit's chunks and twice them: medium.
        assert_eq!(refault(1, 66, false), Refault::Keep);
        assert_eq!(
            refault(1, 127, false),
            Refault::Split,
            "the second in a row"
        );
        assert_eq!(
            refault(1, 66, false),
            Refault::Keep,
            "the count starts again"
        );
        // A long refault or a stream's ends the run.
        assert_eq!(refault(2, 128, false), Refault::Long);
        assert_eq!(refault(2, 66, false), Refault::Keep);
        assert_eq!(refault(2, 128, false), Refault::Long);
        assert_eq!(refault(2, 66, false), Refault::Keep);
        assert_eq!(refault(2, 66, true), Refault::Long);
        // A medium refault after a short one (the chunk word's mark) splits.
        let marked = g.on_refault(RefaultEvent {
            chunk: UnitIndex::new(2),
            state: stored(false, true),
            stream: false,
            distance_evictions: 70,
            limit_chunks: Some(64),
        });
        assert_eq!(marked, Refault::Split);
        // A short refault after a medium one splits.
        assert_eq!(refault(2, 66, false), Refault::Keep);
        assert_eq!(refault(2, 3, false), Refault::Split);
        assert_eq!(refault(2, 3, false), Refault::Short, "the run ended");
        // A collapsed chunk's thresholds are four times shorter.
        let collapsed = |distance_evictions: u64| {
            g.on_refault(RefaultEvent {
                chunk: UnitIndex::new(3),
                state: stored(true, false),
                stream: false,
                distance_evictions,
                limit_chunks: Some(64),
            })
        };
        assert_eq!(collapsed(32), Refault::Long);
        assert_eq!(collapsed(16), Refault::Keep);
        assert_eq!(collapsed(32), Refault::Long, "the run ended");
        assert_eq!(collapsed(31), Refault::Keep);
        assert_eq!(collapsed(20), Refault::Split);
        assert_eq!(
            g.dense_burst_faults(UnitIndex::new(3)),
            2 * DENSE_BURST_FAULTS,
            "a collapsed chunk split again flipped"
        );
    }

    #[test]
    fn each_flip_doubles_the_density_a_collapse_needs_up_to_a_whole_chunk() {
        let g = RefaultDistance::new(4, 2);
        assert_eq!(g.dense_burst_faults(UnitIndex::new(1)), DENSE_BURST_FAULTS);
        // A first split (the chunk was never collapsed) is no flip.
        assert_eq!(
            g.on_refault(short_refault(UnitIndex::new(1), stored(false, true))),
            Refault::Split
        );
        assert_eq!(g.dense_burst_faults(UnitIndex::new(1)), DENSE_BURST_FAULTS);
        let mut seen = vec![g.dense_burst_faults(UnitIndex::new(1))];
        for _ in 0..10 {
            assert_eq!(
                g.on_refault(short_refault(UnitIndex::new(1), stored(true, true))),
                Refault::Split
            );
            seen.push(g.dense_burst_faults(UnitIndex::new(1)));
        }
        assert_eq!(seen, [16, 32, 64, 128, 256, 512, 512, 512, 512, 512, 512]);
        assert_eq!(
            g.dense_burst_faults(UnitIndex::new(0)),
            DENSE_BURST_FAULTS,
            "other chunks keep their own count"
        );
        // Only a split verdict on a collapsed chunk is a flip.
        assert_eq!(
            g.on_refault(short_refault(UnitIndex::new(2), stored(true, false))),
            Refault::Short
        );
        assert_eq!(g.dense_burst_faults(UnitIndex::new(2)), DENSE_BURST_FAULTS);
    }
}
