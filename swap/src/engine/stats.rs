//! Swap counters and the fault-latency histogram.
//!
//! Counters are relaxed atomics bumped on the hot path; [`SwapStats`] is a
//! plain snapshot for the VMM's metrics and the benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::counter_group::counter_group;

/// Linear sub-buckets per power of two (3 bits: <= 12.5 % bucket width).
const SUB_BITS: u32 = 3;
const SUB_BUCKETS: u64 = 1 << SUB_BITS;
/// Enough buckets for 2^40 µs (12 days).
const BUCKETS: usize = (SUB_BUCKETS + (40 - SUB_BITS as u64) * SUB_BUCKETS) as usize;

fn bucket_of(value_us: u64) -> usize {
    if value_us < SUB_BUCKETS {
        return value_us as usize;
    }
    let exp = 63 - value_us.leading_zeros();
    let sub = (value_us >> (exp - SUB_BITS)) & (SUB_BUCKETS - 1);
    let index = SUB_BUCKETS + u64::from(exp - SUB_BITS) * SUB_BUCKETS + sub;
    (index as usize).min(BUCKETS - 1)
}

/// Smallest value (µs) that lands in bucket `index`.
fn bucket_low_us(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB_BUCKETS {
        return index;
    }
    let exp = (index - SUB_BUCKETS) / SUB_BUCKETS + u64::from(SUB_BITS);
    let sub = (index - SUB_BUCKETS) % SUB_BUCKETS;
    (1 << exp) + (sub << (exp - u64::from(SUB_BITS)))
}

/// A snapshot of the fault-latency histogram: log-linear buckets in µs
/// (8 linear buckets per power of two), measured from reading the fault
/// message to waking the faulting thread.
#[derive(Debug, Clone, Default)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    max_us: u64,
}

impl LatencyHistogram {
    /// Number of recorded faults.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(low_us, high_us_exclusive, count)` for every non-empty bucket, for
    /// plots.
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (bucket_low_us(i), bucket_low_us(i + 1), c))
            .collect()
    }

    /// The `q` quantile (0..=1) in µs: the upper edge of the bucket holding
    /// it, capped at the maximum seen. 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return (bucket_low_us(i + 1).saturating_sub(1)).min(self.max_us);
            }
        }
        self.max_us
    }

    /// Median, µs.
    pub fn p50(&self) -> u64 {
        self.quantile_us(0.5)
    }
    /// 90th percentile, µs.
    pub fn p90(&self) -> u64 {
        self.quantile_us(0.9)
    }
    /// 99th percentile, µs.
    pub fn p99(&self) -> u64 {
        self.quantile_us(0.99)
    }
    /// 99.9th percentile, µs.
    pub fn p999(&self) -> u64 {
        self.quantile_us(0.999)
    }
    /// Largest latency seen, µs.
    pub fn max(&self) -> u64 {
        self.max_us
    }
}

/// A histogram in the stats object: its count and percentiles, µs.
impl serde::Serialize for LatencyHistogram {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = serializer.serialize_struct("LatencyHistogram", 6)?;
        out.serialize_field("count", &self.count())?;
        out.serialize_field("p50", &self.p50())?;
        out.serialize_field("p90", &self.p90())?;
        out.serialize_field("p99", &self.p99())?;
        out.serialize_field("p999", &self.p999())?;
        out.serialize_field("max", &self.max())?;
        out.end()
    }
}

/// What served a fault, for the per-source latency histograms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultSource {
    /// The unit was read from the store.
    Store,
    /// The unit was handed back from the parking area (no I/O).
    Staging,
    /// A never-written unit was zero-filled.
    Zero,
    /// A write hit a write-protected (clean) unit.
    WriteProtect,
}

impl FaultSource {
    /// Every source, in the order of [`LatencyBySource::get`]'s index.
    pub const ALL: [FaultSource; 4] = [
        FaultSource::Store,
        FaultSource::Staging,
        FaultSource::Zero,
        FaultSource::WriteProtect,
    ];

