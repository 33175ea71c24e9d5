//! Command line: parsing, the run command, and turning errors into messages.

use crate::balloon_handle;
use crate::console::ConsoleSink;
use crate::exit::{ExitKind, RunEnd, EXIT_CONFIG};
use crate::image_kind::{recognize, ImageKind};
use crate::input_file::{open_checked, read_bounded};
use crate::linux::{LinuxBootConfig, VirtioAnnounce};
use crate::machine_devices::DeviceOptions;
use crate::outputs::{self, OutputFile};
use crate::payload::layout::MAX_VCPUS;
use crate::signals::StopSignals;
use crate::stats;
use crate::swap_setup::{self, SwapOptions};
use crate::vm::{self, Guest, Payload, RunConfig};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use devices::virtio::DiskSpec;
use guestmem::{format_size, parse_size, Backing, Layout};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use swap::engine::SwapUnit;
use swap::store::StoreSpec;

#[derive(Parser)]
#[command(
    name = "hugevmm",
    version,
    about = "A KVM VMM that keeps guest RAM in 2 MiB mappings"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a payload (a guest program following docs/PAYLOAD_PROTOCOL.md).
    Run(Box<RunArgs>),
    /// Send one command to a running VM's control socket (see
    /// `hugevmm run --api-socket`) and print the JSON reply.
    Ctl(crate::control::client::CtlArgs),
    /// List the built-in payloads.
    Payloads,
    /// Run a benchmark suite (see README, "Results").
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Guest RAM size, a multiple of 2 MiB (e.g. 512M, 4G).
    #[arg(long, default_value = "512M", value_parser = parse_size_arg)]
    mem: u64,
    /// Number of vCPUs (one host thread each).
    #[arg(long, default_value_t = 1)]
    vcpus: u32,
    /// Host backing of guest RAM: thp (2 MiB transparent huge pages),
    /// hugetlb (2 MiB hugetlbfs pages, needs /proc/sys/vm/nr_hugepages) or
    /// 4k (small pages, the baseline).
    #[arg(long, default_value = "thp")]
    backing: Backing,
    /// Built-in payload to run (see `hugevmm payloads`).
    #[arg(
        long,
        conflicts_with_all = ["payload_file", "kernel"],
        required_unless_present_any = ["payload_file", "kernel"]
    )]
    payload: Option<String>,
    /// Payload ELF file to run.
    #[arg(long, conflicts_with = "kernel")]
    payload_file: Option<PathBuf>,
    /// Linux kernel to boot: a bzImage (decompressed on the host) or an ELF
    /// vmlinux.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Initial ramdisk for --kernel (a regular file, at most --mem).
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// Kernel command line for --kernel (virtio_mmio.device= words for the
    /// devices are appended, see --virtio-announce) [default: console=ttyS0
    /// earlyprintk=serial,ttyS0,115200 panic=-1].
    #[arg(long)]
    cmdline: Option<String>,
    /// How a Linux guest learns about the --disk and --balloon devices:
    /// ACPI DSDT entries (what stock distribution kernels read),
    /// virtio_mmio.device= words on the command line (kernels built with
    /// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), or both.
    /// [default: both]
    #[arg(long, value_enum)]
    virtio_announce: Option<VirtioAnnounce>,
    /// virtio-blk disk: a raw image, PATH[,readonly]; repeat for more.
    #[arg(long = "disk")]
    disks: Vec<DiskSpec>,
    /// Add a virtio-balloon device (free page reporting drops whole free
    /// 2 MiB chunks).
    #[arg(long)]
    balloon: bool,
    /// Initial balloon target: how much guest RAM the guest is asked to
    /// give back (a multiple of 4K, at most --mem; e.g. 256M). Change it
    /// later with `hugevmm ctl ... balloon SIZE`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    balloon_target: Option<u64>,
    /// Serve a control socket at PATH while the VM runs (one JSON reply
    /// line per command line: `balloon SIZE`, `balloon-stats`, `stats`,
    /// `mem-limit SIZE|none`, `pageout`, `quit`, `help`); talk to it with
    /// `hugevmm ctl --api-socket PATH`. A stale
    /// socket there is replaced; the file is removed when the VM ends.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Write the Linux serial console to this file instead of stdout.
    #[arg(long)]
    console_log: Option<PathBuf>,
    /// Argument string passed verbatim to the payload (`key=value` words).
    #[arg(long)]
    payload_args: Option<String>,
    /// Write run statistics as a JSON object to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Write how the run ended to this file, as one JSON object:
    /// `{"exit_status":N,"exit_kind":"payload|quit|config|timeout|vm-failure|signal","message":...}`
    /// (a payload can exit with any status, so the number alone cannot say).
    #[arg(long, value_name = "PATH")]
    status_file: Option<PathBuf>,
    /// End the run (exit 124) if the payload has not finished after this many seconds.
    #[arg(long)]
    timeout: Option<f64>,
    /// Cap resident guest RAM at SIZE, swapping the rest to --swap-store
    /// (starts the swap engine). A multiple of the swap unit, at least
    /// 8 MiB per vCPU + 8 MiB; changeable at run time through
    /// --api-socket (`hugevmm ctl ... mem-limit SIZE`).
    #[arg(long, value_parser = parse_size_arg)]
    mem_limit: Option<u64>,
    /// Where evicted guest RAM goes: default (an unlinked O_DIRECT file in
    /// $TMPDIR or /var/tmp), file:PATH[,size=SIZE], mem:lz4[,size=SIZE],
    /// mem:zstd[,size=SIZE]. Giving a store starts the swap engine.
    #[arg(long)]
    swap_store: Option<StoreSpec>,
    /// Swap unit: 2m (whole 2 MiB chunks, restored as huge mappings) or 4k
    /// (per-page baseline) [default: 2m].
    #[arg(long)]
    swap_unit: Option<SwapUnit>,
    /// Threads serving guest memory faults (swap engine), 1 to 32
    /// [default: 1].
    #[arg(long)]
    fault_threads: Option<usize>,
    /// Nice value of the fault threads, -20 to 19; below 0 they are served
    /// before the vCPU threads when vCPUs outnumber cores (needs root; 0 =
    /// same as vCPUs) [default: -10].
    #[arg(long, allow_hyphen_values = true)]
    fault_thread_nice: Option<i32>,
    /// Test knob (docs/SPLIT_CHUNKS.md): every Nth restore of a huge chunk
    /// splits it into 4 KiB pages and every Nth page fault on a split chunk
    /// tries to collapse it again, 1 to 1000000. Needs --swap-unit 2m and
    /// --backing thp.
    #[arg(long, hide = true)]
    force_split_every: Option<u32>,
    /// Write a sample of the run's figures (resident memory, faults, KVM
    /// mappings) every --stats-interval milliseconds to this file, one JSON
    /// object per line.
    #[arg(long)]
    stats_timeline: Option<PathBuf>,
    /// Sampling interval for --stats-timeline, in milliseconds, 1 to
    /// 3600000 [default: 100].
    #[arg(long)]
    stats_interval: Option<u64>,
    /// After the payload finished, evict all guest RAM to the store and
    /// report how long it took (`pageout` in --stats-json).
    #[arg(long)]
    pageout: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Serial console with early output, and a reboot (ending the VM) on panic.
