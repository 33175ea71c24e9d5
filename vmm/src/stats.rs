//! The end-of-run statistics: the object written by `--stats-json`, and
//! the summary lines printed on stderr.

use crate::balloon_handle::BalloonSnapshot;
use crate::exit::ExitKind;
use crate::outcome::{RunOutcome, Sample};
use devices::virtio::BalloonStats;
use guestmem::{format_size, Backing, StageTwoPages, PAGE_BYTES};
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
        if let Some(sizing) = &o.sizing {
            value["mem_limit_auto"] = serde_json::to_value(sizing).unwrap_or_else(|e| {
                unreachable!("numbers and a string do not fail to serialize: {e}")
            });
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

impl RunSummary<'_> {
    /// How the run ended, as the first summary line says it: the guest's
    /// status, or what ended it when the guest did not choose (a status
    /// of 143 or 0 alone would not say that a signal or `quit` did).
    fn ending(&self) -> String {
        let status = self.outcome.exit_status;
        match self.outcome.exit_kind {
            ExitKind::Payload => format!("exited {status}"),
            ExitKind::Quit => format!("ended by quit (status {status})"),
            ExitKind::Signal => format!(
                "ended by {} (status {status})",
                crate::signals::signal_name(status - 128)
            ),
            ExitKind::Timeout => format!("timed out (status {status})"),
            ExitKind::VmFailure => format!("failed (status {status})"),
            ExitKind::Config => format!("was refused (status {status})"),
        }
    }

    /// The summary lines printed at the end of a run (stderr).
    pub fn lines(&self) -> Vec<String> {
        let o = self.outcome;
        let mut lines = vec![format!(
            "hugevmm: {} {} after {:.3} s on {} vCPUs, {} {} RAM; KVM stage-2 mappings: {} x 4K, {} x 2M, {} x 1G",
            self.payload,
            self.ending(),
            o.elapsed.as_secs_f64(),
            self.vcpus,
            format_size(self.mem_bytes),
            self.backing,
            o.stage2.pages_4k,
            o.stage2.pages_2m,
            o.stage2.pages_1g
        )];
        if let Some(swap) = &o.swap {
            lines.push(format!(
                "hugevmm: swap: {} faults ({} store, {} staging, {} zero), {} evictions, {} clean drops, {} zero chunks, {} written, {} read, restored {} mapped huge / {} small, fault latency p50 {} us p99 {} us max {} us, resident max {}",
                swap.faults.total,
                swap.faults.store,
                swap.faults.staging,
                swap.faults.zero,
                swap.evictions,
                swap.clean_drops,
                swap.zero_chunks,
                format_size(swap.bytes_written),
                format_size(swap.bytes_read),
                swap.restored_huge,
                swap.restored_split,
                swap.fault_latency.p50(),
                swap.fault_latency.p99(),
                swap.fault_latency.max(),
                format_size(swap.resident_bytes_max)
            ));
            let stall = &swap.stall;
            if stall.some_us > 0 {
                let run_us = o.elapsed.as_micros().max(1) as f64;
                let by = &stall.by_source_us;
                lines.push(format!(
                    "hugevmm: stall: some {:.3} s ({:.1} % of the run), full {:.3} s ({:.1} %); waits by source: store {:.3} s, parking {:.3} s, zero {:.3} s, page {:.3} s, write-protect {:.3} s, in flight {:.3} s",
                    stall.some_us as f64 * 1e-6,
                    stall.some_us as f64 / run_us * 100.0,
                    stall.full_us as f64 * 1e-6,
                    stall.full_us as f64 / run_us * 100.0,
                    by.store as f64 * 1e-6,
                    by.parking as f64 * 1e-6,
                    by.zero as f64 * 1e-6,
                    by.page as f64 * 1e-6,
                    by.write_protect as f64 * 1e-6,
                    by.in_flight as f64 * 1e-6,
                ));
            }
            let ws = &swap.working_set;
            if ws.sampling {
                let shown =
                    |bytes: Option<u64>| bytes.map_or_else(|| "unknown".into(), format_size);
                let vcpu_us = o.elapsed.as_micros().max(1) as f64 * f64::from(self.vcpus.max(1));
                lines.push(format!(
                    "hugevmm: working set: {} (standard error {}) active over {} s ({} samples; {} taken, {} came back); idle 10 s: {}, 60 s: {}, 300 s: {}; sampling cost {:.3} s of waits ({:.2} % of vCPU time)",
                    shown(ws.estimate_bytes),
                    shown(ws.estimate_stderr_bytes),
                    ws.window_ms / 1000,
                    ws.estimate_samples,
                    ws.samples,
                    ws.returned,
                    shown(ws.cold.idle_10s_bytes),
                    shown(ws.cold.idle_60s_bytes),
                    shown(ws.cold.idle_300s_bytes),
                    ws.sample_wait_us as f64 * 1e-6,
                    ws.sample_wait_us as f64 / vcpu_us * 100.0,
                ));
            }
            let split = &swap.split;
            let splits = split.splits;
            if splits > 0 {
                lines.push(format!(
                    "hugevmm: split chunks: {splits} splits, {} collapses verified huge ({} failed), {} page faults ({} store, {} zero), {} page evictions ({} written), {} split now",
                    split.collapses_verified,
                    split.collapse_failures.total(),
                    split.page_faults.store + split.page_faults.zero,
                    split.page_faults.store,
                    split.page_faults.zero,
                    split.page_evictions,
                    split.pages_written,
                    split.chunks_split
                ));
            }
        }
        if let Some(s) = &o.sizing {
            lines.push(format!(
                "hugevmm: mem-limit auto (stall target {} %): {} raises, {} lowers; limit {} to {}, mean {}{}",
                s.stall_target_pct,
                s.raises,
                s.lowers,
                format_size(s.lowest_bytes),
                format_size(s.highest_bytes),
                format_size(s.mean_bytes),
                s.stopped
                    .as_ref()
                    .map_or_else(String::new, |why| format!("; stopped: {why}"))
            ));
        }
        if let Some(p) = &o.pageout {
            lines.push(format!(
                "hugevmm: pageout: {} resident -> {} in {:.3} ms ({} units written, {} clean, {} zero)",
                format_size(p.resident_bytes_before),
                format_size(p.resident_bytes_after),
                p.elapsed.as_secs_f64() * 1e3,
                p.report.written_units,
                p.report.clean_dropped_units,
                p.report.zero_units
            ));
        }
        lines
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

/// The swap figures: the engine's stats struct as serde writes it (its
/// field names are the keys; docs/api.yaml's `Swap` schema is checked
/// against it). `detail` adds the per-source histograms with their
/// buckets: wanted once per run, too bulky for every timeline sample.
fn swap_json(s: &SwapStats, detail: bool) -> Value {
    let mut value = serde_json::to_value(s).unwrap_or_else(|e| {
        // Plain structs of integers cannot fail to serialize; say so
        // rather than write a partial object.
        unreachable!("the swap stats do not serialize: {e}")
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

/// Swap stats whose every integer is different (from 1000 up, in the
/// order serde writes them), so a test can tell which field a figure
/// came from; the latency histogram holds one fault of 1234 µs.
#[cfg(test)]
pub(crate) fn distinct_swap_stats() -> SwapStats {
    fn number_leaves(value: &mut Value, next: &mut u64) {
        match value {
            Value::Number(_) | Value::Null => {
                *value = Value::from(*next);
                *next += 1;
            }
            Value::Object(map) => map.values_mut().for_each(|v| number_leaves(v, next)),
            // Settings that switch figures on (working-set sampling).
            Value::Bool(on) => *on = true,
            _ => {}
        }
    }
    let mut value = serde_json::to_value(SwapStats::default()).unwrap();
    value
        .as_object_mut()
        .unwrap()
        .remove("fault_latency_us")
        .expect("the histogram is serialized");
    number_leaves(&mut value, &mut 1000);
    serde_json::from_value(value).expect("the stats read back what they wrote")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the `swap` object, with the schema's type at it:
    /// walks `schema` (docs/api.yaml's JSON Schema subset) and `value`
    /// together and names each difference.
    fn schema_differences(schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let fits = match value {
            Value::Object(_) => types.contains(&"object"),
            Value::Number(n) if n.is_u64() || n.is_i64() => {
                types.contains(&"integer") || types.contains(&"number")
            }
            Value::Number(_) => types.contains(&"number"),
            Value::Bool(_) => types.contains(&"boolean"),
            Value::Null => types.contains(&"null"),
            _ => types.contains(&"string") || types.contains(&"array"),
        };
        if !fits {
            out.push(format!(
                "{at}: {value} is not of the schema's type {types:?}"
            ));
        }
        let (Value::Object(fields), Some(properties)) = (value, schema["properties"].as_object())
        else {
            return;
        };
        for (key, field) in fields {
            match properties.get(key) {
                Some(property) => schema_differences(property, field, &format!("{at}/{key}"), out),
                None => out.push(format!("{at}/{key}: written but not in the schema")),
            }
        }
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for key in &required {
            if !properties.contains_key(*key) {
                out.push(format!("{at}/{key}: required but not a property"));
            }
        }
        for key in properties.keys() {
            if !fields.contains_key(key) {
                out.push(format!("{at}/{key}: in the schema but never written"));
            }
            if !required.contains(&key.as_str()) {
                out.push(format!("{at}/{key}: written always but not required"));
            }
        }
    }

    /// The `swap` object is the engine's stats struct as serde writes it;
    /// docs/api.yaml's `Swap` schema must name exactly its keys, with
    /// their types, so that a counter added to the struct without the
    /// document (or the other way round) fails here, not in a client.
    #[test]
    fn the_api_schema_names_exactly_the_swap_stats_fields() {
        let doc: Value = serde_yaml_ng::from_str(include_str!("../../docs/api.yaml")).unwrap();
        let schema = &doc["components"]["schemas"]["Swap"];
        assert!(schema.is_object(), "docs/api.yaml has no Swap schema");
        let mut stats = distinct_swap_stats();
        let mut differences = Vec::new();
        schema_differences(schema, &swap_json(&stats, false), "swap", &mut differences);
        stats.mem_limit_bytes = None;
        schema_differences(schema, &swap_json(&stats, false), "swap", &mut differences);
        differences.sort();
        differences.dedup();
        assert!(differences.is_empty(), "{differences:#?}");
    }

    fn outcome(kind: ExitKind, status: i32) -> RunOutcome {
        RunOutcome {
            exit_status: status,
            exit_kind: kind,
            vcpu_statuses: vec![None],
            failure: None,
            elapsed: Duration::from_millis(1500),
            stage2: StageTwoPages::default(),
            tsc_khz: None,
            swap: None,
            timeline: Vec::new(),
            pageout: None,
            balloon: None,
            sizing: None,
        }
    }

    fn first_line(outcome: &RunOutcome) -> String {
        RunSummary {
            payload: "verify",
            vcpus: 2,
            mem_bytes: 1 << 30,
            backing: Backing::Thp,
            outcome,
        }
        .lines()
        .remove(0)
    }

    /// The summary says what ended the run when the guest did not: a
    /// signal's 143 or quit's 0 alone reads like the guest's own status.
    #[test]
    fn the_summary_names_what_ended_the_run() {
        for (kind, status, says) in [
            (ExitKind::Payload, 7, "verify exited 7 after 1.500 s"),
            (
                ExitKind::Signal,
                143,
                "verify ended by SIGTERM (status 143) after",
            ),
            (
                ExitKind::Signal,
                130,
                "verify ended by SIGINT (status 130) after",
            ),
            (ExitKind::Quit, 0, "verify ended by quit (status 0) after"),
            (
                ExitKind::Timeout,
                124,
                "verify timed out (status 124) after",
            ),
            (ExitKind::VmFailure, 125, "verify failed (status 125) after"),
        ] {
            let line = first_line(&outcome(kind, status));
            assert!(line.starts_with(&format!("hugevmm: {says}")), "{line}");
            assert!(
                line.ends_with(
                    "on 2 vCPUs, 1 GiB thp RAM; KVM stage-2 mappings: 0 x 4K, 0 x 2M, 0 x 1G"
                ),
                "{line}"
            );
        }
    }

    #[test]
    fn a_swap_line_with_the_engine() {
        let mut o = outcome(ExitKind::Payload, 0);
        assert_eq!(
            RunSummary {
                payload: "hello",
                vcpus: 1,
                mem_bytes: 64 << 20,
                backing: Backing::Thp,
                outcome: &o,
            }
            .lines()
            .len(),
            1
        );
        o.swap = Some(SwapStats::default());
        let lines = RunSummary {
            payload: "hello",
            vcpus: 1,
            mem_bytes: 64 << 20,
            backing: Backing::Thp,
            outcome: &o,
        }
        .lines();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].starts_with("hugevmm: swap: 0 faults"),
            "{}",
            lines[1]
        );
    }
}
