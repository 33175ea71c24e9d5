//! The docs' result tables, rendered from a results file.
//!
//! README.md and docs/BENCHMARKS.md hold each generated table between two
//! markers, `<!-- results:NAME begin -->` and `<!-- results:NAME end -->`,
//! rendered from a results file of `hugevmm bench report`;
//! docs/KERNEL_BASELINE.md holds the `workloads` block, rendered from a
//! results file of `hugevmm bench workloads` (one with a `workloads` key).
//! [`write_docs`] (`hugevmm bench report --render FILE`) rewrites what
//! lies between them from a results file; [`stale_docs`] says which
//! blocks differ from what the file renders to (the bench crate's test
//! runs it on the committed results file). Everything here is a function
//! of the file alone, so the same file always gives the same text.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::figures;
use super::hist::median;
use super::report::{Aim, Headline};

/// The docs that carry blocks of a `hugevmm bench report` results file
/// (paths from the repository's top directory) and the blocks each
/// carries, in order.
pub const DOCS: [(&str, &[&str]); 2] = [
    ("README.md", &["summary", "figures", "fio", "swap-w-seq"]),
    (
        "docs/BENCHMARKS.md",
        &[
            "summary",
            "figures",
            "fio",
            "swap-w-seq",
            "pageout",
            "fault-latency",
            "vhost-user",
            "limits",
        ],
    ),
];

/// The doc that carries the block of a `hugevmm bench workloads` results
/// file, and its block.
pub const WORKLOADS_DOCS: [(&str, &[&str]); 1] = [("docs/KERNEL_BASELINE.md", &["workloads"])];

/// The doc that carries the blocks of a `hugevmm bench self-sizing`
/// results file, and its blocks.
pub const SELF_SIZING_DOCS: [(&str, &[&str]); 1] =
    [("docs/SELF_SIZING.md", &["self-sizing", "host-budget"])];

/// The doc that carries the block of a `hugevmm bench fault-4k` results
/// file, and its block.
pub const FAULT_4K_DOCS: [(&str, &[&str]); 1] = [("docs/BENCHMARKS.md", &["fault-4k"])];