const DEFAULT_CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1";
/// Most `--fault-threads`: as many as vCPUs can fault at once.
const MAX_FAULT_THREADS: usize = MAX_VCPUS as usize;
/// Longest `--stats-interval`: an hour.
const MAX_STATS_INTERVAL_MS: u64 = 3_600_000;
/// Default `--stats-interval`.
const DEFAULT_STATS_INTERVAL_MS: u64 = 100;
/// Default `--fault-thread-nice` (see its help).
const DEFAULT_FAULT_THREAD_NICE: i32 = -10;
/// How much of a kernel file validation reads to tell what it is: the
/// bzImage setup header and an ELF's program headers lie well inside.
const KERNEL_HEAD_BYTES: u64 = 64 << 10;
/// Why an input file is bounded by guest RAM.
const MUST_FIT_IN_RAM: &str = "guest RAM, which it is loaded into";

/// Refuses `option` when it does not apply to this run, saying why.
fn not_applicable(given: bool, option: &str, why: &str) -> Result<()> {
    if given {
        bail!("{option} {why}");
    }
    Ok(())
}

/// The payload to run, read and checked.
fn load_payload(args: &RunArgs) -> Result<Payload> {
    if let Some(path) = &args.payload_file {
        let elf = read_bounded("--payload-file", path, args.mem, MUST_FIT_IN_RAM)?;
        if matches!(recognize(&elf), ImageKind::BzImage | ImageKind::Vmlinux) {
            bail!(
                "--payload-file {} is a Linux kernel, not a payload: boot it with --kernel {0}",
                path.display()
            );
        }
        return Ok(Payload {
            name: path.display().to_string(),
            elf,
        });
    }
    let name = args.payload.as_deref().unwrap_or_default();
    let builtin = payloads::find(name).with_context(|| {
        let names: Vec<&str> = payloads::all().iter().map(|p| p.name).collect();
        format!(
            "no built-in payload named '{name}'; built-in payloads: {}",
            names.join(", ")
        )
    })?;
    Ok(Payload {
        name: builtin.name.to_string(),
        elf: builtin.elf.to_vec(),
    })
}

