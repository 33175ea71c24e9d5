//! `hugevmm bench`: benchmark suites that reproduce the seed measurements
//! (`../shared/seeds/`) on this VMM and write `results.json`,
//! `results.csv`, `results.md` and SVG plots.
//!
//! Suites (each also runnable alone):
//! - `limits`: the machine's ceilings (O_DIRECT disk, memcpy, codecs); every
//!   other suite states its swap I/O as a fraction of them.
//! - `swap-w-seq`: seed 000 (vm-scalability case-swap-w-seq) inside the
//!   guest, 2 MiB against 4 KiB swap units, plus randwrite.
//! - `pageout`: seed 001, a timed "evict everything" per store next to the
//!   kernel's `madvise(MADV_PAGEOUT)` on a host swap file.
//! - `fault-latency`: the distribution of fault service time per source
//!   against the floor measured in the same run (seed 004: worst case, not
//!   only the average).
//! - `fault-4k` (not in `all`): where one 4 KiB store fault's time goes:
//!   the guest-observed cost per fault, the engine's service time and the
//!   rest, the bare userfault round trip, the service's parts (store
//!   reads, install ioctls, the eviction's page writes one by one against
//!   batched) and the CPU time and context switches per fault.
//! - `encryption`: seqwrite on the file store with `--swap-encrypt` on and
//!   off, interleaved, beside the cipher's own throughput.
//! - `nbd`: seqwrite on an NBD store over loopback against fio's nbd
//!   engine on the same server, same request size and queue depth.
//! - `vhost-user`: seqwrite and key-value on a vhost-user-blk store
//!   (qemu-storage-daemon) against the file store on the same file, with
//!   host CPU per GiB moved, beside fio's io_uring engine on that file.
//! - `linux` (opt-in, not in `all`): a stock Linux kernel with a busybox
//!   tmpfs workload under a limit, per unit, nested in QEMU where this
//!   host cannot run guest kernels.
//! - `workloads` (alias `kernel-swap`; opt-in, not in `all`; root): six
//!   workloads (seqwrite, randwrite, mixed, verify, key-value, phases)
//!   under the engine's three units and under the host kernel's own swap
//!   in a memory cgroup of auto's footprint (docs/KERNEL_BASELINE.md).
//! - `report`: every suite whose figures README.md and docs/BENCHMARKS.md
//!   publish, into one results file; `report --render FILE` rewrites the
//!   docs' generated tables from such a file ([`render`]).
//!
//! The VM runs are `hugevmm run` subprocesses: a run's figures come from
//! its `--stats-json`, exactly what a user would get, and a crashing run
//! cannot take the bench down with it. The crate is its own binary,
//! `hugevmm-bench` (`src/main.rs`), so that the VMM does not link the
//! plotting code; `hugevmm bench ARGS` replaces itself with the
//! `hugevmm-bench` beside it and names itself in [`HUGEVMM_BIN`], the
//! binary every VM run of the bench uses (without it: the `hugevmm`
//! beside `hugevmm-bench`).

#![deny(missing_docs)]

mod encryption;
mod fault_4k;
mod fault_latency;
mod figures;
mod fio;
mod floor;
mod hist;
mod host_budget;
mod host_pageout;
mod interrupt;
mod limits;
mod linux;
mod nbd;
mod pageout;
mod plots;
mod prime;
mod progress;
pub mod render;
mod report;
mod runner;
mod self_sizing;
mod swap_w_seq;
mod vhost_user;
mod workloads;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

use limits::Limits;
use progress::Progress;
use report::Report;

/// The environment variable naming the `hugevmm` binary the VM runs use;
/// `hugevmm bench` sets it to itself.
pub const HUGEVMM_BIN: &str = "HUGEVMM_BIN";