/// The docs a results file renders into: a workloads, self-sizing or
/// fault-4k suite's file (it has a `workloads`, `self_sizing` or
/// `fault_4k` key) renders its own blocks, any other the report's.
pub fn docs_of(results: &Value) -> &'static [(&'static str, &'static [&'static str])] {
    if results.get("workloads").is_some() {
        &WORKLOADS_DOCS
    } else if results.get("self_sizing").is_some() {
        &SELF_SIZING_DOCS
    } else if results.get("fault_4k").is_some() {
        &FAULT_4K_DOCS
    } else {
        &DOCS
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The opening marker of block `name`.
pub fn begin_marker(name: &str) -> String {
    format!("<!-- results:{name} begin -->")
}

/// The closing marker of block `name`.
pub fn end_marker(name: &str) -> String {
    format!("<!-- results:{name} end -->")
}

/// The text of block `name` rendered from `results` (without markers).
pub fn block(results: &Value, name: &str) -> Result<String> {
    Ok(match name {
        "summary" => summary(results),
        "figures" => figures_table(&figures::derive(results)),
        "fio" => fio(results),
        "swap-w-seq" => swap_w_seq(results),
        "pageout" => pageout(results),
        "fault-latency" => fault_latency(results),
        "limits" => limits(results),
        "vhost-user" => vhost_user(results),
        "workloads" => workloads(results)?,
        "self-sizing" => self_sizing(results)?,
        "host-budget" => host_budget(results)?,
        "fault-4k" => fault_4k(results)?,
        other => bail!("no block named {other:?} (known: summary, figures, fio, swap-w-seq, pageout, fault-latency, vhost-user, limits, workloads, self-sizing, host-budget, fault-4k)"),
    })
}

/// `text` with every block of `names` replaced by its rendering. A block
/// whose markers are missing, doubled or out of order is an error naming
/// the marker: nothing is rewritten then.
pub fn apply(text: &str, results: &Value, names: &[&str]) -> Result<String> {
    let mut out = text.to_string();
    for name in names {
        let (begin, end) = (begin_marker(name), end_marker(name));
        let (Some(b), Some(e)) = (out.find(&begin), out.find(&end)) else {
            bail!("the marker pair {begin} ... {end} is missing: add both, on lines of their own, where the table goes");
        };
        if out.matches(&begin).count() != 1 || out.matches(&end).count() != 1 || e < b {
            bail!("the markers of block {name:?} must appear once each, {begin} first");
        }
        let inner_start = b + begin.len();
        let rendered = format!("\n{}", block(results, name)?);
        out.replace_range(inner_start..e, &rendered);
    }
    Ok(out)
}

/// Reads a results file.
pub fn read_results(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the results file {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a results file (JSON)", path.display()))
}

/// Rewrites the blocks of every doc of [`DOCS`] under `repo` from the
/// results file at `results_path`; returns the docs it changed.
pub fn write_docs(repo: &Path, results_path: &Path) -> Result<Vec<PathBuf>> {
    let results = read_results(results_path)?;
    let mut rendered = Vec::new();
    // Everything is rendered before anything is written: a bad marker in
    // the second doc leaves the first unchanged too.
    for &(doc, names) in docs_of(&results) {
        let path = repo.join(doc);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (run --render from the repository's top directory)",
                path.display()
            )
        })?;
        let new =
            apply(&text, &results, names).with_context(|| format!("in {}", path.display()))?;
        if new != text {
            rendered.push((path, new));
        }
    }
    let mut changed = Vec::new();
    for (path, text) in rendered {
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        changed.push(path);
    }
    Ok(changed)
}

/// The docs under `repo` whose blocks differ from what `results_path`
/// renders to, each with the first block that differs.
pub fn stale_docs(repo: &Path, results_path: &Path) -> Result<Vec<String>> {
    let results = read_results(results_path)?;
    let mut stale = Vec::new();
    for &(doc, names) in docs_of(&results) {
        let path = repo.join(doc);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        for name in names {
            let new = apply(&text, &results, &[name]).with_context(|| format!("in {doc}"))?;
            if new != text {
                stale.push(format!("{doc}: block {name}"));
                break;
            }
        }
    }
    Ok(stale)
}

/// The keys of `results.json`'s headline object whose entry differs from
/// what [`figures::derive`] computes from the file's runs.
pub fn headline_mismatches(results: &Value) -> Vec<String> {
    let stored = results.get("headline").and_then(Value::as_object);
    figures::derive(results)
        .into_iter()
        .filter(|h| {
            !stored
                .and_then(|m| m.get(&h.key))
                .and_then(|v| Headline::from_json(&h.key, v))
                .is_some_and(|s| same_figure(&s, h))
        })
        .map(|h| h.key)
        .collect()
}

/// The same figure, its values equal to within float noise: the stored
/// values were computed from the runs before they were written as JSON,
/// the derived ones from the numbers read back, and JSON's decimal form
/// of a float may read back one unit in the last place off.
fn same_figure(a: &Headline, b: &Headline) -> bool {
    a.key == b.key
        && a.what == b.what
        && a.aim == b.aim
        && a.how == b.how
        && a.values.len() == b.values.len()
        && a.values
            .iter()
            .zip(&b.values)
            .all(|(x, y)| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn f64_at(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
}

/// A number with `digits` decimals, `-` when absent or not finite.
fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "-".into(),
    }
}

fn summary(r: &Value) -> String {
    let m = |k: &str| r.pointer(&format!("/machine/{k}"));
    let commit = str_at(r, "/source/commit").unwrap_or("unknown");
    let short = commit.get(..10).unwrap_or(commit);
    let date = str_at(r, "/source/commit_date")
        .and_then(|d| d.get(..10))
        .unwrap_or("unknown date");
    let modified = match r
        .pointer("/source/tracked_files_modified")
        .and_then(Value::as_bool)
    {
        Some(true) => ", with tracked files modified in the checkout",
        _ => "",
    };
    let argv = r
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| str_at(r, "/command").unwrap_or("?").to_string());
    let failures = r
        .get("failures")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let skipped: Vec<&str> = r
        .get("skipped")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut s = format!(
        "`{argv}` ({} mode) at commit `{short}` ({date}{modified}), {} s, on {} cores ({}), {} GiB, Linux {}, KVM {}, THP `{}`; load average {} at the end.\n",
        str_at(r, "/mode").unwrap_or("?"),
        num(f64_at(r, "/wall_s"), 0),
        m("cores").map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
        m("cpu").and_then(Value::as_str).unwrap_or("?"),
        num(m("mem_gib").and_then(Value::as_f64), 0),
        m("kernel").and_then(Value::as_str).unwrap_or("?"),
        m("kvm").and_then(Value::as_str).unwrap_or("?"),
        m("thp").and_then(Value::as_str).unwrap_or("?"),
        m("loadavg_at_end")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| num(v.as_f64(), 2)).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "?".into()),
    );
    if failures > 0 {
        s += &format!("\n**{failures} step(s) of this run failed** (the results file's `failures`); their figures are missing below.\n");
    }
    for line in skipped {
        s += &format!("\n{line}\n");
    }
    s
}

