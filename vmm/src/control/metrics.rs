//! `GET /metrics`: the VM's figures as Prometheus metrics, encoded by the
//! official client library (`prometheus-client`).
//!
//! The figures live in the swap engine's counters, the balloon and KVM;
//! each scrape reads them once ([`Snapshot`]) and a collector hands them
//! to the encoder, so nothing is counted twice and no metric can drift
//! from `GET /stats`. Names follow Prometheus' rules: one `hugevmm_`
//! prefix, base units (bytes, seconds), `_total` on counters.
//!
//! Format: OpenMetrics 1.0 text unless the `Accept` header prefers the
//! Prometheus text format 0.0.4 (`text/plain`), which older parsers need
//! (they read OpenMetrics' counter family `x` with samples `x_total` as
//! two metrics).

use super::context::{Refusal, Snapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use swap::engine::{FaultSource, LatencyHistogram};

/// OpenMetrics' media type, as `prometheus-client` writes it.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the exported latency buckets, µs: powers of two from
/// 1 µs to 2^24 µs (16.8 s). The engine's own buckets are log-linear
/// (8 per power of two), so each of these bounds is one of its bucket
/// edges and the cumulative counts are exact; 8 buckets per octave would
/// be 200 series per histogram, more than a scrape is worth.
const BOUNDS_LOG2_US: std::ops::RangeInclusive<u32> = 0..=24;

/// Which format a client gets, from its `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenMetrics,
    PrometheusText,
}

/// The quality a media range gives a format (0 when it does not match).
fn quality(range: &str, format: Format) -> f64 {
    let mut parts = range.split(';');
    let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let q = parts
        .filter_map(|p| p.trim().strip_prefix("q="))
        .find_map(|q| q.trim().parse::<f64>().ok())
        .unwrap_or(1.0);
    let matches = match media.as_str() {
        "*/*" => true,
        "application/*" | "application/openmetrics-text" => format == Format::OpenMetrics,
        "text/*" | "text/plain" => format == Format::PrometheusText,
        _ => false,
    };
    if matches {
        q
    } else {
        0.0
    }
}

/// OpenMetrics when nothing says otherwise (the library's own format);
/// the Prometheus text format when `Accept` rates it higher.
fn choose(accept: Option<&str>) -> Option<Format> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Format::OpenMetrics);
    };
    let best = |format| {
        accept
            .split(',')
            .map(|range| quality(range, format))
            .fold(0.0, f64::max)
    };
    let (open, text) = (best(Format::OpenMetrics), best(Format::PrometheusText));
    if open <= 0.0 && text <= 0.0 {
        None
    } else if text > open {
        Some(Format::PrometheusText)
    } else {
        Some(Format::OpenMetrics)
    }
}

/// The metrics text for `snapshot` in the format `accept` asks for, with
/// its content type; 406 if it asks for neither format.
pub fn render(
    snapshot: &Snapshot,
    accept: Option<&str>,
) -> Result<(&'static str, String), Refusal> {
    let mut registry = Registry::with_prefix("hugevmm");
    registry.register_collector(Box::new(Figures(snapshot.clone())));
    encode(&registry, accept)
}

/// `registry`'s metrics in the format `accept` asks for, with its content
/// type; 406 if it asks for neither format (also `hugevmm host`'s).
pub fn encode(
    registry: &Registry,
    accept: Option<&str>,
) -> Result<(&'static str, String), Refusal> {
    let format = choose(accept).ok_or_else(|| Refusal {
        status: 406,
        message: format!(
            "Accept {:?} allows neither metrics format: ask for application/openmetrics-text or text/plain (Prometheus 0.0.4), or send no Accept",
            super::http::shorten(accept.unwrap_or_default())
        ),
    })?;
    let mut text = String::new();
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry),
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)
        }
    };
    encoded.map_err(|e| Refusal {
        status: 500,
        message: format!("cannot encode the metrics: {e}"),
    })?;
    let content_type = match format {
        Format::OpenMetrics => OPENMETRICS,
        Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
    };
    Ok((content_type, text))
}

/// The exported buckets of `h`: (upper bound in seconds, count in the
/// bucket alone; the encoder makes them cumulative). The engine records
/// whole µs, truncated, so a recorded v stands for a time in [v, v + 1) µs
/// and "at most 2^k µs" means v < 2^k: the engine buckets that end at or
/// below 2^k.
fn buckets(h: &LatencyHistogram) -> Vec<(f64, u64)> {
    per_bound(&h.buckets())
}

/// [`buckets`] from the engine's `(low_us, high_us_exclusive, count)`:
/// each engine bucket lands in the first bound it ends at or below, or in
/// `+Inf`.
fn per_bound(engine: &[(u64, u64, u64)]) -> Vec<(f64, u64)> {
    let bounds: Vec<u64> = BOUNDS_LOG2_US.map(|k| 1u64 << k).collect();
    let mut counts = vec![0u64; bounds.len() + 1];
    for &(_, high, n) in engine {
        let slot = bounds
            .iter()
            .position(|&b| high <= b)
            .unwrap_or(bounds.len());
        counts[slot] += n;
    }
    bounds
        .iter()
        .map(|&b| b as f64 * 1e-6)
        .chain(std::iter::once(f64::INFINITY))
        .zip(counts)
        .collect()
}

