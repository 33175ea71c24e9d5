//! `hugevmm host`: a supervisor that starts several VMs from their config
//! files and divides one memory budget among them (issue 30, item 4).
//!
//! Each VM is a `hugevmm run` process of its own, with its own seccomp
//! filters and API socket in the state folder; the supervisor runs no
//! guest and touches no guest memory, it only reads each VM's figures
//! (`GET /stats`: limit, resident memory, stall, working-set estimate)
//! once a period and sets their limits (`PUT /mem-limit`) by the law in
//! [`law`]. Limits that go down are set before limits that go up, so the
//! sum of the limits stays within the budget at every moment. A VM that
//! ends gives its memory back at the next period. If the supervisor dies,
//! the VMs run on with their last limits (they are processes of their own,
//! and a limit lives in the VM).
//!
//! - [`law`]: the division.
//! - [`child`]: one VM: started, read, steered, stopped.
//! - [`api`]: the supervisor's own API (`--api-socket`).

mod api;
mod child;
pub mod law;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guestmem::size::format_size;

use crate::control::ControlSocket;
use crate::run_options::{self, RunFlags};
use api::{HostState, VmView};
use child::{ChildVm, Launch};
use law::Demand;

/// The swap unit the limits are whole numbers of: the VMs' limits must be
/// multiples of their unit, and 2 MiB is a multiple of every unit.
const UNIT_BYTES: u64 = 2 << 20;

/// Arguments of `hugevmm host`.
#[derive(clap::Args, Debug)]
pub struct HostArgs {
    /// The memory all the VMs together may keep resident (e.g. 1G).
    #[arg(long, value_name = "SIZE", value_parser = run_options::parse_size_arg)]
    budget: u64,
    /// A VM's description (the `--config` file of `hugevmm run`); give one
    /// per VM. Its name is the file's stem.
    #[arg(long = "vm", value_name = "CONFIG", required = true)]
    vms: Vec<PathBuf>,
    /// No VM's limit goes below this (nor below what its vCPUs need, 8 MiB
    /// per vCPU + 8 MiB).
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = run_options::parse_size_arg)]
    floor: u64,
    /// The stall (waits on refaults, percent of the VM's vCPU time) above
    /// which a VM asks for half as much again as its limit.
    #[arg(long, value_name = "PCT", default_value_t = 2.0)]
    stall_target: f64,
    /// How often the limits are set, ms (100 to 60000).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    period_ms: u64,
    /// Working-set sampling in each VM (`--working-set-sampling`), units per
    /// second; 0: none added (a VM's file may still ask for it; without an
    /// estimate the law uses resident memory and stall alone).
    #[arg(long, value_name = "UNITS_PER_S", default_value_t = 2.0)]
    sampling: f64,
    /// Where the VMs' sockets, statistics and output go (created if
    /// missing; default: a new folder hugevmm-host-PID in $TMPDIR).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Write the run's report here: each VM's end and limits, and the
    /// limits and stall of every period.
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,
    /// Steer the balloons of the VMs whose config gives them one
    /// (`"balloon": true`): before a VM's limit goes down, and whenever it
    /// changes, its balloon target is set to what its RAM has above the
    /// limit, so that the guest gives back memory it does not need before
    /// the engine evicts.
    #[arg(long)]
    balloons: bool,
    /// Serve the supervisor's API on this Unix socket (mode 0600): the VMs
    /// (`GET /vms`), the budget (`GET`/`PUT /budget`) and `GET /metrics`
    /// with a `vm` label.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
}

/// One VM's description as the supervisor checked it.
struct Planned {
    config: PathBuf,
    name: String,
    mem_bytes: u64,
    floor_bytes: u64,
    balloon: bool,
}

