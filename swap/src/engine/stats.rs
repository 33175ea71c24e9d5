//! Swap counters and the fault-latency histogram.
//!
//! Counters are relaxed atomics bumped on the hot path; [`SwapStats`] is a
//! plain snapshot for the VMM's metrics and the benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Fault counts by what served them.
#[derive(Debug, Clone, Default)]
pub struct FaultCounts {
    /// Every fault message handled (including write-protect faults and
    /// messages for units another thread had already restored).
    pub total: u64,
    /// Restores read from the store (whole units; a split chunk's pages
    /// are in [`SplitStats`]).
    pub store: u64,
    /// Restores handed back from the parking area (no I/O).
    pub staging: u64,
    /// Of `staging`, units whose store write was in flight: the fault met
    /// the writer and took a copy (the race the engine's write-back tests
    /// must hit).
    pub staging_writing: u64,
    /// Restores of never-written units (zero fill).
    pub zero: u64,
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

/// Split chunks: modes, transitions and page traffic.
#[derive(Debug, Clone, Default)]
pub struct SplitStats {
    /// Chunks split now (a snapshot count, not atomic with the rest).
    pub chunks_split: u64,
    /// Chunks mapped as one unit now.
    pub chunks_huge: u64,
    /// Splits, by what the chunk was: `[absent, stored, staged, resident]`.
    pub splits_by_origin: [u64; 4],
    /// Collapses PAGEMAP_SCAN confirmed as one huge mapping.
    pub collapses_verified: u64,
    /// Of those, done by `MADV_COLLAPSE` (the rest by moving a THP in).
    pub collapses_by_madvise: u64,
    /// Attempts that did not give a huge mapping, by
    /// [`CollapseFailure::ALL`] order.
    pub collapse_failures: [u64; 4],
    /// Split chunks whose pages were all absent, made absent whole.
    pub merged_absent: u64,
    /// Page faults served by a zero fill.
    pub page_faults_zero: u64,
    /// Page faults served from the store.
    pub page_faults_store: u64,
    /// Splits by reason: `[forced, thrashing, requested]` (the test knob,
    /// the granularity policy, `split_range`).
    pub splits_by_reason: [u64; 3],
    /// Collapse attempts by reason: `[forced, dense, requested]`.
    pub collapses_by_reason: [u64; 3],
    /// Chunks split again by the policy after it had collapsed them.
    pub flips: u64,
    /// Pages evicted one by one.
    pub page_evictions: u64,
    /// Of those, written to the store.
    pub pages_written: u64,
    /// Of those, found all zero and dropped.
    pub pages_zero: u64,
    /// Pages that faulted back from the store soon after their eviction
    /// and were given extra CLOCK passes (see `engine::policy`).
    pub page_activations: u64,
}

/// Sequential prefetch (`--swap-unit auto`, see `engine::prefetch`).
#[derive(Debug, Clone, Default)]
pub struct PrefetchStats {
    /// Chunks read ahead of a stream and installed.
    pub issued: u64,
    /// Of those, faulted on or written by the guest afterwards.
    pub hits: u64,
    /// Of those, evicted again without a fault or a write (only read, or
    /// never used).
    pub waste: u64,
    /// Offers not taken: memory held was within the headroom of the limit.
    pub skipped: u64,
    /// Stream faults that offered nothing: more streams ran than CPUs (see
    /// `Granularity::prefetch_pays`).
    pub withheld: u64,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Default)]
pub struct SwapStats {
    /// Fault counts.
    pub faults: FaultCounts,
    /// Sequential prefetch.
    pub prefetch: PrefetchStats,
    /// Split chunks.
    pub split: SplitStats,
    /// Units taken away from the guest (any outcome).
    pub evictions: u64,
    /// Units that faulted back soon after their eviction and were given
    /// extra CLOCK passes (see `engine::policy`).
    pub activations: u64,
    /// Evicted units whose store copy was still valid (no write).
    pub clean_drops: u64,
    /// Evicted units found all zero (no write, become absent).
    pub zero_chunks: u64,
    /// Units written to the store.
    pub units_written: u64,
    /// Bytes written to the store.
    pub bytes_written: u64,
    /// Bytes read from the store.
    pub bytes_read: u64,
    /// Restores installed as one huge mapping.
    pub restored_huge: u64,
    /// Restores installed as small pages.
    pub restored_split: u64,
    /// Latency of every fault.
    pub fault_latency: LatencyHistogram,
    /// Service time of restores and write-protect faults, per source.
    pub fault_latency_by_source: LatencyBySource,
    /// Guest bytes held in memory now (resident + staged + in flight).
    pub resident_bytes: u64,
    /// Largest `resident_bytes` seen.
    pub resident_bytes_max: u64,
    /// Bytes of per-unit metadata.
    pub metadata_bytes: u64,
    /// Write-protect faults (first write to a clean unit).
    pub wp_faults: u64,
    /// Faults that had to evict synchronously to stay under the limit.
    pub evict_waits: u64,
    /// Clean units whose content hash no longer matched (written in the
    /// window between restore and write-protect); written instead of
    /// dropped.
    pub clean_hash_mismatches: u64,
    /// Evictions given up because the kernel refused to move the unit
    /// (pinned pages); the unit stays resident.
    pub evict_busy: u64,
    /// Fault messages for units already resident (woken only).
    pub stale_faults: u64,
    /// Installs that found the restore buffer still pinned by the O_DIRECT
    /// read that filled it (EBUSY) and retried.
    pub install_busy_retries: u64,
    /// Restores (2 MiB THP units) whose buffer was the huge page of an
    /// evicted unit, reused without clearing it.
    pub buffers_recycled: u64,
    /// Restores (2 MiB THP units) whose buffer was a fresh huge page the
    /// kernel cleared.
    pub buffers_fresh: u64,
    /// Of `buffers_recycled`, pages the refill thread had not cleared yet
    /// (the fault thread wrote them first; a zero fill cleared it itself).
    pub buffers_recycled_uncleared: u64,
    /// Huge pages of evicted units freed instead of reused: the pool was
    /// full, or the page was not (or no longer) one huge page.
    pub buffers_recycle_dropped: u64,
    /// Most restore buffers idle at once (fresh and reused); at most
    /// `buffers_bound`.
    pub buffers_idle_max: u64,
    /// The restore buffer pool's size, each buffer one unit.
    pub buffers_bound: u64,
    /// Bytes of one swap unit.
    pub unit_bytes: u64,
    /// The memory limit, if any.
    pub mem_limit_bytes: Option<u64>,
    /// What the store's retry policy did, and the faults a test store
    /// injected (`store::retry`).
    pub store: crate::store::StoreReport,
}