    /// Short name for stats and plots (`store`, `staging`, `zero`, `wp`).
    pub fn name(self) -> &'static str {
        match self {
            FaultSource::Store => "store",
            FaultSource::Staging => "staging",
            FaultSource::Zero => "zero",
            FaultSource::WriteProtect => "wp",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Fault service time per source: from the moment a fault thread starts on
/// the message to the wake of the faulting thread. Unlike
/// [`SwapStats::fault_latency`], which starts when the batch of messages
/// was read, this leaves out the time the message waited behind others of
/// its batch, so it compares directly with the cost of one restore.
/// Messages that restored nothing (another thread had already done it, or
/// the address lies outside guest RAM) are in none of these.
#[derive(Debug, Clone, Default)]
pub struct LatencyBySource {
    by_source: [LatencyHistogram; 4],
}

impl LatencyBySource {
    /// The histogram of one source.
    pub fn get(&self, source: FaultSource) -> &LatencyHistogram {
        &self.by_source[source.index()]
    }
}

counter_group! {
    /// Fault counts by what served them.
    pub struct FaultCounts / AtomicFaultCounts {
        /// Every fault message handled (including write-protect faults and
        /// messages for units another thread had already restored).
        total,
        /// Restores read from the store (whole units; a split chunk's pages
        /// are in [`SplitStats`]).
        store,
        /// Restores handed back from the parking area (no I/O).
        staging,
        /// Of `staging`, units whose store write was in flight: the fault met
        /// the writer and took a copy (the race the engine's write-back tests
        /// must hit).
        staging_writing,
        /// Restores of never-written units (zero fill).
        zero,
    }
}

/// Why an attempt to collapse a split chunk back into one huge mapping did
/// not give one (each attempt that did not is counted under one reason;
/// `MADV_COLLAPSE` failures are counted too, though the move-based
/// fallback then usually succeeds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollapseFailure {
    /// `MADV_COLLAPSE` refused (busy, out of memory, or a page it cannot
    /// take); the move-based collapse was tried next.
    MadviseRefused,
    /// A page was pinned (device I/O): nothing moved, the chunk stays split.
    Pinned,
    /// The pages were installed again, but PAGEMAP_SCAN does not see one
    /// huge mapping (the chunk is a whole unit mapped by small pages).
    NotHuge,
    /// No parking slot (shutting down): the chunk stays split.
    NoParking,
}

impl CollapseFailure {
    /// Every reason, in the order of [`SplitStats::collapse_failures`].
    pub const ALL: [CollapseFailure; 4] = [
        CollapseFailure::MadviseRefused,
        CollapseFailure::Pinned,
        CollapseFailure::NotHuge,
        CollapseFailure::NoParking,
    ];

    /// Short name for stats (`madvise_refused`, `pinned`, `not_huge`,
    /// `no_parking`).
    pub fn name(self) -> &'static str {
        match self {
            CollapseFailure::MadviseRefused => "madvise_refused",
            CollapseFailure::Pinned => "pinned",
            CollapseFailure::NotHuge => "not_huge",
            CollapseFailure::NoParking => "no_parking",
        }
    }
}

counter_group! {
    /// Splits, by what the chunk was.
    pub struct SplitsByOrigin / AtomicSplitsByOrigin {
        /// Absent (never written, or dropped): nothing to read.
        absent,
        /// In the store: only the faulting page was read.
        stored,
        /// In the parking area.
        staged,
        /// Resident (`split_range`, `--force-split-every`).
        resident,
    }
}

impl AtomicSplitsByOrigin {
    /// The counter of a chunk split from state `tag`.
    pub fn of(&self, tag: crate::chunk::Tag) -> &AtomicU64 {
        use crate::chunk::Tag;
        match tag {
            Tag::Absent => &self.absent,
            Tag::Stored => &self.stored,
            Tag::Staged => &self.staged,
            _ => &self.resident,
        }
    }
}

counter_group! {
    /// Splits by reason (the test knob, the granularity policy,
    /// `split_range`).
    pub struct SplitsByReason / AtomicSplitsByReason {
        /// `--force-split-every`.
        forced,
        /// Faulted back soon after its eviction, not on a stream.
        thrashing,
        /// `SwapEngine::split_range`.
        requested,
    }
}