/// Checks a kernel and initrd before anything is allocated: regular
/// files no larger than guest RAM, and the kernel really a kernel.
fn check_kernel_inputs(kernel: &Path, initrd: Option<&Path>, mem_bytes: u64) -> Result<()> {
    // The headers tell a payload from a kernel; the whole image is read
    // once, when it is loaded (bounded the same way).
    let (file, _) = open_checked("--kernel", kernel, mem_bytes, MUST_FIT_IN_RAM)?;
    let mut head = Vec::with_capacity(KERNEL_HEAD_BYTES as usize);
    file.take(KERNEL_HEAD_BYTES)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read --kernel {}", kernel.display()))?;
    if recognize(&head) == ImageKind::PayloadElf {
        bail!(
            "--kernel {} is a hugevmm payload (an ELF linked at low addresses), not a Linux kernel: run it with --payload-file {0}",
            kernel.display()
        );
    }
    if let Some(initrd) = initrd {
        open_checked("--initrd", initrd, mem_bytes, MUST_FIT_IN_RAM)?;
    }
    Ok(())
}

/// Every check of `run`'s options that needs no resource: ranges, options
/// that do not apply to this run, input files, output paths. Nothing the
/// user named is opened for writing before this has passed.
fn validate(args: &RunArgs) -> Result<(Guest, Option<SwapOptions>, u32)> {
    if args.vcpus == 0 || args.vcpus > MAX_VCPUS {
        bail!(
            "--vcpus {} is out of range: give 1 to {MAX_VCPUS}",
            args.vcpus
        );
    }
    Layout::new(args.mem).context("invalid --mem")?;
    let is_linux = args.kernel.is_some();
    let for_kernels = "applies to --kernel only: drop it (a payload has no kernel command line, initrd or serial console; its output goes to stdout)";
    not_applicable(!is_linux && args.initrd.is_some(), "--initrd", for_kernels)?;
    not_applicable(
        !is_linux && args.cmdline.is_some(),
        "--cmdline",
        for_kernels,
    )?;
    not_applicable(
        !is_linux && args.virtio_announce.is_some(),
        "--virtio-announce",
        for_kernels,
    )?;
    not_applicable(
        !is_linux && args.console_log.is_some(),
        "--console-log",
        for_kernels,
    )?;
    not_applicable(
        is_linux && args.payload_args.is_some(),
        "--payload-args",
        "applies to payloads only: a kernel's arguments go in --cmdline",
    )?;
    not_applicable(
        args.balloon_target.is_some() && !args.balloon,
        "--balloon-target",
        "needs --balloon: add it or drop the target",
    )?;
    let engine = args.mem_limit.is_some() || args.swap_store.is_some();
    let for_engine = "configures the swap engine, which runs only with --mem-limit or --swap-store: add one of them or drop this option";
    not_applicable(
        !engine && args.swap_unit.is_some(),
        "--swap-unit",
        for_engine,
    )?;
    not_applicable(
        !engine && args.fault_threads.is_some(),
        "--fault-threads",
        for_engine,
    )?;
    not_applicable(
        !engine && args.fault_thread_nice.is_some(),
        "--fault-thread-nice",
        for_engine,
    )?;
    not_applicable(!engine && args.pageout, "--pageout", for_engine)?;
    not_applicable(
        !engine && args.force_split_every.is_some(),
        "--force-split-every",
        for_engine,
    )?;
    if let Some(n) = args.force_split_every {
        if !(1..=1_000_000).contains(&n) {
            bail!(
                "--force-split-every {n} is out of range: give 1 (split every restore) to 1000000"
            );
        }
        if args.swap_unit == Some(SwapUnit::Small4K) || args.backing != Backing::Thp {
            bail!("--force-split-every splits 2 MiB chunks of THP memory: use --swap-unit 2m and --backing thp");
        }
    }
    not_applicable(
        args.stats_interval.is_some() && args.stats_timeline.is_none(),
        "--stats-interval",
        "sets the sampling of --stats-timeline: add --stats-timeline PATH or drop it",
    )?;
    if let Some(ms) = args.stats_interval {
        if !(1..=MAX_STATS_INTERVAL_MS).contains(&ms) {
            bail!("--stats-interval {ms} is out of range: give 1 to {MAX_STATS_INTERVAL_MS} milliseconds");
        }
    }
    let fault_threads = args.fault_threads.unwrap_or(1);
    if !(1..=MAX_FAULT_THREADS).contains(&fault_threads) {
        bail!("--fault-threads {fault_threads} is out of range: give 1 to {MAX_FAULT_THREADS}");
    }
    let fault_thread_nice = args.fault_thread_nice.unwrap_or(DEFAULT_FAULT_THREAD_NICE);
    if !(-20..=19).contains(&fault_thread_nice) {
        bail!("--fault-thread-nice {fault_thread_nice} is out of range: give -20 (first served) to 19");
    }
    if let Some(secs) = args.timeout {
        if !(secs.is_finite() && secs > 0.0) {
            bail!("--timeout must be a positive number of seconds");
        }
    }
    let swap_unit = args.swap_unit.unwrap_or_default();
    if let Some(limit_bytes) = args.mem_limit {
        swap_setup::check_mem_limit(limit_bytes, swap_unit.bytes(), args.vcpus, args.mem)
            .context("invalid --mem-limit")?;
    }
    let balloon_target_pages = match args.balloon_target {
        Some(bytes) => {
            balloon_handle::target_pages(bytes, args.mem).context("invalid --balloon-target")?
        }
        None => 0,
    };
    for (option, path) in [
        ("--stats-json", &args.stats_json),
        ("--stats-timeline", &args.stats_timeline),
        ("--status-file", &args.status_file),
        ("--console-log", &args.console_log),
    ] {
        if let Some(path) = path {
            outputs::check_output_path(option, path)?;
        }
    }
    if let Some(socket) = &args.api_socket {
        // The socket itself is created (replacing a stale one) when the VM
        // is built; its directory must exist.
        let parent = socket.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = parent {
            if !dir.is_dir() {
                bail!(
                    "--api-socket {}: {} is not an existing directory",
                    socket.display(),
                    dir.display()
                );
            }
        }
    }
    let guest = match &args.kernel {
        Some(kernel) => {
            check_kernel_inputs(kernel, args.initrd.as_deref(), args.mem)?;
            Guest::Linux(LinuxBootConfig {
                kernel: kernel.clone(),
                initrd: args.initrd.clone(),
                cmdline: args
                    .cmdline
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CMDLINE.into()),
                virtio_announce: args.virtio_announce.unwrap_or_default(),
            })
        }
        None => Guest::Payload {
            payload: load_payload(args)?,
            args: args.payload_args.clone().unwrap_or_default(),
        },
    };
    let swap = engine.then(|| SwapOptions {
        mem_limit_bytes: args.mem_limit,
        store: args.swap_store.clone().unwrap_or(StoreSpec::Default),
        unit: swap_unit,
        fault_threads,
        fault_thread_nice,
        force_split_every: args.force_split_every,
    });
    Ok((guest, swap, balloon_target_pages))
}

