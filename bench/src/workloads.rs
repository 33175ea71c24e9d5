//! `workloads` (alias `kernel-swap`): the workload suite of issue 33
//! against the host kernel's own swap (docs/KERNEL_BASELINE.md). Each
//! workload (seqwrite, randwrite, mixed, verify, key-value, phases) runs
//! five ways (six where the kernel needs more room), alternated in rounds:
//!
//! - `hugevmm auto`, `hugevmm 2m`, `hugevmm 4k`: `hugevmm run ...
//!   --mem-limit L --swap-store default --swap-unit U` (the swap engine,
//!   an unlinked O_DIRECT file store on `--store-dir`);
//! - `kernel, thp` and `kernel, 4k`: the same command without the engine
//!   (no `--mem-limit`, no `--swap-store`), `--backing thp` or `--backing
//!   4k`, inside a memory cgroup limited to the auto run's peak
//!   footprint, with a swap file on `--store-dir` enabled at the highest
//!   priority. A kernel run OOM-killed there twice runs again with more
//!   room, up a ladder (1.25, 1.5, 2x the footprint, [`KERNEL_HEADROOM`],
//!   [`KERNEL_TRIES_PER_STEP`] tries a step); the
//!   tables say at which limit each kernel variant finished;
//! - `hugevmm auto, kernel's limit`: in a round where a kernel run
//!   needed more room than auto's footprint, auto once more with its
//!   `--mem-limit` raised by that room, so that the aim is judged at the
//!   same footprint, as issue 33 states it.
//!
//! The footprint is matched with the counter the limit is enforced on: the
//! engine runs also run in a cgroup of their own (no limit), and the auto
//! run's peak charge (`memory.max_usage_in_bytes` on v1, `memory.peak` on
//! v2) is what the kernel runs get: the guest's resident memory, the VMM's
//! own buffers, page tables and any page cache all count, as they do for
//! the kernel runs. The process's own peak RSS (`ru_maxrss` from `wait4`,
//! the kernel's high-water mark of the process, taken at exit so that no
//! sampling can miss a peak) is reported beside it, and is the limit only
//! where the cgroup has no peak file.
//!
//! Swap-ins and swap-outs are `pswpin`/`pswpout` of the run's cgroup's
//! `memory.stat` where the kernel keeps them there, else the deltas of the
//! global `/proc/vmstat` over the run (the host should be quiet). An
//! OOM kill (the cgroup's `oom_kill` count) is a result, never a time.
//!
//! Per workload the suite reports, per round and as medians: the kernel's
//! better backing over auto, the better fixed unit (2m or 4k) over auto,
//! and auto's flips per split, each against issue 33's aim.
//!
//! The swap file and every cgroup are guards: dropped on return, on error
//! and on Ctrl-C (`interrupt`), which `swapoff`s and removes the file and
//! removes the cgroup directories.
//!
//! [`PLAN_VAR`]`=tiny` picks a one-round seqwrite of a few MiB instead of
//! the mode's plan, for the test that checks the suite end to end. It
//! writes twice: the second pass faults evicted chunks back from the
//! store, so every engine run uses its store (one pass reads back only
//! what a race happens to evict early, sometimes nothing).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::hist::median;
use super::host_pageout::{zswap_enabled, SwapFile};
use super::report::{fmt_f, Table};
use super::runner::{num, CHUNK_BYTES, MIB};
use super::{interrupt, Ctx, Mode};

/// The environment variable that replaces the mode's plan (`tiny`).
pub const PLAN_VAR: &str = "HUGEVMM_BENCH_WORKLOADS_PLAN";

/// The kernel runs' limits, as multiples of auto's footprint, each tried
/// when the run at the one before was OOM-killed. On cgroup v1 (this
/// host) reclaim gives up at auto's footprint on most workloads: the
/// swap-in of a guest page charges the cgroup while little has been
/// swapped out (docs/KERNEL_BASELINE.md). The smallest limit at which the
/// kernel finishes is a figure in itself; auto then runs again with the
/// same room ([`Variant::AutoMatched`]), which is the ratio at equal
/// memory, and the ratio against auto at its own footprint stays beside
/// it.
const KERNEL_HEADROOM: [f64; 4] = [1.0, 1.25, 1.5, 2.0];

/// Kernel runs at one step of the ladder before an OOM kill climbs it.
/// Why more than one: on this host (cgroup v1) the OOM kill is not a
/// property of the limit alone. The key-value guest, 4 KiB backing, was
/// OOM-killed at 260 MiB after 2.0 s and finished at 240 MiB in 4.6 s,
/// one right after the other (2026-12-07); the OOM report named the
/// swap-in's charge, with 222 MB of active anon and none inactive. A
/// limit the kernel copes with on some tries is one a user could pick;
/// an OOM kill costs a couple of seconds.
const KERNEL_TRIES_PER_STEP: usize = 2;

/// The prefix of every cgroup directory the suite creates.
pub const CGROUP_PREFIX: &str = "hugevmm-bench-";

/// One guest workload: the plan's own (`'static`), or one read back from a
/// results file to render its tables.
struct Workload<'a> {
    /// Table label.
    name: &'a str,
    payload: &'a str,
    args: &'a str,
    mem: &'a str,
    /// The engine run's `--mem-limit`.
    mem_limit: &'a str,
    /// `--timeout`: a thrashing run ends as a time bound, not a hang.
    timeout_s: u32,
    /// Aim for the kernel's better time over auto's.
    kernel_aim: f64,
    /// Aim for the better fixed unit's time over auto's.
    fixed_aim: f64,
}

/// Aim for auto's flips per split, on every workload.
const FLIPS_PER_SPLIT_AIM: f64 = 0.01;

impl<'a> Workload<'a> {
    /// A workload with the suite's default aims (beat the kernel, stay
    /// within 0.9 of the better fixed unit); sizes and time bound follow.
    const fn new(name: &'a str, payload: &'a str, args: &'a str) -> Workload<'a> {
        Workload {
            name,
            payload,
            args,
            mem: "",
            mem_limit: "",
            timeout_s: 0,
            kernel_aim: 1.0,
            fixed_aim: 0.9,
        }
    }

    /// Guest RAM and the engine runs' `--mem-limit`.
    const fn sized(self, mem: &'a str, mem_limit: &'a str) -> Workload<'a> {
        Workload {
            mem,
            mem_limit,
            ..self
        }
    }

    const fn timeout(self, timeout_s: u32) -> Workload<'a> {
        Workload { timeout_s, ..self }
    }

    const fn aims(self, kernel_aim: f64, fixed_aim: f64) -> Workload<'a> {
        Workload {
            kernel_aim,
            fixed_aim,
            ..self
        }
    }

    /// The workload of one entry of a results file's `workloads` list.
    fn from_json(v: &'a Value) -> Result<Workload<'a>> {
        let text = |key: &str| {
            v[key]
                .as_str()
                .with_context(|| format!("a workload without {key:?}: {v}"))
        };
        let aim = |key: &str| {
            v["aims"][key]
                .as_f64()
                .with_context(|| format!("a workload without aims.{key}: {v}"))
        };
        Ok(Workload {
            name: text("workload")?,
            payload: text("payload")?,
            args: text("payload_args")?,
            mem: text("mem")?,
            mem_limit: text("engine_mem_limit")?,
            timeout_s: v["timeout_s"]
                .as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .with_context(|| format!("a workload without timeout_s: {v}"))?,
            kernel_aim: aim("kernel_over_auto")?,
            fixed_aim: aim("fixed_over_auto")?,
        })
    }
}

struct Plan {
    vcpus: u32,
    rounds: usize,
    workloads: Vec<Workload<'static>>,
}