impl AtomicSplitsByReason {
    /// The counter of `reason`.
    pub fn of(&self, reason: super::granularity::SplitReason) -> &AtomicU64 {
        use super::granularity::SplitReason;
        match reason {
            SplitReason::Forced => &self.forced,
            SplitReason::Thrashing => &self.thrashing,
            SplitReason::Requested => &self.requested,
        }
    }
}

counter_group! {
    /// Collapse attempts by reason.
    pub struct CollapsesByReason / AtomicCollapsesByReason {
        /// `--force-split-every`.
        forced,
        /// A burst of page faults on the chunk.
        dense,
        /// `SwapEngine::collapse_range`.
        requested,
    }
}

impl AtomicCollapsesByReason {
    /// The counter of `reason`.
    pub fn of(&self, reason: super::granularity::CollapseReason) -> &AtomicU64 {
        use super::granularity::CollapseReason;
        match reason {
            CollapseReason::Forced => &self.forced,
            CollapseReason::Dense => &self.dense,
            CollapseReason::Requested => &self.requested,
        }
    }
}

counter_group! {
    /// Collapse attempts that did not give a huge mapping, by
    /// [`CollapseFailure`].
    pub struct CollapseFailures / AtomicCollapseFailures {
        /// [`CollapseFailure::MadviseRefused`].
        madvise_refused,
        /// [`CollapseFailure::Pinned`].
        pinned,
        /// [`CollapseFailure::NotHuge`].
        not_huge,
        /// [`CollapseFailure::NoParking`].
        no_parking,
    }
}

impl CollapseFailures {
    /// The count of `reason`.
    pub fn of(&self, reason: CollapseFailure) -> u64 {
        match reason {
            CollapseFailure::MadviseRefused => self.madvise_refused,
            CollapseFailure::Pinned => self.pinned,
            CollapseFailure::NotHuge => self.not_huge,
            CollapseFailure::NoParking => self.no_parking,
        }
    }

    /// Every failure.
    pub fn total(&self) -> u64 {
        CollapseFailure::ALL.iter().map(|&r| self.of(r)).sum()
    }
}

impl AtomicCollapseFailures {
    /// The counter of `reason`.
    pub fn of(&self, reason: CollapseFailure) -> &AtomicU64 {
        match reason {
            CollapseFailure::MadviseRefused => &self.madvise_refused,
            CollapseFailure::Pinned => &self.pinned,
            CollapseFailure::NotHuge => &self.not_huge,
            CollapseFailure::NoParking => &self.no_parking,
        }
    }
}

counter_group! {
    /// Page faults on split chunks, by what served them.
    pub struct PageFaults / AtomicPageFaults {
        /// A zero fill.
        zero,
        /// The store.
        store,
    }
}

counter_group! {
    /// Split chunks: modes, transitions and page traffic.
    pub struct SplitStats / AtomicSplitStats {
        counts {
            /// Chunks split again by the policy after it had collapsed them.
            flips,
            /// Collapses PAGEMAP_SCAN confirmed as one huge mapping.
            collapses_verified,
            /// Of those, done by `MADV_COLLAPSE` (the rest by moving a THP in).
            collapses_by_madvise,
            /// Split chunks whose pages were all absent, made absent whole.
            merged_absent,
            /// Pages evicted one by one.
            page_evictions,
            /// Of those, written to the store.
            pages_written,
            /// Of those, found all zero and dropped.
            pages_zero,
            /// Of those, given up and moved back into the guest: the chunk
            /// was being merged back or split when the page needed its
            /// store slot (a race the evictor loses, harmlessly).
            pages_given_up,
            /// Pages that faulted back from the store soon after their eviction
            /// and were given extra CLOCK passes (see `engine::policy`).
            page_activations,
        }
        gauges {
            /// Chunks split now (a snapshot count, not atomic with the rest).
            chunks_split: u64,
            /// Chunks mapped as one unit now.
            chunks_huge: u64,
            /// Every split (the sum of `splits_by_origin`).
            splits: u64,
        }
        groups {
            /// Splits, by what the chunk was.
            splits_by_origin: SplitsByOrigin / AtomicSplitsByOrigin,
            /// Splits by reason.
            splits_by_reason: SplitsByReason / AtomicSplitsByReason,
            /// Collapse attempts by reason.
            #[serde(rename = "collapse_attempts_by_reason")]
            collapses_by_reason: CollapsesByReason / AtomicCollapsesByReason,
            /// Attempts that did not give a huge mapping.
            collapse_failures: CollapseFailures / AtomicCollapseFailures,
            /// Page faults by what served them.
            page_faults: PageFaults / AtomicPageFaults,
        }
        live {}
    }
}