/// The histogram's sum in seconds, estimated from the engine's buckets
/// (each sample at its bucket's middle: within 6.25 % of the true value,
/// the engine's bucket width), because the engine keeps no exact sum.
fn sum_seconds(h: &LatencyHistogram) -> f64 {
    estimated_sum_seconds(&h.buckets())
}

fn estimated_sum_seconds(engine: &[(u64, u64, u64)]) -> f64 {
    engine
        .iter()
        .map(|&(low, high, n)| (low + high) as f64 / 2.0 * n as f64)
        .sum::<f64>()
        * 1e-6
}

/// The snapshot as a collector: the registry calls it once per encoding.
#[derive(Debug)]
struct Figures(Snapshot);

/// One metric: name (without prefix, unit and `_total`), help, unit, type.
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    unit: Option<Unit>,
    kind: MetricType,
}

impl Family<'_> {
    fn counter(self, encoder: &mut DescriptorEncoder, value: u64) -> std::fmt::Result {
        let mut metric =
            encoder.encode_descriptor(self.name, self.help, self.unit.as_ref(), self.kind)?;
        metric.encode_counter::<NoLabelSet, _, f64>(&value, None)
    }

    fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
        self,
        encoder: &mut DescriptorEncoder,
        value: V,
    ) -> std::fmt::Result {
        let mut metric =
            encoder.encode_descriptor(self.name, self.help, self.unit.as_ref(), self.kind)?;
        metric.encode_gauge(&value)
    }
}

fn counter<'a>(name: &'a str, help: &'a str, unit: Option<Unit>) -> Family<'a> {
    Family {
        name,
        help,
        unit,
        kind: MetricType::Counter,
    }
}

