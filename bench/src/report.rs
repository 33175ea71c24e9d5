//! The results of an invocation: `results.json` (one object, a key per
//! suite plus the headline figures), `results.csv` (one measured value per
//! line, long format so every suite fits one header), `results.md` (the
//! tables as markdown, for docs/BENCHMARKS.md) and the tables on stdout.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A table printed at the end (and written as markdown).
#[derive(Debug, Clone)]
pub struct Table {
    /// Heading.
    pub title: String,
    /// Column names.
    pub headers: Vec<String>,
    /// Cells.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table.
    pub fn new(title: &str, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row (as many cells as headers).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds a note line.
    pub fn note(&mut self, text: &str) {
        self.notes.push(text.to_string());
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if i < w.len() {
                    w[i] = w[i].max(c.chars().count());
                }
            }
        }
        w
    }

    /// Plain text with aligned columns (numbers right-aligned).
    pub fn text(&self) -> String {
        let w = self.widths();
        let mut s = format!("\n{}\n", self.title);
        let line = |cells: &[String]| -> String {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                let width = w.get(i).copied().unwrap_or(0);
                let numeric = c
                    .chars()
                    .next()
                    .is_some_and(|ch| ch.is_ascii_digit() || ch == '-' || ch == '.')
                    && i > 0;
                if numeric {
                    let _ = write!(l, "{c:>width$}  ");
                } else {
                    let _ = write!(l, "{c:<width$}  ");
                }
            }
            l.trim_end().to_string() + "\n"
        };
        s += &line(&self.headers);
        s += &(w
            .iter()
            .map(|n| "-".repeat(*n))
            .collect::<Vec<_>>()
            .join("  ")
            + "\n");
        for r in &self.rows {
            s += &line(r);
        }
        for n in &self.notes {
            s += &format!("  {n}\n");
        }
        s
    }

    /// GitHub markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "### {}\n\n| {} |\n|{}|\n",
            self.title,
            self.headers.join(" | "),
            self.headers
                .iter()
                .map(|_| " --- ")
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                s += &format!("{n}\n");
            }
        }
        s.push('\n');
        s
    }
}

/// An aim a figure is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aim {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be at most this.
    AtMost(f64),
}

impl Aim {
    /// Whether `value` meets the aim.
    pub fn met_by(self, value: f64) -> bool {
        match self {
            Aim::AtLeast(bound) => value >= bound,
            Aim::AtMost(bound) => value <= bound,
        }
    }

    /// `>= 0.9`, `<= 2`.
    pub fn text(self) -> String {
        match self {
            Aim::AtLeast(b) => format!(">= {b}"),
            Aim::AtMost(b) => format!("<= {b}"),
        }
    }

    /// The inverse of [`Aim::text`].
    pub fn parse(text: &str) -> Option<Aim> {
        let (op, bound) = text.trim().split_once(' ')?;
        let bound: f64 = bound.trim().parse().ok()?;
        match op {
            ">=" => Some(Aim::AtLeast(bound)),
            "<=" => Some(Aim::AtMost(bound)),
            _ => None,
        }
    }
}

/// One headline figure: its value in each alternated round (or each run,
/// where nothing is paired), and the aim it is held to. The noise rule,
/// whichever way the aim points: the figure is the median of the values,
/// their min and max are its spread, and the aim is met only when the
/// median meets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Headline {
    /// Key in results.json.
    pub key: String,
    /// What it is.
    pub what: String,
    /// One value per round or run (finite values only).
    pub values: Vec<f64>,
    /// The aim, if the figure has one.
    pub aim: Option<Aim>,
    /// How it was computed.
    pub how: String,
}

impl Headline {
    /// A figure from its per-round values (non-finite ones are left out:
    /// a stopped run has no ratio).
    pub fn new(
        key: &str,
        what: impl Into<String>,
        values: Vec<f64>,
        aim: Option<Aim>,
        how: impl Into<String>,
    ) -> Headline {
        Headline {
            key: key.into(),
            what: what.into(),
            values: values.into_iter().filter(|v| v.is_finite()).collect(),
            aim,
            how: how.into(),
        }
    }

    /// The median of the values (NaN without any).
    pub fn median(&self) -> f64 {
        super::hist::median(&self.values).unwrap_or(f64::NAN)
    }

    /// The smallest value.
    pub fn min(&self) -> f64 {
        self.values.iter().copied().fold(f64::NAN, f64::min)
    }

