//! One run of a payload: builds the VM, loads the image, runs the vCPUs and
//! collects the outcome.

use crate::balloon_handle::BalloonSnapshot;
use crate::console::ConsoleSink;
use crate::control::server::ControlServer;
use crate::control::{ControlContext, ControlSocket, MetricsListener};
use crate::cpu::{self, EntryState};
use crate::exit::ExitKind;
use crate::linux::{self, console_input, LinuxBootConfig, MachineInfo};
use crate::machine_devices::{self, DeviceOptions, Interrupts, MachineDevices};
use crate::payload::bootinfo::{self, GpaRange};
use crate::payload::layout::{BOOT_INFO_GPA, MAX_VCPUS};
use crate::payload::{elf, tables};
use crate::signals::{self, StopSignals};
use crate::swap_setup::{self, SwapOptions};
use crate::vcpu::{self, GuestKind, UnknownAccessLog, VcpuContext, VcpuEvent};
use anyhow::{bail, Context, Result};
use guestmem::{format_size, Backing, GuestRam, KvmStats, Layout, StageTwoPages};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use swap::engine::{EvictReport, SwapEngine, SwapStats};

/// Exit status when the VM failed (guest exception, KVM error).
pub const EXIT_VM_FAILURE: i32 = 125;
/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
/// How long the end of a run waits for its vCPU threads to stop.
const VCPU_STOP_LIMIT: Duration = Duration::from_secs(10);
/// The same after a failure, when a vCPU may wait for memory nobody will
/// serve.
const VCPU_STOP_LIMIT_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// A payload image and where it came from.
pub struct Payload {
    /// Name for logs: the built-in's name or the file path.
    pub name: String,
    /// The ELF bytes.
    pub elf: Vec<u8>,
}

/// What runs in the VM.
pub enum Guest {
    /// A payload and its `--payload-args`, passed verbatim.
    Payload {
        /// The image.
        payload: Payload,
        /// The argument string.
        args: String,
    },
    /// A Linux kernel.
    Linux(LinuxBootConfig),
}

impl Guest {
    /// For logs and statistics: the payload's name, or the kernel's path.
    pub fn name(&self) -> String {
        match self {
            Guest::Payload { payload, .. } => payload.name.clone(),
            Guest::Linux(boot) => boot.kernel.display().to_string(),
        }
    }
}

/// What to run.
pub struct RunConfig {
    /// Guest RAM size.
    pub mem_bytes: u64,
    /// Host backing of guest RAM.
    pub backing: Backing,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// What to run: a payload or a Linux kernel.
    pub guest: Guest,
    /// Devices to give the guest.
    pub devices: DeviceOptions,
    /// Give up after this long.
    pub timeout: Option<Duration>,
    /// Swap engine options; None runs without the engine.
    pub swap: Option<SwapOptions>,
    /// Sample the run's figures this often while the guest runs.
    pub sample_interval: Option<Duration>,
    /// Print the status line this often (`progress`); None: never.
    pub progress_interval: Option<Duration>,
    /// After the payload finished, evict all guest RAM and time it.
    pub pageout_at_exit: bool,
    /// Install the per-thread seccomp filters (off: `--no-seccomp`).
    pub seccomp: bool,
    /// Serve the API here while the guest runs.
    pub api_socket: Option<PathBuf>,
    /// Uids served there besides this process's and root's.
    pub api_allow_uids: Vec<u32>,
    /// Leave the process dumpable (`--dumpable`).
    pub dumpable: bool,
    /// Serve `GET /metrics` on this TCP address while the guest runs.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The run's options as given (flags over `--config`), for `GET /vm`.
    pub options_json: serde_json::Value,
    /// Handlers for SIGTERM/SIGINT/SIGHUP, installed before the run so
    /// that none of them kills it uncleanly; None leaves the defaults.
    pub stop_signals: Option<StopSignals>,
}