/// Checks the arguments and every config file before any VM starts.
fn plan(args: &HostArgs) -> Result<Vec<Planned>> {
    if !(100..=60_000).contains(&args.period_ms) {
        bail!("--period-ms {}: give 100 to 60000", args.period_ms);
    }
    if !(args.stall_target.is_finite() && args.stall_target > 0.0 && args.stall_target < 100.0) {
        bail!(
            "--stall-target {}: give a percentage above 0 and below 100",
            args.stall_target
        );
    }
    let slowest = swap::engine::working_set::MIN_UNITS_PER_SECOND;
    if !(args.sampling == 0.0 || (slowest..=1000.0).contains(&args.sampling)) {
        bail!(
            "--sampling {}: give 0 (none) or {slowest} (one unit an hour) to 1000 units per second",
            args.sampling
        );
    }
    let mut planned: Vec<Planned> = Vec::new();
    for config in &args.vms {
        let resolved = run_options::resolve(RunFlags {
            config: Some(config.clone()),
            ..RunFlags::default()
        })
        .with_context(|| format!("--vm {}", config.display()))?;
        let stem = config
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("vm");
        let mut name = stem.to_string();
        let mut n = 2;
        while planned.iter().any(|p| p.name == name) {
            name = format!("{stem}-{n}");
            n += 1;
        }
        let need = swap::engine::MemLimit::min_bytes(resolved.vcpus);
        let floor_bytes = args.floor.max(need).div_ceil(UNIT_BYTES) * UNIT_BYTES;
        if floor_bytes > resolved.mem {
            bail!(
                "--vm {}: its floor {} is more than its guest RAM {}: lower --floor or give it more --mem",
                config.display(),
                format_size(floor_bytes),
                format_size(resolved.mem)
            );
        }
        planned.push(Planned {
            config: config.clone(),
            name,
            mem_bytes: resolved.mem,
            floor_bytes,
            balloon: args.balloons && resolved.balloon(),
        });
    }
    let floors: u64 = planned.iter().map(|p| p.floor_bytes).sum();
    if floors > args.budget {
        bail!(
            "--budget {} is below the VMs' floors together ({}): give a larger budget, fewer VMs or a lower --floor",
            format_size(args.budget),
            format_size(floors)
        );
    }
    Ok(planned)
}