    /// The largest value.
    pub fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NAN, f64::max)
    }

    /// Whether the median meets the aim; `None` without an aim or values.
    pub fn met(&self) -> Option<bool> {
        let aim = self.aim?;
        (!self.values.is_empty()).then(|| aim.met_by(self.median()))
    }

    /// `met`, `missed`, `not measured` (an aim, but no value: the run gave
    /// nothing to compare, which is no success), or empty.
    pub fn verdict(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "missed",
            None if self.aim.is_some() => "not measured",
            None => "",
        }
    }

    /// The entry of `results.json`'s `headline` object.
    pub fn json(&self) -> Value {
        json!({
            "what": self.what,
            "values": self.values,
            "value": self.median(),
            "min": self.min(),
            "median": self.median(),
            "max": self.max(),
            "aim": self.aim.map(Aim::text),
            "met": self.met(),
            "how": self.how,
        })
    }

    /// Reads back [`Headline::json`].
    pub fn from_json(key: &str, v: &Value) -> Option<Headline> {
        Some(Headline {
            key: key.into(),
            what: v.get("what")?.as_str()?.into(),
            values: v
                .get("values")?
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect(),
            aim: v.get("aim").and_then(Value::as_str).and_then(Aim::parse),
            how: v.get("how")?.as_str()?.into(),
        })
    }
}

/// Everything measured in one invocation.
#[derive(Debug, Default)]
pub struct Report {
    /// The command line that produced it (normalized: every option).
    pub command: String,
    /// The arguments exactly as given.
    pub argv: Vec<String>,
    /// `quick` or `full`.
    pub mode: String,
    /// Wall time of the whole invocation.
    pub wall_s: f64,
    /// Suite results by key.
    pub suites: Map<String, Value>,
    /// Tables in order.
    pub tables: Vec<Table>,
    /// Long-format CSV rows.
    pub rows: Vec<[String; 7]>,
    /// Plot file names (in the output directory).
    pub plots: Vec<String>,
    /// `SKIP ...` lines.
    pub skipped: Vec<String>,
    /// Suites that failed.
    pub failures: Vec<String>,
    /// Headline figures (filled by the suites).
    pub headline: Vec<Headline>,
    /// Top-level `ratio_2m_over_4k` (swap-w-seq).
    pub ratio_2m_over_4k: Option<f64>,
}

/// Formats with `digits` decimals.
pub fn fmt_f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One line about the machine: cores, memory, CPU, kernel, KVM flavour.
pub fn machine_summary() -> String {
    let m = machine_json();
    format!(
        "{} cores, {:.0} GiB RAM, {}, Linux {}, KVM {}",
        m["cores"],
        m["mem_gib"].as_f64().unwrap_or(0.0),
        m["cpu"].as_str().unwrap_or("?"),
        m["kernel"].as_str().unwrap_or("?"),
        m["kvm"].as_str().unwrap_or("?")
    )
}

/// The machine as JSON.
pub fn machine_json() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    // PVM is the nested, VMX-less KVM these numbers were first taken on; its
    // per-exit costs differ a lot from hardware KVM, so say which it is.
    let kvm = if Path::new("/sys/module/kvm_pvm").exists() {
        "PVM (kvm_pvm, nested without VMX)"
    } else if Path::new("/sys/module/kvm_intel").exists() {
        "kvm_intel"
    } else if Path::new("/sys/module/kvm_amd").exists() {
        "kvm_amd"
    } else {
        "none"
    };
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .unwrap_or_default()
        .trim()
        .to_string();
    // Other work on the machine moves every figure here; record how busy it
    // was (1, 5 and 15 minute load averages) when the results were written.
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let loadavg: Vec<f64> = loadavg
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    json!({"cores": cores, "mem_gib": mem_kib / 1048576.0, "cpu": cpu, "kernel": kernel, "kvm": kvm, "thp": thp, "loadavg_at_end": loadavg})
}

/// The commit of the checkout the bench runs in (the current directory),
/// and whether tracked files differ from it: the figures belong to that
/// source only if the binary was built from it.
pub fn source_json() -> Value {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(commit) => json!({
            "commit": commit,
            "commit_date": git(&["show", "-s", "--format=%cI", "HEAD"]),
            "tracked_files_modified": git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        }),
        None => json!({"commit": null, "note": "not run inside a git checkout"}),
    }
}