/// The run's figures at one moment (`--stats-timeline`).
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// KVM stage-2 mapping counts.
    pub stage2: StageTwoPages,
    /// Swap engine counters, if it runs.
    pub swap: Option<SwapStats>,
}

/// A timed "swap out everything" after the payload (`--pageout`).
#[derive(Debug, Clone)]
pub struct Pageout {
    /// Resident guest RAM before.
    pub resident_bytes_before: u64,
    /// Resident guest RAM after.
    pub resident_bytes_after: u64,
    /// Wall time of the eviction, writes included.
    pub elapsed: Duration,
    /// What the engine did.
    pub report: EvictReport,
}

/// How a run ended.
pub struct RunOutcome {
    /// Process exit status to use.
    pub exit_status: i32,
    /// Why the run ended.
    pub exit_kind: ExitKind,
    /// Per-vCPU statuses written to the finish port (None: did not finish).
    pub vcpu_statuses: Vec<Option<u32>>,
    /// Why the VM failed, if it did.
    pub failure: Option<String>,
    /// Wall time from the first vCPU start to the end.
    pub elapsed: Duration,
    /// KVM stage-2 mapping counts read before the vCPUs were torn down.
    pub stage2: StageTwoPages,
    /// TSC frequency of vCPU 0, for converting payload cycle counts.
    pub tsc_khz: Option<u32>,
    /// Swap engine figures, read at the same moment as `stage2`.
    pub swap: Option<SwapStats>,
    /// Samples taken while the guest ran (`sample_interval`).
    pub timeline: Vec<Sample>,
    /// The timed eviction after the payload, if asked for.
    pub pageout: Option<Pageout>,
    /// The balloon's figures when the guest stopped, if it has one.
    pub balloon: Option<BalloonSnapshot>,
}

fn open_kvm() -> Result<Kvm> {
    Kvm::new().map_err(|e| {
        let hint = match e.errno() {
            libc::ENOENT => "this host has no KVM: load kvm_intel/kvm_amd, or run on a host with hardware virtualization",
            libc::EACCES | libc::EPERM => "permission denied: run as root or add your user to the group that owns /dev/kvm (usually `kvm`)",
            _ => "check that KVM is loaded and usable",
        };
        anyhow::anyhow!("cannot open /dev/kvm: {e} ({hint})")
    })
}

fn ram_ranges(layout: &Layout) -> Vec<GpaRange> {
    layout
        .regions()
        .iter()
        .map(|r| GpaRange {
            start: r.gpa,
            end: r.gpa + r.len_bytes,
        })
        .collect()
}

/// Exit status for the statuses the vCPUs reported: the first non-zero in
/// vCPU order, squeezed into the 8 bits a process exit status has (a
/// non-zero status never becomes 0).
pub fn combined_status(statuses: &[Option<u32>]) -> i32 {
    match statuses.iter().flatten().find(|s| **s != 0) {
        None => 0,
        Some(s) if *s <= 255 => *s as i32,
        Some(_) => 255,
    }
}

