//! The published figures, derived from a results file's raw runs only.
//!
//! Every headline figure that README.md and docs/BENCHMARKS.md print is
//! computed here from the JSON a suite wrote (`results.json`), never from
//! state that is not in the file: the suites push what these functions
//! return, and the tables of the docs are rendered from the same file
//! (`render`), so a committed results file, its headline object and the
//! docs can be checked against each other.
//!
//! Ratios between units pair the runs of one round (the suites alternate
//! the units, one run of each per round): a figure's values are its
//! per-round ratios, and the figure is their median (see [`Headline`]).

use serde_json::Value;

use super::report::{Aim, Headline};

/// Every figure of a results file, in the order the docs print them.
pub fn derive(results: &Value) -> Vec<Headline> {
    let mut out = Vec::new();
    if let Some(s) = results.get("swap_w_seq") {
        out.extend(swap_w_seq(s));
    }
    if let Some(s) = results.get("pageout") {
        out.extend(pageout(s));
    }
    if let Some(s) = results.get("fault_latency") {
        out.extend(fault_latency(s));
    }
    if let Some(s) = results.get("vhost_user") {
        out.extend(super::vhost_user::headlines(s));
    }
    out
}

/// A run of `swap-w-seq` as its JSON holds it.
struct SwsRun<'a>(&'a Value);

impl SwsRun<'_> {
    fn str(&self, key: &str) -> &str {
        self.0.get(key).and_then(Value::as_str).unwrap_or("")
    }
    fn num(&self, key: &str) -> f64 {
        self.0.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
    }
    fn round(&self) -> u64 {
        self.0.get("run").and_then(Value::as_u64).unwrap_or(0)
    }
    fn timed_out(&self) -> bool {
        self.0
            .get("timed_out")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The file-store runs of one case: `(round, unit, run)`.
fn case_runs<'a>(suite: &'a Value, case: &str) -> Vec<SwsRun<'a>> {
    suite
        .get("runs")
        .and_then(Value::as_array)
        .map(|runs| {
            runs.iter()
                .map(SwsRun)
                .filter(|r| r.str("case") == case && r.str("store") == "file")
                .collect()
        })
        .unwrap_or_default()
}

/// The rounds of `case` (ascending) that ran.
fn rounds(runs: &[SwsRun<'_>]) -> Vec<u64> {
    let mut r: Vec<u64> = runs.iter().map(SwsRun::round).collect();
    r.sort_unstable();
    r.dedup();
    r
}

fn in_round<'a, 'b>(runs: &'b [SwsRun<'a>], round: u64, unit: &str) -> Option<&'b SwsRun<'a>> {
    runs.iter()
        .find(|r| r.round() == round && r.str("unit") == unit)
}

