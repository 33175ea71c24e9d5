//! One run of a guest: builds the machine ([`Vm`]), loads the guest, runs
//! the vCPUs until the run ends, and ends it in the order the fields of
//! [`Vm`] give.

use crate::console::ConsoleSink;
use crate::control::server::ControlServer;
use crate::control::{ControlContext, ControlSocket, MetricsListener};
use crate::cpu::{self, EntryState};
use crate::event::RunEvent;
use crate::exit::{
    combined_status, signal_status, ExitKind, EXIT_TIMEOUT, EXIT_TRAPPED, EXIT_VM_FAILURE,
};
use crate::host_terminal::{self, HostTerminal};
use crate::linux::{self, LinuxBootConfig, MachineInfo};
use crate::machine_devices::{self, DeviceOptions, Interrupts, MachineDevices};
use crate::outcome::{Pageout, RunOutcome, Sample};
use crate::payload::bootinfo::{self, GpaRange};
use crate::payload::layout::{BOOT_INFO_GPA, MAX_VCPUS};
use crate::payload::{elf, tables};
use crate::seccomp::RamTeardown;
use crate::signals::{self, StopSignals};
use crate::swap_setup::{self, SwapOptions};
use crate::vcpu::{self, GuestKind, UnknownAccessLog, VcpuContext};
use crate::vcpu_stop::VcpuThreads;
use anyhow::{bail, Context, Result};
use guestmem::{format_size, Backing, GuestRam, KvmStats, Layout};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use swap::engine::SwapEngine;
use vm_memory::{Address, GuestAddress};

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
            start: r.gpa.raw_value(),
            end: r.end_gpa().raw_value(),
        })
        .collect()
}