/// Runs the payload to completion: checks the configuration and the host,
/// builds the machine, loads the guest, creates and starts the vCPUs,
/// waits for the end of the run, and ends it in the order that keeps guest
/// memory served while anything may still touch it ([`finish`]).
pub fn run(mut config: RunConfig, console: ConsoleSink) -> Result<RunOutcome> {
    let (layout, ranges, image, kind) = check_config(&config)?;
    crate::seccomp::init(config.seccomp)?;
    if crate::seccomp::enabled() {
        // Before any store or disk is opened: their NBD reader threads
        // install the filter of their kind first thing.
        blockio::nbd::set_reader_thread_setup(|| {
            crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Nbd)
        });
    }

    if let Some(swap) = &config.swap {
        for warning in crate::host_check::check_swap_host(config.backing, &swap.store)? {
            eprintln!("hugevmm: warning: {warning}");
        }
    }

    // Bound before anything is allocated, so that a path in use fails fast;
    // removed again on every way out of this function.
    let control_socket = config
        .api_socket
        .as_deref()
        .map(|path| ControlSocket::bind(path, &config.api_allow_uids))
        .transpose()?;
    let metrics_listener = config.metrics_addr.map(MetricsListener::bind).transpose()?;

    let (kvm, ram, vm, stats, events_tx, events_rx, engine, machine) =
        build_machine(&mut config, &layout, kind)?;
    // Not before: the engine opens /proc/self/pagemap, which a
    // non-dumpable process may open only as root. Nothing of the guest is
    // in memory yet (the key is in a page left out of core dumps).
    crate::dumpable::set(config.dumpable)?;
    let entry = load_guest(&config, &ram, &ranges, &image, &machine)?;
    let (vcpus, tsc_khz) = create_vcpus(&kvm, &vm, &config, &entry, &image)?;
    // Started last, after everything that can fail, and dropped when this
    // function returns (any way it returns): it restores the terminal. The
    // console still shows output without it, so a failure is only a warning.
    let _console_input = match (&machine.serial, kind) {
        (Some(serial), GuestKind::Linux) => console_input::start(serial.clone(), events_tx.clone())
            .unwrap_or_else(|e| {
                eprintln!("hugevmm: no console input: {e}");
                None
            }),
        _ => None,
    };
    let started = Instant::now();
    let control = serve_control(
        control_socket,
        metrics_listener,
        &config,
        &machine,
        &engine,
        &vm,
        started,
        &events_tx,
    )?;
    let (stop, vcpu_threads) = spawn_vcpus(vcpus, kind, &machine, &ram, &console, &events_tx)?;
    drop(events_tx);
    // Guest RAM's memslots are deleted there at the end: no thread that
    // runs beside the guest may set memory regions.
    let ram_teardown = crate::seccomp::RamTeardown::start()?;
    // Last: every other thread has started, and filters only narrow.
    crate::seccomp::install(crate::seccomp::ThreadKind::Main)?;

    let end = wait_for_the_end(&config, &events_rx, started, &engine, &stats);
    let outcome = finish(
        &config,
        started,
        end,
        &stats,
        tsc_khz,
        engine,
        machine,
        _console_input,
        control,
        stop,
        vcpu_threads,
    );
    ram_teardown.release(ram);
    outcome.map(crate::seccomp::account_for_trap)
}

/// Checks the options against each other and the payload image against
/// guest RAM, before anything is allocated; returns the layout, the RAM
/// ranges, the parsed payload image (none for Linux) and the kind of guest.
fn check_config(
    config: &RunConfig,
) -> Result<(Layout, Vec<GpaRange>, Option<elf::PayloadImage>, GuestKind)> {
    // The vCPU count and whether --pageout has an engine were checked by
    // `cli::validate` with the other options.
    debug_assert!((1..=MAX_VCPUS).contains(&config.vcpus));
    debug_assert!(!config.pageout_at_exit || config.swap.is_some());
    let layout = Layout::new(config.mem_bytes).context("invalid --mem")?;
    let ranges = ram_ranges(&layout);
    // Check the image before allocating anything: bad input fails fast.
    let image = match &config.guest {
        Guest::Payload { payload, .. } => Some(
            elf::parse(
                &payload.elf,
                |start, len| layout.contains(start, len),
                &describe_ram(&layout),
            )
            .with_context(|| format!("payload {} cannot be loaded", payload.name))?,
        ),
        Guest::Linux(_) => None,
    };
    let kind = match config.guest {
        Guest::Payload { .. } => GuestKind::Payload,
        Guest::Linux(_) => GuestKind::Linux,
    };
    Ok((layout, ranges, image, kind))
}

/// What [`build_machine`] returns, in the order `run` declares (and, in
/// reverse, drops) it.
type BuiltMachine = (
    Kvm,
    Arc<GuestRam>,
    VmFd,
    KvmStats,
    mpsc::Sender<VcpuEvent>,
    mpsc::Receiver<VcpuEvent>,
    Option<Arc<SwapEngine>>,
    MachineDevices,
);