/// Which suite to run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// seqwrite, randwrite and mixed (scattered hot pages beside a stream) under a memory limit, 2m vs 4k vs auto units.
    SwapWSeq,
    /// Time to evict 256 MiB to each store, next to the kernel's MADV_PAGEOUT.
    Pageout,
    /// Fault service time per source against the measured floor.
    FaultLatency,
    /// Disk, memcpy and codec ceilings of this machine.
    Limits,
    /// seqwrite on the file store with --swap-encrypt on vs off, and the cipher's own throughput.
    Encryption,
    /// seqwrite on an NBD store over loopback vs fio's nbd engine on the same server.
    Nbd,
    /// seqwrite and key-value on a vhost-user-blk store (qemu-storage-daemon) vs the file store on the same file, with host CPU per GiB, beside fio io_uring on that file.
    VhostUser,
    /// A Debian kernel with a busybox tmpfs workload under a limit, auto vs 4k vs 2m (nested in QEMU TCG on hosts without VMX/SVM; not in `all`).
    Linux,
    /// The workload suite against the host kernel's own swap: seqwrite, randwrite, mixed, verify, key-value and phases under the engine's auto, 2m and 4k units and, without the engine, in a memory cgroup of auto's footprint with a host swap file, THP and 4k backing (root; not in `all`).
    #[value(alias = "kernel-swap")]
    Workloads,
    /// Several VMs with changing active sets under one budget: `hugevmm host` against an equal static split (not in `all`).
    HostBudget,
    /// Memory that sizes itself: the phases payload with no limit, under a ladder of fixed limits and under `--mem-limit auto`, then `host-budget` (not in `all`).
    SelfSizing,
    /// All of the above but `linux` and `workloads` (limits first).
    All,
    /// Where one 4 KiB store fault's time goes: guest-observed cost, engine service, userfault round trip, store reads, installs, eviction writes, CPU and context switches per fault (not in `all`).
    #[value(name = "fault-4k")]
    Fault4k,
    /// The suites whose figures README.md and docs/BENCHMARKS.md publish (limits, swap-w-seq, pageout, fault-latency, vhost-user), into one results file; with --render FILE, rewrite the docs' tables from such a file instead (or docs/KERNEL_BASELINE.md's from a `workloads` results file).
    Report,
}

impl Suite {
    fn name(self) -> &'static str {
        match self {
            Suite::SwapWSeq => "swap-w-seq",
            Suite::Pageout => "pageout",
            Suite::FaultLatency => "fault-latency",
            Suite::Fault4k => "fault-4k",
            Suite::Limits => "limits",
            Suite::Encryption => "encryption",
            Suite::Nbd => "nbd",
            Suite::VhostUser => "vhost-user",
            Suite::Linux => "linux",
            Suite::Workloads => "workloads",
            Suite::HostBudget => "host-budget",
            Suite::SelfSizing => "self-sizing",
            Suite::All => "all",
            Suite::Report => "report",
        }
    }

    /// Whether the suite runs VMs, with the `hugevmm` binary.
    fn runs_vms(self) -> bool {
        self != Suite::Limits
    }
}

/// Arguments of `hugevmm bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Suite to run.
    #[arg(value_enum)]
    pub suite: Suite,
    /// Small sizes and single runs, for a quick look (minutes rather than
    /// the full mode's tens of minutes; how long depends on the machine:
    /// README "Results" has this one's). Without it (full mode) the sizes
    /// and repetitions are the ones docs/BENCHMARKS.md reports.
    #[arg(long)]
    pub quick: bool,
    /// Directory for results.json, results.csv, results.md, the SVG plots
    /// and the raw per-run statistics (created if missing).
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Directory on a real disk (one that accepts O_DIRECT) for swap store
    /// files and the host swap file; everything the bench puts there is
    /// removed afterwards.
    #[arg(long, default_value = "/var/tmp")]
    pub store_dir: PathBuf,
    /// Do not touch and free each VM run's memory before starting it. By
    /// default the bench does, because a host that returns free memory to
    /// its own hypervisor makes a run's first touch of memory up to 15x
    /// slower after an idle moment (see docs/BENCHMARKS.md); this flag
    /// measures that cost instead.
    #[arg(long)]
    pub no_prime: bool,
    /// With `report` only: run nothing, and rewrite the generated tables
    /// of README.md and docs/BENCHMARKS.md (found in the current
    /// directory, the repository's top) from this results file, or those
    /// of docs/KERNEL_BASELINE.md from a `workloads` results file.
    #[arg(long, value_name = "RESULTS_FILE")]
    pub render: Option<PathBuf>,
}