/// Runs `hugevmm host`; its exit status: 0 when every VM exited 0, else
/// the first VM's non-zero status (in the order given).
pub fn run(args: HostArgs) -> Result<i32> {
    let planned = plan(&args)?;
    let state_dir = state_dir(args.state_dir.as_deref())?;
    let binary = std::env::current_exe().context("cannot find the hugevmm binary")?;
    let state = Arc::new(HostState::new(
        args.budget,
        planned.iter().map(|p| p.floor_bytes).sum(),
    ));
    // Bound before any VM starts, so that a path in use fails at once.
    let socket = args
        .api_socket
        .as_deref()
        .map(|path| ControlSocket::bind(path, &[]))
        .transpose()?;
    let signals = StopSignals::install()?;
    // The first limits: the law with no figures yet, every VM asking for
    // an equal share.
    let share = args.budget / planned.len() as u64;
    let first = law::divide(
        args.budget,
        &planned
            .iter()
            .map(|p| Demand {
                floor_bytes: p.floor_bytes,
                max_bytes: p.mem_bytes,
                limit_bytes: 0,
                need_bytes: share,
                stall_share: 0.0,
            })
            .collect::<Vec<_>>(),
        UNIT_BYTES,
    );
    let mut vms = Vec::new();
    for (p, limit_bytes) in planned.into_iter().zip(first) {
        let started = ChildVm::start(Launch {
            binary: &binary,
            config: &p.config,
            name: p.name.clone(),
            state_dir: &state_dir,
            mem_bytes: p.mem_bytes,
            floor_bytes: p.floor_bytes,
            limit_bytes,
            sampling: (args.sampling > 0.0).then_some(args.sampling),
            balloon: p.balloon,
        });
        match started {
            Ok(vm) => vms.push(vm),
            Err(e) => {
                // The ones started end as on SIGTERM, and are waited for.
                vms.iter().for_each(ChildVm::stop);
                vms.iter_mut().for_each(ChildVm::wait);
                return Err(e);
            }
        }
    }
    state.set_vms(vms.iter().map(view).collect());
    let server = socket
        .map(|socket| socket.serve_routes(state.clone()))
        .transpose()?;
    eprintln!(
        "hugevmm host: {} VM(s) under a budget of {}; sockets, statistics and output in {}",
        vms.len(),
        format_size(args.budget),
        state_dir.display()
    );
    let mut report = Report::new(&args, &vms);
    let started = Instant::now();
    let period = Duration::from_millis(args.period_ms);
    let mut stopping = false;
    let mut killed = false;
    let mut next_period = Instant::now();
    loop {
        match signals.received() {
            0 => {}
            1 if !stopping => {
                eprintln!("hugevmm host: stop signal: ending the VMs (a second one kills them)");
                vms.iter().for_each(ChildVm::stop);
                stopping = true;
            }
            1 => {}
            _ if !killed => {
                eprintln!("hugevmm host: second stop signal: killing the VMs");
                vms.iter().for_each(ChildVm::kill);
                killed = true;
            }
            _ => {}
        }
        for vm in vms.iter_mut() {
            let was_running = vm.ended.is_none();
            if !vm.running() && was_running {
                eprintln!(
                    "hugevmm host: VM {} ended ({}); its memory goes to the others",
                    vm.name,
                    describe_status(vm.ended)
                );
            }
        }
        if vms.iter().all(|vm| vm.ended.is_some()) {
            break;
        }
        if !stopping && Instant::now() >= next_period {
            steer(&args, state.budget_bytes(), &mut vms, &mut report, started);
            state.set_vms(vms.iter().map(view).collect());
            next_period = Instant::now() + period;
        }
        // Short naps: a signal or a VM's end is seen within one.
        std::thread::sleep(period.min(Duration::from_millis(100)));
    }
    state.set_vms(vms.iter().map(view).collect());
    if let Some(server) = server {
        server.shutdown(true);
    }
    report.finish(&vms, started);
    for line in report.summary() {
        eprintln!("{line}");
    }
    if let Some(path) = &args.report {
        let text = serde_json::to_string_pretty(&report.json)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write --report {}", path.display()))?;
    }
    Ok(vms
        .iter()
        .map(|vm| exit_code(vm.ended))
        .find(|&code| code != 0)
        .unwrap_or(0))
}