impl Report {
    /// Sets a suite's result object.
    pub fn set(&mut self, key: &str, value: Value) {
        self.suites.insert(key.to_string(), value);
    }

    /// Adds one CSV row: suite, case, variant, run number (0 for a summary),
    /// metric, value, unit.
    #[allow(clippy::too_many_arguments)]
    pub fn csv(
        &mut self,
        suite: &str,
        case: &str,
        variant: &str,
        run: usize,
        metric: &str,
        value: f64,
        unit: &str,
    ) {
        self.rows.push([
            suite.to_string(),
            case.to_string(),
            variant.to_string(),
            run.to_string(),
            metric.to_string(),
            format!("{value}"),
            unit.to_string(),
        ]);
    }

    /// Builds the headline table from what the suites filled in.
    pub fn finish_headline(&mut self) {
        if self.headline.is_empty() {
            return;
        }
        let mut t = Table::new(
            "headline figures (one invocation; median of the alternated rounds, min-max)",
            &["figure", "median", "min-max", "rounds", "aim", "met", "how"],
        );
        for h in &self.headline {
            let (median, spread) = if h.values.is_empty() {
                ("-".to_string(), "-".to_string())
            } else {
                (
                    fmt_f(h.median(), 2),
                    format!("{}-{}", fmt_f(h.min(), 2), fmt_f(h.max(), 2)),
                )
            };
            t.row(vec![
                h.what.clone(),
                median,
                spread,
                h.values.len().to_string(),
                h.aim.map(Aim::text).unwrap_or_default(),
                h.verdict().into(),
                h.how.clone(),
            ]);
        }
        self.tables.push(t);
    }

    /// Everything as `results.json` holds it.
    pub fn json(&self) -> Value {
        let mut v = json!({
            "command": self.command,
            "argv": self.argv,
            "source": source_json(),
            "mode": self.mode,
            "wall_s": self.wall_s,
            "machine": machine_json(),
            "ratio_2m_over_4k": self.ratio_2m_over_4k,
            "headline": self.headline.iter().map(|h| (h.key.clone(), h.json())).collect::<Map<String, Value>>(),
            "skipped": self.skipped,
            "failures": self.failures,
            "plots": self.plots,
        });
        for (k, s) in &self.suites {
            v[k] = s.clone();
        }
        v
    }

    /// Writes results.json, results.csv and results.md; returns their paths.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let json_path = dir.join("results.json");
        let text = serde_json::to_string_pretty(&self.json()).context("serializing results")?;
        std::fs::write(&json_path, text + "\n")
            .with_context(|| format!("cannot write {}", json_path.display()))?;

        let csv_path = dir.join("results.csv");
        let mut csv = String::from("suite,case,variant,run,metric,value,unit\n");
        for r in &self.rows {
            csv += &r.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(",");
            csv.push('\n');
        }
        std::fs::write(&csv_path, csv)
            .with_context(|| format!("cannot write {}", csv_path.display()))?;

        let md_path = dir.join("results.md");
        let mut md = format!(
            "# hugevmm bench results\n\n`{}` ({} mode, {:.0} s)\n\nMachine: {}\n\n",
            self.command,
            self.mode,
            self.wall_s,
            machine_summary()
        );
        for t in &self.tables {
            md += &t.markdown();
        }
        for s in &self.skipped {
            md += &format!("- {s}\n");
        }
        for f in &self.failures {
            md += &format!("- FAILED: {f}\n");
        }
        std::fs::write(&md_path, md)
            .with_context(|| format!("cannot write {}", md_path.display()))?;
        let mut written = vec![json_path, csv_path, md_path];
        written.extend(self.plots.iter().map(|p| dir.join(p)));
        Ok(written)
    }

    /// Prints every table to stdout.
    pub fn print_tables(&self) {
        for t in &self.tables {
            print!("{}", t.text());
        }
        for s in &self.skipped {
            println!("{s}");
        }
        for f in &self.failures {
            println!("FAILED: {f}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("t", &["name", "value"]);
        t.row(vec!["a".into(), "1.5".into()]);
        t.row(vec!["longer".into(), "12.25".into()]);
        let text = t.text();
        assert!(text.contains(&format!("a{}1.5", " ".repeat(9))), "{text}");
        assert!(t.markdown().contains("| longer | 12.25 |"));
    }
}