fn plan(mode: Mode) -> Plan {
    if std::env::var(PLAN_VAR).is_ok_and(|v| v == "tiny") {
        return Plan {
            vcpus: 2,
            rounds: 1,
            workloads: vec![
                Workload::new("seqwrite (tiny)", "seqwrite", "bytes=64M passes=2")
                    .sized("96M", "32M")
                    .timeout(30),
            ],
        };
    }
    // Aims from issue 33: the kernel / auto and best fixed / auto ratios
    // it names (seqwrite >= 10, mixed >= 5 and >= 5, key-value and phases
    // >= 1.0 and >= 0.9); where it names none, beating the kernel and
    // staying within 0.9 of the better fixed unit.
    match mode {
        Mode::Quick => Plan {
            vcpus: 2,
            rounds: 2,
            workloads: vec![
                Workload::new("seqwrite", "seqwrite", "bytes=512M passes=2")
                    .sized("768M", "192M")
                    .timeout(60)
                    .aims(10.0, 0.9),
                Workload::new("randwrite", "randwrite", "bytes=96M passes=1")
                    .sized("128M", "80M")
                    .timeout(30),
                Workload::new("mixed", "mixed", "hot=128 stream=256M passes=2")
                    .sized("768M", "128M")
                    .timeout(60)
                    .aims(5.0, 5.0),
                Workload::new("verify", "verify", "bytes=256M passes=2")
                    .sized("384M", "128M")
                    .timeout(60),
                Workload::new("key-value", "kv", "heap=256M ops=300000")
                    .sized("512M", "96M")
                    .timeout(120),
                Workload::new("phases", "phases", "heap=256M")
                    .sized("512M", "96M")
                    .timeout(90),
            ],
        },
        Mode::Full => Plan {
            vcpus: 2,
            rounds: 3,
            workloads: vec![
                Workload::new("seqwrite", "seqwrite", "bytes=768M passes=3")
                    .sized("1G", "256M")
                    .timeout(600)
                    .aims(10.0, 0.9),
                Workload::new("randwrite", "randwrite", "bytes=384M passes=1")
                    .sized("512M", "320M")
                    .timeout(300),
                Workload::new("mixed", "mixed", "hot=128 stream=512M passes=2")
                    .sized("1G", "192M")
                    .timeout(300)
                    .aims(5.0, 5.0),
                Workload::new("verify", "verify", "bytes=768M passes=2")
                    .sized("1G", "256M")
                    .timeout(300),
                Workload::new("key-value", "kv", "heap=512M ops=1000000")
                    .sized("1G", "160M")
                    .timeout(400),
                Workload::new("phases", "phases", "heap=512M")
                    .sized("1G", "160M")
                    .timeout(300),
            ],
        },
    }
}

/// How a workload is run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Auto,
    TwoM,
    FourK,
    KernelThp,
    Kernel4k,
    /// Auto given the memory the kernel needed: run in a round where a
    /// kernel run was OOM-killed at auto's footprint and finished higher
    /// up the ladder, with `--mem-limit` raised by the difference, so
    /// the two are compared at the same footprint (issue 33's aims are
    /// "same footprint"), not auto at 1x against the kernel at 1.5x.
    AutoMatched,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Auto,
        Variant::TwoM,
        Variant::FourK,
        Variant::KernelThp,
        Variant::Kernel4k,
        Variant::AutoMatched,
    ];
    const FIXED: [Variant; 2] = [Variant::TwoM, Variant::FourK];
    const KERNEL: [Variant; 2] = [Variant::KernelThp, Variant::Kernel4k];

    fn name(self) -> &'static str {
        match self {
            Variant::Auto => "hugevmm auto",
            Variant::TwoM => "hugevmm 2m",
            Variant::FourK => "hugevmm 4k",
            Variant::KernelThp => "kernel, thp",
            Variant::Kernel4k => "kernel, 4k",
            Variant::AutoMatched => "hugevmm auto, kernel's limit",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::Auto => "auto",
            Variant::TwoM => "2m",
            Variant::FourK => "4k",
            Variant::KernelThp => "kernel-thp",
            Variant::Kernel4k => "kernel-4k",
            Variant::AutoMatched => "auto-matched",
        }
    }

    /// The engine's `--swap-unit`, for the engine variants.
    fn unit(self) -> Option<&'static str> {
        match self {
            Variant::Auto | Variant::AutoMatched => Some("auto"),
            Variant::TwoM => Some("2m"),
            Variant::FourK => Some("4k"),
            Variant::KernelThp | Variant::Kernel4k => None,
        }
    }

    fn is_engine(self) -> bool {
        self.unit().is_some()
    }

    fn backing(self) -> &'static str {
        match self {
            Variant::Kernel4k => "4k",
            _ => "thp",
        }
    }

    /// `hugevmm run`'s arguments; `engine_limit` is the engine variants'
    /// `--mem-limit`.
    fn args(self, w: &Workload<'_>, vcpus: u32, engine_limit: &str) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "run".into(),
            "--payload".into(),
            w.payload.into(),
            "--payload-args".into(),
            w.args.into(),
            "--vcpus".into(),
            vcpus.to_string(),
            "--mem".into(),
            w.mem.into(),
            "--backing".into(),
            self.backing().into(),
            "--timeout".into(),
            w.timeout_s.to_string(),
            "--quiet".into(),
        ];
        if let Some(unit) = self.unit() {
            a.extend([
                "--mem-limit".into(),
                engine_limit.into(),
                "--swap-store".into(),
                "default".into(),
                "--swap-unit".into(),
                unit.into(),
            ]);
        }
        a
    }
}

/// The memory controller's hierarchy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hierarchy {
    V1,
    V2,
}

#[derive(Clone, Debug)]
struct Controller {
    hierarchy: Hierarchy,
    root: PathBuf,
}

/// Where the memory controller is: v2 when the unified hierarchy has it,
/// else the v1 `memory` hierarchy; `Err` says why neither works.
fn find_controller() -> std::result::Result<Controller, String> {
    let v2 = Path::new("/sys/fs/cgroup");
    if let Ok(list) = std::fs::read_to_string(v2.join("cgroup.controllers")) {
        if list.split_whitespace().any(|c| c == "memory") {
            let subtree =
                std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
            if subtree.split_whitespace().any(|c| c == "memory") {
                return Ok(Controller {
                    hierarchy: Hierarchy::V2,
                    root: v2.to_path_buf(),
                });
            }
            return Err(
                "cgroup v2 has the memory controller but /sys/fs/cgroup/cgroup.subtree_control does not enable it for children (echo +memory > it)"
                    .into(),
            );
        }
    }
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Ok(Controller {
            hierarchy: Hierarchy::V1,
            root: v1.to_path_buf(),
        });
    }
    Err("no memory cgroup controller (neither cgroup v2 with `memory` in /sys/fs/cgroup/cgroup.controllers nor a v1 /sys/fs/cgroup/memory)".into())
}

/// A cgroup of the suite's own, removed on drop.
struct Cgroup {
    dir: PathBuf,
    hierarchy: Hierarchy,
    procs: CString,
    /// The limit it was created with (none: unlimited).
    limit_bytes: Option<u64>,
}

static CGROUP_SEQ: AtomicUsize = AtomicUsize::new(0);

impl Cgroup {
    /// A fresh child of the controller's root, limited to `limit_bytes`
    /// (none: unlimited), with unlimited swap.
    fn create(c: &Controller, limit_bytes: Option<u64>) -> Result<Cgroup> {
        let name = format!(
            "{CGROUP_PREFIX}{}-{}",
            std::process::id(),
            CGROUP_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = c.root.join(name);
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create the cgroup {}", dir.display()))?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .context("cgroup path with a NUL")?;
        let cg = Cgroup {
            dir,
            hierarchy: c.hierarchy,
            procs,
            limit_bytes,
        };
        if let Some(limit) = limit_bytes {
            let file = match cg.hierarchy {
                Hierarchy::V1 => "memory.limit_in_bytes",
                Hierarchy::V2 => "memory.max",
            };
            cg.write(file, &limit.to_string())?;
        }
        if cg.hierarchy == Hierarchy::V2 && cg.dir.join("memory.swap.max").exists() {
            cg.write("memory.swap.max", "max")?;
        }
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("cannot write {value} to {}", path.display()))
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// The peak charge since creation, bytes.
    fn peak_bytes(&self) -> Option<u64> {
        let file = match self.hierarchy {
            Hierarchy::V1 => "memory.max_usage_in_bytes",
            Hierarchy::V2 => "memory.peak",
        };
        self.read(file)?.trim().parse().ok()
    }

    /// OOM kills inside the cgroup.
    fn oom_kills(&self) -> u64 {
        let file = match self.hierarchy {
            Hierarchy::V1 => "memory.oom_control",
            Hierarchy::V2 => "memory.events",
        };
        self.read(file)
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// `memory.stat` key, where the kernel keeps it per cgroup.
    fn stat(&self, key: &str) -> Option<u64> {
        keyed(&self.read("memory.stat")?, key)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The last task has been reaped, but the kernel may still be
        // taking it out of the cgroup for a moment: EBUSY, then success.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!(
            "hugevmm bench: WARNING: cannot remove the cgroup {}; remove it by hand (rmdir {0})",
            self.dir.display()
        );
    }
}

/// The number after `key ` in a `key value` per line file.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| keyed(&t, key))
        .unwrap_or(0)
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is
/// `procs` (`0` names the writer). Runs between fork and exec, so only
/// async-signal-safe calls.
fn join_cgroup(procs: &CStr) -> std::io::Result<()> {
    // SAFETY: `procs` is a NUL-terminated path that outlives the calls;
    // open, write and close are async-signal-safe and get valid
    // arguments (a one-byte static buffer).
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(err);
        }
    }
    Ok(())
}