fn gauge<'a>(name: &'a str, help: &'a str, unit: Option<Unit>) -> Family<'a> {
    Family {
        name,
        help,
        unit,
        kind: MetricType::Gauge,
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let e = &mut encoder;
        gauge(
            "uptime",
            "Time since the vCPUs started.",
            Some(Unit::Seconds),
        )
        .gauge(e, s.uptime.as_secs_f64())?;
        gauge("vcpus", "vCPUs of the VM.", None).gauge(e, s.vcpus)?;
        gauge("guest_memory", "Guest RAM size.", Some(Unit::Bytes)).gauge(e, s.mem_bytes)?;
        if let Some(stage2) = &s.stage2 {
            let mut metric = e.encode_descriptor(
                "kvm_stage2_pages",
                "KVM stage-2 (EPT/NPT) mappings of guest RAM, by page size.",
                None,
                MetricType::Gauge,
            )?;
            for (size, pages) in [
                ("4k", stage2.pages_4k),
                ("2m", stage2.pages_2m),
                ("1g", stage2.pages_1g),
            ] {
                metric
                    .encode_family(&[("size", size)])?
                    .encode_gauge(&pages)?;
            }
        }
        if let Some(swap) = &s.swap {
            let mut metric = e.encode_descriptor(
                "swap_faults",
                "Guest memory faults served by the swap engine, by what served them (wp: a write to a clean, write-protected chunk).",
                None,
                MetricType::Counter,
            )?;
            for (source, n) in [
                ("store", swap.faults.store),
                ("staging", swap.faults.staging),
                ("zero", swap.faults.zero),
                ("wp", swap.wp_faults),
            ] {
                metric
                    .encode_family(&[("source", source)])?
                    .encode_counter::<NoLabelSet, _, f64>(&n, None)?;
            }
            counter(
                "swap_fault_messages",
                "Every userfault message handled, including those for units another thread had already restored.",
                None,
            )
            .counter(e, swap.faults.total)?;
            counter("swap_evictions", "Chunks evicted from guest RAM.", None)
                .counter(e, swap.evictions)?;
            counter(
                "swap_clean_drops",
                "Evictions of chunks unchanged since they were read from the store: dropped without a write.",
                None,
            )
            .counter(e, swap.clean_drops)?;
            counter(
                "swap_zero_chunks",
                "Evictions of all-zero chunks: dropped without a write.",
                None,
            )
            .counter(e, swap.zero_chunks)?;
            counter(
                "swap_evict_waits",
                "Faults that waited for the evictor to make room.",
                None,
            )
            .counter(e, swap.evict_waits)?;
            counter(
                "swap_units_written",
                "Chunks (or units) written to the store.",
                None,
            )
            .counter(e, swap.units_written)?;
            counter("swap_read", "Bytes read from the store.", Some(Unit::Bytes))
                .counter(e, swap.bytes_read)?;
            counter(
                "swap_written",
                "Bytes written to the store.",
                Some(Unit::Bytes),
            )
            .counter(e, swap.bytes_written)?;
            let mut metric = e.encode_descriptor(
                "swap_restored_units",
                "Units restored, by the mapping they got: huge (one 2 MiB mapping) or split.",
                None,
                MetricType::Counter,
            )?;
            for (mapping, n) in [("huge", swap.restored_huge), ("split", swap.restored_split)] {
                metric
                    .encode_family(&[("mapping", mapping)])?
                    .encode_counter::<NoLabelSet, _, f64>(&n, None)?;
            }
            gauge(
                "swap_resident",
                "Guest RAM resident in host memory.",
                Some(Unit::Bytes),
            )
            .gauge(e, swap.resident_bytes)?;
            gauge(
                "swap_resident_max",
                "Most guest RAM resident at once so far.",
                Some(Unit::Bytes),
            )
            .gauge(e, swap.resident_bytes_max)?;
            if let Some(limit) = swap.mem_limit_bytes {
                gauge(
                    "swap_limit",
                    "The cap on resident guest RAM (absent when there is none).",
                    Some(Unit::Bytes),
                )
                .gauge(e, limit)?;
            }
            gauge("swap_unit", "The swap unit.", Some(Unit::Bytes)).gauge(e, swap.unit_bytes)?;
            stall_metrics(e, &swap.stall)?;
            if swap.working_set.sampling {
                working_set_metrics(e, &swap.working_set)?;
            }
            split_metrics(e, &swap.split, &swap.prefetch, swap.activations)?;
            store_metrics(e, &swap.store)?;
            gauge(
                "swap_metadata",
                "Host memory the engine's own tables use.",
                Some(Unit::Bytes),
            )
            .gauge(e, swap.metadata_bytes)?;
            let h = &swap.fault_latency;
            let mut metric = e.encode_descriptor(
                "swap_fault_latency",
                "Fault latency, from reading the batch of fault messages to waking the faulting thread (buckets from the engine's; _sum estimated from them).",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            metric.encode_histogram::<NoLabelSet>(sum_seconds(h), h.count(), &buckets(h), None)?;
            let mut metric = e.encode_descriptor(
                "swap_fault_service",
                "Fault service time by source, from starting on the message to waking the faulting thread (buckets from the engine's; _sum estimated from them).",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for source in FaultSource::ALL {
                let h = swap.fault_latency_by_source.get(source);
                metric
                    .encode_family(&[("source", source.name())])?
                    .encode_histogram::<NoLabelSet>(sum_seconds(h), h.count(), &buckets(h), None)?;
            }
        }
        if let Some(b) = &s.balloon {
            let page = guestmem::PAGE_BYTES;
            gauge(
                "balloon_target",
                "Guest RAM the guest is asked to give back.",
                Some(Unit::Bytes),
            )
            .gauge(e, u64::from(b.target_pages) * page)?;
            gauge(
                "balloon_actual",
                "Guest RAM the guest's balloon driver says it holds.",
                Some(Unit::Bytes),
            )
            .gauge(e, u64::from(b.actual_pages) * page)?;
            gauge(
                "balloon_inflated",
                "Pages inflated minus pages deflated on the queues, as bytes.",
                Some(Unit::Bytes),
            )
            .gauge(e, b.inflated_pages * page)?;
            gauge(
                "balloon_driver_active",
                "1 when a guest driver runs the balloon.",
                None,
            )
            .gauge(e, u64::from(b.driver_active))?;
            counter(
                "balloon_stats_reports",
                "Statistics reports the guest sent.",
                None,
            )
            .counter(e, b.stats_reports)?;
        }
        Ok(())
    }
}

// The collector is handed to the registry by value.
const _: () = {
    const fn is_collector<T: Collector>() {}
    is_collector::<Figures>();
};

/// The split-chunk figures (docs/SPLIT_CHUNKS.md): chunks by mode, splits
/// by origin, collapses by outcome, page faults and evictions.
/// The store's retry policy (docs/RETRY.md).
fn store_metrics(e: &mut DescriptorEncoder, r: &swap::store::StoreReport) -> std::fmt::Result {
    let by_kind = |e: &mut DescriptorEncoder,
                   name: &str,
                   help: &str,
                   values: [(&str, u64); 3]|
     -> std::fmt::Result {
        let mut metric = e.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (kind, n) in values {
            metric
                .encode_family(&[("kind", kind)])?
                .encode_counter::<NoLabelSet, _, f64>(&n, None)?;
        }
        Ok(())
    };
    let mut metric = e.encode_descriptor(
        "swap_store_transient_errors",
        "Store operations that failed with a transient error (each then retried, or fatal once the retries are spent).",
        None,
        MetricType::Counter,
    )?;
    metric.encode_counter::<NoLabelSet, _, f64>(&r.retry.transient_errors, None)?;
    by_kind(
        e,
        "swap_store_retries",
        "Store operations attempted again: after a transient error (with backoff), or re-read after a checksum mismatch or a sealed image that failed authentication (--swap-encrypt).",
        [
            ("transient", r.retry.retries),
            ("checksum", r.retry.checksum_rereads),
            ("authentication", r.retry.auth_rereads),
        ],
    )?;
    by_kind(
        e,
        "swap_store_recovered",
        "Store operations that succeeded on a later attempt.",
        [
            ("transient", r.retry.recovered),
            ("checksum", r.retry.checksum_recovered),
            ("authentication", r.retry.auth_recovered),
        ],
    )?;
    by_kind(
        e,
        "swap_store_fatal",
        "Store operations given up (fatal for the VM): transient errors past the last retry, a second checksum mismatch, or a second authentication failure.",
        [
            ("transient", r.retry.exhausted),
            ("checksum", r.retry.checksum_fatal),
            ("authentication", r.retry.auth_fatal),
        ],
    )
}

/// The stall figures (`engine::stall`), in seconds.
fn stall_metrics(e: &mut DescriptorEncoder, stall: &swap::engine::StallStats) -> std::fmt::Result {
    let seconds = |us: u64| us as f64 * 1e-6;
    let mut metric = e.encode_descriptor(
        "memory_stall",
        "Wall time the guest's threads waited on the swap engine, as PSI counts it: some (at least one thread waiting) and full (every vCPU waiting).",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?;
    for (kind, us) in [("some", stall.some_us), ("full", stall.full_us)] {
        metric
            .encode_family(&[("kind", kind)])?
            .encode_counter::<NoLabelSet, _, f64>(&seconds(us), None)?;
    }
    let by = &stall.by_source_us;
    let mut metric = e.encode_descriptor(
        "memory_stall_waits",
        "Every fault message's wait on the swap engine, from reading it to waking its thread, summed by what served it (thread-seconds).",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?;
    for (source, us) in [
        ("store", by.store),
        ("parking", by.parking),
        ("zero", by.zero),
        ("page", by.page),
        ("write_protect", by.write_protect),
        ("in_flight", by.in_flight),
        ("other", by.other),
    ] {
        metric
            .encode_family(&[("source", source)])?
            .encode_counter::<NoLabelSet, _, f64>(&seconds(us), None)?;
    }
    Ok(())
}

/// The working-set figures (`engine::working_set`), when sampling is on;
/// an estimate not made yet is absent.
fn working_set_metrics(
    e: &mut DescriptorEncoder,
    ws: &swap::engine::WorkingSetStats,
) -> std::fmt::Result {
    if let Some(bytes) = ws.estimate_bytes {
        gauge(
            "working_set",
            "Guest memory active over the sampling window (10 s), estimated by sampling resident units.",
            Some(Unit::Bytes),
        )
        .gauge(e, bytes)?;
    }
    let cold = &ws.cold;
    let ages = [
        ("10s", cold.idle_10s_bytes),
        ("60s", cold.idle_60s_bytes),
        ("300s", cold.idle_300s_bytes),
    ];
    if ages.iter().any(|(_, bytes)| bytes.is_some()) {
        let mut metric = e.encode_descriptor(
            "cold_memory",
            "Resident guest memory not touched for at least `idle`, estimated by sampling.",
            Some(&Unit::Bytes),
            MetricType::Gauge,
        )?;
        for (idle, bytes) in ages {
            if let Some(bytes) = bytes {
                metric
                    .encode_family(&[("idle", idle)])?
                    .encode_gauge(&bytes)?;
            }
        }
    }
    counter(
        "working_set_samples",
        "Resident units taken out to sample the working set.",
        None,
    )
    .counter(e, ws.samples)?;
    counter(
        "working_set_samples_returned",
        "Sampled units that faulted back.",
        None,
    )
    .counter(e, ws.returned)?;
    e.encode_descriptor(
        "working_set_sample_wait",
        "Time the guest's threads waited for sampled units to come back: the sampling's cost (thread-seconds).",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?
    .encode_counter::<NoLabelSet, _, f64>(&(ws.sample_wait_us as f64 * 1e-6), None)?;
    Ok(())
}

fn split_metrics(
    e: &mut DescriptorEncoder,
    split: &swap::engine::SplitStats,
    prefetch: &swap::engine::PrefetchStats,
    unit_activations: u64,
) -> std::fmt::Result {
    let labelled = |e: &mut DescriptorEncoder,
                    name: &str,
                    help: &str,
                    kind: MetricType,
                    label: &str,
                    values: &[(&str, u64)]|
     -> std::fmt::Result {
        let mut metric = e.encode_descriptor(name, help, None, kind)?;
        for &(value, n) in values {
            let labels = [(label, value)];
            let mut family = metric.encode_family(&labels)?;
            match kind {
                MetricType::Gauge => family.encode_gauge(&(n as i64))?,
                _ => family.encode_counter::<NoLabelSet, _, f64>(&n, None)?,
            }
        }
        Ok(())
    };
    labelled(
        e,
        "swap_chunks",
        "2 MiB chunks by mode now: resident and mapped huge, or split into pages.",
        MetricType::Gauge,
        "mode",
        &[("huge", split.chunks_huge), ("split", split.chunks_split)],
    )?;
    let origin = &split.splits_by_origin;
    labelled(
        e,
        "swap_splits",
        "Chunks split into pages, by what they were.",
        MetricType::Counter,
        "origin",
        &[
            ("absent", origin.absent),
            ("stored", origin.stored),
            ("staged", origin.staged),
            ("resident", origin.resident),
        ],
    )?;
    let mut outcomes = vec![("verified", split.collapses_verified)];
    for reason in swap::engine::CollapseFailure::ALL {
        outcomes.push((reason.name(), split.collapse_failures.of(reason)));
    }
    labelled(
        e,
        "swap_collapses",
        "Collapse attempts by outcome: verified huge by PAGEMAP_SCAN, or the reason it was not.",
        MetricType::Counter,
        "outcome",
        &outcomes,
    )?;
    let reason = &split.splits_by_reason;
    labelled(
        e,
        "swap_split_reasons",
        "Chunks split into pages, by why (forced: --force-split-every; thrashing: the granularity policy; requested: a split of a range).",
        MetricType::Counter,
        "reason",
        &[
            ("forced", reason.forced),
            ("thrashing", reason.thrashing),
            ("requested", reason.requested),
        ],
    )?;
    let attempts = &split.collapses_by_reason;
    labelled(
        e,
        "swap_collapse_attempts",
        "Collapses of split chunks tried, by why (forced; dense: a burst of page faults; requested).",
        MetricType::Counter,
        "reason",
        &[
            ("forced", attempts.forced),
            ("dense", attempts.dense),
            ("requested", attempts.requested),
        ],
    )?;
    counter(
        "swap_flips",
        "Chunks the granularity policy split again after it had collapsed them (docs/GRANULARITY.md bounds them).",
        None,
    )
    .counter(e, split.flips)?;
    labelled(
        e,
        "swap_page_faults",
        "Faults on pages of split chunks, by what served them.",
        MetricType::Counter,
        "source",
        &[
            ("zero", split.page_faults.zero),
            ("store", split.page_faults.store),
        ],
    )?;
    labelled(
        e,
        "swap_prefetches",
        "Chunks prefetched ahead of a stream, by outcome (issued; hit: faulted on or written; waste: evicted unused; skipped: an offer found no headroom; withheld: a stream fault offered nothing, more streams ran than CPUs).",
        MetricType::Counter,
        "outcome",
        &[
            ("issued", prefetch.issued),
            ("hit", prefetch.hits),
            ("waste", prefetch.waste),
            ("skipped", prefetch.skipped),
            ("withheld", prefetch.withheld),
        ],
    )?;
    labelled(
        e,
        "swap_page_evictions",
        "Pages of split chunks evicted, by where they went (given_up: moved back into the guest because the chunk was being merged back or split).",
        MetricType::Counter,
        "result",
        &[
            ("written", split.pages_written),
            ("zero", split.pages_zero),
            ("given_up", split.pages_given_up),
        ],
    )?;
    labelled(
        e,
        "swap_activations",
        "Refaults soon after their eviction that earned extra CLOCK passes: of whole units, or of pages of split chunks.",
        MetricType::Counter,
        "of",
        &[("unit", unit_activations), ("page", split.page_activations)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balloon_handle::BalloonSnapshot;
    use serde_json::Value;
    use std::time::Duration;

    fn snapshot() -> Snapshot {
        Snapshot {
            uptime: Duration::from_millis(1500),
            vcpus: 2,
            mem_bytes: 64 << 20,
            stage2: None,
            swap: None,
            balloon: Some(BalloonSnapshot {
                target_pages: 1024,
                ..Default::default()
            }),
        }
    }

    /// Where each figure of the swap stats is exported: its path in the
    /// `swap` object, and the sample (name and labels, Prometheus text
    /// format) that carries it.
    const EXPORTED: &[(&str, &str)] = &[
        (
            "/activations",
            r#"hugevmm_swap_activations_total{of="unit"}"#,
        ),
        ("/bytes_read", "hugevmm_swap_read_bytes_total"),
        ("/bytes_written", "hugevmm_swap_written_bytes_total"),
        ("/clean_drops", "hugevmm_swap_clean_drops_total"),
        ("/evict_waits", "hugevmm_swap_evict_waits_total"),
        ("/evictions", "hugevmm_swap_evictions_total"),
        (
            "/faults/staging",
            r#"hugevmm_swap_faults_total{source="staging"}"#,
        ),
        (
            "/faults/store",
            r#"hugevmm_swap_faults_total{source="store"}"#,
        ),
        ("/faults/total", "hugevmm_swap_fault_messages_total"),
        (
            "/faults/zero",
            r#"hugevmm_swap_faults_total{source="zero"}"#,
        ),
        ("/mem_limit_bytes", "hugevmm_swap_limit_bytes"),
        ("/metadata_bytes", "hugevmm_swap_metadata_bytes"),
        (
            "/prefetch/hits",
            r#"hugevmm_swap_prefetches_total{outcome="hit"}"#,
        ),
        (
            "/prefetch/issued",
            r#"hugevmm_swap_prefetches_total{outcome="issued"}"#,
        ),
        (
            "/prefetch/skipped",
            r#"hugevmm_swap_prefetches_total{outcome="skipped"}"#,
        ),
        (
            "/prefetch/waste",
            r#"hugevmm_swap_prefetches_total{outcome="waste"}"#,
        ),
        (
            "/prefetch/withheld",
            r#"hugevmm_swap_prefetches_total{outcome="withheld"}"#,
        ),
        ("/resident_bytes", "hugevmm_swap_resident_bytes"),
        ("/resident_bytes_max", "hugevmm_swap_resident_max_bytes"),
        (
            "/restored_huge",
            r#"hugevmm_swap_restored_units_total{mapping="huge"}"#,
        ),
        (
            "/restored_split",
            r#"hugevmm_swap_restored_units_total{mapping="split"}"#,
        ),
        ("/split/chunks_huge", r#"hugevmm_swap_chunks{mode="huge"}"#),
        (
            "/split/chunks_split",
            r#"hugevmm_swap_chunks{mode="split"}"#,
        ),
        (
            "/split/collapse_attempts_by_reason/dense",
            r#"hugevmm_swap_collapse_attempts_total{reason="dense"}"#,
        ),
        (
            "/split/collapse_attempts_by_reason/forced",
            r#"hugevmm_swap_collapse_attempts_total{reason="forced"}"#,
        ),
        (
            "/split/collapse_attempts_by_reason/requested",
            r#"hugevmm_swap_collapse_attempts_total{reason="requested"}"#,
        ),
        (
            "/split/collapse_failures/madvise_refused",
            r#"hugevmm_swap_collapses_total{outcome="madvise_refused"}"#,
        ),
        (
            "/split/collapse_failures/no_parking",
            r#"hugevmm_swap_collapses_total{outcome="no_parking"}"#,
        ),
        (
            "/split/collapse_failures/not_huge",
            r#"hugevmm_swap_collapses_total{outcome="not_huge"}"#,
        ),
        (
            "/split/collapse_failures/pinned",
            r#"hugevmm_swap_collapses_total{outcome="pinned"}"#,
        ),
        (
            "/split/collapses_verified",
            r#"hugevmm_swap_collapses_total{outcome="verified"}"#,
        ),
        ("/split/flips", "hugevmm_swap_flips_total"),
        (
            "/split/page_activations",
            r#"hugevmm_swap_activations_total{of="page"}"#,
        ),
        (
            "/split/page_faults/store",
            r#"hugevmm_swap_page_faults_total{source="store"}"#,
        ),
        (
            "/split/page_faults/zero",
            r#"hugevmm_swap_page_faults_total{source="zero"}"#,
        ),
        (
            "/split/pages_given_up",
            r#"hugevmm_swap_page_evictions_total{result="given_up"}"#,
        ),
        (
            "/split/pages_written",
            r#"hugevmm_swap_page_evictions_total{result="written"}"#,
        ),
        (
            "/split/pages_zero",
            r#"hugevmm_swap_page_evictions_total{result="zero"}"#,
        ),
        (
            "/split/splits_by_origin/absent",
            r#"hugevmm_swap_splits_total{origin="absent"}"#,
        ),
        (
            "/split/splits_by_origin/resident",
            r#"hugevmm_swap_splits_total{origin="resident"}"#,
        ),
        (
            "/split/splits_by_origin/staged",
            r#"hugevmm_swap_splits_total{origin="staged"}"#,
        ),
        (
            "/split/splits_by_origin/stored",
            r#"hugevmm_swap_splits_total{origin="stored"}"#,
        ),
        (
            "/split/splits_by_reason/forced",
            r#"hugevmm_swap_split_reasons_total{reason="forced"}"#,
        ),
        (
            "/split/splits_by_reason/requested",
            r#"hugevmm_swap_split_reasons_total{reason="requested"}"#,
        ),
        (
            "/split/splits_by_reason/thrashing",
            r#"hugevmm_swap_split_reasons_total{reason="thrashing"}"#,
        ),
        (
            "/store/auth_fatal",
            r#"hugevmm_swap_store_fatal_total{kind="authentication"}"#,
        ),
        (
            "/store/auth_recovered",
            r#"hugevmm_swap_store_recovered_total{kind="authentication"}"#,
        ),
        (
            "/store/auth_rereads",
            r#"hugevmm_swap_store_retries_total{kind="authentication"}"#,
        ),
        (
            "/store/checksum_fatal",
            r#"hugevmm_swap_store_fatal_total{kind="checksum"}"#,
        ),
        (
            "/store/checksum_recovered",
            r#"hugevmm_swap_store_recovered_total{kind="checksum"}"#,
        ),
        (
            "/store/checksum_rereads",
            r#"hugevmm_swap_store_retries_total{kind="checksum"}"#,
        ),
        (
            "/store/exhausted",
            r#"hugevmm_swap_store_fatal_total{kind="transient"}"#,
        ),
        (
            "/store/recovered",
            r#"hugevmm_swap_store_recovered_total{kind="transient"}"#,
        ),
        (
            "/store/retries",
            r#"hugevmm_swap_store_retries_total{kind="transient"}"#,
        ),
        (
            "/store/transient_errors",
            "hugevmm_swap_store_transient_errors_total",
        ),
        ("/unit_bytes", "hugevmm_swap_unit_bytes"),
        ("/units_written", "hugevmm_swap_units_written_total"),
        ("/wp_faults", r#"hugevmm_swap_faults_total{source="wp"}"#),
        ("/zero_chunks", "hugevmm_swap_zero_chunks_total"),
        (
            "/stall/some_us",
            r#"hugevmm_memory_stall_seconds_total{kind="some"}"#,
        ),
        (
            "/stall/full_us",
            r#"hugevmm_memory_stall_seconds_total{kind="full"}"#,
        ),
        (
            "/stall/by_source_us/store",
            r#"hugevmm_memory_stall_waits_seconds_total{source="store"}"#,
        ),
        (
            "/stall/by_source_us/parking",
            r#"hugevmm_memory_stall_waits_seconds_total{source="parking"}"#,
        ),
        (
            "/stall/by_source_us/zero",
            r#"hugevmm_memory_stall_waits_seconds_total{source="zero"}"#,
        ),
        (
            "/stall/by_source_us/page",
            r#"hugevmm_memory_stall_waits_seconds_total{source="page"}"#,
        ),
        (
            "/stall/by_source_us/write_protect",
            r#"hugevmm_memory_stall_waits_seconds_total{source="write_protect"}"#,
        ),
        (
            "/stall/by_source_us/in_flight",
            r#"hugevmm_memory_stall_waits_seconds_total{source="in_flight"}"#,
        ),
        (
            "/stall/by_source_us/other",
            r#"hugevmm_memory_stall_waits_seconds_total{source="other"}"#,
        ),
        ("/working_set/estimate_bytes", "hugevmm_working_set_bytes"),
        (
            "/working_set/cold/idle_10s_bytes",
            r#"hugevmm_cold_memory_bytes{idle="10s"}"#,
        ),
        (
            "/working_set/cold/idle_60s_bytes",
            r#"hugevmm_cold_memory_bytes{idle="60s"}"#,
        ),
        (
            "/working_set/cold/idle_300s_bytes",
            r#"hugevmm_cold_memory_bytes{idle="300s"}"#,
        ),
        ("/working_set/samples", "hugevmm_working_set_samples_total"),
        (
            "/working_set/returned",
            "hugevmm_working_set_samples_returned_total",
        ),
        (
            "/working_set/sample_wait_us",
            "hugevmm_working_set_sample_wait_seconds_total",
        ),
    ];

    /// The figures of the `swap` object that are not metrics, and why.
    const JSON_ONLY: &[(&str, &str)] = &[
        (
            "/buffers/bound",
            "restore-buffer pool internals (docs/ARCHITECTURE.md), read by the engine's tests",
        ),
        ("/buffers/fresh", "restore-buffer pool internals"),
        ("/buffers/idle_max", "restore-buffer pool internals"),
        ("/buffers/recycle_dropped", "restore-buffer pool internals"),
        ("/buffers/recycled", "restore-buffer pool internals"),
        (
            "/buffers/recycled_uncleared",
            "restore-buffer pool internals",
        ),
        (
            "/clean_hash_mismatches",
            "a rare race the engine's tests provoke",
        ),
        ("/evict_busy", "a rare race the engine's tests provoke"),
        (
            "/faults/staging_writing",
            "a race the write-back tests must hit; part of staging",
        ),
        (
            "/install_busy_retries",
            "a rare race the engine's tests provoke",
        ),
        (
            "/store/sealed",
            "a setting (GET /vm's configuration), not a figure",
        ),
        (
            "/working_set/sampling",
            "a setting (GET /vm's configuration); the metrics are absent when it is off",
        ),
        ("/working_set/window_ms", "a setting: the estimate's window"),
        (
            "/working_set/estimate_samples",
            "how many samples the estimate is over: diagnosis",
        ),
        (
            "/working_set/estimate_stderr_bytes",
            "the estimate's standard error: diagnosis",
        ),
        (
            "/split/collapses_by_madvise",
            "which mechanism collapsed: diagnosis",
        ),
        ("/split/merged_absent", "a bookkeeping step: diagnosis"),
        (
            "/split/page_evictions",
            "its outcomes are swap_page_evictions_total's results",
        ),
        (
            "/split/splits",
            "the sum of swap_splits_total over its origins",
        ),
        (
            "/stale_faults",
            "duplicate messages, part of swap_fault_messages_total",
        ),
        ("/stall/vcpus", "hugevmm_vcpus says it"),
        (
            "/store/injected/delays",
            "what a faulty: test store injected",
        ),
        (
            "/store/injected/transient_corruptions",
            "what a faulty: test store injected",
        ),
        (
            "/store/injected/transient_errors",
            "what a faulty: test store injected",
        ),
    ];

    fn leaves(value: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match value {
            Value::Object(map) => {
                for (key, field) in map {
                    leaves(field, format!("{at}/{key}"), out);
                }
            }
            _ => out.push((at, value.clone())),
        }
    }

    /// Every figure of the `swap` object is either a metric carrying the
    /// same value or listed as JSON-only with its reason, and neither list
    /// names a figure that is gone: the two views of the engine's stats
    /// struct cannot drift apart. The histogram (`fault_latency_us`) is
    /// checked by `histograms_are_cumulative_and_in_seconds`.
    #[test]
    fn every_swap_figure_is_a_metric_or_says_why_not() {
        let stats = crate::stats::distinct_swap_stats();
        let mut snap = snapshot();
        snap.swap = Some(stats.clone());
        let (_, text) = render(&snap, Some("text/plain")).unwrap();
        let samples: std::collections::HashMap<&str, &str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .collect();
        let mut figures = Vec::new();
        leaves(
            &serde_json::to_value(&stats).unwrap(),
            String::new(),
            &mut figures,
        );
        let mut problems = Vec::new();
        for (path, value) in &figures {
            if path.starts_with("/fault_latency_us/") {
                continue;
            }
            let exported = EXPORTED.iter().find(|(p, _)| p == path);
            let json_only = JSON_ONLY.iter().any(|(p, _)| p == path);
            match (exported, json_only) {
                (Some((_, sample)), false) => match samples.get(sample) {
                    Some(got) if got.parse::<u64>().ok() == value.as_u64() => {}
                    // µs in the stats, seconds (the base unit) in the metrics.
                    Some(got) if path.ends_with("_us") || path.contains("_us/") => {
                        let want = value.as_u64().unwrap_or(u64::MAX) as f64 * 1e-6;
                        if got
                            .parse::<f64>()
                            .map_or(true, |g| (g - want).abs() > 1e-12)
                        {
                            problems.push(format!("{path} = {value} µs, but {sample} = {got} s"));
                        }
                    }
                    got => problems.push(format!("{path} = {value}, but {sample} = {got:?}")),
                },
                (None, true) => {}
                (Some(_), true) => problems.push(format!("{path} is in both lists")),
                (None, false) => problems.push(format!("{path} is neither a metric nor JSON-only")),
            }
        }
        for (path, _) in EXPORTED.iter().chain(JSON_ONLY) {
            if !figures.iter().any(|(p, _)| p == path) {
                problems.push(format!("{path} is listed but not in the stats"));
            }
        }
        assert!(problems.is_empty(), "{problems:#?}\n{text}");
    }

    #[test]
    fn formats_follow_accept() {
        assert_eq!(choose(None), Some(Format::OpenMetrics));
        assert_eq!(choose(Some("*/*")), Some(Format::OpenMetrics));
        assert_eq!(choose(Some("text/plain")), Some(Format::PrometheusText));
        // What Prometheus 2.x sends: OpenMetrics preferred.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(choose(Some(prometheus)), Some(Format::OpenMetrics));
        assert_eq!(
            choose(Some(
                "text/plain;version=0.0.4, application/openmetrics-text;q=0.2"
            )),
            Some(Format::PrometheusText)
        );
        assert_eq!(choose(Some("application/json")), None);
        let refusal = render(&snapshot(), Some("application/json")).unwrap_err();
        assert_eq!(refusal.status, 406);
    }

    #[test]
    fn both_formats_carry_the_figures() {
        let (ct, text) = render(&snapshot(), None).unwrap();
        assert_eq!(ct, OPENMETRICS);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("hugevmm_vcpus 2\n"), "{text}");
        assert!(
            text.contains("hugevmm_balloon_target_bytes 4194304\n"),
            "{text}"
        );
        assert!(
            text.contains("hugevmm_balloon_stats_reports_total 0\n"),
            "{text}"
        );
        let (ct, text) = render(&snapshot(), Some("text/plain")).unwrap();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        assert!(!text.contains("# EOF"), "{text}");
        assert!(
            text.contains("hugevmm_guest_memory_bytes 67108864\n"),
            "{text}"
        );
    }

    #[test]
    fn buckets_are_exact_at_powers_of_two() {
        let h = LatencyHistogram::default();
        let b = buckets(&h);
        assert_eq!(b.len(), BOUNDS_LOG2_US.count() + 1);
        assert!(b.iter().all(|(_, n)| *n == 0));
        assert_eq!(sum_seconds(&h), 0.0);
        // Engine buckets as the engine cuts them: [0,1) [1,2) ... [8,9)
        // ... [1024,1152) ... [2^25, 2^25 + 2^22) past the last bound.
        let engine = [
            (0, 1, 3),
            (1, 2, 1),
            (8, 9, 2),
            (1024, 1152, 4),
            (1 << 25, (1 << 25) + (1 << 22), 1),
        ];
        let b = per_bound(&engine);
        // What the encoder writes: running sums.
        let mut total = 0;
        let cumulative: Vec<(f64, u64)> = b
            .iter()
            .map(|&(bound, n)| {
                total += n;
                (bound, total)
            })
            .collect();
        let at = |us: u64| {
            cumulative
                .iter()
                .find(|(s, _)| (*s - us as f64 * 1e-6).abs() < 1e-12)
                .unwrap()
                .1
        };
        assert_eq!(at(1), 3, "v < 1 us");
        assert_eq!(at(2), 4);
        assert_eq!(at(8), 4, "[8, 9) is not below 8 us");
        assert_eq!(at(16), 6);
        assert_eq!(at(1024), 6);
        assert_eq!(at(2048), 10);
        assert_eq!(at(1 << 24), 10);
        assert_eq!(cumulative.last(), Some(&(f64::INFINITY, 11)));
        let sum = estimated_sum_seconds(&[(1024, 1152, 2)]);
        assert!((sum - 2.0 * 1088e-6).abs() < 1e-12, "{sum}");
    }
}