/// One period: reads every running VM, divides the budget, and sets the
/// limits that change, those that go down first.
fn steer(
    args: &HostArgs,
    budget_bytes: u64,
    vms: &mut [ChildVm],
    report: &mut Report,
    started: Instant,
) {
    let target = args.stall_target / 100.0;
    let mut running = Vec::new();
    let mut demands = Vec::new();
    for (i, vm) in vms.iter_mut().enumerate() {
        if vm.ended.is_some() {
            continue;
        }
        let Some(reading) = vm.read() else {
            // Starting or ending: its current limit stays, and is counted.
            let held = vm.limit_bytes;
            running.push((i, held, false));
            demands.push(Demand {
                floor_bytes: held,
                max_bytes: held,
                limit_bytes: held,
                need_bytes: held,
                stall_share: 0.0,
            });
            continue;
        };
        let stall_share = vm.stall_share();
        running.push((i, reading.limit_bytes, true));
        demands.push(Demand {
            floor_bytes: vm.floor_bytes,
            max_bytes: vm.mem_bytes,
            limit_bytes: reading.limit_bytes,
            need_bytes: law::need_bytes(
                reading.limit_bytes,
                reading.resident_bytes,
                reading.estimate_bytes,
                stall_share,
                target,
            ),
            stall_share,
        });
    }
    let limits = law::divide(budget_bytes, &demands, UNIT_BYTES);
    // Down first, then up: the sum never passes the budget in between.
    let mut changes: Vec<(usize, u64, u64)> = running
        .iter()
        .zip(&limits)
        .filter(|((_, now, readable), new)| *readable && *now != **new)
        .map(|(&(i, now, _), &new)| (i, now, new))
        .collect();
    changes.sort_by_key(|&(_, now, new)| new > now);
    // What is in force: a lowering that failed (a VM ending, or too slow to
    // answer) keeps its old limit, so a raise goes out only if it fits
    // beside what is in force; the rest waits for the next period.
    let mut in_force: u64 = running.iter().map(|&(_, now, _)| now).sum();
    for (i, now, new) in changes {
        if new > now && in_force - now + new > budget_bytes {
            log::info!(
                "host: VM {}: raise to {} waits: a lowering did not take",
                vms[i].name,
                format_size(new)
            );
            continue;
        }
        // The guest first: a lowering asks it to give memory back before
        // the engine evicts; a raise lets it have the memory back after.
        let balloon = |vm: &mut ChildVm| {
            if let Err(e) = vm.set_balloon_for(new) {
                log::info!("host: VM {}: balloon not set: {e:#}", vm.name);
            }
        };
        if new < now {
            balloon(&mut vms[i]);
        }
        if let Err(e) = vms[i].set_limit(new) {
            // Ending meanwhile, or a limit it cannot take: it keeps `now`.
            log::info!(
                "host: VM {}: limit {} not set: {e:#}",
                vms[i].name,
                format_size(new)
            );
            continue;
        }
        log::debug!(
            "host: VM {}: limit {} -> {}",
            vms[i].name,
            format_size(now),
            format_size(new)
        );
        vms[i].limit_bytes = new;
        in_force = in_force - now + new;
        if new > now {
            balloon(&mut vms[i]);
        }
    }
    // A balloon not set yet (the first period) follows the limit in force.
    for &(i, now, readable) in &running {
        if readable && vms[i].balloon_target_bytes.is_none() {
            if let Err(e) = vms[i].set_balloon_for(now) {
                log::info!("host: VM {}: balloon not set: {e:#}", vms[i].name);
            }
        }
    }
    report.sample(vms, started);
}

/// The state folder: the one given (created if missing), or a new one of
/// this process's, mode 0700, in `$TMPDIR` (refused if it exists: another
/// user could have made it to plant links or sockets in it).
fn state_dir(given: Option<&Path>) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    match given {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the state folder {}", dir.display()))?;
            Ok(dir.to_path_buf())
        }
        None => {
            let dir = std::env::temp_dir().join(format!("hugevmm-host-{}", std::process::id()));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .with_context(|| {
                    format!(
                        "cannot create a new state folder {} (give one with --state-dir)",
                        dir.display()
                    )
                })?;
            Ok(dir)
        }
    }
}

/// Counts the stop signals (SIGTERM, SIGINT, SIGHUP); one delivered twice
/// within [`crate::signals::SECOND_SIGNAL_AFTER`] (GNU timeout signals
/// the child and then its group) counts once.
struct StopSignals {
    count: Arc<AtomicUsize>,
}

impl StopSignals {
    fn install() -> Result<StopSignals> {
        let mut signals =
            signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
                .context("cannot install signal handlers")?;
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut last: Option<Instant> = None;
                for _ in signals.forever() {
                    let now = Instant::now();
                    if last.is_none_or(|t| now - t >= crate::signals::SECOND_SIGNAL_AFTER) {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    last = Some(now);
                }
            })
            .context("cannot spawn the signal thread")?;
        Ok(StopSignals { count })
    }

    fn received(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// A VM as the API shows it.
fn view(vm: &ChildVm) -> VmView {
    let last = vm.last.clone().unwrap_or_default();
    VmView {
        name: vm.name.clone(),
        running: vm.ended.is_none(),
        exit_status: vm.ended.map(|s| exit_code(Some(s))),
        mem_bytes: vm.mem_bytes,
        floor_bytes: vm.floor_bytes,
        limit_bytes: vm.limit_bytes,
        resident_bytes: last.resident_bytes,
        estimate_bytes: last.estimate_bytes,
        stall_share: vm.stall_share(),
        socket: vm.socket.clone(),
    }
}

/// A VM's exit status as a number: its code, or 128 + the signal.
fn exit_code(status: Option<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        None => 0,
    }
}