/// A variant is its key in results files.
impl Serialize for Variant {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

impl<'de> Deserialize<'de> for Variant {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Variant, D::Error> {
        let key = String::deserialize(deserializer)?;
        Variant::ALL
            .into_iter()
            .find(|v| v.key() == key)
            .ok_or_else(|| serde::de::Error::custom(format!("a run of an unknown variant {key:?}")))
    }
}

/// How a run ended; in results files `end` (its key) and `failure` (the
/// message of a failed run, else null).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "EndFields", into = "EndFields")]
enum End {
    Ok,
    Oom,
    Timeout,
    Failed(String),
}

/// [`End`] as its two keys.
#[derive(Clone, Serialize, Deserialize)]
struct EndFields {
    end: String,
    #[serde(default)]
    failure: Option<String>,
}

impl From<End> for EndFields {
    fn from(end: End) -> EndFields {
        EndFields {
            end: end.key().to_string(),
            failure: match end {
                End::Failed(message) => Some(message),
                _ => None,
            },
        }
    }
}

impl TryFrom<EndFields> for End {
    type Error = String;

    fn try_from(fields: EndFields) -> Result<End, String> {
        Ok(match fields.end.as_str() {
            "ok" => End::Ok,
            "oom-killed" => End::Oom,
            "timeout" => End::Timeout,
            "failed" => End::Failed(fields.failure.unwrap_or_default()),
            other => return Err(format!("a run that ended as {other:?}")),
        })
    }
}

impl End {
    fn key(&self) -> &'static str {
        match self {
            End::Ok => "ok",
            End::Oom => "oom-killed",
            End::Timeout => "timeout",
            End::Failed(_) => "failed",
        }
    }
}

/// One run's figures: an entry of a results file's `runs` list as serde
/// writes and reads it (the field names are the keys).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Outcome {
    variant: Variant,
    /// 0-based here, 1-based in the file (as the tables count rounds).
    #[serde(with = "one_based")]
    round: usize,
    /// `end` and `failure` in the file.
    #[serde(flatten)]
    end: End,
    /// Spawn to exit, s.
    wall_s: f64,
    /// The run's own `elapsed_s` (guest run), when it wrote stats.
    elapsed_s: Option<f64>,
    rss_peak_bytes: u64,
    cgroup_peak_bytes: Option<u64>,
    /// The cgroup's limit (kernel variants).
    limit_bytes: Option<u64>,
    /// The kernel run's limit over auto's footprint (1 unless the runs at
    /// smaller limits were OOM-killed: [`KERNEL_HEADROOM`]); for
    /// [`Variant::AutoMatched`], that of the kernel run it matches. A file from
    /// before the ladder of limits has none: its kernel runs all had
    /// auto's footprint.
    #[serde(default = "one")]
    headroom: f64,
    /// Whole units restored from the store.
    #[serde(default)]
    store_faults: f64,
    /// Pages of split chunks restored from the store (auto).
    #[serde(default)]
    page_store_faults: f64,
    #[serde(default)]
    evictions: f64,
    /// Pages of split chunks evicted one by one (auto).
    #[serde(default)]
    page_evictions: f64,
    #[serde(default)]
    splits: f64,
    #[serde(default)]
    collapses: f64,
    #[serde(default)]
    flips: f64,
    /// Splits and flips in the second half of the run (engine runs, from
    /// its `--stats-timeline`): the steady state of issue 33's flips aim,
    /// past the first splits every chunk pays. None without a timeline.
    late_splits: Option<f64>,
    late_flips: Option<f64>,
    #[serde(default)]
    swap_ins: u64,
    #[serde(default)]
    swap_outs: u64,
    #[serde(default)]
    command: String,
}

fn one() -> f64 {
    1.0
}

/// A round, 1-based in results files.
mod one_based {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(round: &usize, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(*round as u64 + 1)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
        let round = u64::deserialize(deserializer)?;
        let round = round
            .checked_sub(1)
            .ok_or_else(|| serde::de::Error::custom("a round is counted from 1"))?;
        usize::try_from(round).map_err(serde::de::Error::custom)
    }
}

impl Outcome {
    /// What the kernel runs are limited to: the charged peak, else RSS.
    fn footprint_bytes(&self) -> u64 {
        self.cgroup_peak_bytes.unwrap_or(self.rss_peak_bytes)
    }

    fn json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|e| {
            // Numbers, strings and options: serde_json cannot refuse them.
            unreachable!("a run's figures do not serialize: {e}")
        })
    }

    /// The run [`Outcome::json`] wrote.
    fn from_json(v: &Value) -> Result<Outcome> {
        Outcome::deserialize(v).with_context(|| format!("a run that does not read: {v}"))
    }
}

fn command_text(args: &[String], limit_bytes: Option<u64>) -> String {
    let words: Vec<String> = args
        .iter()
        .map(|a| {
            if a.contains(' ') {
                format!("\"{a}\"")
            } else {
                a.clone()
            }
        })
        .collect();
    let cmd = format!("hugevmm {}", words.join(" "));
    match limit_bytes {
        Some(l) => format!("{cmd}  (in a memory cgroup limited to {l} bytes, host swap on)"),
        None => cmd,
    }
}