counter_group! {
    /// Sequential prefetch (`--swap-unit auto`, see `engine::prefetch`).
    pub struct PrefetchStats / AtomicPrefetchStats {
        /// Chunks read ahead of a stream and installed.
        issued,
        /// Of those, faulted on or written by the guest afterwards.
        hits,
        /// Of those, evicted again without a fault or a write (only read, or
        /// never used).
        waste,
        /// Offers not taken: memory held was within the headroom of the limit.
        skipped,
        /// Stream faults that offered nothing: more streams ran than CPUs (see
        /// `Granularity::prefetch_pays`).
        withheld,
    }
}

counter_group! {
    /// The restore buffers (2 MiB THP units).
    pub struct BufferStats / AtomicBufferStats {
        counts {
            /// Restores whose buffer was the huge page of an evicted unit,
            /// reused without clearing it.
            recycled,
            /// Restores whose buffer was a fresh huge page the kernel cleared.
            fresh,
            /// Of `recycled`, pages the refill thread had not cleared yet (the
            /// fault thread wrote them first; a zero fill cleared it itself).
            recycled_uncleared,
            /// Huge pages of evicted units freed instead of reused: the pool
            /// was full, or the page was not (or no longer) one huge page.
            recycle_dropped,
        }
        gauges {
            /// Most restore buffers idle at once (fresh and reused); at most
            /// `bound`.
            idle_max: u64,
            /// The pool's size, each buffer one unit.
            bound: u64,
        }
        groups {}
        live {}
    }
}

