//! Command line: parsing, the run command, and turning errors into messages.

use crate::balloon_handle;
use crate::console::ConsoleSink;
use crate::exit::{ExitKind, RunEnd, EXIT_CONFIG};
use crate::image_kind::{recognize, ImageKind};
use crate::input_file::{open_checked, read_bounded};
use crate::linux::LinuxBootConfig;
use crate::machine_devices::DeviceOptions;
use crate::outputs::{self, OutputFile};
use crate::payload::layout::MAX_VCPUS;
use crate::run_options::{self, MemLimit, RunArgs, RunFlags};
use crate::signals::StopSignals;
use crate::stats;
use crate::swap_setup::SwapOptions;
use crate::vm::{self, Guest, Payload, RunConfig};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use guestmem::Layout;
use std::ffi::OsString;
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
    Run(Box<RunFlags>),
    /// Send one command to a running VM's API (see `hugevmm run
    /// --api-socket`) and print the JSON body of the response.
    Ctl(crate::control::client::CtlArgs),
    /// Start several VMs from their config files and divide one memory
    /// budget among them, by their stall and working sets (README, "Several
    /// VMs under one budget").
    Host(crate::host::HostArgs),
    /// List the built-in payloads.
    Payloads,
    /// Run a benchmark suite (see README, "Results"): starts the
    /// benchmark binary, hugevmm-bench, from beside this one with the same
    /// arguments (`hugevmm bench --help` lists the suites).
    #[command(disable_help_flag = true)]
    Bench {
        /// The suite and its options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// The benchmark binary `hugevmm bench` starts, from this binary's
/// directory.
const BENCH_BINARY: &str = "hugevmm-bench";
/// What tells the benchmark binary which `hugevmm` its VM runs use
/// (`bench::HUGEVMM_BIN`).
const BENCH_HUGEVMM_VARIABLE: &str = "HUGEVMM_BIN";

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
    if let Some(path) = &args.flags.payload_file {
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
    let name = args.flags.payload.as_deref().unwrap_or_default();
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
    let is_linux = args.flags.kernel.is_some();
    let for_kernels = "applies to --kernel only: drop it (a payload has no kernel command line, initrd or serial console; its output goes to stdout)";
    not_applicable(
        !is_linux && args.flags.initrd.is_some(),
        "--initrd",
        for_kernels,
    )?;
    not_applicable(
        !is_linux && args.flags.cmdline.is_some(),
        "--cmdline",
        for_kernels,
    )?;
    not_applicable(
        !is_linux && args.flags.virtio_announce.is_some(),
        "--virtio-announce",
        for_kernels,
    )?;
    not_applicable(
        !is_linux && args.flags.console_log.is_some(),
        "--console-log",
        for_kernels,
    )?;
    not_applicable(
        args.flags.console_log_max.is_some() && args.flags.console_log.is_none(),
        "--console-log-max",
        "caps --console-log: add --console-log PATH or drop it",
    )?;
    not_applicable(
        !args.flags.api_allow_uid.is_empty() && args.flags.api_socket.is_none(),
        "--api-allow-uid",
        "names who else may use --api-socket: add --api-socket PATH or drop it",
    )?;
    not_applicable(
        is_linux && args.flags.payload_args.is_some(),
        "--payload-args",
        "applies to payloads only: a kernel's arguments go in --cmdline",
    )?;
    not_applicable(
        args.flags.balloon_target.is_some() && !args.balloon(),
        "--balloon-target",
        "needs --balloon: add it or drop the target",
    )?;
    let engine = args.flags.mem_limit.is_some() || args.flags.swap_store.is_some();
    let for_engine = "configures the swap engine, which runs only with --mem-limit or --swap-store: add one of them or drop this option";
    not_applicable(
        !engine && args.flags.swap_unit.is_some(),
        "--swap-unit",
        for_engine,
    )?;
    not_applicable(
        !engine && args.flags.fault_threads.is_some(),
        "--fault-threads",
        for_engine,
    )?;
    not_applicable(
        !engine && args.flags.fault_thread_nice.is_some(),
        "--fault-thread-nice",
        for_engine,
    )?;
    not_applicable(!engine && args.pageout(), "--pageout", for_engine)?;
    not_applicable(!engine && args.swap_encrypt(), "--swap-encrypt", for_engine)?;
    not_applicable(
        args.flags.swap_key_file.is_some() && !args.swap_encrypt(),
        "--swap-key-file",
        "is the key of --swap-encrypt: add --swap-encrypt or drop the key file",
    )?;
    not_applicable(
        !engine && args.flags.force_split_every.is_some(),
        "--force-split-every",
        for_engine,
    )?;
    not_applicable(
        !engine && args.flags.prefetch.is_some(),
        "--prefetch",
        for_engine,
    )?;
    not_applicable(
        !engine && args.flags.working_set_sampling.is_some(),
        "--working-set-sampling",
        for_engine,
    )?;
    let working_set = match args.flags.working_set_sampling {
        Some(units_per_second) => Some(working_set_config(
            units_per_second,
            args.flags.working_set_window_ms,
            args.flags.working_set_horizon_ms,
        )?),
        None => {
            for (given, flag) in [
                (
                    args.flags.working_set_window_ms.is_some(),
                    "--working-set-window-ms",
                ),
                (
                    args.flags.working_set_horizon_ms.is_some(),
                    "--working-set-horizon-ms",
                ),
            ] {
                if given {
                    bail!("{flag} sets up working-set sampling: give --working-set-sampling UNITS_PER_S too (2 is a good start), or leave {flag} out");
                }
            }
            None
        }
    };
    if args.flags.prefetch == Some(true)
        && matches!(
            args.flags.swap_unit,
            Some(swap::engine::SwapUnit::Huge2M | swap::engine::SwapUnit::Small4K)
        )
    {
        bail!("--prefetch is the auto unit's sequential prefetch: use --swap-unit auto (the default), or leave --prefetch out");
    }
    if let Some(n) = args.flags.force_split_every {
        if !(1..=1_000_000).contains(&n) {
            bail!(
                "--force-split-every {n} is out of range: give 1 (split every restore) to 1000000"
            );
        }
        if args.flags.swap_unit == Some(swap::engine::SwapUnit::Small4K)
            || args.backing != guestmem::Backing::Thp
        {
            bail!("--force-split-every splits 2 MiB chunks of THP memory: use --swap-unit 2m and --backing thp");
        }
    }
    not_applicable(
        args.flags.stats_interval.is_some() && args.flags.stats_timeline.is_none(),
        "--stats-interval",
        "sets the sampling of --stats-timeline: add --stats-timeline PATH or drop it",
    )?;
    if let Some(ms) = args.flags.stats_interval {
        if !(1..=MAX_STATS_INTERVAL_MS).contains(&ms) {
            bail!("--stats-interval {ms} is out of range: give 1 to {MAX_STATS_INTERVAL_MS} milliseconds");
        }
    }
    let fault_threads = args.flags.fault_threads.unwrap_or(1);
    if !(1..=MAX_FAULT_THREADS).contains(&fault_threads) {
        bail!("--fault-threads {fault_threads} is out of range: give 1 to {MAX_FAULT_THREADS}");
    }
    let fault_thread_nice = args
        .flags
        .fault_thread_nice
        .unwrap_or(DEFAULT_FAULT_THREAD_NICE);
    if !(-20..=19).contains(&fault_thread_nice) {
        bail!("--fault-thread-nice {fault_thread_nice} is out of range: give -20 (first served) to 19");
    }
    if let Some(secs) = args.flags.timeout {
        if !(secs.is_finite() && secs > 0.0) {
            bail!("--timeout must be a positive number of seconds");
        }
    }
    // 4 KiB RAM is the small-page baseline end to end, so its swap unit is
    // the page: a 2 MiB unit is restored by moving a THP into place, which
    // would map the "4k" RAM huge.
    let swap_unit = match (args.backing, args.flags.swap_unit) {
        (guestmem::Backing::Small4k, None) => SwapUnit::Small4K,
        (guestmem::Backing::Small4k, Some(unit @ (SwapUnit::Huge2M | SwapUnit::Auto))) => {
            let name = if unit == SwapUnit::Huge2M {
                "2m"
            } else {
                "auto"
            };
            bail!(
                "--swap-unit {name} restores 2 MiB chunks as huge mappings, which --backing 4k \
                 (the small-page baseline) must not get: use --backing thp for 2 MiB units, or \
                 drop --swap-unit (4k RAM swaps 4 KiB pages)"
            );
        }
        (_, unit) => unit.unwrap_or_default(),
    };
    if let Some(MemLimit::Bytes(limit_bytes)) = args.flags.mem_limit {
        swap::engine::MemLimit::new(limit_bytes, swap_unit.bytes(), args.vcpus, args.mem)
            .context("invalid --mem-limit")?;
    }
    let auto_limit = auto_limit_target(args, swap_unit.bytes())?;
    let balloon_target_pages = match args.flags.balloon_target {
        Some(bytes) => {
            balloon_handle::target_pages(bytes, args.mem).context("invalid --balloon-target")?
        }
        None => 0,
    };
    for (option, path) in [
        ("--stats-json", &args.flags.stats_json),
        ("--stats-timeline", &args.flags.stats_timeline),
        ("--status-file", &args.flags.status_file),
        ("--console-log", &args.flags.console_log),
    ] {
        if let Some(path) = path {
            outputs::check_output_path(option, path)?;
        }
    }
    if let Some(socket) = &args.flags.api_socket {
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
    let guest = match &args.flags.kernel {
        Some(kernel) => {
            check_kernel_inputs(kernel, args.flags.initrd.as_deref(), args.mem)?;
            Guest::Linux(LinuxBootConfig {
                kernel: kernel.clone(),
                initrd: args.flags.initrd.clone(),
                cmdline: args
                    .flags
                    .cmdline
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CMDLINE.into()),
                virtio_announce: args.flags.virtio_announce.unwrap_or_default(),
            })
        }
        None => Guest::Payload {
            payload: load_payload(args)?,
            args: args.flags.payload_args.clone().unwrap_or_default(),
        },
    };
    // The key is made (or the key file read and checked) now, before
    // anything else is acquired, so a bad key file is a configuration
    // error naming what to do.
    let seal = match (engine && args.swap_encrypt(), &args.flags.swap_key_file) {
        (false, _) => None,
        (true, None) => Some(swap::store::Sealer::random()?),
        (true, Some(path)) => Some(swap::store::Sealer::from_key_file(path)?),
    }
    .map(std::sync::Arc::new);
    if let Some(warning) = args.unsealed_remote_store_warning() {
        eprintln!("hugevmm: warning: {warning}");
    }
    for warning in args.clear_network_link_warnings() {
        eprintln!("hugevmm: warning: {warning}");
    }
    let swap = engine.then(|| SwapOptions {
        mem_limit_bytes: match auto_limit {
            Some(target) => Some(target.max_bytes),
            None => args.flags.mem_limit.and_then(MemLimit::bytes),
        },
        auto_limit,
        store: args.flags.swap_store.clone().unwrap_or(StoreSpec::Default),
        unit: swap_unit,
        fault_threads,
        fault_thread_nice,
        force_split_every: args.flags.force_split_every,
        prefetch: args.flags.prefetch.unwrap_or(true),
        working_set,
        seal,
    });
    Ok((guest, swap, balloon_target_pages))
}

/// `--working-set-sampling`'s configuration: the rate given, the window
/// and horizon given or the defaults.
fn working_set_config(
    units_per_second: f64,
    window_ms: Option<u64>,
    horizon_ms: Option<u64>,
) -> Result<swap::engine::WorkingSetConfig> {
    let default = swap::engine::WorkingSetConfig::default();
    let config = swap::engine::WorkingSetConfig {
        units_per_second,
        window: window_ms.map_or(default.window, std::time::Duration::from_millis),
        horizon: horizon_ms.map_or(default.horizon, std::time::Duration::from_millis),
    };
    config.check().map_err(|e| {
        anyhow::anyhow!(
            "--working-set-sampling {units_per_second}{}{}: {e}",
            window_ms.map_or(String::new(), |w| format!(" --working-set-window-ms {w}")),
            horizon_ms.map_or(String::new(), |h| format!(" --working-set-horizon-ms {h}")),
        )
    })?;
    Ok(config)
}

/// `--mem-limit auto`'s target and bounds, each bound checked as a fixed
/// `--mem-limit` would be; None without auto sizing.
fn auto_limit_target(
    args: &RunArgs,
    unit_bytes: u64,
) -> Result<Option<swap::engine::sizing::SizingTarget>> {
    let Some(MemLimit::Auto { stall_pct }) = args.flags.mem_limit else {
        for (given, flag) in [
            (args.flags.mem_limit_min.is_some(), "--mem-limit-min"),
            (args.flags.mem_limit_max.is_some(), "--mem-limit-max"),
        ] {
            if given {
                bail!("{flag} bounds --mem-limit auto: add --mem-limit auto or drop {flag}");
            }
        }
        return Ok(None);
    };
    let floor_bytes =
        swap::engine::MemLimit::min_bytes(args.vcpus).div_ceil(unit_bytes) * unit_bytes;
    let min_bytes = args.flags.mem_limit_min.unwrap_or(floor_bytes);
    let max_bytes = args
        .flags
        .mem_limit_max
        .unwrap_or(args.mem / unit_bytes * unit_bytes);
    for (bytes, flag) in [
        (min_bytes, "--mem-limit-min"),
        (max_bytes, "--mem-limit-max"),
    ] {
        swap::engine::MemLimit::new(bytes, unit_bytes, args.vcpus, args.mem)
            .with_context(|| format!("invalid {flag}"))?;
    }
    if min_bytes > max_bytes {
        bail!(
            "--mem-limit-min {} is above --mem-limit-max {}: give a minimum at most the maximum",
            guestmem::format_size(min_bytes),
            guestmem::format_size(max_bytes)
        );
    }
    Ok(Some(swap::engine::sizing::SizingTarget {
        stall_share: stall_pct / 100.0,
        min_bytes,
        max_bytes,
        unit_bytes,
    }))
}

/// The output files, opened once the options are valid and before the VM
/// is built.
struct Outputs {
    stats_json: Option<OutputFile>,
    stats_timeline: Option<OutputFile>,
    /// Written by the serial device while the guest runs; opened here so
    /// that a run that fails to start removes a log it created.
    console_log: Option<OutputFile>,
}

impl Outputs {
    fn open(args: &RunArgs) -> Result<Self> {
        let open = |option, path: &Option<PathBuf>| {
            path.as_deref()
                .map(|p| OutputFile::open(option, p))
                .transpose()
        };
        Ok(Self {
            stats_json: open("--stats-json", &args.flags.stats_json)?,
            stats_timeline: open("--stats-timeline", &args.flags.stats_timeline)?,
            console_log: open("--console-log", &args.flags.console_log)?,
        })
    }
}

/// Validates, acquires and runs; `Err` is a configuration or setup error.
fn run_checked(args: &RunArgs) -> Result<RunEnd> {
    let (guest, swap, balloon_target_pages) = validate(args)?;
    let outputs = Outputs::open(args)?;
    let stop_signals = StopSignals::install()?;
    let payload_name = guest.name();
    let console_on_stdout = matches!(guest, Guest::Linux(_)) && args.flags.console_log.is_none();
    let progress_interval = crate::progress::wanted(args.quiet(), console_on_stdout)
        .then_some(crate::progress::INTERVAL);
    let config = RunConfig {
        mem_bytes: args.mem,
        backing: args.backing,
        vcpus: args.vcpus,
        guest,
        devices: DeviceOptions {
            disks: args.flags.disks.clone(),
            balloon: args.balloon(),
            balloon_target_pages,
            console_log: outputs
                .console_log
                .as_ref()
                .map(|log| log.console_log(args.flags.console_log_max))
                .transpose()?,
        },
        timeout: args.flags.timeout.map(Duration::from_secs_f64),
        swap,
        sample_interval: args.flags.stats_timeline.as_ref().map(|_| {
            Duration::from_millis(
                args.flags
                    .stats_interval
                    .unwrap_or(DEFAULT_STATS_INTERVAL_MS),
            )
        }),
        progress_interval,
        pageout_at_exit: args.pageout(),
        seccomp: args.seccomp(),
        api_socket: args.flags.api_socket.clone(),
        api_allow_uids: args.flags.api_allow_uid.clone(),
        dumpable: args.dumpable(),
        metrics_addr: args.flags.metrics_addr,
        options_json: args.given.clone(),
        stop_signals: Some(stop_signals),
    };
    let console: ConsoleSink = Arc::new(Mutex::new(Box::new(std::io::stdout())));
    let outcome = vm::run(config, console)?;
    if let Some(log) = outputs.console_log {
        log.keep();
    }
    if let Some(failure) = &outcome.failure {
        eprintln!("hugevmm: {failure}");
    }
    let summary = stats::RunSummary {
        payload: &payload_name,
        vcpus: args.vcpus,
        mem_bytes: args.mem,
        backing: args.backing,
        outcome: &outcome,
    };
    for line in summary.lines() {
        eprintln!("{line}");
    }
    if let Some(line) = crate::ratelimit::summary(crate::ratelimit::global()) {
        eprintln!("{line}");
    }
    // The run is over: an output that cannot be written is reported, but
    // the guest's status stays the process's status.
    if let Some(out) = outputs.stats_timeline {
        let mut text = String::new();
        for sample in &outcome.timeline {
            text += &stats::sample_json(sample).to_string();
            text.push('\n');
        }
        if let Err(e) = out.replace_with(&text) {
            eprintln!("hugevmm: error: {}", error_text::one_line(&e));
        }
    }
    if let Some(out) = outputs.stats_json {
        let json = serde_json::to_string_pretty(&summary.to_json()).expect("stats serialize");
        if let Err(e) = out.replace_with(&(json + "\n")) {
            eprintln!("hugevmm: error: {}", error_text::one_line(&e));
        }
    }
    Ok(RunEnd {
        status: outcome.exit_status,
        kind: outcome.exit_kind,
        message: outcome.failure.clone(),
    })
}

/// A configuration error as the run's end.
fn config_end(e: anyhow::Error) -> RunEnd {
    let text = error_text::one_line(&e);
    eprintln!("hugevmm: error: {text}");
    RunEnd {
        status: EXIT_CONFIG,
        kind: ExitKind::Config,
        message: Some(text),
    }
}

/// `hugevmm run`: the process exit status, with `--status-file` written.
/// `refused` is an error found before the command line was read (an
/// unknown `HUGEVMM_LOG` level): the run ends with it as a configuration
/// error.
fn run_command(flags: RunFlags, refused: Option<anyhow::Error>) -> i32 {
    // A --config that cannot be read still gets the flag's status file.
    let status_file_flag = flags.status_file.clone();
    let open = |path: &PathBuf| OutputFile::open("--status-file", path);
    let (end, status_file) = match run_options::resolve(flags) {
        Ok(args) => {
            // Opened before the run: the main thread's seccomp filter lets
            // it open nothing once the VM runs.
            let status_file = args.flags.status_file.as_ref().map(open);
            let end = match refused {
                Some(e) => config_end(e),
                None => run_checked(&args).unwrap_or_else(config_end),
            };
            (end, status_file)
        }
        Err(e) => (config_end(e), status_file_flag.as_ref().map(open)),
    };
    // Written on configuration errors too: telling those apart from a
    // payload's status 1 is what the file is for.
    if let Some(file) = status_file {
        let written = file.and_then(|f| f.replace_with(&end.status_file_text()));
        if let Err(e) = written {
            eprintln!("hugevmm: error: {}", error_text::one_line(&e));
        }
    }
    end.status
}

/// `hugevmm bench ARGS`: replaces this process with `hugevmm-bench ARGS`
/// from this binary's directory, naming this binary as the one its VM runs
/// use. Its `argv[0]` is this one's followed by ` bench`, so that its
/// usage line and the command it records read `hugevmm bench ...`.
/// Returns only if that cannot be done.
fn exec_bench(args: Vec<OsString>) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().context("cannot find this binary (current_exe)")?;
    let bench = me.with_file_name(BENCH_BINARY);
    if !bench.is_file() {
        bail!(
            "hugevmm bench runs the benchmark binary {}, which is not there: {}",
            bench.display(),
            how_to_get_bench(&me)
        );
    }
    let mut argv0 = std::env::args_os()
        .next()
        .unwrap_or_else(|| me.clone().into());
    argv0.push(" bench");
    let error = std::process::Command::new(&bench)
        .arg0(argv0)
        .args(args)
        .env(BENCH_HUGEVMM_VARIABLE, &me)
        .exec();
    Err(anyhow::Error::new(error).context(format!("cannot start {}", bench.display())))
}