/// Runs one `hugevmm run` inside `cg` (the engine variants with
/// `--mem-limit engine_limit`), waiting with `wait4` for its rusage.
fn run_once(
    ctx: &Ctx,
    w: &Workload<'_>,
    vcpus: u32,
    variant: Variant,
    round: usize,
    cg: &Cgroup,
    engine_limit: &str,
) -> Result<Outcome> {
    interrupt::check()?;
    let limit_bytes = cg.limit_bytes;
    let base = format!(
        "workloads-{}-{}-{}",
        w.name.replace(|c: char| !c.is_ascii_alphanumeric(), ""),
        variant.key(),
        round + 1
    );
    let stats_path = ctx.raw_path(&format!("{base}.json"));
    let _ = std::fs::remove_file(&stats_path);
    let timeline_path = ctx.raw_path(&format!("{base}.timeline.jsonl"));
    let _ = std::fs::remove_file(&timeline_path);
    let stdout = std::fs::File::create(ctx.raw_path(&format!("{base}.stdout")))?;
    let stderr_path = ctx.raw_path(&format!("{base}.stderr"));
    let stderr = std::fs::File::create(&stderr_path)?;
    let args = variant.args(w, vcpus, engine_limit);
    if ctx.prime {
        let guest_bytes = guestmem::parse_size(w.mem)
            .with_context(|| format!("--mem {} is not a size", w.mem))?;
        crate::prime::prime(guest_bytes);
    }
    let mut cmd = Command::new(&ctx.hugevmm);
    cmd.args(&args).arg("--stats-json").arg(&stats_path);
    if variant.is_engine() {
        cmd.arg("--stats-timeline")
            .arg(&timeline_path)
            .args(["--stats-interval", &TIMELINE_INTERVAL_MS.to_string()]);
    }
    cmd.env("TMPDIR", &ctx.store_dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    let procs = cg.procs.clone();
    // SAFETY: the closure runs in the forked child before exec and only
    // calls `join_cgroup`, which makes async-signal-safe calls on memory
    // the closure owns (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || join_cgroup(&procs));
    }
    let (ins0, outs0) = (vmstat("pswpin"), vmstat("pswpout"));
    let started = Instant::now();
    let child = cmd.spawn().with_context(|| {
        format!(
            "cannot start {} in {}",
            ctx.hugevmm.display(),
            cg.dir.display()
        )
    })?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value for it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our child, not reaped yet (std's `Child` only
        // reaps in wait/try_wait, which are not called); the pointers are
        // to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            bail!("wait4 on {pid}: {e}");
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    drop(child);
    let (ins1, outs1) = (vmstat("pswpin"), vmstat("pswpout"));
    let stats: Option<Value> = std::fs::read_to_string(&stats_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let oom = cg.oom_kills() > 0;
    let end = if oom {
        End::Oom
    } else if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        End::Ok
    } else if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 124 {
        End::Timeout
    } else {
        let how = if libc::WIFSIGNALED(status) {
            format!("killed by signal {}", libc::WTERMSIG(status))
        } else {
            format!("exit status {}", libc::WEXITSTATUS(status))
        };
        let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(4).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        End::Failed(format!("{how}: {}", tail.join(" / ")))
    };
    let swap_ins = cg.stat("pswpin").unwrap_or(ins1.saturating_sub(ins0));
    let swap_outs = cg.stat("pswpout").unwrap_or(outs1.saturating_sub(outs0));
    let stat = |p: &str| stats.as_ref().map(|s| num(s, p)).unwrap_or(0.0);
    let (splits, flips) = (stat("/swap/split/splits"), stat("/swap/split/flips"));
    let late = if variant.is_engine() && matches!(end, End::Ok | End::Timeout) {
        std::fs::read_to_string(&timeline_path)
            .ok()
            .and_then(|text| second_half(&text, splits, flips))
    } else {
        None
    };
    Ok(Outcome {
        variant,
        round,
        end,
        wall_s,
        elapsed_s: stats
            .as_ref()
            .and_then(|s| s.pointer("/elapsed_s"))
            .and_then(Value::as_f64),
        rss_peak_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
        cgroup_peak_bytes: cg.peak_bytes(),
        limit_bytes,
        headroom: 1.0,
        store_faults: stat("/swap/faults/store"),
        page_store_faults: stat("/swap/split/page_faults/store"),
        evictions: stat("/swap/evictions"),
        page_evictions: stat("/swap/split/page_evictions"),
        splits,
        collapses: stat("/swap/split/collapses_verified"),
        flips,
        late_splits: late.map(|(s, _)| s),
        late_flips: late.map(|(_, f)| f),
        swap_ins,
        swap_outs,
        command: command_text(&args, limit_bytes),
    })
}

/// How often an engine run samples its figures (`--stats-interval`): the
/// second half of even a one-second run has a few samples.
const TIMELINE_INTERVAL_MS: u32 = 100;

/// Splits and flips in the second half of a run, from its timeline (one
/// JSON object per line, `t_s` and `swap.split.{splits,flips}`) and its
/// final figures: the final ones less those of the last sample at or
/// before half the last sample's time. None when the timeline has no
/// sample in the first half (a run too short to have a steady state).
fn second_half(timeline: &str, splits: f64, flips: f64) -> Option<(f64, f64)> {
    let samples: Vec<Value> = timeline
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let end_s = samples.last()?.get("t_s")?.as_f64()?;
    let half = samples.iter().rev().find(|v| {
        v.get("t_s")
            .and_then(Value::as_f64)
            .is_some_and(|t| t <= end_s / 2.0)
    })?;
    let at_half = |key: &str| half.pointer(&format!("/swap/split/{key}"))?.as_f64();
    Some((
        (splits - at_half("splits")?).max(0.0),
        (flips - at_half("flips")?).max(0.0),
    ))
}

fn mib(bytes: u64) -> String {
    fmt_f(bytes as f64 / MIB, 0)
}

/// Why the suite cannot run here, if it cannot.
fn missing(ctx: &Ctx) -> Option<String> {
    if !ctx.is_root {
        return Some("needs root (cgroups, mkswap and swapon)".into());
    }
    for tool in ["mkswap", "swapon", "swapoff"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            return Some(format!("{tool} (util-linux) is not on PATH"));
        }
    }
    None
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    if ctx.kvm_unusable.is_some() {
        // Said once at the start (SKIP VM runs).
        return Ok(());
    }
    if let Some(why) = missing(ctx) {
        ctx.skip("workloads", &why);
        return Ok(());
    }
    let controller = match find_controller() {
        Ok(c) => c,
        Err(why) => {
            ctx.skip("workloads", &why);
            return Ok(());
        }
    };
    let p = plan(ctx.mode);
    let largest_mem = p
        .workloads
        .iter()
        .map(|w| guestmem::parse_size(w.mem).unwrap_or(1 << 30))
        .max()
        .unwrap_or(1 << 30);
    // Auto at the kernel's footprint adds its step only where it runs.
    // Room for all of guest RAM and the VMM's own memory besides.
    let swap_bytes = largest_mem + (256 << 20);
    ctx.progress
        .plan(1 + p.rounds * p.workloads.len() * (Variant::ALL.len() - 1));
    ctx.progress.start(&format!(
        "swap file of {} MiB on {} (mkswap, swapon -p 32767)",
        swap_bytes >> 20,
        ctx.store_dir.display()
    ));
    let swap = match SwapFile::create(&ctx.store_dir, swap_bytes) {
        Ok(s) => {
            ctx.progress.done("on");
            s
        }
        Err(e) => {
            ctx.progress.failed(&format!("{e:#}"));
            ctx.skip("workloads", &format!("no host swap file: {e:#}"));
            return Ok(());
        }
    };
    let zswap = zswap_enabled();
    let mut workloads_json = Vec::new();
    for w in &p.workloads {
        if payloads::find(w.payload).is_none() {
            ctx.skip(
                &format!("workloads {}", w.name),
                &format!("this build has no `{}` payload", w.payload),
            );
            continue;
        }
        let outcomes = run_workload(ctx, &controller, &p, w)?;
        let limit_bytes = outcomes.iter().filter_map(|o| o.limit_bytes).max();
        for o in &outcomes {
            if o.end == End::Ok {
                ctx.report.csv(
                    "workloads",
                    w.name,
                    o.variant.key(),
                    o.round + 1,
                    "wall_s",
                    o.wall_s,
                    "s",
                );
            }
        }
        workloads_json.push(json!({
            "workload": w.name,
            "payload": w.payload,
            "payload_args": w.args,
            "vcpus": p.vcpus,
            "mem": w.mem,
            "engine_mem_limit": w.mem_limit,
            "kernel_limit_bytes": limit_bytes,
            "timeout_s": w.timeout_s,
            "aims": {"kernel_over_auto": w.kernel_aim, "fixed_over_auto": w.fixed_aim, "flips_per_split": FLIPS_PER_SPLIT_AIM},
            "ratios": ratios_json(&outcomes, w.timeout_s),
            "runs": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
        }));
    }
    let suite = json!({
        "cgroup": match controller.hierarchy { Hierarchy::V1 => "v1", Hierarchy::V2 => "v2" },
        "swap_file": swap.path().display().to_string(),
        "swap_file_bytes": swap_bytes,
        "zswap": zswap,
        "rounds": p.rounds,
        "footprint": "auto run's cgroup peak charge (memory.max_usage_in_bytes / memory.peak); ru_maxrss from wait4 beside it",
        "workloads": workloads_json,
    });
    // Read back, as `report --render` reads the committed file: what this
    // run prints is what the docs publish from its results file.
    ctx.report.tables.extend(tables_from_json(&suite)?);
    ctx.report.set("workloads", suite);
    drop(swap);
    Ok(())
}

/// The suite's tables, one per workload and the aims table, from the
/// `workloads` object of a results file (`results.json`'s `workloads`
/// key): what a run prints and what docs/KERNEL_BASELINE.md publishes
/// (`hugevmm bench report --render docs/results/workloads-quick.json`).
pub fn tables_from_json(suite: &Value) -> Result<Vec<Table>> {
    let rounds = suite["rounds"]
        .as_u64()
        .context("the workloads object has no rounds")? as usize;
    let zswap = suite["zswap"].as_bool().unwrap_or(false);
    let list = suite["workloads"]
        .as_array()
        .context("the workloads object has no workloads list")?;
    let mut tables = Vec::new();
    let mut aims = None;
    for entry in list {
        let w = Workload::from_json(entry)?;
        let vcpus = entry["vcpus"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("workload {} has no vcpus", w.name))?;
        let outcomes = entry["runs"]
            .as_array()
            .with_context(|| format!("workload {} has no runs", w.name))?
            .iter()
            .map(Outcome::from_json)
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("in workload {}", w.name))?;
        tables.push(table(vcpus, rounds, &w, &outcomes, zswap));
        aims_row(
            aims.get_or_insert_with(|| aims_table(vcpus, rounds)),
            &w,
            &outcomes,
        );
    }
    tables.extend(aims);
    Ok(tables)
}