/// Quick or full sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--quick`.
    Quick,
    /// The default.
    Full,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// What every suite needs: sizes, paths, the progress printer, the report
/// being built, and the ceilings once measured.
pub struct Ctx {
    /// Quick or full.
    pub mode: Mode,
    /// `--out`.
    pub out_dir: PathBuf,
    /// `--store-dir`.
    pub store_dir: PathBuf,
    /// The `hugevmm` binary, run as `hugevmm run` for every VM run
    /// ([`hugevmm_binary`]).
    pub hugevmm: PathBuf,
    /// Per-step lines on stderr.
    pub progress: Progress,
    /// Everything measured so far.
    pub report: Report,
    /// Effective uid 0 (needed for swapon).
    pub is_root: bool,
    /// Why VM runs cannot work here, if they cannot (`/dev/kvm`).
    pub kvm_unusable: Option<String>,
    /// Ceilings from the `limits` suite, measured once per invocation.
    pub limits: Option<Limits>,
    /// Prime the host's memory before each VM run (not `--no-prime`).
    pub prime: bool,
}

impl Ctx {
    /// True in `--quick` mode.
    pub fn quick(&self) -> bool {
        self.mode == Mode::Quick
    }

    /// Records that something was skipped and says so at once.
    pub fn skip(&mut self, what: &str, reason: &str) {
        let line = format!("SKIP {what}: {reason}");
        self.progress.note(&line);
        self.report.skipped.push(line);
    }

    /// The ceilings, measuring them (quick sizes) if no `limits` suite ran
    /// yet in this invocation: every suite reports its I/O as a fraction
    /// of them.
    pub fn limits(&mut self) -> Result<Limits> {
        if let Some(l) = &self.limits {
            return Ok(l.clone());
        }
        let suite = self.progress.current_suite();
        self.progress
            .suite("limits (quick sizes: the ceilings this suite's fractions need)");
        let l = limits::measure(self, Mode::Quick)?;
        self.limits = Some(l.clone());
        self.progress.suite(&suite);
        Ok(l)
    }

    /// Where a run's raw statistics go.
    pub fn raw_path(&self, file: &str) -> PathBuf {
        self.out_dir.join("runs").join(file)
    }

    /// Runs one VM as a progress step: prints `label`, then `figure` of the
    /// result. A run that fails is reported (progress line and the report's
    /// failures) and gives `None`, so the suite goes on with the others;
    /// only an interrupt is an error.
    pub fn run_vm(
        &mut self,
        spec: &runner::RunSpec,
        label: &str,
        figure: impl Fn(&runner::RunResult) -> String,
    ) -> Result<Option<runner::RunResult>> {
        interrupt::check()?;
        if self.kvm_unusable.is_some() {
            // Said once at the start (SKIP VM runs); not a failure.
            return Ok(None);
        }
        self.progress.start(label);
        match runner::run(self, spec) {
            Ok(r) => {
                self.progress.done(&figure(&r));
                Ok(Some(r))
            }
            Err(e) => {
                interrupt::check()?;
                let msg = format!("{e:#}");
                self.progress.failed(&msg);
                self.report.failures.push(format!("{label}: {msg}"));
                Ok(None)
            }
        }
    }
}

/// Checks that /dev/kvm can be opened read-write, as `hugevmm run` will.
fn kvm_problem() -> Option<String> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => None,
        Err(e) => Some(format!(
            "cannot open /dev/kvm ({e}); VM runs need KVM: run as root or in the group owning /dev/kvm"
        )),
    }
}

fn prepare_dirs(args: &BenchArgs) -> Result<()> {
    std::fs::create_dir_all(args.out.join("runs"))
        .with_context(|| format!("cannot create the output directory {}", args.out.display()))?;
    let meta = std::fs::metadata(&args.store_dir)
        .with_context(|| format!("--store-dir {} is not usable", args.store_dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "--store-dir {} is not a directory",
            args.store_dir.display()
        );
    }
    Ok(())
}