/// Opens KVM, allocates guest RAM, creates the VM and its memslots, the
/// run's event channel (the stop signals forwarded into it), the swap
/// engine when asked for, and the devices.
fn build_machine(config: &mut RunConfig, layout: &Layout, kind: GuestKind) -> Result<BuiltMachine> {
    let kvm = open_kvm()?;
    let ram = Arc::new(
        GuestRam::new(layout.clone(), config.backing).context("cannot allocate guest RAM")?,
    );
    let vm = kvm.create_vm().context("KVM_CREATE_VM failed")?;
    if kind == GuestKind::Linux {
        linux::prepare_vm(&vm).context("cannot set up the interrupt controllers")?;
    } else {
        // Only needed by VMX hosts for real-mode emulation; harmless elsewhere.
        let _ = vm.set_tss_address(0xfffb_d000);
    }
    ram.register_memslots(&vm)
        .context("cannot register guest RAM with KVM")?;
    let stats = KvmStats::open(&vm).context("cannot open KVM statistics")?;
    let (events_tx, events_rx) = mpsc::channel();
    crate::seccomp::forward_traps(events_tx.clone())?;
    if let Some(stop_signals) = config.stop_signals.take() {
        stop_signals.forward(events_tx.clone())?;
    }
    let (engine, old_store_content) = match &config.swap {
        Some(options) => {
            let started = swap_setup::start(&ram, options, events_tx.clone())?;
            (Some(Arc::new(started.engine)), started.old_content)
        }
        None => (None, None),
    };
    let interrupts = match kind {
        GuestKind::Linux => Interrupts::Irqchip(&vm),
        GuestKind::Payload => Interrupts::Polled,
    };
    let machine = machine_devices::build(
        &ram,
        &config.devices,
        interrupts,
        kind == GuestKind::Linux,
        &events_tx,
    )?;
    if let Some(engine) = &engine {
        machine.free_memory.attach_engine(engine.clone());
    }
    // Every file is open and locked, and nothing has touched guest RAM.
    swap_setup::cut_old_content(old_store_content)?;
    Ok((kvm, ram, vm, stats, events_tx, events_rx, engine, machine))
}

/// Loads the payload (none returned: its vCPUs are set up from the image)
/// or the Linux kernel (its boot CPU's entry state returned).
fn load_guest(
    config: &RunConfig,
    ram: &Arc<GuestRam>,
    ranges: &[GpaRange],
    image: &Option<elf::PayloadImage>,
    machine: &MachineDevices,
) -> Result<Option<linux::BootSetup>> {
    let entry = match (&config.guest, image) {
        (Guest::Payload { payload, args }, Some(image)) => {
            load_payload(ram, ranges, payload, args, image, config.vcpus, machine)?;
            None
        }
        (Guest::Linux(boot), _) => {
            let mut boot = boot.clone();
            let devices = machine.kernel_cmdline();
            if !devices.is_empty() && boot.virtio_announce.in_cmdline() {
                boot.cmdline = format!("{} {devices}", boot.cmdline);
            }
            let described = MachineInfo {
                vcpus: config.vcpus,
                virtio: machine
                    .windows
                    .iter()
                    .map(|w| linux::VirtioMmioDevice {
                        base_gpa: w.base,
                        size_bytes: w.size_bytes,
                        irq: w.irq,
                    })
                    .collect(),
                virtio_in_dsdt: boot.virtio_announce.in_acpi(),
            };
            Some(linux::load(ram, &boot, &described).context("cannot load the kernel")?)
        }
        _ => unreachable!("payload images are parsed above"),
    };
    Ok(entry)
}