/// The rounds of one workload; round r runs the variants in order, odd
/// rounds reversed, the first round starting with auto so that the
/// kernel runs have its footprint.
fn run_workload(
    ctx: &mut Ctx,
    controller: &Controller,
    p: &Plan,
    w: &Workload<'_>,
) -> Result<Vec<Outcome>> {
    let mut outcomes: Vec<Outcome> = Vec::new();
    // Per kernel variant: the ladder step its last round finished at.
    let mut ladder_start = [0usize; Variant::KERNEL.len()];
    for round in 0..p.rounds {
        // Auto at the kernel's limit needs the kernel runs of its round
        // before it: last in a round, or right after them when the round
        // runs the other way.
        let mut order = Variant::ALL.to_vec();
        if round % 2 == 1 {
            order.retain(|&v| v != Variant::AutoMatched);
            order.reverse();
            order.insert(Variant::KERNEL.len(), Variant::AutoMatched);
        }
        for variant in order {
            interrupt::check()?;
            // The largest auto footprint so far: the kernel never gets
            // less memory than any auto run of this workload used. A run
            // that reached its time bound had reached its footprint too.
            let engine_peak = outcomes
                .iter()
                .filter(|o| o.variant == Variant::Auto && matches!(o.end, End::Ok | End::Timeout))
                .map(Outcome::footprint_bytes)
                .max();
            if variant == Variant::AutoMatched {
                if let Some(o) = run_matched(ctx, controller, p, w, &outcomes, round, engine_peak)?
                {
                    outcomes.push(o);
                }
                continue;
            }
            let limit = match variant.unit() {
                Some(_) => None,
                None => match engine_peak {
                    Some(b) => Some(b),
                    None => {
                        ctx.progress.start(&format!(
                            "{} {}, round {}",
                            w.name,
                            variant.name(),
                            round + 1
                        ));
                        ctx.progress
                            .failed("no auto run finished, so no footprint to match");
                        continue;
                    }
                },
            };
            // A kernel run OOM-killed at auto's footprint is run again
            // with more room, up the ladder; a later round starts where
            // the last one finished, so the ladder costs each variant its
            // OOM kills once.
            let first_step = if limit.is_some() {
                ladder_start[Variant::KERNEL
                    .iter()
                    .position(|&v| v == variant)
                    .unwrap_or(0)]
            } else {
                0
            };
            let tries = KERNEL_HEADROOM
                .iter()
                .enumerate()
                .skip(first_step)
                .flat_map(|(step, &headroom)| {
                    let tries = if limit.is_some() {
                        KERNEL_TRIES_PER_STEP
                    } else {
                        1
                    };
                    (0..tries).map(move |attempt| (step, headroom, attempt))
                })
                .collect::<Vec<_>>();
            for (i, &(step, headroom, attempt)) in tries.iter().enumerate() {
                let limit = limit.map(|b| ((b as f64 * headroom) as u64).div_ceil(4096) * 4096);
                ctx.progress.start(&format!(
                    "{} {}{}, round {}{}",
                    w.name,
                    variant.name(),
                    match limit {
                        Some(l) if headroom > 1.0 => format!(
                            " in a cgroup of {} MiB ({headroom}x auto's footprint)",
                            mib(l)
                        ),
                        Some(l) => format!(" in a cgroup of {} MiB", mib(l)),
                        None => format!(" --mem-limit {}", w.mem_limit),
                    },
                    round + 1,
                    if attempt > 0 {
                        ", again after an OOM kill"
                    } else {
                        ""
                    }
                ));
                let cg = Cgroup::create(controller, limit)?;
                let mut o = run_once(ctx, w, p.vcpus, variant, round, &cg, w.mem_limit)?;
                o.headroom = headroom;
                drop(cg);
                report_outcome(ctx, w, variant, round, &o);
                let oom = o.end == End::Oom;
                outcomes.push(o);
                if limit.is_none() || !oom {
                    if let Some(i) = Variant::KERNEL.iter().position(|&v| v == variant) {
                        ladder_start[i] = step;
                    }
                    break;
                }
                if i + 1 < tries.len() {
                    ctx.progress.add_step();
                }
            }
        }
    }
    Ok(outcomes)
}

/// The kernel's largest limit among its runs of `round` that finished
/// and swapped after a smaller limit was OOM-killed (headroom above 1):
/// the memory auto at the kernel's footprint gets. None when every kernel
/// run of the round finished at auto's footprint or none finished.
fn kernel_matched_limit(outcomes: &[Outcome], round: usize) -> Option<(u64, f64)> {
    outcomes
        .iter()
        .filter(|o| !o.variant.is_engine() && o.round == round && o.end == End::Ok)
        .filter(|o| swapped(o) && o.headroom > 1.0)
        .filter_map(|o| Some((o.limit_bytes?, o.headroom)))
        .max_by_key(|&(limit, _)| limit)
}

/// The `--mem-limit` that gives the engine a footprint of
/// `target_bytes`: its own limit raised by what the kernel got beyond
/// auto's footprint, in whole 2 MiB chunks, at most guest RAM. None when
/// that is no more than the limit it has.
fn matched_engine_limit(
    mem_limit_bytes: u64,
    mem_bytes: u64,
    auto_footprint_bytes: u64,
    target_bytes: u64,
) -> Option<u64> {
    let extra = target_bytes.checked_sub(auto_footprint_bytes)?;
    let limit = ((mem_limit_bytes + extra) / CHUNK_BYTES * CHUNK_BYTES).min(mem_bytes);
    (limit > mem_limit_bytes).then_some(limit)
}

/// Runs auto at the kernel's footprint in `round`, if a kernel run of
/// the round needed more room than auto's footprint to finish.
fn run_matched(
    ctx: &mut Ctx,
    controller: &Controller,
    p: &Plan,
    w: &Workload<'_>,
    outcomes: &[Outcome],
    round: usize,
    auto_footprint_bytes: Option<u64>,
) -> Result<Option<Outcome>> {
    let Some((target_bytes, headroom)) = kernel_matched_limit(outcomes, round) else {
        return Ok(None);
    };
    let Some(auto_footprint_bytes) = auto_footprint_bytes else {
        return Ok(None);
    };
    let mem_limit_bytes = guestmem::parse_size(w.mem_limit)
        .with_context(|| format!("--mem-limit {} is not a size", w.mem_limit))?;
    let mem_bytes =
        guestmem::parse_size(w.mem).with_context(|| format!("--mem {} is not a size", w.mem))?;
    let Some(limit) = matched_engine_limit(
        mem_limit_bytes,
        mem_bytes,
        auto_footprint_bytes,
        target_bytes,
    ) else {
        return Ok(None);
    };
    let engine_limit = guestmem::format_size_arg(limit);
    ctx.progress.add_step();
    ctx.progress.start(&format!(
        "{} {} --mem-limit {engine_limit} (the kernel's {} MiB, {headroom}x auto's footprint), round {}",
        w.name,
        Variant::AutoMatched.name(),
        mib(target_bytes),
        round + 1
    ));
    let cg = Cgroup::create(controller, None)?;
    let mut o = run_once(
        ctx,
        w,
        p.vcpus,
        Variant::AutoMatched,
        round,
        &cg,
        &engine_limit,
    )?;
    drop(cg);
    o.headroom = headroom;
    report_outcome(ctx, w, Variant::AutoMatched, round, &o);
    Ok(Some(o))
}

/// Prints how one run ended; a failure goes into the report.
fn report_outcome(ctx: &mut Ctx, w: &Workload<'_>, variant: Variant, round: usize, o: &Outcome) {
    match &o.end {
        End::Ok => ctx.progress.done(&format!(
            "{:.2} s, footprint {} MiB (RSS peak {} MiB), {}",
            o.wall_s,
            mib(o.footprint_bytes()),
            mib(o.rss_peak_bytes),
            if variant.is_engine() {
                format!(
                    "{} store faults, {} splits, {} flips",
                    fmt_f(o.store_faults + o.page_store_faults, 0),
                    fmt_f(o.splits, 0),
                    fmt_f(o.flips, 0)
                )
            } else {
                format!("{} swap-ins, {} swap-outs", o.swap_ins, o.swap_outs)
            }
        )),
        End::Oom => ctx
            .progress
            .done(&format!("OOM-killed after {:.1} s", o.wall_s)),
        End::Timeout => ctx
            .progress
            .done(&format!("not done within --timeout {} s", w.timeout_s)),
        End::Failed(m) => {
            ctx.progress.failed(m);
            ctx.report.failures.push(format!(
                "workloads {} {} round {}: {m}",
                w.name,
                variant.name(),
                round + 1
            ));
        }
    }
}

/// Whether a finished run's time is a swap figure: every engine run's
/// is; a kernel run's only if the kernel swapped out. With the room of a
/// higher step of the ladder the whole guest may fit, and its time is
/// then that of a VM that never swaps (verify in 0.05 s against seconds),
/// no comparison with a run that had to.
fn swapped(o: &Outcome) -> bool {
    o.variant.is_engine() || o.swap_outs > 0
}

/// The best wall time of `variants` in `round`, among runs that finished
/// and swapped ([`swapped`]).
fn best_wall(outcomes: &[Outcome], variants: &[Variant], round: usize) -> Option<f64> {
    outcomes
        .iter()
        .filter(|o| variants.contains(&o.variant) && o.round == round && o.end == End::Ok)
        .filter(|o| swapped(o))
        .map(|o| o.wall_s)
        .reduce(f64::min)
}

fn rounds(outcomes: &[Outcome]) -> usize {
    outcomes.iter().map(|o| o.round + 1).max().unwrap_or(0)
}

