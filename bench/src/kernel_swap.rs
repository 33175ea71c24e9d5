//! `kernel-swap`: the host kernel's own swap as a baseline
//! (docs/KERNEL_BASELINE.md). Each workload runs three ways, alternated in
//! rounds:
//!
//! - `hugevmm auto`: `hugevmm run ... --mem-limit L --swap-store default`
//!   (the swap engine, default unit, an unlinked O_DIRECT file store on
//!   `--store-dir`);
//! - `kernel, thp` and `kernel, 4k`: the same command without the engine
//!   (no `--mem-limit`, no `--swap-store`), `--backing thp` or `--backing
//!   4k`, inside a memory cgroup limited to the engine run's peak
//!   footprint, with a swap file on `--store-dir` enabled at the highest
//!   priority.
//!
//! The footprint is matched with the counter the limit is enforced on: the
//! engine run also runs in a cgroup of its own (no limit), and its peak
//! charge (`memory.max_usage_in_bytes` on v1, `memory.peak` on v2) is what
//! the kernel runs get: the guest's resident memory, the VMM's own buffers,
//! page tables and any page cache all count, as they do for the kernel
//! runs. The process's own peak RSS (`ru_maxrss` from `wait4`, the
//! kernel's high-water mark of the process, taken at exit so that no
//! sampling can miss a peak) is reported beside it, and is the limit only
//! where the cgroup has no peak file.
//!
//! Swap-ins and swap-outs are `pswpin`/`pswpout` of the run's cgroup's
//! `memory.stat` where the kernel keeps them there, else the deltas of the
//! global `/proc/vmstat` over the run (the host should be quiet). An
//! OOM kill (the cgroup's `oom_kill` count) is a result, never a time.
//!
//! The swap file and every cgroup are guards: dropped on return, on error
//! and on Ctrl-C (`interrupt`), which `swapoff`s and removes the file and
//! removes the cgroup directories.
//!
//! [`PLAN_VAR`]`=tiny` picks a one-round seqwrite of a few MiB instead of
//! the mode's plan, for the test that checks the suite end to end.

use anyhow::{bail, Context, Result};
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
use super::runner::{num, MIB};
use super::{interrupt, Ctx, Mode};

/// The environment variable that replaces the mode's plan (`tiny`).
pub const PLAN_VAR: &str = "HUGEVMM_BENCH_KERNEL_SWAP_PLAN";

/// The prefix of every cgroup directory the suite creates.
pub const CGROUP_PREFIX: &str = "hugevmm-bench-";

/// One guest workload.
struct Workload {
    /// Table label.
    name: &'static str,
    payload: &'static str,
    args: &'static str,
    mem: &'static str,
    /// The engine run's `--mem-limit`.
    mem_limit: &'static str,
    /// `--timeout`: a thrashing run ends as a time bound, not a hang.
    timeout_s: u32,
}

struct Plan {
    vcpus: u32,
    rounds: usize,
    workloads: Vec<Workload>,
}

fn plan(mode: Mode) -> Plan {
    if std::env::var(PLAN_VAR).is_ok_and(|v| v == "tiny") {
        return Plan {
            vcpus: 2,
            rounds: 1,
            workloads: vec![Workload {
                name: "seqwrite (tiny)",
                payload: "seqwrite",
                args: "bytes=64M passes=1",
                mem: "96M",
                mem_limit: "32M",
                timeout_s: 30,
            }],
        };
    }
    // The issue 33 workloads that have a payload here; there is no
    // key-value payload (docs/KERNEL_BASELINE.md).
    match mode {
        Mode::Quick => Plan {
            vcpus: 2,
            rounds: 2,
            workloads: vec![
                Workload {
                    name: "seqwrite",
                    payload: "seqwrite",
                    args: "bytes=512M passes=2",
                    mem: "768M",
                    mem_limit: "192M",
                    timeout_s: 60,
                },
                Workload {
                    name: "randwrite",
                    payload: "randwrite",
                    args: "bytes=96M passes=1",
                    mem: "128M",
                    mem_limit: "80M",
                    timeout_s: 20,
                },
                Workload {
                    name: "mixed",
                    payload: "mixed",
                    args: "hot=128 stream=256M passes=2",
                    mem: "768M",
                    mem_limit: "128M",
                    timeout_s: 60,
                },
            ],
        },
        Mode::Full => Plan {
            vcpus: 2,
            rounds: 3,
            workloads: vec![
                Workload {
                    name: "seqwrite",
                    payload: "seqwrite",
                    args: "bytes=768M passes=3",
                    mem: "1G",
                    mem_limit: "256M",
                    timeout_s: 600,
                },
                Workload {
                    name: "randwrite",
                    payload: "randwrite",
                    args: "bytes=384M passes=1",
                    mem: "512M",
                    mem_limit: "320M",
                    timeout_s: 300,
                },
                Workload {
                    name: "mixed",
                    payload: "mixed",
                    args: "hot=128 stream=512M passes=2",
                    mem: "1G",
                    mem_limit: "192M",
                    timeout_s: 300,
                },
            ],
        },
    }
}

