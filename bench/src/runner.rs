//! One VM run as a `hugevmm run` subprocess, and its figures parsed back
//! from `--stats-json`, `--stats-timeline` and the payload's output lines.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::hist::Hist;
use super::{interrupt, Ctx};

pub use guestmem::CHUNK_BYTES;
/// 1 GiB, for rates.
pub const GIB: f64 = (1u64 << 30) as f64;
/// 1 MiB, for rates.
pub const MIB: f64 = (1u64 << 20) as f64;

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// File-name-safe label, unique within the invocation (raw stats go to
    /// `runs/<name>.json`).
    pub name: String,
    /// Built-in payload.
    pub payload: &'static str,
    /// `--payload-args`.
    pub payload_args: String,
    /// `--vcpus`.
    pub vcpus: u32,
    /// `--mem` (text, e.g. `2G`).
    pub mem: String,
    /// `--mem-limit`, if any.
    pub mem_limit: Option<String>,
    /// `--swap-store` (`default`, `mem:lz4`, ...).
    pub store: String,
    /// `--swap-unit` (`2m` or `4k`).
    pub unit: &'static str,
    /// `--pageout`.
    pub pageout: bool,
    /// `--swap-encrypt`.
    pub encrypt: bool,
    /// `--stats-timeline` sampling interval, if wanted.
    pub timeline_ms: Option<u64>,
    /// `--timeout`: a run that hangs ends as a failure instead of stalling
    /// the bench.
    pub timeout_s: f64,
    /// Reaching `timeout_s` is a result (`RunResult::timed_out`), not a
    /// failure: for workloads that may thrash (random writes over a working
    /// set larger than memory) the time bound is the point.
    pub allow_timeout: bool,
    /// Further `hugevmm run` options, as typed (e.g. working-set sampling).
    pub extra_args: Vec<String>,
}

impl RunSpec {
    /// The `hugevmm run` arguments.
    fn args(&self, stats: &Path, timeline: Option<&PathBuf>) -> Vec<String> {
        let mut a = vec![
            "run".to_string(),
            "--payload".into(),
            self.payload.into(),
            "--payload-args".into(),
            self.payload_args.clone(),
            "--vcpus".into(),
            self.vcpus.to_string(),
            "--mem".into(),
            self.mem.clone(),
            "--swap-store".into(),
            self.store.clone(),
            "--swap-unit".into(),
            self.unit.into(),
            "--stats-json".into(),
            stats.display().to_string(),
            "--timeout".into(),
            format!("{}", self.timeout_s),
        ];
        if let Some(limit) = &self.mem_limit {
            a.push("--mem-limit".into());
            a.push(limit.clone());
        }
        if self.pageout {
            a.push("--pageout".into());
        }
        if self.encrypt {
            a.push("--swap-encrypt".into());
        } else if self.store.starts_with("nbd") {
            // NBD stores are sealed by default: a run without encryption
            // says so.
            a.push("--swap-encrypt=false".into());
        }
        if let (Some(ms), Some(path)) = (self.timeline_ms, timeline) {
            a.push("--stats-timeline".into());
            a.push(path.display().to_string());
            a.push("--stats-interval".into());
            a.push(ms.to_string());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// The command line as a user would type it (for the docs and errors).
    pub fn command_line(&self) -> String {
        let mut s = format!(
            "hugevmm run --payload {} --payload-args \"{}\" --vcpus {} --mem {} --swap-store {} --swap-unit {}",
            self.payload, self.payload_args, self.vcpus, self.mem, self.store, self.unit
        );
        if let Some(limit) = &self.mem_limit {
            s += &format!(" --mem-limit {limit}");
        }
        if self.pageout {
            s += " --pageout";
        }
        if self.encrypt {
            s += " --swap-encrypt";
        } else if self.store.starts_with("nbd") {
            s += " --swap-encrypt=false";
        }
        for arg in &self.extra_args {
            s += " ";
            s += arg;
        }
        s
    }
}

/// One `<payload> vcpu=<i> bytes=<n> cycles=<c> passes=<p>` line, or one
/// of `phases`' per-phase lines (`phase=<p> set=<name> hot_bytes=<n>
/// touches=<t> cycles=<c>`).
#[derive(Debug, Clone, Default)]
pub struct PayloadLine {
    /// The vCPU that printed it.
    pub vcpu: u32,
    /// Bytes the vCPU wrote over all passes.
    pub bytes: u64,
    /// TSC cycles the vCPU's loop (or the phase) took.
    pub cycles: u64,
    /// `phases`: the phase this line ends (none on the closing line).
    pub phase: Option<u64>,
    /// `phases`: the name of the phase's hot set.
    pub set: String,
    /// `phases`: the bytes of the phase's hot set.
    pub hot_bytes: u64,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// What ran.
    pub spec: RunSpec,
    /// The `--stats-json` object.
    pub stats: Value,
    /// Per-vCPU payload lines.
    pub lines: Vec<PayloadLine>,
    /// `--stats-timeline` samples (empty if not asked for).
    pub timeline: Vec<Value>,
    /// The run hit its `--timeout` (only with `allow_timeout`): the stats
    /// cover the time until then, the payload printed nothing.
    pub timed_out: bool,
    /// User plus system CPU seconds of the `hugevmm run` process (all its
    /// threads, io_uring's workers among them), from `getrusage` of the
    /// bench's reaped children around the run.
    pub cpu_s: f64,
}

/// Runs `spec` to completion; an exit status other than 0 is an error
/// carrying the run's last stderr lines.
pub fn run(ctx: &Ctx, spec: &RunSpec) -> Result<RunResult> {
    interrupt::check()?;
    if let Some(why) = &ctx.kvm_unusable {
        bail!("{why}");
    }
    let stats_path = ctx.raw_path(&format!("{}.json", spec.name));
    let timeline_path = ctx.raw_path(&format!("{}.timeline.jsonl", spec.name));
    let timeline = spec.timeline_ms.map(|_| &timeline_path);
    let _ = std::fs::remove_file(&stats_path);
    if ctx.prime {
        let guest_bytes = guestmem::parse_size(&spec.mem)
            .with_context(|| format!("the run's --mem {} is not a size", spec.mem))?;
        crate::prime::prime(guest_bytes);
    }
    let children_cpu_before_s = children_cpu_s();
    let output = Command::new(&ctx.hugevmm)
        .args(spec.args(&stats_path, timeline))
        // The default store is an unlinked file in $TMPDIR: it lives on
        // --store-dir and disappears with the run whatever happens.
        .env("TMPDIR", &ctx.store_dir)
        .output()
        .with_context(|| format!("cannot start {}", ctx.hugevmm.display()))?;
    // `output` reaped the run, so the children's total grew by its CPU
    // time alone (the bench waits for one child at a time).
    let cpu_s = children_cpu_s() - children_cpu_before_s;
    interrupt::check()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let timed_out = spec.allow_timeout && output.status.code() == Some(124) && stats_path.exists();
    if !output.status.success() && !timed_out {
        let tail: Vec<&str> = stderr
            .lines()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!(
            "`{}` failed ({}):\n    {}",
            spec.command_line(),
            output.status,
            tail.join("\n    ")
        );
    }
    let text = std::fs::read_to_string(&stats_path).with_context(|| {
        format!(
            "run {} wrote no stats at {}",
            spec.name,
            stats_path.display()
        )
    })?;
    let stats: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "cannot parse the stats of run {} ({})",
            spec.name,
            stats_path.display()
        )
    })?;
    let lines = parse_payload_lines(spec.payload, &stdout);
    let timeline = match timeline {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("run {} wrote no timeline at {}", spec.name, path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()
            .with_context(|| format!("cannot parse the timeline of run {}", spec.name))?,
        None => Vec::new(),
    };
    Ok(RunResult {
        spec: spec.clone(),
        stats,
        lines,
        timeline,
        timed_out,
        cpu_s,
    })
}