fn describe_status(status: Option<std::process::ExitStatus>) -> String {
    format!("exit status {}", exit_code(status))
}

/// The run's report: the limits and stall of every period, and each VM's
/// end.
struct Report {
    json: serde_json::Value,
    /// Per VM: sum of limits over periods, periods, least and most limit.
    limits: Vec<(u128, u64, u64, u64)>,
}

impl Report {
    fn new(args: &HostArgs, vms: &[ChildVm]) -> Report {
        Report {
            json: serde_json::json!({
                "budget_bytes": args.budget,
                "period_ms": args.period_ms,
                "stall_target_pct": args.stall_target,
                "timeline": [],
                "vms": vms.iter().map(|vm| serde_json::json!({
                    "name": vm.name,
                    "config": vm.config,
                    "mem_bytes": vm.mem_bytes,
                    "floor_bytes": vm.floor_bytes,
                    "socket": vm.socket,
                    "stats_json": vm.stats_path,
                    "stdout": vm.log_paths.0,
                    "stderr": vm.log_paths.1,
                })).collect::<Vec<_>>(),
            }),
            limits: vec![(0, 0, u64::MAX, 0); vms.len()],
        }
    }

    /// One period's line of the timeline: the running VMs' figures.
    fn sample(&mut self, vms: &[ChildVm], started: Instant) {
        let mut entries = Vec::new();
        for (i, vm) in vms.iter().enumerate() {
            if vm.ended.is_some() {
                continue;
            }
            let limit = vm.limit_bytes;
            let l = &mut self.limits[i];
            l.0 += u128::from(limit);
            l.1 += 1;
            l.2 = l.2.min(limit);
            l.3 = l.3.max(limit);
            let last = vm.last.clone().unwrap_or_default();
            entries.push(serde_json::json!({
                "name": vm.name,
                "limit_bytes": limit,
                "resident_bytes": last.resident_bytes,
                "estimate_bytes": last.estimate_bytes,
                "stall_share": vm.stall_share(),
            }));
        }
        if let Some(timeline) = self.json["timeline"].as_array_mut() {
            timeline.push(serde_json::json!({
                "t_s": started.elapsed().as_secs_f64(),
                "vms": entries,
            }));
        }
    }

    /// Each VM's end and limits, and the run's length.
    fn finish(&mut self, vms: &[ChildVm], started: Instant) {
        self.json["elapsed_s"] = started.elapsed().as_secs_f64().into();
        for (i, vm) in vms.iter().enumerate() {
            let (sum, n, least, most) = self.limits[i];
            let entry = &mut self.json["vms"][i];
            entry["exit_status"] = exit_code(vm.ended).into();
            entry["limit"] = serde_json::json!({
                "mean_bytes": (n > 0).then(|| (sum / u128::from(n)) as u64),
                "least_bytes": (n > 0).then_some(least),
                "most_bytes": (n > 0).then_some(most),
            });
        }
    }

    /// A line per VM for stderr.
    fn summary(&self) -> Vec<String> {
        let vms = self.json["vms"].as_array().cloned().unwrap_or_default();
        vms.iter()
            .map(|vm| {
                let size = |key: &str| {
                    vm["limit"][key]
                        .as_u64()
                        .map_or_else(|| "-".to_string(), format_size)
                };
                format!(
                    "hugevmm host: VM {}: exit status {}; limit {} to {}, mean {}; its figures in {}",
                    vm["name"].as_str().unwrap_or("?"),
                    vm["exit_status"],
                    size("least_bytes"),
                    size("most_bytes"),
                    size("mean_bytes"),
                    vm["stats_json"].as_str().unwrap_or("?"),
                )
            })
            .collect()
    }
}