/// `| a | b |` lines.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!(
        "| {} |\n|{}|\n",
        headers.join(" | "),
        headers
            .iter()
            .map(|_| " --- ")
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    s
}

/// The headline figures with their spread and verdict.
pub fn figures_table(headlines: &[Headline]) -> String {
    let rows: Vec<Vec<String>> = headlines
        .iter()
        .map(|h| {
            let verdict = match h.met() {
                Some(true) => "met".to_string(),
                Some(false) => "**missed**".to_string(),
                None if h.aim.is_some() => "**not measured**".to_string(),
                None => "(no aim)".to_string(),
            };
            vec![
                h.what.clone(),
                format!("**{}**", num(Some(h.median()), 2)),
                if h.values.is_empty() {
                    "no value".into()
                } else if h.values.len() > 1 {
                    format!(
                        "{}-{} ({} rounds)",
                        num(Some(h.min()), 2),
                        num(Some(h.max()), 2),
                        h.values.len()
                    )
                } else {
                    "1 run".into()
                },
                h.aim.map(Aim::text).unwrap_or_default(),
                verdict,
            ]
        })
        .collect();
    let mut s = table(&["figure", "median", "min-max", "aim", "aim met?"], &rows);
    s += "\nEach ratio pairs the runs of one round (the variants alternate, one run each per round); an aim counts as met only when the median of the rounds meets it.\n";
    s
}