/// Creates the vCPUs and sets up their entry state; returns them and the
/// TSC frequency of the first.
fn create_vcpus(
    kvm: &Kvm,
    vm: &VmFd,
    config: &RunConfig,
    entry: &Option<linux::BootSetup>,
    image: &Option<elf::PayloadImage>,
) -> Result<(Vec<VcpuFd>, Option<u32>)> {
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .context("KVM_GET_SUPPORTED_CPUID failed")?;
    let mut vcpus = Vec::new();
    let mut tsc_khz = None;
    for index in 0..config.vcpus {
        let fd = vm
            .create_vcpu(u64::from(index))
            .with_context(|| format!("cannot create vCPU {index}"))?;
        match (entry, image) {
            (Some(setup), _) => linux::configure_vcpu(kvm, &fd, index, setup)
                .with_context(|| format!("cannot set up vCPU {index}"))?,
            (None, Some(image)) => {
                let state = EntryState {
                    index,
                    vcpu_count: config.vcpus,
                    rip: image.entry,
                    boot_info_gpa: BOOT_INFO_GPA,
                };
                cpu::configure(&fd, &cpuid, &state)
                    .with_context(|| format!("cannot set up vCPU {index}"))?;
            }
            (None, None) => unreachable!("either a kernel or a payload"),
        }
        if index == 0 {
            tsc_khz = fd.get_tsc_khz().ok();
        }
        vcpus.push(fd);
    }
    Ok((vcpus, tsc_khz))
}

/// Starts the API's threads, for `--api-socket` and `--metrics-addr`.
#[allow(clippy::too_many_arguments)]
fn serve_control(
    control_socket: Option<ControlSocket>,
    metrics_listener: Option<MetricsListener>,
    config: &RunConfig,
    machine: &MachineDevices,
    engine: &Option<Arc<SwapEngine>>,
    vm: &VmFd,
    started: Instant,
    events_tx: &mpsc::Sender<VcpuEvent>,
) -> Result<Vec<ControlServer>> {
    if control_socket.is_none() && metrics_listener.is_none() {
        return Ok(Vec::new());
    }
    let context = Arc::new(ControlContext {
        payload: config.guest.name(),
        vcpus: config.vcpus,
        mem_bytes: config.mem_bytes,
        backing: config.backing,
        config: config.options_json.clone(),
        started,
        balloon: machine.balloon.clone(),
        engine: engine.clone(),
        // Its own descriptor: the run loop keeps reading `stats`.
        kvm_stats: KvmStats::open(vm).ok(),
        events: events_tx.clone(),
        pageout_lock: Default::default(),
    });
    let mut servers = Vec::new();
    if let Some(socket) = control_socket {
        servers.push(socket.serve(context.clone())?);
    }
    if let Some(listener) = metrics_listener {
        servers.push(listener.serve(context)?);
    }
    Ok(servers)
}

/// Installs the kick signal handler and starts one thread per vCPU;
/// returns the flag that asks them to stop and their handles.
fn spawn_vcpus(
    vcpus: Vec<VcpuFd>,
    kind: GuestKind,
    machine: &MachineDevices,
    ram: &Arc<GuestRam>,
    console: &ConsoleSink,
    events_tx: &mpsc::Sender<VcpuEvent>,
) -> Result<(crate::vcpu_stop::StopFlag, Vec<JoinHandle<()>>)> {
    let unknown = Arc::new(UnknownAccessLog::default());
    crate::vcpu_stop::install_kick_handler()
        .context("cannot install the vCPU kick signal handler")?;
    let stop = crate::vcpu_stop::StopFlag::default();
    let mut vcpu_threads = Vec::new();
    for (index, fd) in vcpus.into_iter().enumerate() {
        let ctx = VcpuContext {
            kind,
            pio: machine.pio.clone(),
            mmio: machine.mmio.clone(),
            index: index as u32,
            ram: ram.clone(),
            console: console.clone(),
            unknown: unknown.clone(),
            events: events_tx.clone(),
            stop: stop.clone(),
        };
        vcpu_threads.push(
            std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || vcpu::run(fd, ctx))
                .context("cannot spawn a vCPU thread")?,
        );
    }
    Ok((stop, vcpu_threads))
}

/// How the run loop ended.
struct TheEnd {
    statuses: Vec<Option<u32>>,
    failure: Option<String>,
    exit_status: Option<i32>,
    exit_kind: ExitKind,
    timeline: Vec<Sample>,
}