/// The output files, opened once the options are valid and before the VM
/// is built.
struct Outputs {
    stats_json: Option<OutputFile>,
    stats_timeline: Option<OutputFile>,
}

impl Outputs {
    fn open(args: &RunArgs) -> Result<Self> {
        let open = |option, path: &Option<PathBuf>| {
            path.as_deref()
                .map(|p| OutputFile::open(option, p))
                .transpose()
        };
        Ok(Self {
            stats_json: open("--stats-json", &args.stats_json)?,
            stats_timeline: open("--stats-timeline", &args.stats_timeline)?,
        })
    }
}

/// Validates, acquires and runs; `Err` is a configuration or setup error.
fn run_checked(args: &RunArgs) -> Result<RunEnd> {
    let (guest, swap, balloon_target_pages) = validate(args)?;
    let outputs = Outputs::open(args)?;
    let stop_signals = StopSignals::install()?;
    let payload_name = guest.name();
    let config = RunConfig {
        mem_bytes: args.mem,
        backing: args.backing,
        vcpus: args.vcpus,
        guest,
        devices: DeviceOptions {
            disks: args.disks.clone(),
            balloon: args.balloon,
            balloon_target_pages,
            console_log: args.console_log.clone(),
        },
        timeout: args.timeout.map(Duration::from_secs_f64),
        swap,
        sample_interval: args.stats_timeline.as_ref().map(|_| {
            Duration::from_millis(args.stats_interval.unwrap_or(DEFAULT_STATS_INTERVAL_MS))
        }),
        pageout_at_exit: args.pageout,
        api_socket: args.api_socket.clone(),
        stop_signals: Some(stop_signals),
    };
    let console: ConsoleSink = Arc::new(Mutex::new(Box::new(std::io::stdout())));
    let outcome = vm::run(config, console)?;
    if let Some(failure) = &outcome.failure {
        eprintln!("hugevmm: {failure}");
    }
    print_summary(args, &payload_name, &outcome);
    let summary = stats::RunSummary {
        payload: &payload_name,
        vcpus: args.vcpus,
        mem_bytes: args.mem,
        backing: args.backing,
        outcome: &outcome,
    };
    // The run is over: an output that cannot be written is reported, but
    // the guest's status stays the process's status.
    if let Some(out) = outputs.stats_timeline {
        let mut text = String::new();
        for sample in &outcome.timeline {
            text += &stats::sample_json(sample).to_string();
            text.push('\n');
        }
        if let Err(e) = out.replace_with(&text) {
            eprintln!("hugevmm: error: {e:#}");
        }
    }
    if let Some(out) = outputs.stats_json {
        let json = serde_json::to_string_pretty(&summary.to_json()).expect("stats serialize");
        if let Err(e) = out.replace_with(&(json + "\n")) {
            eprintln!("hugevmm: error: {e:#}");
        }
    }
    Ok(RunEnd {
        status: outcome.exit_status,
        kind: outcome.exit_kind,
        message: outcome.failure.clone(),
    })
}