fn fio(r: &Value) -> String {
    let Some(rounds) = r.pointer("/swap_w_seq/fio").and_then(Value::as_array) else {
        return "No fio ceiling in this results file (fio missing, or swap-w-seq did not run).\n"
            .into();
    };
    let runs: Vec<&Value> = r
        .pointer("/swap_w_seq/runs")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let rate = |unit: &str, round: u64, key: &str| -> Option<f64> {
        let run = runs.iter().find(|x| {
            str_at(x, "/case") == Some("seqwrite")
                && str_at(x, "/store") == Some("file")
                && str_at(x, "/unit") == Some(unit)
                && x.get("run").and_then(Value::as_u64) == Some(round)
        })?;
        Some(f64_at(run, key)? / f64_at(run, "/swapping_s")?.max(1e-9) / GIB)
    };
    let depths: Vec<u64> = r
        .pointer("/swap_w_seq/fio_shape/write_depths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let rows: Vec<Vec<String>> = rounds
        .iter()
        .map(|f| {
            let round = f.get("round").and_then(Value::as_u64).unwrap_or(0);
            let mut row = vec![round.to_string()];
            for depth in &depths {
                let run = f.get("runs").and_then(Value::as_array).and_then(|runs| {
                    runs.iter()
                        .find(|x| x.get("write_depth").and_then(Value::as_u64) == Some(*depth))
                });
                row.push(match run {
                    Some(x) => format!(
                        "{} + {}",
                        num(f64_at(x, "/read_bytes_per_s").map(|v| v / GIB), 2),
                        num(f64_at(x, "/write_bytes_per_s").map(|v| v / GIB), 2)
                    ),
                    None => "-".into(),
                });
            }
            row.push(format!(
                "**{}**",
                num(f64_at(f, "/read_bytes_per_s").map(|v| v / GIB), 2)
            ));
            row.push(format!(
                "**{}**",
                num(f64_at(f, "/write_bytes_per_s").map(|v| v / GIB), 2)
            ));
            for unit in ["2m", "auto"] {
                row.push(num(rate(unit, round, "/swapping_bytes_read"), 2));
                row.push(num(rate(unit, round, "/swapping_bytes_written"), 2));
            }
            row
        })
        .collect();
    let mut headers: Vec<String> = vec!["round".into()];
    headers.extend(
        depths
            .iter()
            .map(|d| format!("fio read + write, writer {d} deep")),
    );
    headers.extend(
        [
            "read ceiling",
            "write ceiling",
            "2m read",
            "2m write",
            "auto read",
            "auto write",
        ]
        .map(String::from),
    );
    let mut s = table(
        &headers.iter().map(String::as_str).collect::<Vec<_>>(),
        &rows,
    );
    s += &format!(
        "\nGiB/s. Ceilings: {} (`bench/src/fio.rs`), {} s per run, just before the round's seqwrite runs (4 vCPUs, file store). Engine: store bytes read and written per second from the run's first store I/O to its end, each held to the ceiling of its own direction in the figures above.\n",
        str_at(r, "/swap_w_seq/fio_shape/text").unwrap_or("fio"),
        if str_at(r, "/mode") == Some("full") { 10 } else { 3 },
    );
    s
}

/// Medians of the runs of one case, unit and store, with the spread of
/// the throughput.
fn swap_w_seq(r: &Value) -> String {
    let Some(runs) = r.pointer("/swap_w_seq/runs").and_then(Value::as_array) else {
        return "No swap-w-seq runs in this results file.\n".into();
    };
    let mut groups: Vec<(String, String, String)> = Vec::new();
    for x in runs {
        let k = (
            str_at(x, "/case").unwrap_or("?").to_string(),
            str_at(x, "/store").unwrap_or("?").to_string(),
            str_at(x, "/unit").unwrap_or("?").to_string(),
        );
        if !groups.contains(&k) {
            groups.push(k);
        }
    }
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|(case, store, unit)| {
            let g: Vec<&Value> = runs
                .iter()
                .filter(|x| {
                    str_at(x, "/case") == Some(case)
                        && str_at(x, "/store") == Some(store)
                        && str_at(x, "/unit") == Some(unit)
                })
                .collect();
            let med = |p: &str| median(&g.iter().filter_map(|x| f64_at(x, p)).collect::<Vec<_>>());
            let mibs: Vec<f64> = g
                .iter()
                .filter_map(|x| f64_at(x, "/throughput_mibs"))
                .collect();
            let stopped = g
                .iter()
                .filter(|x| x.get("timed_out").and_then(Value::as_bool) == Some(true))
                .count();
            let amp: Vec<f64> = g
                .iter()
                .filter_map(|x| {
                    let guest = f64_at(x, "/guest_bytes").filter(|b| *b > 0.0)?;
                    Some((f64_at(x, "/bytes_read")? + f64_at(x, "/bytes_written")?) / guest)
                })
                .collect();
            let lo = mibs.iter().copied().fold(f64::NAN, f64::min);
            let hi = mibs.iter().copied().fold(f64::NAN, f64::max);
            vec![
                case.clone(),
                unit.clone(),
                store.clone(),
                if stopped > 0 {
                    format!("{} ({stopped} stopped)", g.len())
                } else {
                    g.len().to_string()
                },
                format!(
                    "{}{}",
                    if stopped > 0 { "<" } else { "" },
                    num(median(&mibs), 1)
                ),
                if g.len() > 1 {
                    format!("{}-{}", num(Some(lo), 1), num(Some(hi), 1))
                } else {
                    "-".into()
                },
                num(med("/elapsed_s"), 2),
                num(med("/store_faults"), 0),
                format!(
                    "{} / {} / {}",
                    num(med("/fault_latency_us/p50"), 0),
                    num(med("/fault_latency_us/p99"), 0),
                    num(
                        g.iter()
                            .filter_map(|x| f64_at(x, "/fault_latency_us/max"))
                            .reduce(f64::max),
                        0
                    )
                ),
                num(median(&amp), 2),
                format!("{}%", num(med("/pages_2m_coverage").map(|v| v * 100.0), 0)),
            ]
        })
        .collect();
    let mut s = table(
        &[
            "case",
            "unit",
            "store",
            "runs",
            "MiB/s (median)",
            "MiB/s min-max",
            "elapsed s",
            "store faults",
            "fault p50 / p99 / max us",
            "store bytes per guest byte",
            "2M coverage",
        ],
        &rows,
    );
    s += "\nMedians of each group's runs; fault max is the worst of all its runs. A stopped run (`<`) reached its time bound: its MiB/s is the work over the bound, an upper bound. 2M coverage: KVM 2 MiB stage-2 mappings per resident chunk at the end.\n";
    if let Some(w) = str_at(r, "/swap_w_seq/same_work") {
        s += &format!("\nWork: {w}.\n");
    }
    s
}