/// `report --render FILE`: the docs' tables from a results file.
fn render_docs(args: &BenchArgs, results: &std::path::Path) -> Result<i32> {
    if args.suite != Suite::Report {
        bail!(
            "--render is an option of `hugevmm bench report`, not of `{}`",
            args.suite.name()
        );
    }
    let file = render::read_results(results)?;
    let mismatched = render::headline_mismatches(&file);
    if !mismatched.is_empty() {
        bail!(
            "{}: its headline figures {} are not the ones its runs give; render only a file that `hugevmm bench report` wrote",
            results.display(),
            mismatched.join(", ")
        );
    }
    let changed = render::write_docs(std::path::Path::new("."), results)?;
    if changed.is_empty() {
        eprintln!(
            "hugevmm bench: the tables already match {}",
            results.display()
        );
    }
    for path in changed {
        eprintln!(
            "hugevmm bench: rewrote the tables of {} from {}",
            path.display(),
            results.display()
        );
    }
    Ok(0)
}

/// Whether `program` is on the PATH (a suite that starts it skips, saying
/// which package has it, when it is not).
fn have_program(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The `hugevmm` binary the VM runs use: the one [`HUGEVMM_BIN`] names,
/// else the `hugevmm` beside this binary (`target/release/hugevmm-bench`
/// runs `target/release/hugevmm`).
pub fn hugevmm_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(HUGEVMM_BIN) {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe().context("cannot find this binary (current_exe)")?;
    Ok(me.with_file_name("hugevmm"))
}

/// Runs a suite; returns the process exit status.
pub fn run(args: BenchArgs) -> Result<i32> {
    if let Some(results) = &args.render {
        return render_docs(&args, results);
    }
    let hugevmm = hugevmm_binary()?;
    if args.suite.runs_vms() && !hugevmm.is_file() {
        let release = hugevmm.parent().and_then(Path::file_name) == Some("release".as_ref());
        bail!(
            "the {} suite runs VMs with {}, which does not exist: build it (`cargo build{} -p vmm`), start the bench as `hugevmm bench`, or name the binary in {HUGEVMM_BIN}",
            args.suite.name(),
            hugevmm.display(),
            if release { " --release" } else { "" }
        );
    }
    let started = Instant::now();
    prepare_dirs(&args)?;
    interrupt::install();
    let mode = if args.quick { Mode::Quick } else { Mode::Full };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let mut ctx = Ctx {
        mode,
        out_dir: args.out.clone(),
        store_dir: args.store_dir.clone(),
        hugevmm,
        progress: Progress::new(),
        report: Report::default(),
        is_root,
        kvm_unusable: kvm_problem(),
        limits: None,
        prime: !args.no_prime,
    };
    let command = format!(
        "hugevmm bench {}{}{} --out {} --store-dir {}",
        args.suite.name(),
        if args.quick { " --quick" } else { "" },
        if args.no_prime { " --no-prime" } else { "" },
        args.out.display(),
        args.store_dir.display()
    );
    ctx.progress.note(&format!(
        "{command}  ({} mode; {}; {})",
        mode.name(),
        report::machine_summary(),
        if ctx.prime {
            "each VM run's memory touched and freed just before it (--no-prime: not)"
        } else {
            "memory not primed before VM runs"
        }
    ));
    if let Some(why) = ctx.kvm_unusable.clone() {
        ctx.skip("VM runs", &why);
    }

    let suites: Vec<Suite> = match args.suite {
        Suite::All => vec![
            Suite::Limits,
            Suite::SwapWSeq,
            Suite::Pageout,
            Suite::FaultLatency,
            Suite::Encryption,
            Suite::Nbd,
            Suite::VhostUser,
        ],
        // What README.md and docs/BENCHMARKS.md publish.
        Suite::Report => vec![
            Suite::Limits,
            Suite::SwapWSeq,
            Suite::Pageout,
            Suite::FaultLatency,
            Suite::VhostUser,
        ],
        one => vec![one],
    };
    let mut failures = Vec::new();
    for suite in suites {
        if interrupt::requested() {
            break;
        }
        ctx.progress.suite(suite.name());
        let result = match suite {
            Suite::Limits => limits::run(&mut ctx),
            Suite::SwapWSeq => swap_w_seq::run(&mut ctx),
            Suite::Pageout => pageout::run(&mut ctx),
            Suite::FaultLatency => fault_latency::run(&mut ctx),
            Suite::Fault4k => fault_4k::run(&mut ctx),
            Suite::Encryption => encryption::run(&mut ctx),
            Suite::Nbd => nbd::run(&mut ctx),
            Suite::VhostUser => vhost_user::run(&mut ctx),
            Suite::Linux => linux::run(&mut ctx),
            Suite::Workloads => workloads::run(&mut ctx),
            Suite::HostBudget => host_budget::run(&mut ctx),
            Suite::SelfSizing => self_sizing::run(&mut ctx),
            Suite::All | Suite::Report => unreachable!("expanded above"),
        };
        if let Err(e) = result {
            // One suite failing must not lose what the others measured:
            // report it, keep going, and exit non-zero at the end.
            let msg = format!("suite {} failed: {e:#}", suite.name());
            ctx.progress.note(&msg);
            failures.push(msg);
            if interrupt::requested() {
                break;
            }
        }
    }

    ctx.report.command = command;
    ctx.report.argv = std::env::args().collect();
    ctx.report.mode = mode.name().to_string();
    ctx.report.wall_s = started.elapsed().as_secs_f64();
    ctx.report.failures.extend(failures.iter().cloned());
    ctx.report.finish_headline();
    let written = ctx.report.write(&ctx.out_dir)?;
    ctx.report.print_tables();
    if args.suite == Suite::Report {
        let json_path = ctx.out_dir.join("results.json");
        let published = ctx.out_dir.join("published.md");
        // Read back: the tables come from the file, as --render's do.
        let results = render::read_results(&json_path)?;
        let mut md = String::new();
        for name in [
            "summary",
            "figures",
            "fio",
            "swap-w-seq",
            "pageout",
            "fault-latency",
            "vhost-user",
            "limits",
        ] {
            md += &format!("## {name}\n\n{}\n", render::block(&results, name)?);
        }
        std::fs::write(&published, md)
            .with_context(|| format!("cannot write {}", published.display()))?;
        eprintln!(
            "hugevmm bench: the docs' tables from this run are in {}; to publish them: cp {} docs/results/{}.json && hugevmm bench report --render docs/results/{}.json",
            published.display(),
            json_path.display(),
            mode.name(),
            mode.name()
        );
    }
    // The suites whose results file renders into a doc of its own: how to
    // publish a run that had no failure.
    let own_doc = match args.suite {
        Suite::Workloads => Some(("docs/KERNEL_BASELINE.md", "workloads")),
        Suite::Fault4k => Some(("docs/BENCHMARKS.md", "fault-4k")),
        Suite::SelfSizing => Some(("docs/SELF_SIZING.md", "self-sizing")),
        _ => None,
    };
    if let (Some((doc, file)), true) = (own_doc, ctx.report.failures.is_empty()) {
        let committed = format!("docs/results/{file}-{}.json", mode.name());
        eprintln!(
            "hugevmm bench: to publish this run's tables in {doc}: cp {} {committed} && hugevmm bench report --render {committed}",
            ctx.out_dir.join("results.json").display(),
        );
    }
    eprintln!(
        "hugevmm bench: {} in {:.0} s; wrote {}",
        if ctx.report.failures.is_empty() {
            "done"
        } else {
            "finished with failures"
        },
        ctx.report.wall_s,
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if interrupt::requested() {
        eprintln!("hugevmm bench: interrupted; partial results written");
        return Ok(130);
    }
    Ok(if ctx.report.failures.is_empty() { 0 } else { 1 })
}