/// The run loop: waits for every vCPU's `Finished`, or the first event
/// that ends the run, or `--timeout`; samples the timeline meanwhile.
fn wait_for_the_end(
    config: &RunConfig,
    events_rx: &mpsc::Receiver<VcpuEvent>,
    started: Instant,
    engine: &Option<Arc<SwapEngine>>,
    stats: &KvmStats,
) -> TheEnd {
    let mut statuses = vec![None; config.vcpus as usize];
    let mut failure = None;
    let mut exit_status = None;
    let mut exit_kind = ExitKind::Payload;
    let mut timeline = Vec::new();
    let deadline = config.timeout.map(|t| started + t);
    let mut next_sample = config.sample_interval.map(|i| started + i);
    let mut progress = config
        .progress_interval
        .map(|i| crate::progress::Progress::new(started, i));
    while statuses.iter().any(Option::is_none) {
        let next_progress = progress.as_ref().map(|p| p.next_at());
        let wake = [deadline, next_sample, next_progress]
            .into_iter()
            .flatten()
            .min();
        let event = match wake {
            Some(wake) => {
                match events_rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                    Ok(event) => event,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let now = Instant::now();
                        if let (Some(at), Some(interval)) = (next_sample, config.sample_interval) {
                            if now >= at {
                                timeline.push(Sample {
                                    t_s: started.elapsed().as_secs_f64(),
                                    swap: engine.as_ref().map(|e| e.stats()),
                                    stage2: stats.read().unwrap_or_default(),
                                });
                                next_sample = Some(at + interval);
                            }
                        }
                        if let Some(p) = progress.as_mut().filter(|p| now >= p.next_at()) {
                            let swap = engine.as_ref().map(|e| e.stats());
                            let stage2 = stats.read().ok();
                            let elapsed = started.elapsed();
                            let line = p.due(now, elapsed, swap.as_ref(), stage2.as_ref());
                            if let Some(line) = line {
                                eprintln!("{line}");
                            }
                        }
                        if deadline.is_some_and(|d| now >= d) {
                            let waiting: Vec<usize> = (0..statuses.len())
                                .filter(|i| statuses[*i].is_none())
                                .collect();
                            failure = Some(format!(
                            "timed out after {:.1} s (--timeout); vCPUs still running: {waiting:?}",
                            started.elapsed().as_secs_f64()
                        ));
                            exit_status = Some(EXIT_TIMEOUT);
                            exit_kind = ExitKind::Timeout;
                            break;
                        }
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            None => match events_rx.recv() {
                Ok(event) => event,
                Err(_) => break,
            },
        };
        match event {
            VcpuEvent::Finished { index, status } => statuses[index as usize] = Some(status),
            VcpuEvent::GuestReset { how } | VcpuEvent::Quit { how } => {
                // A guest reset or power-off, the console user's Ctrl-A x,
                // or `quit` on the control socket.
                eprintln!("hugevmm: ending the VM: {how}");
                if matches!(event, VcpuEvent::Quit { .. }) {
                    exit_kind = ExitKind::Quit;
                }
                statuses.iter_mut().for_each(|s| *s = Some(s.unwrap_or(0)));
                break;
            }
            VcpuEvent::Signal { signo } => {
                eprintln!(
                    "hugevmm: ending the VM: {} received (a second one ends hugevmm at once)",
                    signals::signal_name(signo)
                );
                exit_status = Some(signals::exit_status(signo));
                exit_kind = ExitKind::Signal;
                break;
            }
            VcpuEvent::SwapFatal { message } => {
                failure = Some(format!("swap engine: {message}"));
                exit_status = Some(EXIT_VM_FAILURE);
                exit_kind = ExitKind::VmFailure;
                break;
            }
            VcpuEvent::Forbidden { message } => {
                failure = Some(message);
                exit_status = Some(crate::seccomp::TRAPPED_STATUS);
                exit_kind = ExitKind::VmFailure;
                break;
            }
            VcpuEvent::Fatal { index, message } => {
                failure = Some(format!("vCPU {index}: {message}"));
                exit_status = Some(EXIT_VM_FAILURE);
                exit_kind = ExitKind::VmFailure;
                break;
            }
        }
    }
    TheEnd {
        statuses,
        failure,
        exit_status,
        exit_kind,
        timeline,
    }
}

/// The end of a run (docs/ARCHITECTURE.md, "The end of a run"): reads the
/// statistics, stops the vCPUs while the engine still serves their faults,
/// shuts the control socket, pages out, snapshots the balloon, drops the
/// devices, and only then the engine. The resources are parameters in the
/// order `run` declared them, so that on an early return they are dropped
/// in the same order as before (parameters drop in reverse order).
#[allow(clippy::too_many_arguments)]
fn finish(
    config: &RunConfig,
    started: Instant,
    end: TheEnd,
    stats: &KvmStats,
    tsc_khz: Option<u32>,
    engine: Option<Arc<SwapEngine>>,
    machine: MachineDevices,
    _console_input: Option<console_input::ConsoleInput>,
    control: Vec<ControlServer>,
    stop: crate::vcpu_stop::StopFlag,
    mut vcpu_threads: Vec<JoinHandle<()>>,
) -> Result<RunOutcome> {
    let TheEnd {
        statuses,
        failure,
        exit_status,
        exit_kind,
        timeline,
    } = end;
    let elapsed = started.elapsed();
    // Read while the vCPUs are as the guest left them.
    let swap_stats = engine.as_ref().map(|e| e.stats());
    let stage2 = stats.read().context("cannot read KVM statistics")?;
    // vCPUs first, while the engine still serves the faults they may be
    // blocked in; after a failure one may be stuck for good, so the wait is
    // short then.
    let stop_limit = if failure.is_none() {
        VCPU_STOP_LIMIT
    } else {
        VCPU_STOP_LIMIT_AFTER_FAILURE
    };
    let still_running = crate::vcpu_stop::stop_all(&stop, &mut vcpu_threads, stop_limit);
    if still_running > 0 && failure.is_none() {
        eprintln!(
            "hugevmm: {still_running} vCPU(s) did not stop within {stop_limit:?}; guest memory stays served until hugevmm exits"
        );
    }
    let vcpus_still_running = still_running > 0;
    for server in control {
        // After a failure a request may be stuck on guest memory nobody
        // will serve any more: do not wait for it then.
        server.shutdown(failure.is_none());
    }
    let pageout = match (&engine, config.pageout_at_exit && failure.is_none()) {
        (Some(engine), true) => {
            let resident_bytes_before = engine.stats().resident_bytes;
            let t0 = Instant::now();
            let report = engine
                .evict_all()
                .context("--pageout: evicting guest RAM failed")?;
            let elapsed = t0.elapsed();
            Some(Pageout {
                resident_bytes_before,
                resident_bytes_after: engine.stats().resident_bytes,
                elapsed,
                report,
            })
        }
        _ => None,
    };
    let balloon = machine.balloon.as_ref().and_then(|b| {
        // After a failure a vCPU may hold the device forever (blocked on
        // guest memory); the figures are not worth hanging for.
        if failure.is_none() {
            Some(b.snapshot())
        } else {
            b.try_snapshot()
        }
    });
    // The devices hold the engine too (balloon drops); release them first.
    drop(machine);
    // A fault thread may be blocked on an NBD server that is down (its
    // client retries for the store's timeout=, possibly long): shutting the
    // engine down would join it, so a SIGTERM could not end the VM.
    let store_unreachable = blockio::nbd::clients_reconnecting() > 0;
    if store_unreachable && engine.is_some() {
        eprintln!(
            "hugevmm: an NBD server is unreachable: not waiting for the requests to it (the process exit ends them)"
        );
    }
    match engine.map(Arc::try_unwrap) {
        // Every vCPU thread has ended and the devices (served on vCPU
        // threads) and the control socket are gone: nothing can fault any
        // more.
        Some(Ok(engine)) if failure.is_none() && !vcpus_still_running && !store_unreachable => {
            engine.shutdown()
        }
        // vCPUs may still run or be blocked in faults. Unregistering would
        // let them see empty memory before the process exits; keep the
        // engine (and its threads) until then.
        Some(Ok(engine)) => std::mem::forget(engine),
        Some(Err(engine)) => std::mem::forget(engine),
        None => {}
    }
    // vCPU threads still running (after a failure or timeout) are left to
    // the process exit: the VM ends with this run.
    Ok(RunOutcome {
        exit_status: exit_status.unwrap_or_else(|| combined_status(&statuses)),
        exit_kind,
        vcpu_statuses: statuses,
        failure,
        elapsed,
        stage2,
        tsc_khz,
        swap: swap_stats,
        timeline,
        pageout,
        balloon,
    })
}

/// Writes the VMM region, the boot info and the image of a payload.
fn load_payload(
    ram: &GuestRam,
    ranges: &[GpaRange],
    payload: &Payload,
    args: &str,
    image: &elf::PayloadImage,
    vcpus: u32,
    machine: &MachineDevices,
) -> Result<()> {
    let version = image
        .max_protocol_version
        .clamp(1, bootinfo::PROTOCOL_VERSION);
    if version < 2 && !machine.windows.is_empty() {
        bail!(
            "payload {} speaks protocol version 1, which has no devices: drop --disk/--balloon or rebuild it with the current SDK (docs/PAYLOAD_PROTOCOL.md, version 2)",
            payload.name
        );
    }
    let windows: Vec<GpaRange> = machine
        .windows
        .iter()
        .map(|w| GpaRange {
            start: w.base,
            end: w.base + w.size_bytes,
        })
        .collect();
    let region = tables::build_vmm_region(vcpus, ranges, &windows)?;
    let used: Vec<GpaRange> = image
        .segments
        .iter()
        .map(|s| GpaRange {
            start: s.gpa,
            end: s.end_gpa(),
        })
        .collect();
    let free = bootinfo::free_ranges(ranges, &used);
    let mmio: Vec<bootinfo::MmioWindow> = machine
        .windows
        .iter()
        .map(|w| bootinfo::MmioWindow {
            base: w.base,
            size_bytes: w.size_bytes,
            irq: w.irq,
        })
        .collect();
    let boot_info = bootinfo::encode(
        version,
        vcpus,
        ram.layout().ram_bytes(),
        args.as_bytes(),
        &free,
        &mmio,
    )?;
    ram.write_bytes(0, &region)
        .context("writing the VMM region")?;
    ram.write_bytes(BOOT_INFO_GPA, &boot_info)
        .context("writing the boot info")?;
    for segment in &image.segments {
        let bytes =
            &payload.elf[segment.file_offset..segment.file_offset + segment.file_bytes as usize];
        // The bss needs no write: guest RAM is fresh anonymous (or hugetlb)
        // memory, which reads as zero.
        ram.write_bytes(segment.gpa, bytes)
            .with_context(|| format!("loading segment at {:#x}", segment.gpa))?;
    }
    Ok(())
}

fn describe_ram(layout: &Layout) -> String {
    let parts: Vec<String> = layout
        .regions()
        .iter()
        .map(|r| format!("[{:#x}, {:#x})", r.gpa, r.gpa + r.len_bytes))
        .collect();
    format!(
        "{} at {}",
        format_size(layout.ram_bytes()),
        parts.join(" and ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_first_nonzero_and_never_wraps_to_zero() {
        assert_eq!(combined_status(&[Some(0), Some(0)]), 0);
        assert_eq!(combined_status(&[Some(0), Some(7), Some(3)]), 7);
        assert_eq!(combined_status(&[Some(256)]), 255);
        assert_eq!(combined_status(&[Some(1), None]), 1);
    }
}