/// Runs the guest to completion: checks the configuration and the host,
/// builds the machine, loads the guest, creates and starts the vCPUs,
/// waits for the end of the run, and ends it in the order that keeps guest
/// memory served while anything may still touch it ([`Vm`]).
pub fn run(mut config: RunConfig, console: ConsoleSink) -> Result<RunOutcome> {
    let (layout, ranges, image, kind) = check_config(&config)?;
    crate::seccomp::init(config.seccomp)?;
    if crate::seccomp::enabled() {
        // Before any store or disk is opened: their NBD reader threads
        // install the filter of their kind first thing.
        blockio::nbd::set_reader_thread_setup(|| {
            crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Nbd)
        });
        blockio::vhost_user_blk::set_worker_thread_setup(|| {
            crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::VhostUser)
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

    let (events_tx, events_rx) = mpsc::channel();
    let mut vm = Vm::build(&mut config, &layout, kind, &events_tx)?;
    // Not before: the engine opens /proc/self/pagemap, which a
    // non-dumpable process may open only as root. Nothing of the guest is
    // in memory yet (the key is in a page left out of core dumps).
    crate::dumpable::set(config.dumpable)?;
    let entry = vm.load_guest(&config, &ranges, &image)?;
    let (vcpu_fds, tsc_khz) = vm.create_vcpus(&config, &entry, &image)?;
    vm.start_host_terminal(kind, &events_tx);
    let started = Instant::now();
    vm.serve_control(
        control_socket,
        metrics_listener,
        &config,
        started,
        &events_tx,
    )?;
    vm.spawn_vcpus(vcpu_fds, kind, &console, &events_tx)?;
    // The run loop's channel closes if every thread that reports is gone.
    drop(events_tx);
    vm.ram.start_teardown()?;
    // Last: every other thread has started, and filters only narrow.
    crate::seccomp::install(crate::seccomp::ThreadKind::Main)?;

    let mut end = wait_for_the_end(&config, &events_rx, started, &vm.engine, &vm.stats);
    end.account_for_trap();
    vm.finish(&config, started, end, tsc_khz)
        .map(crate::seccomp::account_for_trap)
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
                |start, len| layout.contains(GuestAddress(start), len),
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

/// A built machine and everything its run holds, owned in one place so
/// that the run comes apart in one order whichever way it ends.
///
/// **Teardown order is field order.** [`Vm::finish`] ends a run by
/// releasing the fields one by one in the order they are declared, and
/// Rust drops a struct's fields in that same order, so an error while the
/// machine is built or the run ends (or a panic) tears down in the order
/// of a normal end. A field's place is where nothing that comes after it
/// can still need it:
///
/// 1. `vcpus`: `finish` stops the vCPU threads and waits for them while
///    the engine still serves the faults they may be blocked in (a thread
///    that does not stop in time, and every thread when the value is only
///    dropped, is left to the process exit);
/// 2. `control`: the API and metrics servers, whose requests reach the
///    devices, the engine and guest memory;
/// 3. `host_terminal`: the terminal restored, the thread feeding it to the
///    serial port stopped;
/// 4. `devices`: they are served on vCPU threads and hold the engine
///    (balloon drops);
/// 5. `engine`: `finish` shuts it down only once nothing can fault any
///    more and keeps it until the process exits otherwise (an unregistered
///    range hands out zero pages);
/// 6. `ram`: guest RAM, dropped on the teardown thread once the main
///    thread's filter forbids deleting memslots ([`HeldRam`]);
/// 7. `stats`, `vm_fd`, `kvm`: KVM's descriptors.
struct Vm {
    vcpus: VcpuThreads,
    control: Vec<ControlServer>,
    host_terminal: Option<HostTerminal>,
    devices: MachineDevices,
    engine: Option<Arc<SwapEngine>>,
    ram: HeldRam,
    stats: KvmStats,
    vm_fd: VmFd,
    kvm: Kvm,
}

/// Guest RAM as the run holds it. Until [`HeldRam::start_teardown`] it is
/// dropped on the thread that drops the holder; after, on the teardown
/// thread (`seccomp::RamTeardown`), the one thread whose filter allows
/// deleting memslots.
struct HeldRam {
    /// Some until dropped.
    ram: Option<Arc<GuestRam>>,
    teardown: Option<RamTeardown>,
}

impl HeldRam {
    fn get(&self) -> &Arc<GuestRam> {
        self.ram.as_ref().expect("guest RAM is held until dropped")
    }

    /// Starts the thread that will drop guest RAM. Call before the main
    /// thread installs its filter: it forbids starting threads, and the
    /// memslots must be deleted on a thread whose filter allows it.
    fn start_teardown(&mut self) -> Result<()> {
        self.teardown = Some(RamTeardown::start()?);
        Ok(())
    }
}

impl Drop for HeldRam {
    fn drop(&mut self) {
        let Some(ram) = self.ram.take() else {
            return;
        };
        match self.teardown.take() {
            Some(teardown) => teardown.release(ram),
            None => drop(ram),
        }
    }
}

impl Vm {
    /// Opens KVM, allocates guest RAM, creates the VM and its memslots,
    /// forwards the stop signals and seccomp traps into `events`, starts
    /// the swap engine when asked for, and builds the devices. The vCPUs,
    /// the API servers and the host terminal come later.
    fn build(
        config: &mut RunConfig,
        layout: &Layout,
        kind: GuestKind,
        events: &Sender<RunEvent>,
    ) -> Result<Vm> {
        let kvm = open_kvm()?;
        let ram = Arc::new(
            GuestRam::new(layout.clone(), config.backing).context("cannot allocate guest RAM")?,
        );
        let vm_fd = kvm.create_vm().context("KVM_CREATE_VM failed")?;
        if kind == GuestKind::Linux {
            linux::prepare_vm(&vm_fd).context("cannot set up the interrupt controllers")?;
        } else {
            // Only needed by VMX hosts for real-mode emulation; harmless elsewhere.
            let _ = vm_fd.set_tss_address(0xfffb_d000);
        }
        ram.register_memslots(&vm_fd)
            .context("cannot register guest RAM with KVM")?;
        let stats = KvmStats::open(&vm_fd).context("cannot open KVM statistics")?;
        crate::seccomp::forward_traps(events.clone())?;
        if let Some(stop_signals) = config.stop_signals.take() {
            stop_signals.forward(events.clone())?;
        }
        let (engine, old_store_content) = match &config.swap {
            Some(options) => {
                let started = swap_setup::start(&ram, options, config.vcpus, events.clone())?;
                (Some(Arc::new(started.engine)), started.old_content)
            }
            None => (None, None),
        };
        let interrupts = match kind {
            GuestKind::Linux => Interrupts::Irqchip(&vm_fd),
            GuestKind::Payload => Interrupts::Polled,
        };
        let devices = machine_devices::build(
            &ram,
            &config.devices,
            interrupts,
            kind == GuestKind::Linux,
            events,
        )?;
        if let Some(engine) = &engine {
            devices.free_memory.attach_engine(engine.clone());
        }
        // Every file is open and locked, and nothing has touched guest RAM.
        swap_setup::cut_old_content(old_store_content)?;
        Ok(Vm {
            vcpus: VcpuThreads::default(),
            control: Vec::new(),
            host_terminal: None,
            devices,
            engine,
            ram: HeldRam {
                ram: Some(ram),
                teardown: None,
            },
            stats,
            vm_fd,
            kvm,
        })
    }

    /// Loads the payload (none returned: its vCPUs are set up from the
    /// image) or the Linux kernel (its boot CPU's entry state returned).
    fn load_guest(
        &self,
        config: &RunConfig,
        ranges: &[GpaRange],
        image: &Option<elf::PayloadImage>,
    ) -> Result<Option<linux::BootSetup>> {
        let ram = self.ram.get();
        let entry = match (&config.guest, image) {
            (Guest::Payload { payload, args }, Some(image)) => {
                load_payload(
                    ram,
                    ranges,
                    payload,
                    args,
                    image,
                    config.vcpus,
                    &self.devices,
                )?;
                None
            }
            (Guest::Linux(boot), _) => {
                let mut boot = boot.clone();
                let devices = self.devices.kernel_cmdline();
                if !devices.is_empty() && boot.virtio_announce.in_cmdline() {
                    boot.cmdline = format!("{} {devices}", boot.cmdline);
                }
                let described = MachineInfo {
                    vcpus: config.vcpus,
                    virtio: self
                        .devices
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

    /// Creates the vCPUs and sets up their entry state; returns them and
    /// the TSC frequency of the first.
    fn create_vcpus(
        &self,
        config: &RunConfig,
        entry: &Option<linux::BootSetup>,
        image: &Option<elf::PayloadImage>,
    ) -> Result<(Vec<VcpuFd>, Option<u32>)> {
        let cpuid = self
            .kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .context("KVM_GET_SUPPORTED_CPUID failed")?;
        let mut vcpus = Vec::new();
        let mut tsc_khz = None;
        for index in 0..config.vcpus {
            let fd = self
                .vm_fd
                .create_vcpu(u64::from(index))
                .with_context(|| format!("cannot create vCPU {index}"))?;
            match (entry, image) {
                (Some(setup), _) => linux::configure_vcpu(&self.kvm, &fd, index, setup)
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

    /// Feeds the host terminal to a Linux guest's serial port, when stdin
    /// is a terminal in the foreground. Started after everything but the
    /// threads that run beside the guest; the console still shows output
    /// without it, so a failure is only a warning.
    fn start_host_terminal(&mut self, kind: GuestKind, events: &Sender<RunEvent>) {
        self.host_terminal = match (&self.devices.serial, kind) {
            (Some(serial), GuestKind::Linux) => {
                host_terminal::start(serial.clone(), events.clone()).unwrap_or_else(|e| {
                    eprintln!("hugevmm: no console input: {e}");
                    None
                })
            }
            _ => None,
        };
    }

    /// Starts the API's threads, for `--api-socket` and `--metrics-addr`.
    fn serve_control(
        &mut self,
        control_socket: Option<ControlSocket>,
        metrics_listener: Option<MetricsListener>,
        config: &RunConfig,
        started: Instant,
        events: &Sender<RunEvent>,
    ) -> Result<()> {
        if control_socket.is_none() && metrics_listener.is_none() {
            return Ok(());
        }
        let context = Arc::new(ControlContext {
            payload: config.guest.name(),
            vcpus: config.vcpus,
            mem_bytes: config.mem_bytes,
            backing: config.backing,
            config: config.options_json.clone(),
            started,
            balloon: self.devices.balloon.clone(),
            engine: self.engine.clone(),
            // Its own descriptor: the run loop keeps reading `stats`.
            kvm_stats: KvmStats::open(&self.vm_fd).ok(),
            events: events.clone(),
            pageout_lock: Default::default(),
        });
        if let Some(socket) = control_socket {
            self.control.push(socket.serve(context.clone())?);
        }
        if let Some(listener) = metrics_listener {
            self.control.push(listener.serve(context)?);
        }
        Ok(())
    }

    /// Installs the kick signal handler and starts one thread per vCPU.
    fn spawn_vcpus(
        &mut self,
        fds: Vec<VcpuFd>,
        kind: GuestKind,
        console: &ConsoleSink,
        events: &Sender<RunEvent>,
    ) -> Result<()> {
        let unknown = Arc::new(UnknownAccessLog::default());
        crate::vcpu_stop::install_kick_handler()
            .context("cannot install the vCPU kick signal handler")?;
        for (index, fd) in fds.into_iter().enumerate() {
            let ctx = VcpuContext {
                kind,
                pio: self.devices.pio.clone(),
                mmio: self.devices.mmio.clone(),
                index: index as u32,
                ram: self.ram.get().clone(),
                console: console.clone(),
                unknown: unknown.clone(),
                events: events.clone(),
                stop: self.vcpus.stop.clone(),
            };
            self.vcpus.threads.push(
                std::thread::Builder::new()
                    .name(format!("vcpu{index}"))
                    .spawn(move || vcpu::run(fd, ctx))
                    .context("cannot spawn a vCPU thread")?,
            );
        }
        Ok(())
    }
}

/// How the run loop ended.
struct TheEnd {
    statuses: Vec<Option<u32>>,
    failure: Option<String>,
    exit_status: Option<i32>,
    exit_kind: ExitKind,
    timeline: Vec<Sample>,
    /// What `--mem-limit auto` did.
    sizing: Option<crate::auto_limit::SizingReport>,
}

impl TheEnd {
    /// Takes a call a filter stopped as the run's failure, also when the
    /// loop ended before the seccomp watcher forwarded it (the watcher is
    /// a thread of its own, which a busy host may run after the vCPUs
    /// have finished): the trapped thread is parked for good, and the end
    /// of a failed run waits for no thread, where that of a clean one
    /// joins the API servers' and the engine's.
    fn account_for_trap(&mut self) {
        if self.failure.is_some() {
            return;
        }
        if let Some(message) = crate::seccomp::trapped_message() {
            self.failure = Some(message);
            self.exit_status = Some(EXIT_TRAPPED);
            self.exit_kind = ExitKind::VmFailure;
        }
    }
}

/// The run loop: waits for every vCPU's `Finished`, or the first event
/// that ends the run, or `--timeout`; samples the timeline meanwhile.
fn wait_for_the_end(
    config: &RunConfig,
    events_rx: &Receiver<RunEvent>,
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
    let mut auto_limit = match (engine, config.swap.as_ref().and_then(|s| s.auto_limit)) {
        (Some(_), Some(target)) => Some(crate::auto_limit::AutoLimit::new(
            target,
            config.vcpus,
            config.mem_bytes,
            started,
        )),
        _ => None,
    };
    while statuses.iter().any(Option::is_none) {
        let next_progress = progress.as_ref().map(|p| p.next_at());
        let next_sizing = auto_limit.as_ref().and_then(|a| a.next_at());
        let wake = [deadline, next_sample, next_progress, next_sizing]
            .into_iter()
            .flatten()
            .min();
        let event = match wake {
            Some(wake) => {
                match events_rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                    Ok(event) => event,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let now = Instant::now();
                        if let (Some(a), Some(engine)) = (auto_limit.as_mut(), engine) {
                            a.tick(engine, now);
                        }
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
            RunEvent::Finished { index, status } => statuses[index as usize] = Some(status),
            RunEvent::GuestReset { how } | RunEvent::Quit { how } => {
                // A guest reset or power-off, the console user's Ctrl-A x,
                // or `quit` on the control socket.
                eprintln!("hugevmm: ending the VM: {how}");
                if matches!(event, RunEvent::Quit { .. }) {
                    exit_kind = ExitKind::Quit;
                }
                statuses.iter_mut().for_each(|s| *s = Some(s.unwrap_or(0)));
                break;
            }
            RunEvent::Signal { signo } => {
                eprintln!(
                    "hugevmm: ending the VM: {} received (a second one ends hugevmm at once)",
                    signals::signal_name(signo)
                );
                exit_status = Some(signal_status(signo));
                exit_kind = ExitKind::Signal;
                break;
            }
            RunEvent::SwapFatal { message } => {
                failure = Some(format!("swap engine: {message}"));
                exit_status = Some(EXIT_VM_FAILURE);
                exit_kind = ExitKind::VmFailure;
                break;
            }
            RunEvent::Forbidden { message } => {
                failure = Some(message);
                exit_status = Some(EXIT_TRAPPED);
                exit_kind = ExitKind::VmFailure;
                break;
            }
            RunEvent::Fatal { index, message } => {
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
        sizing: auto_limit.map(|a| a.report()),
    }
}

impl Vm {
    /// The end of a run (docs/ARCHITECTURE.md, "The end of a run"): reads
    /// the statistics, then releases the fields in their order: stops the
    /// vCPUs while the engine still serves their faults, shuts the API
    /// servers, restores the terminal, pages out and snapshots the
    /// balloon, drops the devices, and only then the engine; guest RAM and
    /// KVM's descriptors go when `self`'s remaining fields drop.
    fn finish(
        mut self,
        config: &RunConfig,
        started: Instant,
        end: TheEnd,
        tsc_khz: Option<u32>,
    ) -> Result<RunOutcome> {
        let TheEnd {
            statuses,
            failure,
            exit_status,
            exit_kind,
            timeline,
            sizing,
        } = end;
        let elapsed = started.elapsed();
        // Read while the vCPUs are as the guest left them.
        let swap_stats = self.engine.as_ref().map(|e| e.stats());
        let stage2 = self.stats.read().context("cannot read KVM statistics")?;
        // After a failure a vCPU may be stuck for good, so the wait is
        // short then.
        let stop_limit = if failure.is_none() {
            VCPU_STOP_LIMIT
        } else {
            VCPU_STOP_LIMIT_AFTER_FAILURE
        };
        let still_running = self.vcpus.stop_all(stop_limit);
        if still_running > 0 && failure.is_none() {
            eprintln!(
                "hugevmm: {still_running} vCPU(s) did not stop within {stop_limit:?}; guest memory stays served until hugevmm exits"
            );
        }
        let vcpus_still_running = still_running > 0;
        // A thread a filter stopped while the run was ending is parked for
        // good: from then on the end waits for no thread, as after a
        // failure (the outcome names the call: `account_for_trap`).
        let clean = || failure.is_none() && crate::seccomp::trapped_message().is_none();
        for server in self.control.drain(..) {
            // After a failure a request may be stuck on guest memory nobody
            // will serve any more: do not wait for it then.
            server.shutdown(clean());
        }
        drop(self.host_terminal.take());
        let pageout = match (&self.engine, config.pageout_at_exit && failure.is_none()) {
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
        let balloon = self.devices.balloon.as_ref().and_then(|b| {
            // After a failure a vCPU may hold the device forever (blocked on
            // guest memory); the figures are not worth hanging for.
            if failure.is_none() {
                Some(b.snapshot())
            } else {
                b.try_snapshot()
            }
        });
        drop(self.devices);
        // A fault thread may be blocked on an NBD server that is down (its
        // client retries for the store's timeout=, possibly long): shutting
        // the engine down would join it, so a SIGTERM could not end the VM.
        let store_unreachable = blockio::nbd::clients_reconnecting()
            + blockio::vhost_user_blk::clients_reconnecting()
            > 0;
        if store_unreachable && self.engine.is_some() {
            eprintln!(
                "hugevmm: a storage server (NBD or vhost-user-blk) is unreachable: not waiting for the requests to it (the process exit ends them)"
            );
        }
        match self.engine.take().map(Arc::try_unwrap) {
            // Every vCPU thread has ended and the devices (served on vCPU
            // threads) and the API servers are gone: nothing can fault any
            // more.
            Some(Ok(engine)) if clean() && !vcpus_still_running && !store_unreachable => {
                // A thread a filter stops from here on (one that started
                // late, say) is parked for good: stop waiting then.
                engine.shutdown_unless(&|| crate::seccomp::trapped_message().is_some());
            }
            // vCPUs may still run or be blocked in faults. Unregistering
            // would let them see empty memory before the process exits;
            // keep the engine (and its threads) until then.
            Some(Ok(engine)) => std::mem::forget(engine),
            Some(Err(engine)) => std::mem::forget(engine),
            None => {}
        }
        // vCPU threads still running (after a failure or timeout) are left
        // to the process exit: the VM ends with this run.
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
            sizing,
        })
    }
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
    ram.write_bytes(GuestAddress(0), &region)
        .context("writing the VMM region")?;
    ram.write_bytes(GuestAddress(BOOT_INFO_GPA), &boot_info)
        .context("writing the boot info")?;
    for segment in &image.segments {
        let bytes =
            &payload.elf[segment.file_offset..segment.file_offset + segment.file_bytes as usize];
        // The bss needs no write: guest RAM is fresh anonymous (or hugetlb)
        // memory, which reads as zero.
        ram.write_bytes(GuestAddress(segment.gpa), bytes)
            .with_context(|| format!("loading segment at {:#x}", segment.gpa))?;
    }
    Ok(())
}

fn describe_ram(layout: &Layout) -> String {
    let parts: Vec<String> = layout
        .regions()
        .iter()
        .map(|r| format!("[{:#x}, {:#x})", r.gpa.raw_value(), r.end_gpa().raw_value()))
        .collect();
    format!(
        "{} at {}",
        format_size(layout.ram_bytes()),
        parts.join(" and ")
    )
}