fn print_summary(args: &RunArgs, payload_name: &str, outcome: &vm::RunOutcome) {
    eprintln!(
        "hugevmm: {} exited {} after {:.3} s on {} vCPUs, {} {} RAM; KVM stage-2 mappings: {} x 4K, {} x 2M, {} x 1G",
        payload_name,
        outcome.exit_status,
        outcome.elapsed.as_secs_f64(),
        args.vcpus,
        format_size(args.mem),
        args.backing,
        outcome.stage2.pages_4k,
        outcome.stage2.pages_2m,
        outcome.stage2.pages_1g
    );
    if let Some(swap) = &outcome.swap {
        eprintln!(
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
        );
        let split = &swap.split;
        let splits: u64 = split.splits_by_origin.iter().sum();
        if splits > 0 {
            eprintln!(
                "hugevmm: split chunks: {splits} splits, {} collapses verified huge ({} failed), {} page faults ({} store, {} zero), {} page evictions ({} written), {} split now",
                split.collapses_verified,
                split.collapse_failures.iter().sum::<u64>(),
                split.page_faults_store + split.page_faults_zero,
                split.page_faults_store,
                split.page_faults_zero,
                split.page_evictions,
                split.pages_written,
                split.chunks_split
            );
        }
    }
    if let Some(p) = &outcome.pageout {
        eprintln!(
            "hugevmm: pageout: {} resident -> {} in {:.3} ms ({} units written, {} clean, {} zero)",
            format_size(p.resident_bytes_before),
            format_size(p.resident_bytes_after),
            p.elapsed.as_secs_f64() * 1e3,
            p.report.written_units,
            p.report.clean_dropped_units,
            p.report.zero_units
        );
    }
}

/// `hugevmm run`: the process exit status, with `--status-file` written.
fn run_command(args: RunArgs) -> i32 {
    let end = run_checked(&args).unwrap_or_else(|e| {
        eprintln!("hugevmm: error: {e:#}");
        RunEnd {
            status: EXIT_CONFIG,
            kind: ExitKind::Config,
            message: Some(format!("{e:#}")),
        }
    });
    // Written on configuration errors too: telling those apart from a
    // payload's status 1 is what the file is for.
    if let Some(path) = &args.status_file {
        let written = OutputFile::open("--status-file", path)
            .and_then(|f| f.replace_with(&end.status_file_text()));
        if let Err(e) = written {
            eprintln!("hugevmm: error: {e:#}");
        }
    }
    end.status
}

/// Runs the CLI and returns the process exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => Ok(run_command(*args)),
        Command::Bench(args) => bench::run(args),
        Command::Ctl(args) => crate::control::client::run(args),
        Command::Payloads => {
            for p in payloads::all() {
                println!("{:<10} {}", p.name, p.description);
            }
            Ok(0)
        }
    };
    match result {
        Ok(status) => status,
        Err(e) => {
            eprintln!("hugevmm: error: {e:#}");
            1
        }
    }
}