fn pageout(r: &Value) -> String {
    let Some(p) = r.get("pageout") else {
        return "No pageout runs in this results file.\n".into();
    };
    let mut rows = Vec::new();
    for e in p
        .get("hugevmm")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rows.push(vec![
            "hugevmm --pageout".into(),
            match str_at(e, "/store") {
                Some("default") => "file (O_DIRECT)".into(),
                other => other.unwrap_or("?").into(),
            },
            e.get("runs").map(|v| v.to_string()).unwrap_or_default(),
            num(f64_at(e, "/median_ms"), 1),
            num(f64_at(e, "/mib_per_s"), 0),
            format!(
                "{} -> {} MiB resident",
                num(
                    f64_at(e, "/resident_bytes_before").map(|b| b / (1u64 << 20) as f64),
                    0
                ),
                num(
                    f64_at(e, "/resident_bytes_after").map(|b| b / (1u64 << 20) as f64),
                    0
                )
            ),
        ]);
    }
    for e in p
        .get("kernel")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rows.push(vec![
            "kernel MADV_PAGEOUT".into(),
            str_at(e, "/variant").unwrap_or("?").into(),
            e.get("runs").map(|v| v.to_string()).unwrap_or_default(),
            format!(
                "{} (call {})",
                num(f64_at(e, "/median_written_ms"), 1),
                num(f64_at(e, "/median_madvise_ms"), 1)
            ),
            "-".into(),
            if e.get("really_paged_out").and_then(Value::as_bool) == Some(true) {
                "paged out".into()
            } else {
                "NOT paged out".into()
            },
        ]);
    }
    let mut s = table(
        &[
            "who",
            "store / variant",
            "runs",
            "ms (median)",
            "MiB/s",
            "check",
        ],
        &rows,
    );
    s += &format!(
        "\nhugevmm: `pageout.elapsed_ms` (evict every resident chunk of {} MiB written, wait for the store writes). Kernel: `madvise(MADV_PAGEOUT)` of the same amount until `/proc/meminfo` Writeback is back to its level before the call (`call`: the madvise call alone); {}.\n",
        num(f64_at(p, "/bytes").map(|b| b / (1u64 << 20) as f64), 0),
        str_at(p, "/kernel_setup").filter(|s| !s.is_empty()).unwrap_or("no kernel comparison (needs root)")
    );
    s
}

