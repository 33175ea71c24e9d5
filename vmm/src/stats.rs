//! The end-of-run statistics object written by `--stats-json`.

use crate::balloon_handle::BalloonSnapshot;
use crate::vm::{RunOutcome, Sample};
use devices::virtio::BalloonStats;
use guestmem::{Backing, StageTwoPages, PAGE_BYTES};
use serde_json::{json, Value};
use std::time::Duration;
use swap::engine::{FaultSource, LatencyHistogram, SwapStats};

/// Everything the stats object reports about one run.
pub struct RunSummary<'a> {
    /// Payload name or path.
    pub payload: &'a str,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size.
    pub mem_bytes: u64,
    /// Guest RAM backing.
    pub backing: Backing,
    /// How the run ended.
    pub outcome: &'a RunOutcome,
}

impl RunSummary<'_> {
    /// The JSON object (field names are a stable interface for scripts).
    pub fn to_json(&self) -> Value {
        let o = self.outcome;
        let mut value = json!({
            "payload": self.payload,
            "elapsed_s": o.elapsed.as_secs_f64(),
            "vcpus": self.vcpus,
            "mem_bytes": self.mem_bytes,
            "backing": self.backing.to_string(),
            "exit_status": o.exit_status,
            "exit_kind": o.exit_kind.name(),
            "vcpu_statuses": o.vcpu_statuses,
            "failure": o.failure,
            "tsc_khz": o.tsc_khz,
            "kvm": {
                "pages_4k": o.stage2.pages_4k,
                "pages_2m": o.stage2.pages_2m,
                "pages_1g": o.stage2.pages_1g,
            },
        });
        if let Some(swap) = &o.swap {
            value["swap"] = swap_json(swap, true);
        }
        if let Some(balloon) = &o.balloon {
            value["balloon"] = balloon_json(balloon);
        }
        if let Some(p) = &o.pageout {
            value["pageout"] = json!({
                "resident_bytes_before": p.resident_bytes_before,
                "resident_bytes_after": p.resident_bytes_after,
                "elapsed_ms": p.elapsed.as_secs_f64() * 1e3,
                "written_units": p.report.written_units,
                "clean_dropped_units": p.report.clean_dropped_units,
                "zero_units": p.report.zero_units,
                "busy_units": p.report.busy_units,
                "written_bytes": p.report.written_bytes,
            });
        }
        value
    }
}

/// The figures of a VM that is still running (`stats` on the control
/// socket): the `--stats-json` fields known before the end, under the same
/// names.
pub struct LiveSummary<'a> {
    /// Payload name or kernel path.
    pub payload: &'a str,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size.
    pub mem_bytes: u64,
    /// Guest RAM backing.
    pub backing: Backing,
    /// Since the vCPUs started.
    pub elapsed: Duration,
    /// KVM stage-2 mapping counts, if they could be read.
    pub stage2: Option<StageTwoPages>,
    /// Swap engine counters, if the engine runs.
    pub swap: Option<SwapStats>,
    /// The balloon, if there is one.
    pub balloon: Option<BalloonSnapshot>,
}

impl LiveSummary<'_> {
    /// The JSON object.
    pub fn to_json(&self) -> Value {
        let mut value = json!({
            "payload": self.payload,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "vcpus": self.vcpus,
            "mem_bytes": self.mem_bytes,
            "backing": self.backing.to_string(),
        });
        if let Some(stage2) = &self.stage2 {
            value["kvm"] = json!({
                "pages_4k": stage2.pages_4k,
                "pages_2m": stage2.pages_2m,
                "pages_1g": stage2.pages_1g,
            });
        }
        if let Some(swap) = &self.swap {
            value["swap"] = swap_json(swap, false);
        }
        if let Some(balloon) = &self.balloon {
            value["balloon"] = balloon_json(balloon);
        }
        value
    }
}

/// The balloon's figures; `guest_stats` maps the statistics tags' names
/// (`free_bytes`, ...; `tag_<n>` for tags without one) to their values.
pub fn balloon_json(b: &BalloonSnapshot) -> Value {
    let guest_stats = b.guest_stats.as_ref().map(|stats| {
        stats
            .iter()
            .map(|(tag, v)| {
                let name = BalloonStats::tag_name(tag)
                    .map_or_else(|| format!("tag_{tag}"), str::to_string);
                (name, Value::from(v))
            })
            .collect::<serde_json::Map<_, _>>()
    });
    json!({
        "target_pages": b.target_pages,
        "target_bytes": u64::from(b.target_pages) * PAGE_BYTES,
        "actual_pages": b.actual_pages,
        "actual_bytes": u64::from(b.actual_pages) * PAGE_BYTES,
        "inflated_pages": b.inflated_pages,
        "driver_active": b.driver_active,
        "stats_reports": b.stats_reports,
        "guest_stats": guest_stats,
    })
}

/// Percentiles of a latency histogram; with `buckets`, also every
/// non-empty bucket as `[low_us, high_us_exclusive, count]` (for plots, and
/// so that runs can be merged exactly).
fn histogram_json(h: &LatencyHistogram, buckets: bool) -> Value {
    let mut value = json!({
        "count": h.count(),
        "p50": h.p50(),
        "p90": h.p90(),
        "p99": h.p99(),
        "p999": h.p999(),
        "max": h.max(),
    });
    if buckets {
        value["buckets"] = h
            .buckets()
            .into_iter()
            .map(|(lo, hi, n)| json!([lo, hi, n]))
            .collect();
    }
    value
}