/// How a workload is run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Engine,
    KernelThp,
    Kernel4k,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Engine, Variant::KernelThp, Variant::Kernel4k];

    fn name(self) -> &'static str {
        match self {
            Variant::Engine => "hugevmm auto",
            Variant::KernelThp => "kernel, thp",
            Variant::Kernel4k => "kernel, 4k",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::Engine => "engine",
            Variant::KernelThp => "kernel-thp",
            Variant::Kernel4k => "kernel-4k",
        }
    }

    fn backing(self) -> &'static str {
        match self {
            Variant::Engine | Variant::KernelThp => "thp",
            Variant::Kernel4k => "4k",
        }
    }

    fn args(self, w: &Workload, vcpus: u32) -> Vec<String> {
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
        if self == Variant::Engine {
            a.extend([
                "--mem-limit".into(),
                w.mem_limit.into(),
                "--swap-store".into(),
                "default".into(),
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

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
enum End {
    Ok,
    Oom,
    Timeout,
    Failed(String),
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

/// One run's figures.
#[derive(Clone, Debug)]
struct Outcome {
    variant: Variant,
    round: usize,
    end: End,
    /// Spawn to exit, s.
    wall_s: f64,
    /// The run's own `elapsed_s` (guest run), when it wrote stats.
    elapsed_s: Option<f64>,
    rss_peak_bytes: u64,
    cgroup_peak_bytes: Option<u64>,
    /// The cgroup's limit (kernel variants).
    limit_bytes: Option<u64>,
    store_faults: f64,
    evictions: f64,
    swap_ins: u64,
    swap_outs: u64,
    command: String,
}

impl Outcome {
    /// What the kernel runs are limited to: the charged peak, else RSS.
    fn footprint_bytes(&self) -> u64 {
        self.cgroup_peak_bytes.unwrap_or(self.rss_peak_bytes)
    }

    fn json(&self) -> Value {
        json!({
            "variant": self.variant.key(),
            "round": self.round + 1,
            "end": self.end.key(),
            "failure": match &self.end { End::Failed(m) => Some(m.clone()), _ => None },
            "wall_s": self.wall_s,
            "elapsed_s": self.elapsed_s,
            "rss_peak_bytes": self.rss_peak_bytes,
            "cgroup_peak_bytes": self.cgroup_peak_bytes,
            "limit_bytes": self.limit_bytes,
            "store_faults": self.store_faults,
            "evictions": self.evictions,
            "swap_ins": self.swap_ins,
            "swap_outs": self.swap_outs,
            "command": self.command,
        })
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

/// Runs one `hugevmm run` inside `cg`, waiting with `wait4` for its
/// rusage.
fn run_once(
    ctx: &Ctx,
    w: &Workload,
    vcpus: u32,
    variant: Variant,
    round: usize,
    cg: &Cgroup,
    limit_bytes: Option<u64>,
) -> Result<Outcome> {
    interrupt::check()?;
    let base = format!(
        "kernel-swap-{}-{}-{}",
        w.name.replace(|c: char| !c.is_ascii_alphanumeric(), ""),
        variant.key(),
        round + 1
    );
    let stats_path = ctx.raw_path(&format!("{base}.json"));
    let _ = std::fs::remove_file(&stats_path);
    let stdout = std::fs::File::create(ctx.raw_path(&format!("{base}.stdout")))?;
    let stderr_path = ctx.raw_path(&format!("{base}.stderr"));
    let stderr = std::fs::File::create(&stderr_path)?;
    let args = variant.args(w, vcpus);
    if ctx.prime {
        let guest_bytes = guestmem::parse_size(w.mem)
            .with_context(|| format!("--mem {} is not a size", w.mem))?;
        crate::prime::prime(guest_bytes);
    }
    let mut cmd = Command::new(&ctx.hugevmm);
    cmd.args(&args)
        .arg("--stats-json")
        .arg(&stats_path)
        .env("TMPDIR", &ctx.store_dir)
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
        store_faults: stat("/swap/faults/store"),
        evictions: stat("/swap/evictions"),
        swap_ins,
        swap_outs,
        command: command_text(&args, limit_bytes),
    })
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
        ctx.skip("kernel-swap", &why);
        return Ok(());
    }
    let controller = match find_controller() {
        Ok(c) => c,
        Err(why) => {
            ctx.skip("kernel-swap", &why);
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
    // Room for all of guest RAM and the VMM's own memory besides.
    let swap_bytes = largest_mem + (256 << 20);
    ctx.progress.plan(1 + p.rounds * p.workloads.len() * 3);
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
            ctx.skip("kernel-swap", &format!("no host swap file: {e:#}"));
            return Ok(());
        }
    };
    let zswap = zswap_enabled();
    let mut workloads_json = Vec::new();
    for w in &p.workloads {
        let outcomes = run_workload(ctx, &controller, &p, w)?;
        let limit_bytes = outcomes.iter().filter_map(|o| o.limit_bytes).max();
        ctx.report.tables.push(table(&p, w, &outcomes, zswap));
        for o in &outcomes {
            if o.end == End::Ok {
                ctx.report.csv(
                    "kernel-swap",
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
            "ratios": ratios_json(&outcomes, w.timeout_s),
            "runs": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
        }));
    }
    ctx.report.set(
        "kernel-swap",
        json!({
            "cgroup": match controller.hierarchy { Hierarchy::V1 => "v1", Hierarchy::V2 => "v2" },
            "swap_file": swap.path().display().to_string(),
            "swap_file_bytes": swap_bytes,
            "zswap": zswap,
            "rounds": p.rounds,
            "footprint": "engine run's cgroup peak charge (memory.max_usage_in_bytes / memory.peak); ru_maxrss from wait4 beside it",
            "key_value": "no key-value payload exists (hugevmm payloads); not run",
            "workloads": workloads_json,
        }),
    );
    drop(swap);
    Ok(())
}

/// The rounds of one workload; round r runs the variants in order, odd
/// rounds reversed, the first round starting with the engine so that the
/// kernel runs have its footprint.
fn run_workload(
    ctx: &mut Ctx,
    controller: &Controller,
    p: &Plan,
    w: &Workload,
) -> Result<Vec<Outcome>> {
    let mut outcomes: Vec<Outcome> = Vec::new();
    for round in 0..p.rounds {
        let mut order = Variant::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            interrupt::check()?;
            // The largest engine footprint so far: the kernel never gets
            // less memory than any engine run of this workload used. A run
            // that reached its time bound had reached its footprint too.
            let engine_peak = outcomes
                .iter()
                .filter(|o| o.variant == Variant::Engine && matches!(o.end, End::Ok | End::Timeout))
                .map(Outcome::footprint_bytes)
                .max();
            let limit = match variant {
                Variant::Engine => None,
                _ => match engine_peak {
                    Some(b) => Some(b.div_ceil(4096) * 4096),
                    None => {
                        ctx.progress.start(&format!(
                            "{} {}, round {}",
                            w.name,
                            variant.name(),
                            round + 1
                        ));
                        ctx.progress
                            .failed("no engine run finished, so no footprint to match");
                        continue;
                    }
                },
            };
            ctx.progress.start(&format!(
                "{} {}{}, round {}",
                w.name,
                variant.name(),
                match limit {
                    Some(l) => format!(" in a cgroup of {} MiB", mib(l)),
                    None => format!(" --mem-limit {}", w.mem_limit),
                },
                round + 1
            ));
            let cg = Cgroup::create(controller, limit)?;
            let o = run_once(ctx, w, p.vcpus, variant, round, &cg, limit)?;
            drop(cg);
            match &o.end {
                End::Ok => ctx.progress.done(&format!(
                    "{:.2} s, footprint {} MiB (RSS peak {} MiB), {}",
                    o.wall_s,
                    mib(o.footprint_bytes()),
                    mib(o.rss_peak_bytes),
                    if variant == Variant::Engine {
                        format!("{} store faults", fmt_f(o.store_faults, 0))
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
                        "kernel-swap {} {} round {}: {m}",
                        w.name,
                        variant.name(),
                        round + 1
                    ));
                }
            }
            outcomes.push(o);
        }
    }
    Ok(outcomes)
}

/// Per round, kernel wall over engine wall where both finished.
fn round_ratios(outcomes: &[Outcome], variant: Variant) -> Vec<f64> {
    let wall = |v: Variant, round: usize| {
        outcomes
            .iter()
            .find(|o| o.variant == v && o.round == round && o.end == End::Ok)
            .map(|o| o.wall_s)
    };
    let rounds = outcomes.iter().map(|o| o.round + 1).max().unwrap_or(0);
    (0..rounds)
        .filter_map(|r| Some(wall(variant, r)? / wall(Variant::Engine, r)?.max(1e-9)))
        .collect()
}

/// Per round where the engine reached its time bound and `variant`
/// finished: the upper bound of the ratio (kernel wall over the bound).
fn round_ratio_bounds(outcomes: &[Outcome], variant: Variant, timeout_s: u32) -> Vec<f64> {
    let rounds = outcomes.iter().map(|o| o.round + 1).max().unwrap_or(0);
    (0..rounds)
        .filter_map(|r| {
            let find = |v: Variant| outcomes.iter().find(|o| o.variant == v && o.round == r);
            let (k, e) = (find(variant)?, find(Variant::Engine)?);
            (k.end == End::Ok && e.end == End::Timeout).then(|| k.wall_s / f64::from(timeout_s))
        })
        .collect()
}

fn ratios_json(outcomes: &[Outcome], timeout_s: u32) -> Value {
    let mut v = serde_json::Map::new();
    for variant in [Variant::KernelThp, Variant::Kernel4k] {
        let r = round_ratios(outcomes, variant);
        v.insert(
            format!("{}_over_engine", variant.key()),
            json!({
                "per_round": r,
                "median": median(&r),
                "upper_bounds_engine_timed_out": round_ratio_bounds(outcomes, variant, timeout_s),
            }),
        );
    }
    Value::Object(v)
}

fn table(p: &Plan, w: &Workload, outcomes: &[Outcome], zswap: bool) -> Table {
    let limit = outcomes.iter().filter_map(|o| o.limit_bytes).max();
    let mut t = Table::new(
        &format!(
            "kernel-swap: {} (`{} {}`), {} vCPUs, {} guest; engine --mem-limit {}, kernel in a memory cgroup of the engine's footprint{}; {} rounds, alternated",
            w.name,
            w.payload,
            w.args,
            p.vcpus,
            w.mem,
            w.mem_limit,
            limit.map(|l| format!(" ({} MiB)", mib(l))).unwrap_or_default(),
            p.rounds
        ),
        &[
            "variant",
            "wall s",
            "min-max",
            "rounds ok",
            "footprint MiB",
            "RSS peak MiB",
            "store faults",
            "evictions",
            "swap-ins",
            "swap-outs",
            "kernel / hugevmm",
        ],
    );
    let mut best_kernel: Option<(Variant, f64)> = None;
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
        let mut rounds_ok = format!("{} of {}", ok.len(), runs.len());
        if ooms > 0 {
            rounds_ok += &format!(", {ooms} OOM");
        }
        if timeouts > 0 {
            rounds_ok += &format!(", {timeouts} timeout");
        }
        let cell = |v: Option<f64>| v.map(|x| fmt_f(x, 0)).unwrap_or_else(|| "-".into());
        let ratio = if variant == Variant::Engine {
            "-".into()
        } else {
            let r = median(&round_ratios(outcomes, variant));
            if let Some(r) = r {
                if best_kernel.is_none_or(|(_, b)| r < b) {
                    best_kernel = Some((variant, r));
                }
            }
            match r {
                Some(x) => fmt_f(x, 2),
                None => {
                    let bounds = round_ratio_bounds(outcomes, variant, w.timeout_s);
                    match bounds.iter().copied().reduce(f64::max) {
                        Some(b) => format!("< {} (engine timed out)", fmt_f(b, 2)),
                        None => "-".into(),
                    }
                }
            }
        };
        let engine = variant == Variant::Engine;
        t.row(vec![
            variant.name().into(),
            wall,
            spread,
            rounds_ok,
            cell(med(&|o| o.footprint_bytes() as f64 / MIB)),
            cell(med(&|o| o.rss_peak_bytes as f64 / MIB)),
            if engine {
                cell(med(&|o| o.store_faults))
            } else {
                "-".into()
            },
            if engine {
                cell(med(&|o| o.evictions))
            } else {
                "-".into()
            },
            cell(med(&|o| o.swap_ins as f64)),
            cell(med(&|o| o.swap_outs as f64)),
            ratio,
        ]);
    }
    match best_kernel {
        Some((v, r)) => t.note(&format!(
            "the kernel's better backing here: {}; its wall time / hugevmm's: {} ({})",
            v.name(),
            fmt_f(r, 2),
            if r >= 1.0 {
                "hugevmm faster"
            } else {
                "the kernel faster: hugevmm loses this workload"
            }
        )),
        None if [Variant::KernelThp, Variant::Kernel4k]
            .iter()
            .any(|&v| !round_ratio_bounds(outcomes, v, w.timeout_s).is_empty()) => t.note(
            "the engine reached its time bound where a kernel variant finished: the kernel faster, hugevmm loses this workload",
        ),
        None if outcomes
            .iter()
            .filter(|o| o.variant != Variant::Engine)
            .all(|o| o.end == End::Oom) =>
        {
            t.note("the kernel was OOM-killed at this footprint in every round, both backings: no time to compare")
        }
        None => t.note("no round where both the engine and a kernel variant finished: no ratio"),
    }
    t.note("wall s: spawn to exit of `hugevmm run`, median of the rounds that finished; footprint: the run's cgroup peak charge (the engine's is the kernel runs' limit); RSS peak: ru_maxrss (wait4); kernel / hugevmm: median over rounds of that round's wall-time ratio");
    t.note(&format!(
        "swap-ins/outs: pages, pswpin/pswpout ({}); store faults/evictions: the engine's --stats-json",
        if outcomes.iter().all(|o| o.variant == Variant::Engine) {
            "-"
        } else {
            "global /proc/vmstat deltas over the run unless the cgroup's memory.stat has them"
        }
    ));
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
            store_faults: 0.0,
            evictions: 0.0,
            swap_ins: 0,
            swap_outs: 0,
            command: String::new(),
        }
    }

    #[test]
    fn keyed_reads_the_named_line_only() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(text, "oom_kill"), Some(3));
        assert_eq!(keyed(text, "oom"), None);
    }

    #[test]
    fn ratios_pair_rounds_and_leave_out_oom_and_timeouts() {
        let runs = vec![
            outcome(Variant::Engine, 0, End::Ok, 2.0),
            outcome(Variant::Kernel4k, 0, End::Ok, 5.0),
            outcome(Variant::Kernel4k, 1, End::Oom, 0.2),
            outcome(Variant::Engine, 1, End::Ok, 1.0),
            outcome(Variant::Engine, 2, End::Timeout, 20.0),
            outcome(Variant::Kernel4k, 2, End::Ok, 4.0),
        ];
        assert_eq!(round_ratios(&runs, Variant::Kernel4k), vec![2.5]);
        assert!(round_ratios(&runs, Variant::KernelThp).is_empty());
        assert_eq!(round_ratio_bounds(&runs, Variant::Kernel4k, 20), vec![0.2]);
    }
}