/// The live counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub faults_total: AtomicU64,
    pub faults_store: AtomicU64,
    pub faults_staging: AtomicU64,
    pub faults_staging_writing: AtomicU64,
    pub faults_zero: AtomicU64,
    pub evictions: AtomicU64,
    pub clean_drops: AtomicU64,
    pub zero_chunks: AtomicU64,
    pub units_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub restored_huge: AtomicU64,
    pub restored_split: AtomicU64,
    pub wp_faults: AtomicU64,
    pub evict_waits: AtomicU64,
    pub clean_hash_mismatches: AtomicU64,
    pub evict_busy: AtomicU64,
    pub stale_faults: AtomicU64,
    pub install_busy_retries: AtomicU64,
    pub buffers_recycled: AtomicU64,
    pub buffers_fresh: AtomicU64,
    pub buffers_recycled_uncleared: AtomicU64,
    pub buffers_recycle_dropped: AtomicU64,
    pub splits_by_origin: [AtomicU64; 4],
    pub splits_by_reason: [AtomicU64; 3],
    pub collapses_by_reason: [AtomicU64; 3],
    pub flips: AtomicU64,
    pub prefetches: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetch_waste: AtomicU64,
    pub prefetch_skipped: AtomicU64,
    pub prefetch_withheld: AtomicU64,
    pub collapses_verified: AtomicU64,
    pub collapses_by_madvise: AtomicU64,
    pub collapse_failures: [AtomicU64; 4],
    pub merged_absent: AtomicU64,
    pub page_faults_zero: AtomicU64,
    pub page_faults_store: AtomicU64,
    pub page_evictions: AtomicU64,
    pub activations: AtomicU64,
    pub page_activations: AtomicU64,
    pub pages_written: AtomicU64,
    pub pages_zero: AtomicU64,
    latency: AtomicHistogram,
    latency_by_source: [AtomicHistogram; 4],
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

struct AtomicHistogram {
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

    /// Fills the counter fields of a snapshot.
    pub fn snapshot(&self) -> SwapStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SwapStats {
            faults: FaultCounts {
                total: get(&self.faults_total),
                store: get(&self.faults_store),
                staging: get(&self.faults_staging),
                staging_writing: get(&self.faults_staging_writing),
                zero: get(&self.faults_zero),
            },
            evictions: get(&self.evictions),
            activations: get(&self.activations),
            clean_drops: get(&self.clean_drops),
            zero_chunks: get(&self.zero_chunks),
            units_written: get(&self.units_written),
            bytes_written: get(&self.bytes_written),
            bytes_read: get(&self.bytes_read),
            restored_huge: get(&self.restored_huge),
            restored_split: get(&self.restored_split),
            fault_latency: self.latency.snapshot(),
            fault_latency_by_source: LatencyBySource {
                by_source: [0, 1, 2, 3].map(|i| self.latency_by_source[i].snapshot()),
            },
            wp_faults: get(&self.wp_faults),
            evict_waits: get(&self.evict_waits),
            clean_hash_mismatches: get(&self.clean_hash_mismatches),
            evict_busy: get(&self.evict_busy),
            stale_faults: get(&self.stale_faults),
            install_busy_retries: get(&self.install_busy_retries),
            buffers_recycled: get(&self.buffers_recycled),
            buffers_fresh: get(&self.buffers_fresh),
            buffers_recycled_uncleared: get(&self.buffers_recycled_uncleared),
            buffers_recycle_dropped: get(&self.buffers_recycle_dropped),
            prefetch: PrefetchStats {
                issued: get(&self.prefetches),
                hits: get(&self.prefetch_hits),
                waste: get(&self.prefetch_waste),
                skipped: get(&self.prefetch_skipped),
                withheld: get(&self.prefetch_withheld),
            },
            split: SplitStats {
                splits_by_origin: self.splits_by_origin.each_ref().map(get),
                splits_by_reason: self.splits_by_reason.each_ref().map(get),
                collapses_by_reason: self.collapses_by_reason.each_ref().map(get),
                flips: get(&self.flips),
                collapses_verified: get(&self.collapses_verified),
                collapses_by_madvise: get(&self.collapses_by_madvise),
                collapse_failures: self.collapse_failures.each_ref().map(get),
                merged_absent: get(&self.merged_absent),
                page_faults_zero: get(&self.page_faults_zero),
                page_faults_store: get(&self.page_faults_store),
                page_evictions: get(&self.page_evictions),
                pages_written: get(&self.pages_written),
                pages_zero: get(&self.pages_zero),
                page_activations: get(&self.page_activations),
                ..SplitStats::default()
            },
            ..SwapStats::default()
        }
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
        let h = c.snapshot().fault_latency;
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
        let by = c.snapshot().fault_latency_by_source;
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
