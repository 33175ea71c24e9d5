//! Command line: parsing, the run command, and turning errors into messages.

use crate::balloon_handle;
use crate::console::ConsoleSink;
use crate::linux::{LinuxBootConfig, VirtioAnnounce};
use crate::machine_devices::DeviceOptions;
use crate::stats;
use crate::swap_setup::{self, SwapOptions};
use crate::vm::{self, Guest, Payload, RunConfig};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use devices::virtio::DiskSpec;
use guestmem::{format_size, parse_size, Backing};
use std::path::PathBuf;
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
    Bench(crate::bench::BenchArgs),
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
    /// Initial ramdisk for --kernel.
    #[arg(long, requires = "kernel")]
    initrd: Option<PathBuf>,
    /// Kernel command line for --kernel (virtio_mmio.device= words for the
    /// devices are appended, see --virtio-announce).
    #[arg(long, default_value = DEFAULT_CMDLINE, requires = "kernel")]
    cmdline: String,
    /// How a Linux guest learns about the --disk and --balloon devices:
    /// ACPI DSDT entries (what stock distribution kernels read),
    /// virtio_mmio.device= words on the command line (kernels built with
    /// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), or both.
    #[arg(long, value_enum, default_value_t, requires = "kernel")]
    virtio_announce: VirtioAnnounce,
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
    #[arg(long, value_name = "SIZE", requires = "balloon", value_parser = parse_size_arg)]
    balloon_target: Option<u64>,
    /// Serve a control socket at PATH while the VM runs (one JSON reply
    /// line per command line: `balloon SIZE`, `balloon-stats`, `stats`,
    /// `mem-limit SIZE|none`, `pageout`, `quit`, `help`); talk to it with
    /// `hugevmm ctl --api-socket PATH`. A stale
    /// socket there is replaced; the file is removed when the VM ends.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Write the Linux serial console to this file instead of stdout.
    #[arg(long, requires = "kernel")]
    console_log: Option<PathBuf>,
    /// Argument string passed verbatim to the payload (`key=value` words).
    #[arg(long, default_value = "")]
    payload_args: String,
    /// Write run statistics as a JSON object to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
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
    /// (per-page baseline).
    #[arg(long, default_value = "2m")]
    swap_unit: SwapUnit,
    /// Threads serving guest memory faults (swap engine).
    #[arg(long, default_value_t = 1)]
    fault_threads: usize,
    /// Nice value of the fault threads; below 0 they are served before the
    /// vCPU threads when vCPUs outnumber cores (needs root; 0 = same as vCPUs).
    #[arg(long, default_value_t = -10, allow_hyphen_values = true)]
    fault_thread_nice: i32,
    /// Write a sample of the run's figures (resident memory, faults, KVM
    /// mappings) every --stats-interval milliseconds to this file, one JSON
    /// object per line.
    #[arg(long)]
    stats_timeline: Option<PathBuf>,
    /// Sampling interval for --stats-timeline, in milliseconds.
    #[arg(long, default_value_t = 100)]
    stats_interval: u64,
    /// After the payload finished, evict all guest RAM to the store and
    /// report how long it took (`pageout` in --stats-json).
    #[arg(long)]
    pageout: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn load_payload(args: &RunArgs) -> Result<Payload> {
    if let Some(path) = &args.payload_file {
        let elf = std::fs::read(path)
            .with_context(|| format!("cannot read --payload-file {}", path.display()))?;
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

/// Serial console with early output, and a reboot (ending the VM) on panic.
const DEFAULT_CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1";

fn run_command(args: RunArgs) -> Result<i32> {
    let guest = match &args.kernel {
        Some(kernel) => Guest::Linux(LinuxBootConfig {
            kernel: kernel.clone(),
            initrd: args.initrd.clone(),
            cmdline: args.cmdline.clone(),
            virtio_announce: args.virtio_announce,
        }),
        None => Guest::Payload {
            payload: load_payload(&args)?,
            args: args.payload_args.clone(),
        },
    };
    let timeout = match args.timeout {
        Some(secs) if !(secs.is_finite() && secs > 0.0) => {
            anyhow::bail!("--timeout must be a positive number of seconds")
        }
        Some(secs) => Some(Duration::from_secs_f64(secs)),
        None => None,
    };
    let payload_name = guest.name();
    let balloon_target_pages = match args.balloon_target {
        Some(bytes) => {
            balloon_handle::target_pages(bytes, args.mem).context("invalid --balloon-target")?
        }
        None => 0,
    };
    if let Some(limit_bytes) = args.mem_limit {
        swap_setup::check_mem_limit(limit_bytes, args.swap_unit.bytes(), args.vcpus)
            .context("invalid --mem-limit")?;
    }
    let swap = (args.mem_limit.is_some() || args.swap_store.is_some()).then(|| SwapOptions {
        mem_limit_bytes: args.mem_limit,
        store: args.swap_store.clone().unwrap_or(StoreSpec::Default),
        unit: args.swap_unit,
        fault_threads: args.fault_threads.max(1),
        fault_thread_nice: args.fault_thread_nice,
    });
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
        timeout,
        swap,
        sample_interval: args
            .stats_timeline
            .as_ref()
            .map(|_| Duration::from_millis(args.stats_interval.max(1))),
        pageout_at_exit: args.pageout,
        api_socket: args.api_socket.clone(),
    };
    let console: ConsoleSink = Arc::new(Mutex::new(Box::new(std::io::stdout())));
    let outcome = vm::run(config, console)?;
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
            "hugevmm: swap: {} faults ({} store, {} staging, {} zero), {} evictions, {} clean drops, {} zero chunks, {} written, {} read, restored {} huge / {} split, fault latency p50 {} us p99 {} us max {} us, resident max {}",
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
    if let Some(path) = &args.stats_timeline {
        let mut text = String::new();
        for sample in &outcome.timeline {
            text += &stats::sample_json(sample).to_string();
            text.push('\n');
        }
        std::fs::write(path, text)
            .with_context(|| format!("cannot write --stats-timeline {}", path.display()))?;
    }
    if let Some(path) = &args.stats_json {
        let json = serde_json::to_string_pretty(&summary.to_json()).expect("stats serialize");
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write --stats-json {}", path.display()))?;
    }
    Ok(outcome.exit_status)
}

/// Runs the CLI and returns the process exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_command(*args),
        Command::Bench(args) => crate::bench::run(args),
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