/// User plus system CPU seconds of every child this process has reaped.
fn children_cpu_s() -> f64 {
    // SAFETY: rusage is plain data; zeroed is a valid value for it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_CHILDREN cannot
    // fail.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn parse_payload_lines(payload: &str, stdout: &str) -> Vec<PayloadLine> {
    let prefix = format!("{payload} vcpu=");
    stdout
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            let mut line = PayloadLine::default();
            for word in l.split_whitespace() {
                if let Some((k, text)) = word.split_once('=') {
                    let v = text.parse().unwrap_or(0);
                    match k {
                        "vcpu" => line.vcpu = u32::try_from(v).unwrap_or(u32::MAX),
                        "bytes" => line.bytes = v,
                        "cycles" => line.cycles = v,
                        "phase" => line.phase = Some(v),
                        "set" => line.set = text.to_string(),
                        "hot_bytes" => line.hot_bytes = v,
                        _ => {}
                    }
                }
            }
            line
        })
        .collect()
}

/// A number at a JSON pointer (0 when absent: older binaries or a run
/// without the engine).
pub fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer).and_then(Value::as_f64).unwrap_or(0.0)
}

impl RunResult {
    /// Wall time of the guest run, s.
    pub fn elapsed_s(&self) -> f64 {
        num(&self.stats, "/elapsed_s")
    }

    /// A swap figure, e.g. `faults/store`.
    pub fn swap(&self, path: &str) -> f64 {
        num(&self.stats, &format!("/swap/{path}"))
    }

    /// Bytes the vCPUs wrote (from the payload lines).
    pub fn guest_bytes(&self) -> u64 {
        self.lines.iter().map(|l| l.bytes).sum()
    }

    /// MiB/s of guest writes: the vCPUs' bytes over the run's wall time
    /// (the seed's aggregate throughput).
    pub fn throughput_mibs(&self) -> f64 {
        self.guest_bytes() as f64 / MIB / self.elapsed_s().max(1e-9)
    }

    /// Store bytes read + written.
    pub fn io_bytes(&self) -> f64 {
        self.swap("bytes_read") + self.swap("bytes_written")
    }

    /// GiB/s of store reads + writes over the run.
    pub fn io_gibs(&self) -> f64 {
        self.io_bytes() / GIB / self.elapsed_s().max(1e-9)
    }

    /// KVM 2 MiB stage-2 mappings per resident 2 MiB of guest memory at
    /// the end (the VMM's own pinned chunk, mapped 4 KiB, is excluded).
    pub fn pages_2m_coverage(&self) -> f64 {
        let chunks = (self.swap("resident_bytes") / CHUNK_BYTES as f64 - 1.0).max(1.0);
        (num(&self.stats, "/kvm/pages_2m") / chunks).min(1.0)
    }

    /// The per-source service-time histogram (`store`, `staging`, `zero`,
    /// `wp`).
    pub fn source_hist(&self, source: &str) -> Hist {
        Hist::from_json(&self.stats["swap"]["fault_latency_by_source_us"][source])
    }
}