/// Per round: `f(numerator run) / g(denominator runs)`, and how many of
/// the runs used stopped at their time bound.
fn per_round(runs: &[SwsRun<'_>], num_unit: &str, den_units: &[&str]) -> (Vec<f64>, usize) {
    let mut values = Vec::new();
    let mut stopped = 0;
    for round in rounds(runs) {
        let Some(n) = in_round(runs, round, num_unit) else {
            continue;
        };
        let dens: Vec<&SwsRun<'_>> = den_units
            .iter()
            .filter_map(|u| in_round(runs, round, u))
            .collect();
        let den = dens
            .iter()
            .map(|d| d.num("throughput_mibs"))
            .fold(f64::NAN, f64::max);
        if den > 0.0 {
            values.push(n.num("throughput_mibs") / den);
            stopped += usize::from(n.timed_out()) + dens.iter().filter(|d| d.timed_out()).count();
        }
    }
    (values, stopped)
}

fn stopped_note(stopped: usize) -> String {
    if stopped == 0 {
        String::new()
    } else {
        format!("; {stopped} of the runs stopped at the time bound (their MiB/s is the work over the bound, an upper bound)")
    }
}

/// A throughput ratio between units of one case, per round.
fn unit_ratio(
    suite: &Value,
    key: &str,
    what: &str,
    case: &str,
    num_unit: &str,
    den_units: &[&str],
    aim: Option<Aim>,
) -> Option<Headline> {
    let runs = case_runs(suite, case);
    let (values, stopped) = per_round(&runs, num_unit, den_units);
    (!values.is_empty()).then(|| {
        Headline::new(
            key,
            what,
            values,
            aim,
            format!(
                "guest MiB/s of {num_unit} over {} in the same round, file store, one value per round{}",
                den_units.join(" / best of "),
                stopped_note(stopped)
            ),
        )
    })
}

/// The seed 000 row's case name (full mode only).
pub const SEED_CASE: &str = "seed 000: seqwrite 6G over 4G";

/// The figures of `swap-w-seq` from its JSON object.
pub fn swap_w_seq(suite: &Value) -> Vec<Headline> {
    let ge = |b| Some(Aim::AtLeast(b));
    let mut out: Vec<Option<Headline>> = vec![
        unit_ratio(
            suite,
            "ratio_2m_over_4k",
            "seqwrite 4 vCPUs, 2m / 4k throughput",
            "seqwrite",
            "2m",
            &["4k"],
            ge(10.0),
        ),
        unit_ratio(
            suite,
            "ratio_2m_over_4k_one_vcpu",
            "seqwrite 1 vCPU (every pass swaps everything), 2m / 4k throughput",
            "seqwrite 1 vCPU",
            "2m",
            &["4k"],
            ge(10.0),
        ),
        unit_ratio(
            suite,
            "auto_over_2m_seqwrite",
            "seqwrite 4 vCPUs, auto / 2m throughput",
            "seqwrite",
            "auto",
            &["2m"],
            ge(0.9),
        ),
        unit_ratio(
            suite,
            "auto_over_4k_randwrite",
            "randwrite, auto / 4k throughput",
            "randwrite",
            "auto",
            &["4k"],
            ge(0.9),
        ),
        unit_ratio(
            suite,
            "auto_over_best_mixed",
            "mixed (hot pages beside a stream), auto / best of (2m, 4k) throughput",
            "mixed",
            "auto",
            &["2m", "4k"],
            ge(5.0),
        ),
        amplification(suite),
        unit_ratio(
            suite,
            "auto_over_2m_seed000",
            "seed 000 (4 vCPUs, 6G written 8 times over a 4G limit), auto / 2m throughput",
            SEED_CASE,
            "auto",
            &["2m"],
            ge(0.9),
        ),
        unit_ratio(
            suite,
            "auto_over_2m_seqwrite_one_vcpu",
            "seqwrite 1 vCPU, auto / 2m throughput",
            "seqwrite 1 vCPU",
            "auto",
            &["2m"],
            None,
        ),
    ];
    for unit in ["2m", "auto"] {
        out.extend(against_fio(suite, unit));
    }
    out.into_iter().flatten().collect()
}

/// Store bytes moved per guest byte, mixed, auto: one value per run.
fn amplification(suite: &Value) -> Option<Headline> {
    let runs = case_runs(suite, "mixed");
    let values: Vec<f64> = runs
        .iter()
        .filter(|r| r.str("unit") == "auto" && r.num("guest_bytes") > 0.0)
        .map(|r| (r.num("bytes_read") + r.num("bytes_written")) / r.num("guest_bytes"))
        .collect();
    (!values.is_empty()).then(|| {
        Headline::new(
            "store_bytes_per_guest_byte_mixed_auto",
            "mixed, auto: store bytes moved (read + written) per guest byte",
            values,
            Some(Aim::AtMost(3.0)),
            "one value per run, file store",
        )
    })
}

/// The engine's read and write rates while it swapped (seqwrite, file
/// store) over fio's read and write ceilings measured just before the
/// same round, each direction on its own.
fn against_fio(suite: &Value, unit: &str) -> Vec<Option<Headline>> {
    let Some(fio) = suite.get("fio").and_then(Value::as_array) else {
        return Vec::new();
    };
    let runs = case_runs(suite, "seqwrite");
    let shape = suite
        .pointer("/fio_shape/text")
        .and_then(Value::as_str)
        .unwrap_or("fio");
    let mut read = Vec::new();
    let mut write = Vec::new();
    for f in fio {
        let Some(round) = f.get("round").and_then(Value::as_u64) else {
            continue;
        };
        let Some(r) = in_round(&runs, round, unit) else {
            continue;
        };
        let s = r.num("swapping_s");
        if s.is_nan() || s <= 0.0 {
            continue;
        }
        let ceiling = |k: &str| f.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        read.push(r.num("swapping_bytes_read") / s / ceiling("read_bytes_per_s"));
        write.push(r.num("swapping_bytes_written") / s / ceiling("write_bytes_per_s"));
    }
    [("read", read), ("write", write)]
        .into_iter()
        .map(|(dir, values)| {
            (!values.is_empty()).then(|| {
                Headline::new(
                    &format!("engine_{dir}_over_fio_{dir}_seqwrite_{unit}"),
                    format!("seqwrite 4 vCPUs {unit}: engine's store {dir} rate / fio's {dir} ceiling"),
                    values,
                    Some(Aim::AtLeast(0.8)),
                    format!(
                        "store bytes {} per second from the run's first store I/O to its end, over the {dir} rate of {shape}, measured just before the same round",
                        if dir == "read" { "read" } else { "written" }
                    ),
                )
            })
        })
        .collect()
}

/// The figure of `pageout`: hugevmm's file store against the kernel's
/// `MADV_PAGEOUT` of the same content, per repetition (both run in each).
pub fn pageout(suite: &Value) -> Vec<Headline> {
    let Some(variant) = suite.get("headline_variant").and_then(Value::as_str) else {
        return Vec::new();
    };
    let vm = suite
        .get("hugevmm")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|e| e.get("store").and_then(Value::as_str) == Some("default"))
        });
    let kernel = suite.get("kernel").and_then(Value::as_array).and_then(|a| {
        a.iter()
            .find(|e| e.get("variant").and_then(Value::as_str) == Some(variant))
    });
    let (Some(vm), Some(kernel)) = (vm, kernel) else {
        return Vec::new();
    };
    let vm_ms: Vec<(u64, f64)> = vm
        .get("runs_by_rep")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e.get("rep")?.as_u64()?, e.get("ms")?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let mut values = Vec::new();
    let mut not_paged_out = 0;
    for k in kernel
        .get("runs_detail")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(rep), Some(written)) = (
            k.get("rep").and_then(Value::as_u64),
            k.get("written_ms").and_then(Value::as_f64),
        ) else {
            continue;
        };
        if k.get("really_paged_out").and_then(Value::as_bool) != Some(true) {
            not_paged_out += 1;
            continue;
        }
        if let Some((_, ms)) = vm_ms.iter().find(|(r, _)| *r == rep) {
            values.push(ms / written.max(1e-9));
        }
    }
    if values.is_empty() {
        return Vec::new();
    }
    vec![Headline::new(
        "pageout_over_kernel",
        "256 MiB pageout: hugevmm to its file store / the kernel's MADV_PAGEOUT to a swap file (writes done)",
        values,
        Some(Aim::AtMost(1.0)),
        format!(
            "per repetition, both in each; kernel = {variant}, on the same disk, until its writes are done{}",
            if not_paged_out > 0 {
                format!("; {not_paged_out} kernel runs left out: they did not really page out")
            } else {
                String::new()
            }
        ),
    )]
}