/// The swap figures. `detail` adds the per-source histograms with their
/// buckets: wanted once per run, too bulky for every timeline sample.
fn swap_json(s: &SwapStats, detail: bool) -> Value {
    let h = &s.fault_latency;
    let mut value = json!({
        "unit_bytes": s.unit_bytes,
        "mem_limit_bytes": s.mem_limit_bytes,
        "faults": {
            "total": s.faults.total,
            "store": s.faults.store,
            "staging": s.faults.staging,
            "staging_writing": s.faults.staging_writing,
            "zero": s.faults.zero,
        },
        "wp_faults": s.wp_faults,
        "evictions": s.evictions,
        "evict_waits": s.evict_waits,
        "clean_drops": s.clean_drops,
        "zero_chunks": s.zero_chunks,
        "units_written": s.units_written,
        "bytes_written": s.bytes_written,
        "bytes_read": s.bytes_read,
        "restored_huge": s.restored_huge,
        "restored_split": s.restored_split,
        "fault_latency_us": {
            "count": h.count(),
            "p50": h.p50(),
            "p90": h.p90(),
            "p99": h.p99(),
            "p999": h.p999(),
            "max": h.max(),
        },
        "resident_bytes": s.resident_bytes,
        "resident_bytes_max": s.resident_bytes_max,
        "metadata_bytes": s.metadata_bytes,
        "install_busy_retries": s.install_busy_retries,
        "split": split_json(&s.split),
        "prefetch": {
            "issued": s.prefetch.issued,
            "hits": s.prefetch.hits,
            "waste": s.prefetch.waste,
            "skipped": s.prefetch.skipped,
            "withheld": s.prefetch.withheld,
        },
        "store": store_json(&s.store),
        "buffers": {
            "recycled": s.buffers_recycled,
            "fresh": s.buffers_fresh,
            "recycled_uncleared": s.buffers_recycled_uncleared,
            "recycle_dropped": s.buffers_recycle_dropped,
            "idle_max": s.buffers_idle_max,
            "bound": s.buffers_bound,
        },
    });
    if detail {
        let by_source: serde_json::Map<String, Value> = FaultSource::ALL
            .iter()
            .map(|&src| {
                (
                    src.name().to_string(),
                    histogram_json(s.fault_latency_by_source.get(src), true),
                )
            })
            .collect();
        value["fault_latency_by_source_us"] = Value::Object(by_source);
    }
    value
}

/// One `--stats-timeline` line.
pub fn sample_json(sample: &Sample) -> Value {
    let mut value = json!({
        "t_s": sample.t_s,
        "kvm": {
            "pages_4k": sample.stage2.pages_4k,
            "pages_2m": sample.stage2.pages_2m,
            "pages_1g": sample.stage2.pages_1g,
        },
    });
    if let Some(swap) = &sample.swap {
        value["swap"] = swap_json(swap, false);
    }
    value
}

/// What the store's retry policy did (`swap::store::retry`), and the
/// faults a `faulty:` test store injected.
fn store_json(r: &swap::store::StoreReport) -> Value {
    json!({
        "transient_errors": r.transient_errors,
        "retries": r.retries,
        "recovered": r.recovered,
        "exhausted": r.exhausted,
        "checksum_rereads": r.checksum_rereads,
        "checksum_recovered": r.checksum_recovered,
        "checksum_fatal": r.checksum_fatal,
        "auth_rereads": r.auth_rereads,
        "auth_recovered": r.auth_recovered,
        "auth_fatal": r.auth_fatal,
        "sealed": r.sealed,
        "injected": {
            "transient_errors": r.injected_transient_errors,
            "transient_corruptions": r.injected_transient_corruptions,
            "delays": r.injected_delays,
        },
    })
}

/// The split-chunk figures of `stats` (docs/SPLIT_CHUNKS.md says what each
/// means).
fn split_json(split: &swap::engine::SplitStats) -> Value {
    use swap::engine::CollapseFailure;
    let failures: serde_json::Map<String, Value> = CollapseFailure::ALL
        .iter()
        .map(|&reason| {
            (
                reason.name().to_string(),
                json!(split.collapse_failures[reason as usize]),
            )
        })
        .collect();
    let [absent, stored, staged, resident] = split.splits_by_origin;
    json!({
        "chunks_split": split.chunks_split,
        "chunks_huge": split.chunks_huge,
        "splits": absent + stored + staged + resident,
        "splits_by_origin": {
            "absent": absent,
            "stored": stored,
            "staged": staged,
            "resident": resident,
        },
        "splits_by_reason": {
            "forced": split.splits_by_reason[0],
            "thrashing": split.splits_by_reason[1],
            "requested": split.splits_by_reason[2],
        },
        "collapse_attempts_by_reason": {
            "forced": split.collapses_by_reason[0],
            "dense": split.collapses_by_reason[1],
            "requested": split.collapses_by_reason[2],
        },
        "flips": split.flips,
        "collapses_verified": split.collapses_verified,
        "collapses_by_madvise": split.collapses_by_madvise,
        "collapse_failures": failures,
        "merged_absent": split.merged_absent,
        "page_faults": {
            "zero": split.page_faults_zero,
            "store": split.page_faults_store,
        },
        "page_evictions": split.page_evictions,
        "pages_written": split.pages_written,
        "pages_zero": split.pages_zero,
    })
}