/// How to put the benchmark binary beside `exe`: a build in the same
/// profile directory, an install into the same `bin`, or a copy.
fn how_to_get_bench(exe: &Path) -> String {
    let dir = exe.parent().unwrap_or(Path::new("."));
    match dir.file_name().and_then(|d| d.to_str()) {
        Some("release") => "build it in the checkout: `cargo build --release -p hugevmm-bench`".into(),
        Some("debug") => "build it in the checkout: `cargo build -p hugevmm-bench`".into(),
        Some("bin") => format!(
            "install it there from the checkout: `cargo install --path bench --root {}`",
            dir.parent().unwrap_or(Path::new("/")).display()
        ),
        _ => format!(
            "build it in the checkout (`cargo build --release -p hugevmm-bench`) and copy target/release/{BENCH_BINARY} to {}",
            dir.display()
        ),
    }
}

/// Runs the CLI and returns the process exit status. `logging` is how
/// the logger took `HUGEVMM_LOG`: a value it refused ends every command.
pub fn main(logging: Result<(), String>) -> i32 {
    let cli = Cli::parse();
    let refused = logging.err().map(anyhow::Error::msg);
    let result = match (cli.command, refused) {
        (Command::Run(args), refused) => Ok(run_command(*args, refused)),
        (_, Some(e)) => Err(e),
        (Command::Bench { args }, None) => exec_bench(args),
        (Command::Ctl(args), None) => crate::control::client::run(args),
        (Command::Host(args), None) => crate::host::run(args),
        (Command::Payloads, None) => {
            for p in payloads::all() {
                println!("{:<10} {}", p.name, p.description);
            }
            println!();
            println!("{PAYLOAD_ARGUMENTS}");
            Ok(0)
        }
    };
    match result {
        Ok(status) => status,
        Err(e) => {
            eprintln!("hugevmm: error: {}", error_text::one_line(&e));
            1
        }
    }
}

/// How payload arguments are written (`hugevmm payloads`).
const PAYLOAD_ARGUMENTS: &str =
    "Arguments (--payload-args \"key=value ...\"): numbers in decimal or 0x hex; \
sizes as --mem takes them (4096, 64K, 512M, 1.5G; K/M/G/T are powers of 1024, a fraction only \
if it makes whole bytes). A payload refuses an unknown key or a value outside its range, \
naming the range, and exits 2.";