fn fault_latency(r: &Value) -> String {
    let Some(rows_json) = r
        .pointer("/fault_latency/sources")
        .and_then(Value::as_array)
    else {
        return "No fault-latency runs in this results file.\n".into();
    };
    let ms = |v: &Value, k: &str| num(f64_at(v, k).map(|us| us / 1000.0), 3);
    let rows: Vec<Vec<String>> = rows_json
        .iter()
        .map(|v| {
            vec![
                str_at(v, "/source").unwrap_or("?").into(),
                num(f64_at(v, "/count"), 0),
                ms(v, "/p50_us"),
                ms(v, "/p99_us"),
                ms(v, "/p999_us"),
                ms(v, "/max_us"),
                ms(v, "/floor_us"),
                // Only a restore from a store is held to its floor: the
                // other sources' times are mostly other waits.
                if str_at(v, "/source").is_some_and(|s| s.contains(" store")) {
                    num(f64_at(v, "/p99_over_floor"), 2)
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    let mut s = table(
        &[
            "source",
            "count",
            "p50",
            "p99",
            "p99.9",
            "max",
            "floor",
            "p99/floor",
        ],
        &rows,
    );
    s += "\nMilliseconds, one run per row; service time from the fault thread taking up the message to the wake of the vCPU; percentiles are bucket upper edges (<= 12.5% wide). Floor: the engine's own pieces (store read, THP fill, UFFDIO_MOVE) timed in the bench process in the same invocation. Staging and zero faults have no p99/floor: their time is mostly other waits (a staged chunk's write in flight, an eviction at the limit).\n";
    s
}

/// The vhost-user suite's table, as its run printed it.
fn vhost_user(r: &Value) -> String {
    match r.get("vhost_user") {
        Some(suite) => super::vhost_user::tables_from_json(suite)
            .iter()
            .map(super::report::Table::markdown)
            .collect(),
        None => "No vhost-user suite in this results file.\n".into(),
    }
}

/// The workloads suite's tables, as its run printed them: one per
/// workload, then the aims table.
fn workloads(r: &Value) -> Result<String> {
    let suite = r
        .get("workloads")
        .context("this results file has no workloads suite (hugevmm bench workloads writes one)")?;
    Ok(super::workloads::tables_from_json(suite)?
        .iter()
        .map(super::report::Table::markdown)
        .collect())
}

/// The fault-4k suite's tables: where a 4 KiB store fault's time goes,
/// and what one fault costs the process.
fn fault_4k(r: &Value) -> Result<String> {
    let suite = r
        .get("fault_4k")
        .context("this results file has no fault-4k suite (hugevmm bench fault-4k writes one)")?;
    Ok(super::fault_4k::tables_from_json(suite)?
        .iter()
        .map(super::report::Table::markdown)
        .collect())
}

/// The self-sizing suite's tables: the sweep, auto's phases, its aims.
fn self_sizing(r: &Value) -> Result<String> {
    let suite = r.get("self_sizing").context(
        "this results file has no self-sizing suite (hugevmm bench self-sizing writes one)",
    )?;
    let tables: String = super::self_sizing::tables_from_json(suite)?
        .iter()
        .map(super::report::Table::markdown)
        .collect();
    Ok(format!(
        "{tables}\n{}",
        figures_table(&super::self_sizing::headlines(suite))
    ))
}

/// The host-budget suite's table and its aims, as the run printed them.
fn host_budget(r: &Value) -> Result<String> {
    let suite = r
        .get("host_budget")
        .context("this results file has no host-budget suite (hugevmm bench self-sizing or host-budget writes one)")?;
    Ok(format!(
        "{}\n{}",
        super::host_budget::table_from_json(suite).markdown(),
        figures_table(&super::host_budget::headlines(suite))
    ))
}

fn limits(r: &Value) -> String {
    let Some(d) = r.pointer("/limits/disk") else {
        return "No limits suite in this results file.\n".into();
    };
    let qd = d
        .get("queue_depth")
        .map(|v| v.to_string())
        .unwrap_or_default();
    let mut rows = vec![
        vec![
            "O_DIRECT write 2 MiB, growing the file".to_string(),
            num(f64_at(d, "/write_grow_gibs"), 2),
            format!("{qd} in flight"),
        ],
        vec![
            "O_DIRECT write 2 MiB, overwriting".into(),
            num(f64_at(d, "/write_overwrite_gibs"), 2),
            format!("{qd} in flight"),
        ],
        vec![
            "O_DIRECT read 2 MiB".into(),
            num(f64_at(d, "/read_gibs"), 2),
            format!("{qd} in flight"),
        ],
        vec![
            "O_DIRECT read 2 MiB, one at a time".into(),
            num(f64_at(d, "/read_qd1_gibs"), 2),
            format!(
                "p50 {} ms per 2 MiB",
                num(f64_at(d, "/read_qd1_2m_ms_p50"), 2)
            ),
        ],
        vec![
            "O_DIRECT read + write 2 MiB at once".into(),
            format!(
                "{} + {}",
                num(f64_at(d, "/mixed_read_gibs"), 2),
                num(f64_at(d, "/mixed_write_gibs"), 2)
            ),
            "read + write, one stream each".into(),
        ],
        vec![
            "memcpy 2 MiB blocks".into(),
            num(f64_at(r, "/limits/memcpy_2m_gibs"), 2),
            String::new(),
        ],
    ];
    // codec -> content ("seqwrite": the payload's chunk, "guest-like").
    if let Some(codecs) = r.pointer("/limits/codecs").and_then(Value::as_object) {
        for (name, contents) in codecs {
            for (content, c) in contents.as_object().into_iter().flatten() {
                rows.push(vec![
                    format!("{name} compress / decompress, {content} chunk"),
                    format!(
                        "{} / {}",
                        num(f64_at(c, "/compress_gibs"), 2),
                        num(f64_at(c, "/decompress_gibs"), 2)
                    ),
                    format!("ratio {}, one core", num(f64_at(c, "/ratio"), 2)),
                ]);
            }
        }
    }
    let mut s = table(&["what", "GiB/s", "note"], &rows);
    s += &format!(
        "\nThrough `blockio` (the engine's own I/O path) on `{}`, best of {} rounds.\n",
        str_at(r, "/limits/store_dir").unwrap_or("?"),
        d.get("rounds_best_of")
            .map(|v| v.to_string())
            .unwrap_or_else(|| "?".into())
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn results() -> Value {
        json!({"mode": "quick", "wall_s": 12.0, "argv": ["hugevmm", "bench", "report", "--quick"],
               "source": {"commit": "0123456789abcdef", "commit_date": "2026-12-03T10:00:00+00:00"},
               "machine": {"cores": 2, "cpu": "cpu", "mem_gib": 24.0, "kernel": "6.18", "kvm": "kvm_amd", "thp": "madvise"}})
    }

    #[test]
    fn a_block_is_replaced_between_its_markers_only() {
        let doc = format!(
            "before\n{}\nold text\n{}\nafter\n",
            begin_marker("summary"),
            end_marker("summary")
        );
        let new = apply(&doc, &results(), &["summary"]).unwrap();
        assert!(new.starts_with("before\n<!-- results:summary begin -->\n`hugevmm bench report --quick` (quick mode) at commit `0123456789` (2026-12-03)"), "{new}");
        assert!(
            new.ends_with("<!-- results:summary end -->\nafter\n"),
            "{new}"
        );
        assert!(!new.contains("old text"));
        assert_eq!(
            apply(&new, &results(), &["summary"]).unwrap(),
            new,
            "rendering is stable"
        );
    }

    #[test]
    fn missing_or_doubled_markers_are_errors() {
        let err = apply("no markers", &results(), &["fio"]).unwrap_err();
        assert!(
            err.to_string().contains("<!-- results:fio begin -->"),
            "{err}"
        );
        let doubled = format!(
            "{b}\n{e}\n{b}\n{e}\n",
            b = begin_marker("fio"),
            e = end_marker("fio")
        );
        assert!(apply(&doubled, &results(), &["fio"]).is_err());
        let reversed = format!("{}\n{}\n", end_marker("fio"), begin_marker("fio"));
        assert!(apply(&reversed, &results(), &["fio"]).is_err());
    }

    #[test]
    fn a_missed_aim_says_missed_in_its_row() {
        let h = Headline::new(
            "k",
            "a figure",
            vec![0.7, 0.95, 0.8],
            Some(Aim::AtLeast(0.9)),
            "",
        );
        let t = figures_table(&[h]);
        let row = t.lines().find(|l| l.starts_with("| a figure")).unwrap();
        assert_eq!(
            row,
            "| a figure | **0.80** | 0.70-0.95 (3 rounds) | >= 0.9 | **missed** |"
        );
    }

    #[test]
    fn the_stored_headline_must_be_the_derived_one() {
        let mut r = results();
        r["fault_latency"] = json!({"sources": [{"source": "2m store, file (1 vCPU)", "p99_us": 3000.0, "floor_us": 1000.0}]});
        assert_eq!(
            headline_mismatches(&r),
            ["p99_over_floor"],
            "nothing stored"
        );
        let h = &figures::fault_latency(&r["fault_latency"])[0];
        r["headline"] = json!({"p99_over_floor": h.json()});
        assert!(headline_mismatches(&r).is_empty());
        r["headline"]["p99_over_floor"]["values"] = json!([3.0 * (1.0 + 1e-15)]);
        assert!(
            headline_mismatches(&r).is_empty(),
            "float noise is no mismatch"
        );
        r["headline"]["p99_over_floor"]["values"] = json!([3.0001]);
        assert_eq!(headline_mismatches(&r), ["p99_over_floor"]);
    }
}