/// Per round where auto and one of `variants` finished: the better of
/// `variants`' wall times over auto's.
fn round_ratios(outcomes: &[Outcome], variants: &[Variant]) -> Vec<f64> {
    (0..rounds(outcomes))
        .filter_map(|r| {
            Some(
                best_wall(outcomes, variants, r)?
                    / best_wall(outcomes, &[Variant::Auto], r)?.max(1e-9),
            )
        })
        .collect()
}

/// Per round where auto ran at the kernel's footprint and finished: the
/// kernel's best time of that round over it. Every kernel run of the
/// round had at most that footprint ([`kernel_matched_limit`]), so the
/// ratio can only flatter the kernel.
fn matched_ratios(outcomes: &[Outcome]) -> Vec<f64> {
    (0..rounds(outcomes))
        .filter_map(|r| {
            Some(
                best_wall(outcomes, &Variant::KERNEL, r)?
                    / best_wall(outcomes, &[Variant::AutoMatched], r)?.max(1e-9),
            )
        })
        .collect()
}

/// Per round where auto reached its time bound and one of `variants`
/// finished: the upper bound of the ratio (their wall over the bound).
fn round_ratio_bounds(outcomes: &[Outcome], variants: &[Variant], timeout_s: u32) -> Vec<f64> {
    (0..rounds(outcomes))
        .filter_map(|r| {
            let auto = outcomes
                .iter()
                .find(|o| o.variant == Variant::Auto && o.round == r)?;
            let best = best_wall(outcomes, variants, r)?;
            (auto.end == End::Timeout).then(|| best / f64::from(timeout_s))
        })
        .collect()
}

/// Auto's flips per split, per round that split anything.
fn flips_per_split(outcomes: &[Outcome]) -> Vec<f64> {
    outcomes
        .iter()
        .filter(|o| o.variant == Variant::Auto && matches!(o.end, End::Ok | End::Timeout))
        .filter(|o| o.splits > 0.0)
        .map(|o| o.flips / o.splits)
        .collect()
}

/// Per auto run with a timeline: its flips per split in the second half
/// of the run, the steady state. A second half without splits has no flip
/// either (a flip is a split): 0.
fn late_flips_per_split(outcomes: &[Outcome]) -> Vec<f64> {
    outcomes
        .iter()
        .filter(|o| o.variant == Variant::Auto && matches!(o.end, End::Ok | End::Timeout))
        .filter_map(|o| Some((o.late_splits?, o.late_flips?)))
        .map(|(splits, flips)| if splits > 0.0 { flips / splits } else { 0.0 })
        .collect()
}

fn ratios_json(outcomes: &[Outcome], timeout_s: u32) -> Value {
    let ratio = |variants: &[Variant]| {
        let r = round_ratios(outcomes, variants);
        json!({
            "per_round": r,
            "median": median(&r),
            "upper_bounds_auto_timed_out": round_ratio_bounds(outcomes, variants, timeout_s),
        })
    };
    let flips = flips_per_split(outcomes);
    let late_flips = late_flips_per_split(outcomes);
    let matched = matched_ratios(outcomes);
    json!({
        "kernel_over_auto_at_kernel_footprint": {"per_round": matched, "median": median(&matched)},
        "kernel_over_auto": ratio(&Variant::KERNEL),
        "kernel_thp_over_auto": ratio(&[Variant::KernelThp]),
        "kernel_4k_over_auto": ratio(&[Variant::Kernel4k]),
        "fixed_over_auto": ratio(&Variant::FIXED),
        "2m_over_auto": ratio(&[Variant::TwoM]),
        "4k_over_auto": ratio(&[Variant::FourK]),
        "flips_per_split": {"per_round": flips, "median": median(&flips)},
        "late_flips_per_split": {"per_round": late_flips, "median": median(&late_flips)},
    })
}

/// A ratio's cell: the median over every round where it has a value. A
/// round where auto reached its time bound and the other side finished
/// counts with its upper bound (the other's wall over the bound: auto took
/// at least that long), so such a round can only flatter auto; the cell
/// then reads `<= x` and the ratio is marked as a bound (`true`).
fn ratio_cell(
    outcomes: &[Outcome],
    variants: &[Variant],
    timeout_s: u32,
) -> (String, Option<f64>, bool) {
    let ratios = round_ratios(outcomes, variants);
    let bounds = round_ratio_bounds(outcomes, variants, timeout_s);
    let all: Vec<f64> = ratios.iter().chain(&bounds).copied().collect();
    match median(&all) {
        Some(r) if bounds.is_empty() => (fmt_f(r, 2), Some(r), false),
        Some(r) => (
            format!(
                "<= {} (auto timed out in {} of {} rounds)",
                fmt_f(r, 2),
                bounds.len(),
                all.len()
            ),
            Some(r),
            true,
        ),
        None => ("-".into(), None, false),
    }
}

fn aims_table(vcpus: u32, rounds: usize) -> Table {
    let mut t = Table::new(
        &format!(
            "workloads: the aims of issue 33, {} vCPUs, {} rounds alternated (ratios: median over rounds of that round's wall-time ratio)",
            vcpus, rounds
        ),
        &[
            "workload",
            "kernel best / auto",
            "aim",
            "best fixed / auto",
            "aim",
            "flips / splits, 2nd half (auto)",
            "aim",
            "verdict",
        ],
    );
    t.note("kernel best / auto at the kernel's footprint: where a kernel run was OOM-killed at auto's footprint and finished with more room, auto runs again in that round with --mem-limit raised by the same room (\"hugevmm auto, kernel's limit\" in the workload's table), and the aim is judged on that ratio, the same footprint; the ratio against auto at 1x follows it");
    t.note("kernel best: the faster of THP and 4 KiB backing in that round; best fixed: the faster of 2m and 4k; flips / splits, 2nd half: the steady state, auto's flips over its splits in the second half of each run (from its --stats-timeline; 0 when the second half splits nothing), median over rounds, the whole run's beside it (a run from before the timelines: the whole run's alone)");
    t
}

fn aims_row(t: &mut Table, w: &Workload<'_>, outcomes: &[Outcome]) {
    let (kernel, kernel_r, kernel_bound) = ratio_cell(outcomes, &Variant::KERNEL, w.timeout_s);
    let (fixed, fixed_r, fixed_bound) = ratio_cell(outcomes, &Variant::FIXED, w.timeout_s);
    let whole_run_flips = median(&flips_per_split(outcomes));
    // The aim is the steady state's; a file from before the timelines has
    // only the whole run's.
    let late_flips = median(&late_flips_per_split(outcomes));
    let flips = late_flips.or(whole_run_flips);
    let kernel_oom = outcomes
        .iter()
        .filter(|o| !o.variant.is_engine())
        .all(|o| o.end == End::Oom);
    let kernel_headroom = outcomes
        .iter()
        .filter(|o| !o.variant.is_engine() && o.end == End::Ok)
        .map(|o| o.headroom)
        .fold(1.0, f64::max);
    // Where the kernel needed more room than auto's footprint, the aim
    // ("same footprint") is judged on auto given that room too; the ratio
    // against auto at its own footprint stays beside it.
    let matched = median(&matched_ratios(outcomes));
    let (kernel, kernel_r, kernel_bound) = match matched {
        Some(m) => (
            format!(
                "{} at the kernel's footprint ({kernel_headroom}x auto's); {kernel} with auto at 1x",
                fmt_f(m, 2)
            ),
            Some(m),
            false,
        ),
        None => (kernel, kernel_r, kernel_bound),
    };
    let kernel = if kernel_r.is_none() && kernel_oom {
        format!(
            "OOM-killed (up to {}x auto's footprint)",
            KERNEL_HEADROOM[KERNEL_HEADROOM.len() - 1]
        )
    } else if kernel_headroom > 1.0 && matched.is_none() {
        format!("{kernel} (kernel at up to {kernel_headroom}x auto's footprint)")
    } else {
        kernel
    };
    // With room to spare the kernel may not swap at all: then its time is
    // that of a VM that fits, no swap comparison.
    let kernel_unswapped = outcomes
        .iter()
        .filter(|o| !o.variant.is_engine() && o.end == End::Ok)
        .filter(|o| o.swap_outs == 0)
        .count();
    let kernel = if kernel_unswapped > 0 {
        format!(
            "{kernel}; {kernel_unswapped} kernel run(s) swapped nothing (the guest fit: left out)"
        )
    } else {
        kernel
    };
    let mut missed = Vec::new();
    // A bound at or above the aim shows nothing: auto timed out there.
    match kernel_r {
        Some(r) if r < w.kernel_aim => missed.push("kernel"),
        Some(_) if kernel_bound => missed.push("kernel (auto timed out)"),
        None if !kernel_oom => missed.push("kernel (no ratio)"),
        _ => {}
    }
    match fixed_r {
        Some(r) if r < w.fixed_aim => missed.push("fixed"),
        Some(_) if fixed_bound => missed.push("fixed (auto timed out)"),
        None => missed.push("fixed (no ratio)"),
        _ => {}
    }
    if flips.is_some_and(|f| f > FLIPS_PER_SPLIT_AIM) {
        missed.push("flips");
    }
    t.row(vec![
        w.name.into(),
        kernel,
        format!(">= {}", fmt_f(w.kernel_aim, 1)),
        fixed,
        format!(">= {}", fmt_f(w.fixed_aim, 1)),
        match (late_flips, whole_run_flips) {
            (Some(late), Some(whole)) => {
                format!("{:.1} % (whole run {:.1} %)", 100.0 * late, 100.0 * whole)
            }
            (Some(late), None) => format!("{:.1} % (no splits)", 100.0 * late),
            (None, Some(whole)) => format!("{:.1} % (whole run)", 100.0 * whole),
            (None, None) => "no splits".into(),
        },
        format!("<= {:.0} %", 100.0 * FLIPS_PER_SPLIT_AIM),
        if missed.is_empty() {
            "met".into()
        } else {
            format!("missed: {}", missed.join(", "))
        },
    ]);
}