counter_group! {
    /// A snapshot of the engine's counters: the `swap` object of
    /// `--stats-json` and `GET /stats`, whose keys are these field names.
    pub struct SwapStats / Counters {
        counts {
            /// Units taken away from the guest (any outcome).
            evictions,
            /// Units that faulted back soon after their eviction and were given
            /// extra CLOCK passes (see `engine::policy`).
            activations,
            /// Evicted units whose store copy was still valid (no write).
            clean_drops,
            /// Evicted units found all zero (no write, become absent).
            zero_chunks,
            /// Units written to the store.
            units_written,
            /// Bytes written to the store.
            bytes_written,
            /// Bytes read from the store.
            bytes_read,
            /// Restores installed as one huge mapping.
            restored_huge,
            /// Restores installed as small pages.
            restored_split,
            /// Write-protect faults (first write to a clean unit).
            wp_faults,
            /// Faults that had to evict synchronously to stay under the limit.
            evict_waits,
            /// Clean units whose content hash no longer matched (written in the
            /// window between restore and write-protect); written instead of
            /// dropped.
            clean_hash_mismatches,
            /// Evictions given up because the kernel refused to move the unit
            /// (pinned pages); the unit stays resident.
            evict_busy,
            /// Fault messages for units already resident (woken only).
            stale_faults,
            /// Installs that found the restore buffer still pinned by the
            /// O_DIRECT read that filled it (EBUSY) and retried.
            install_busy_retries,
        }
        gauges {
            /// Bytes of one swap unit.
            unit_bytes: u64,
            /// The memory limit, if any.
            mem_limit_bytes: Option<u64>,
            /// Guest bytes held in memory now (resident + staged + in flight).
            resident_bytes: u64,
            /// Largest `resident_bytes` seen.
            resident_bytes_max: u64,
            /// Bytes of per-unit metadata.
            metadata_bytes: u64,
            /// Latency of every fault (serialized as its percentiles).
            #[serde(rename = "fault_latency_us", skip_deserializing)]
            fault_latency: LatencyHistogram,
            /// Service time of restores and write-protect faults, per
            /// source (bulky: `--stats-json` adds it once per run).
            #[serde(skip)]
            fault_latency_by_source: LatencyBySource,
            /// What the store's retry policy did, and the faults a test
            /// store injected (`store::retry`).
            store: crate::store::StoreReport,
            /// How long the guest's threads waited on the engine
            /// (`engine::stall`).
            stall: super::stall::StallStats,
            /// Active and cold memory, estimated by sampling
            /// (`engine::working_set`).
            working_set: super::working_set::WorkingSetStats,
        }
        groups {
            /// Fault counts.
            faults: FaultCounts / AtomicFaultCounts,
            /// Split chunks.
            split: SplitStats / AtomicSplitStats,
            /// Sequential prefetch.
            prefetch: PrefetchStats / AtomicPrefetchStats,
            /// Restore buffers.
            buffers: BufferStats / AtomicBufferStats,
        }
        live {
            /// The fault latency histogram's buckets.
            latency: AtomicHistogram,
            /// The per-source histograms' buckets, by [`FaultSource::ALL`].
            latency_by_source: [AtomicHistogram; 4],
        }
    }
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) struct AtomicHistogram {
    counts: Box<[AtomicU64]>,
    max_us: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        AtomicHistogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_us: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    fn record(&self, us: u64) {
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> LatencyHistogram {
        LatencyHistogram {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

impl Counters {
    /// Records one fault's latency.
    pub fn record_latency_us(&self, us: u64) {
        self.latency.record(us);
    }

    /// Records the service time of one fault served by `source`.
    pub fn record_source_latency_us(&self, source: FaultSource, us: u64) {
        self.latency_by_source[source.index()].record(us);
    }

    /// Fills the counter fields of a snapshot (the gauges are the
    /// engine's to fill).
    pub fn snapshot_all(&self) -> SwapStats {
        let mut stats = self.snapshot();
        stats.fault_latency = self.latency.snapshot();
        stats.fault_latency_by_source = LatencyBySource {
            by_source: [0, 1, 2, 3].map(|i| self.latency_by_source[i].snapshot()),
        };
        let o = &stats.split.splits_by_origin;
        stats.split.splits = o.absent + o.stored + o.staged + o.resident;
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotonic() {
        for v in 0..100_000u64 {
            let b = bucket_of(v);
            assert!(
                bucket_low_us(b) <= v && v < bucket_low_us(b + 1),
                "value {v} bucket {b}"
            );
        }
    }

    #[test]
    fn quantiles_come_from_bucket_edges() {
        let c = Counters::default();
        for v in 1..=1000 {
            c.record_latency_us(v);
        }
        let h = c.snapshot_all().fault_latency;
        assert_eq!(h.count(), 1000);
        assert_eq!(h.max(), 1000);
        let p50 = h.p50();
        assert!((500..=575).contains(&p50), "p50 {p50}");
        assert!(h.p99() >= 990 && h.p99() <= 1000);
        assert!(h.p999() <= h.max());
    }

    #[test]
    fn per_source_histograms_are_separate() {
        let c = Counters::default();
        c.record_source_latency_us(FaultSource::Store, 1500);
        c.record_source_latency_us(FaultSource::Store, 1700);
        c.record_source_latency_us(FaultSource::Zero, 90);
        let by = c.snapshot_all().fault_latency_by_source;
        assert_eq!(by.get(FaultSource::Store).count(), 2);
        assert_eq!(by.get(FaultSource::Store).max(), 1700);
        assert_eq!(by.get(FaultSource::Zero).count(), 1);
        assert_eq!(by.get(FaultSource::Staging).count(), 0);
        assert_eq!(by.get(FaultSource::WriteProtect).count(), 0);
        assert_eq!(
            FaultSource::ALL.map(FaultSource::name),
            ["store", "staging", "zero", "wp"]
        );
    }
}