/// The figure of `fault-latency`: p99 of a 2 MiB fault from the file
/// store over the floor measured in the same invocation (one run).
pub fn fault_latency(suite: &Value) -> Vec<Headline> {
    let Some(row) = suite
        .get("sources")
        .and_then(Value::as_array)
        .and_then(|rows| {
            rows.iter().find(|r| {
                r.get("source")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.starts_with("2m store, file"))
            })
        })
    else {
        return Vec::new();
    };
    let (Some(p99), Some(floor)) = (
        row.get("p99_us").and_then(Value::as_f64),
        row.get("floor_us").and_then(Value::as_f64),
    ) else {
        return Vec::new();
    };
    if floor <= 0.0 {
        return Vec::new();
    }
    vec![Headline::new(
        "p99_over_floor",
        "p99 of a 2 MiB fault from the file store / floor (1 vCPU)",
        vec![p99 / floor],
        Some(Aim::AtMost(2.0)),
        format!(
            "one run: p99 {:.2} ms over the floor {:.2} ms (2 MiB O_DIRECT read + THP fill + UFFDIO_MOVE, measured in the same invocation)",
            p99 / 1000.0,
            floor / 1000.0
        ),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIB: f64 = (1u64 << 30) as f64;

    fn run(case: &str, unit: &str, round: u64, mibs: f64) -> Value {
        json!({"case": case, "unit": unit, "store": "file", "run": round, "throughput_mibs": mibs,
               "timed_out": false, "guest_bytes": 100, "bytes_read": 150, "bytes_written": 50,
               "swapping_s": 2.0, "swapping_bytes_read": 2.0 * GIB, "swapping_bytes_written": 1.0 * GIB})
    }

    #[test]
    fn ratios_pair_the_runs_of_a_round_and_the_median_decides() {
        // Ratio of medians would be 300/100 = 3; per round 1, 4 and 0.5.
        let suite = json!({"runs": [
            run("seqwrite", "auto", 1, 100.0), run("seqwrite", "2m", 1, 100.0),
            run("seqwrite", "auto", 2, 400.0), run("seqwrite", "2m", 2, 100.0),
            run("seqwrite", "auto", 3, 300.0), run("seqwrite", "2m", 3, 600.0),
        ]});
        let f = swap_w_seq(&suite);
        let h = f.iter().find(|h| h.key == "auto_over_2m_seqwrite").unwrap();
        assert_eq!(h.values, vec![1.0, 4.0, 0.5]);
        assert_eq!((h.min(), h.median(), h.max()), (0.5, 1.0, 4.0));
        assert_eq!(h.met(), Some(true));
        // An upper bound aim is held to the median too.
        let mut low = h.clone();
        low.aim = Some(Aim::AtMost(0.9));
        assert_eq!(low.met(), Some(false), "max 4 and min 0.5 do not decide");
        assert!(f.iter().all(|h| h.key != "ratio_2m_over_4k"), "no 4k runs");
    }

    #[test]
    fn a_missing_run_drops_its_round_only() {
        let suite = json!({"runs": [
            run("mixed", "auto", 1, 50.0), run("mixed", "2m", 1, 5.0), run("mixed", "4k", 1, 10.0),
            run("mixed", "auto", 2, 60.0),
        ]});
        let f = swap_w_seq(&suite);
        let h = f.iter().find(|h| h.key == "auto_over_best_mixed").unwrap();
        assert_eq!(
            h.values,
            vec![5.0],
            "best of 2m and 4k, round 2 has neither"
        );
        assert_eq!(h.met(), Some(true));
        let a = f
            .iter()
            .find(|h| h.key == "store_bytes_per_guest_byte_mixed_auto")
            .unwrap();
        assert_eq!(a.values, vec![2.0, 2.0]);
    }

    #[test]
    fn fio_ceilings_judge_each_direction_in_its_round() {
        let suite = json!({
            "runs": [run("seqwrite", "2m", 1, 1.0), run("seqwrite", "2m", 2, 1.0)],
            "fio": [
                {"round": 1, "read_bytes_per_s": 1.0 * GIB, "write_bytes_per_s": 1.0 * GIB},
                {"round": 2, "read_bytes_per_s": 2.0 * GIB, "write_bytes_per_s": 0.25 * GIB},
            ],
        });
        let f = swap_w_seq(&suite);
        let r = f
            .iter()
            .find(|h| h.key == "engine_read_over_fio_read_seqwrite_2m")
            .unwrap();
        assert_eq!(r.values, vec![1.0, 0.5]);
        let w = f
            .iter()
            .find(|h| h.key == "engine_write_over_fio_write_seqwrite_2m")
            .unwrap();
        assert_eq!(w.values, vec![0.5, 2.0]);
        assert_eq!(w.median(), 1.25);
    }

    #[test]
    fn pageout_pairs_repetitions_and_skips_kernel_runs_that_did_not_page_out() {
        let suite = json!({
            "headline_variant": "k",
            "hugevmm": [{"store": "default", "runs_by_rep": [{"rep": 1, "ms": 100.0}, {"rep": 2, "ms": 300.0}]}],
            "kernel": [{"variant": "k", "runs_detail": [
                {"rep": 1, "written_ms": 200.0, "really_paged_out": true},
                {"rep": 2, "written_ms": 100.0, "really_paged_out": false},
            ]}],
        });
        let f = pageout(&suite);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].values, vec![0.5]);
        assert_eq!(f[0].met(), Some(true));
        assert!(f[0].how.contains("1 kernel runs left out"), "{}", f[0].how);
    }
}