fn table(vcpus: u32, rounds: usize, w: &Workload<'_>, outcomes: &[Outcome], zswap: bool) -> Table {
    let limit = outcomes
        .iter()
        .filter(|o| o.headroom == 1.0)
        .filter_map(|o| o.limit_bytes)
        .max();
    let mut t = Table::new(
        &format!(
            "workloads: {} (`{} {}`), {} vCPUs, {} guest; engine --mem-limit {}, kernel in a memory cgroup of auto's footprint{}; {} rounds, alternated",
            w.name,
            w.payload,
            w.args,
            vcpus,
            w.mem,
            w.mem_limit,
            limit.map(|l| format!(" ({} MiB)", mib(l))).unwrap_or_default(),
            rounds
        ),
        &[
            "variant",
            "wall s",
            "min-max",
            "rounds ok",
            "footprint MiB",
            "limit / auto's footprint",
            "RSS peak MiB",
            "store faults",
            "evictions",
            "splits",
            "flips",
            "swap-ins",
            "swap-outs",
            "this / auto",
        ],
    );
    for variant in Variant::ALL {
        let runs: Vec<&Outcome> = outcomes.iter().filter(|o| o.variant == variant).collect();
        if runs.is_empty() {
            continue;
        }
        let ok: Vec<&Outcome> = runs.iter().copied().filter(|o| o.end == End::Ok).collect();
        let med = |f: &dyn Fn(&Outcome) -> f64| -> Option<f64> {
            median(&ok.iter().map(|o| f(o)).collect::<Vec<_>>())
        };
        let walls: Vec<f64> = ok.iter().map(|o| o.wall_s).collect();
        let ooms = runs.iter().filter(|o| o.end == End::Oom).count();
        let timeouts = runs.iter().filter(|o| o.end == End::Timeout).count();
        let wall = match median(&walls) {
            Some(m) => fmt_f(m, 2),
            None if ooms > 0 => "OOM-killed".into(),
            None if timeouts > 0 => format!("> {}", w.timeout_s),
            None => "failed".into(),
        };
        let spread = if walls.is_empty() {
            "-".into()
        } else {
            let lo = walls.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = walls.iter().copied().fold(0.0, f64::max);
            format!("{}-{}", fmt_f(lo, 2), fmt_f(hi, 2))
        };
        // Rounds, not runs: a kernel round may take several runs up the
        // ladder of limits.
        let rounds_of = |runs: &[&Outcome]| {
            runs.iter()
                .map(|o| o.round)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        let mut rounds_ok = format!("{} of {}", rounds_of(&ok), rounds_of(&runs));
        if ooms > 0 {
            rounds_ok += &format!(", {ooms} OOM-killed runs");
        }
        if timeouts > 0 {
            rounds_ok += &format!(", {timeouts} timeout");
        }
        let cell = |v: Option<f64>| v.map(|x| fmt_f(x, 0)).unwrap_or_else(|| "-".into());
        let engine = variant.is_engine();
        let engine_cell =
            |f: &dyn Fn(&Outcome) -> f64| if engine { cell(med(f)) } else { "-".into() };
        let ratio = if variant == Variant::Auto {
            "-".into()
        } else {
            ratio_cell(outcomes, &[variant], w.timeout_s).0
        };
        t.row(vec![
            variant.name().into(),
            wall,
            spread,
            rounds_ok,
            cell(med(&|o| o.footprint_bytes() as f64 / MIB)),
            if engine && variant != Variant::AutoMatched {
                "-".into()
            } else {
                ok.iter()
                    .map(|o| o.headroom)
                    .reduce(f64::max)
                    .map_or_else(|| "-".into(), |h| format!("{h}x"))
            },
            cell(med(&|o| o.rss_peak_bytes as f64 / MIB)),
            engine_cell(&|o| o.store_faults + o.page_store_faults),
            engine_cell(&|o| o.evictions + o.page_evictions),
            engine_cell(&|o| o.splits),
            engine_cell(&|o| o.flips),
            if engine {
                "-".into()
            } else {
                cell(med(&|o| o.swap_ins as f64))
            },
            if engine {
                "-".into()
            } else {
                cell(med(&|o| o.swap_outs as f64))
            },
            ratio,
        ]);
    }
    t.note("wall s: spawn to exit of `hugevmm run`, median of the rounds that finished; footprint: the run's cgroup peak charge (auto's is the kernel runs' limit); limit / auto's footprint: the largest limit a finished kernel run had, over auto's footprint (for auto at the kernel's limit: the kernel run it matches) (a kernel run OOM-killed at one limit runs again there once, then at the next of 1, 1.25, 1.5 and 2x; with more room than auto the kernel's time is a bound in its favour); RSS peak: ru_maxrss (wait4); this / auto: median over rounds of that round's wall-time ratio (above 1: auto faster)");
    t.note("store faults: units and split-chunk pages restored from the store; evictions: units and pages evicted (the engine's --stats-json); swap-ins/outs: pages, pswpin/pswpout (global /proc/vmstat deltas over the run unless the cgroup's memory.stat has them)");
    if zswap {
        t.note("zswap is on: the kernel's swap-outs are compressed into RAM first (charged to the cgroup on v2)");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(variant: Variant, round: usize, end: End, wall_s: f64) -> Outcome {
        Outcome {
            variant,
            round,
            end,
            wall_s,
            elapsed_s: None,
            rss_peak_bytes: 0,
            cgroup_peak_bytes: None,
            limit_bytes: None,
            headroom: 1.0,
            store_faults: 0.0,
            page_store_faults: 0.0,
            evictions: 0.0,
            page_evictions: 0.0,
            splits: 0.0,
            collapses: 0.0,
            flips: 0.0,
            late_splits: None,
            late_flips: None,
            swap_ins: 0,
            swap_outs: 0,
            command: String::new(),
        }
    }

    #[test]
    fn the_second_half_counts_what_the_run_split_after_its_midpoint() {
        let line = |t_s: f64, splits: u64, flips: u64| {
            json!({"t_s": t_s, "swap": {"split": {"splits": splits, "flips": flips}}}).to_string()
        };
        let timeline = [
            line(0.1, 10, 0),
            line(1.0, 40, 2),
            line(2.0, 50, 3),
            line(4.0, 55, 3),
        ]
        .join("\n");
        // Half of 4 s: the sample at 2 s; the final figures 60 and 4.
        assert_eq!(second_half(&timeline, 60.0, 4.0), Some((10.0, 1.0)));
        assert_eq!(
            second_half(&line(3.0, 1, 0), 1.0, 0.0),
            None,
            "no sample in the first half"
        );
        assert_eq!(second_half("", 1.0, 0.0), None);
        let mut run = outcome(Variant::Auto, 0, End::Ok, 1.0);
        run.splits = 60.0;
        run.flips = 4.0;
        (run.late_splits, run.late_flips) = (Some(0.0), Some(0.0));
        assert_eq!(
            late_flips_per_split(&[run.clone()]),
            vec![0.0],
            "no split, no flip"
        );
        (run.late_splits, run.late_flips) = (Some(10.0), Some(1.0));
        assert_eq!(late_flips_per_split(&[run]), vec![0.1]);
    }

    #[test]
    fn a_round_where_auto_timed_out_makes_the_ratio_a_bound_and_misses() {
        let runs = vec![
            outcome(Variant::Auto, 0, End::Ok, 2.0),
            outcome(Variant::FourK, 0, End::Ok, 2.5),
            outcome(Variant::Auto, 1, End::Timeout, 30.0),
            outcome(Variant::FourK, 1, End::Ok, 2.5),
        ];
        let (cell, ratio, bound) = ratio_cell(&runs, &Variant::FIXED, 30);
        assert!(bound, "{cell}");
        assert!(
            cell.starts_with("<= ") && cell.contains("1 of 2 rounds"),
            "{cell}"
        );
        assert!(ratio.is_some_and(|r| r < 1.25), "{ratio:?}");
        let (cell, _, bound) = ratio_cell(&runs[..2], &Variant::FIXED, 30);
        assert!(!bound);
        assert_eq!(cell, "1.25");
    }

    #[test]
    fn a_run_read_back_from_its_json_is_the_same_run() {
        let mut run = outcome(Variant::Kernel4k, 1, End::Failed("cgroup gone".into()), 2.5);
        run.headroom = 1.25;
        run.limit_bytes = Some(1 << 20);
        run.cgroup_peak_bytes = Some(3 << 20);
        run.elapsed_s = Some(1.5);
        run.swap_outs = 7;
        run.flips = 3.0;
        let back = Outcome::from_json(&run.json()).unwrap();
        assert_eq!(back.json(), run.json());
        assert_eq!(back.end, run.end);
        // A file from before the ladder: every kernel run had 1x.
        let mut old = run.json();
        old.as_object_mut().unwrap().remove("headroom");
        assert_eq!(Outcome::from_json(&old).unwrap().headroom, 1.0);
        let mut bad = run.json();
        bad["variant"] = json!("kernel-zram");
        let err = Outcome::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("kernel-zram"), "{err}");
    }

    #[test]
    fn the_tables_are_a_function_of_the_results_file() {
        let mut kernel = outcome(Variant::KernelThp, 0, End::Oom, 0.5);
        kernel.limit_bytes = Some(100 << 20);
        let mut kernel_more = outcome(Variant::KernelThp, 0, End::Ok, 3.0);
        kernel_more.headroom = 1.25;
        kernel_more.limit_bytes = Some(125 << 20);
        kernel_more.swap_outs = 10;
        let runs = [
            outcome(Variant::Auto, 0, End::Ok, 2.0),
            outcome(Variant::FourK, 0, End::Ok, 2.5),
            kernel,
            kernel_more,
        ];
        let suite = json!({
            "rounds": 1,
            "zswap": false,
            "workloads": [{
                "workload": "kv", "payload": "kv", "payload_args": "ops=1",
                "vcpus": 2, "mem": "512M", "engine_mem_limit": "96M",
                "timeout_s": 30,
                "aims": {"kernel_over_auto": 1.0, "fixed_over_auto": 0.9, "flips_per_split": 0.01},
                "runs": runs.iter().map(Outcome::json).collect::<Vec<_>>(),
            }],
        });
        let tables = tables_from_json(&suite).unwrap();
        assert_eq!(tables.len(), 2, "one per workload and the aims table");
        let md: Vec<String> = tables.iter().map(Table::markdown).collect();
        assert!(
            md[0].contains("workloads: kv (`kv ops=1`), 2 vCPUs, 512M guest"),
            "{}",
            md[0]
        );
        assert!(md[0].contains("| kernel, thp | 3.00 |"), "{}", md[0]);
        assert!(
            md[0].contains("| 1.25x |"),
            "the limit it needed: {}",
            md[0]
        );
        assert!(
            md[1].contains("| kv | 1.50 (kernel at up to 1.25x auto's footprint) |"),
            "{}",
            md[1]
        );
        assert_eq!(
            tables_from_json(&suite)
                .unwrap()
                .iter()
                .map(Table::markdown)
                .collect::<Vec<_>>(),
            md
        );
        let mut broken = suite.clone();
        broken["workloads"][0]["runs"][1]["end"] = json!("vanished");
        let err = format!("{:#}", tables_from_json(&broken).unwrap_err());
        assert!(
            err.contains("in workload kv") && err.contains("vanished"),
            "{err}"
        );
    }

    #[test]
    fn auto_at_the_kernels_footprint_gets_the_kernels_extra_room_and_judges_the_aim() {
        const M: u64 = 1 << 20;
        // The kernel needed 171 MiB where auto's footprint was 114 MiB at
        // --mem-limit 96M: auto again with 96 + 57 MiB, in whole chunks.
        assert_eq!(
            matched_engine_limit(96 * M, 512 * M, 114 * M, 171 * M),
            Some(152 * M)
        );
        assert_eq!(
            matched_engine_limit(96 * M, 128 * M, 114 * M, 171 * M),
            Some(128 * M),
            "never above guest RAM"
        );
        assert_eq!(
            matched_engine_limit(96 * M, 512 * M, 114 * M, 114 * M),
            None
        );
        assert_eq!(
            matched_engine_limit(96 * M, 512 * M, 114 * M, 100 * M),
            None
        );

        let kernel = |variant, end, wall_s, headroom: f64, limit_mib: u64| Outcome {
            swap_outs: 100,
            headroom,
            limit_bytes: Some(limit_mib * M),
            ..outcome(variant, 0, end, wall_s)
        };
        let mut runs = vec![
            outcome(Variant::Auto, 0, End::Ok, 20.0),
            kernel(Variant::Kernel4k, End::Oom, 1.0, 1.0, 114),
            kernel(Variant::Kernel4k, End::Ok, 12.0, 1.5, 171),
            kernel(Variant::KernelThp, End::Oom, 1.0, 2.0, 228),
        ];
        assert_eq!(kernel_matched_limit(&runs, 0), Some((171 * M, 1.5)));
        assert_eq!(kernel_matched_limit(&runs, 1), None, "another round");
        assert!(matched_ratios(&runs).is_empty(), "not run yet");
        let mut matched = outcome(Variant::AutoMatched, 0, End::Ok, 10.0);
        matched.headroom = 1.5;
        runs.push(matched);
        assert_eq!(matched_ratios(&runs), vec![1.2]);
        let mut t = aims_table(2, 1);
        aims_row(&mut t, &Workload::new("kv", "kv", "ops=1"), &runs);
        let md = t.markdown();
        assert!(
            md.contains(
                "| kv | 1.20 at the kernel's footprint (1.5x auto's); 0.60 with auto at 1x |"
            ),
            "{md}"
        );
        assert!(!md.contains("missed: kernel"), "{md}");
        // Slower than the kernel at the same footprint: missed, whatever
        // the ratio at 1x.
        runs.last_mut().unwrap().wall_s = 15.0;
        let mut t = aims_table(2, 1);
        aims_row(&mut t, &Workload::new("kv", "kv", "ops=1"), &runs);
        assert!(t.markdown().contains("missed: kernel"), "{}", t.markdown());
        // A kernel that finished at auto's own footprint: no matched run.
        assert_eq!(
            kernel_matched_limit(&[kernel(Variant::Kernel4k, End::Ok, 12.0, 1.0, 114)], 0),
            None
        );
    }

    #[test]
    fn keyed_reads_the_named_line_only() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(text, "oom_kill"), Some(3));
        assert_eq!(keyed(text, "oom"), None);
    }

    #[test]
    fn ratios_pair_rounds_and_leave_out_oom_and_timeouts() {
        let kernel = |variant, round, end, wall_s| Outcome {
            swap_outs: 100,
            ..outcome(variant, round, end, wall_s)
        };
        let runs = vec![
            outcome(Variant::Auto, 0, End::Ok, 2.0),
            kernel(Variant::Kernel4k, 0, End::Ok, 5.0),
            kernel(Variant::KernelThp, 0, End::Ok, 3.0),
            kernel(Variant::Kernel4k, 1, End::Oom, 0.2),
            // With room to spare, a kernel run that never swapped: no
            // figure to set beside auto's.
            outcome(Variant::KernelThp, 1, End::Ok, 0.05),
            outcome(Variant::Auto, 1, End::Ok, 1.0),
            outcome(Variant::Auto, 2, End::Timeout, 20.0),
            kernel(Variant::Kernel4k, 2, End::Ok, 4.0),
        ];
        assert_eq!(round_ratios(&runs, &[Variant::Kernel4k]), vec![2.5]);
        assert_eq!(
            round_ratios(&runs, &Variant::KERNEL),
            vec![1.5],
            "the kernel's better backing of the round"
        );
        assert!(round_ratios(&runs, &Variant::FIXED).is_empty());
        assert_eq!(
            round_ratio_bounds(&runs, &[Variant::Kernel4k], 20),
            vec![0.2]
        );
    }
}
