//! The filters: compiled once for the run ([`init`], in the mode
//! `--no-seccomp` and `HUGEVMM_SECCOMP_LOG` choose) and installed by each
//! thread for its kind ([`install`]).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::exit::EXIT_TRAPPED;
use crate::outcome::RunOutcome;
use anyhow::{bail, Context, Result};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

use super::kind::ThreadKind;
use super::{probe, rules, trap};

/// The environment variable that turns the trap into the kernel's log.
const LOG_VARIABLE: &str = "HUGEVMM_SECCOMP_LOG";

/// What the filters do with a forbidden call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It never runs, and the run ends (the default).
    Trap,
    /// It runs, and the kernel logs it (`HUGEVMM_SECCOMP_LOG=1`).
    Log,
    /// No filter is installed (`--no-seccomp`).
    Off,
}

impl Mode {
    /// The mode's name in `GET /vm`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Trap => "trap",
            Mode::Log => "log",
            Mode::Off => "off",
        }
    }

    /// What the start of a run says about a mode other than the trap.
    fn warning(self) -> Option<&'static str> {
        match self {
            Mode::Trap => None,
            Mode::Log => Some(
                "seccomp filters in log mode (HUGEVMM_SECCOMP_LOG=1): a forbidden system call runs, and the kernel only logs it (dmesg, type=1326); for finding the calls a filter lacks, not for guests you do not trust",
            ),
            Mode::Off => Some(
                "seccomp filters off (--no-seccomp): every thread may make any system call; for debugging, not for guests you do not trust (docs/SECURITY.md)",
            ),
        }
    }
}

/// The mode `HUGEVMM_SECCOMP_LOG` asks for: unset, empty or 0 the trap,
/// 1 the log; anything else is refused.
fn mode_from(variable: Option<&std::ffi::OsStr>) -> Result<Mode> {
    match variable.map(|v| v.to_str()) {
        None | Some(Some("" | "0")) => Ok(Mode::Trap),
        Some(Some("1")) => Ok(Mode::Log),
        Some(value) => bail!(
            "{LOG_VARIABLE}={}: give 1 to let forbidden system calls run and have the kernel log them, or 0 (or leave it unset) to stop them",
            value.unwrap_or("(not UTF-8)")
        ),
    }
}

/// The compiled filters: one per kind, and the clone3 one every thread
/// installs first.
struct Filters {
    kinds: BTreeMap<ThreadKind, BpfProgram>,
    clone3: BpfProgram,
    refused: BpfProgram,
}

/// `None` with `--no-seccomp`; set once by [`init`].
static FILTERS: OnceLock<Option<Filters>> = OnceLock::new();
/// The mode [`init`] chose.
static MODE: OnceLock<Mode> = OnceLock::new();

fn target_arch() -> TargetArch {
    TargetArch::x86_64
}

/// `kind`'s allow-list for process `pid`, compiled; `mismatch` is what a
/// call outside it gets.
pub(super) fn compile(kind: ThreadKind, pid: u32, mismatch: SeccompAction) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules::rules(kind, pid),
        mismatch,
        SeccompAction::Allow,
        target_arch(),
    )
    .with_context(|| format!("cannot build the seccomp filter of the {kind} threads"))?;
    filter
        .try_into()
        .with_context(|| format!("cannot compile the seccomp filter of the {kind} threads"))
}

/// The filter that fails `clone3` with ENOSYS, so that glibc falls back
/// to `clone`.
pub(super) fn clone3_filter() -> Result<BpfProgram> {
    SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::<SeccompRule>::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target_arch(),
    )
    .context("cannot build the clone3 seccomp filter")?
    .try_into()
    .context("cannot compile the clone3 seccomp filter")
}

/// The filter that fails [`rules::REFUSED`] with EACCES.
pub(super) fn refused_filter() -> Result<BpfProgram> {
    SeccompFilter::new(
        rules::REFUSED.iter().map(|&nr| (nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        target_arch(),
    )
    .context("cannot build the EACCES seccomp filter")?
    .try_into()
    .context("cannot compile the EACCES seccomp filter")
}

/// Compiles the filters (or, with `enabled` false, records that there are
/// none) and installs the SIGSYS handler; says so on stderr when the
/// filters are off or only log. Call once, on the main thread, before any
/// thread that installs a filter starts.
pub fn init(enabled: bool) -> Result<()> {
    let mode = if enabled {
        mode_from(std::env::var_os(LOG_VARIABLE).as_deref())?
    } else {
        Mode::Off
    };
    // A second call (tests running vm::run more than once) keeps the first.
    if MODE.set(mode).is_ok() {
        if let Some(warning) = mode.warning() {
            eprintln!("hugevmm: warning: {warning}");
        }
    }
    let filters = match mode {
        Mode::Trap | Mode::Log => {
            let mismatch = if mode == Mode::Log {
                SeccompAction::Log
            } else {
                SeccompAction::Trap
            };
            let pid = std::process::id();
            let mut kinds = BTreeMap::new();
            for kind in ThreadKind::ALL {
                kinds.insert(kind, compile(kind, pid, mismatch.clone())?);
            }
            let (clone3, refused) = (clone3_filter()?, refused_filter()?);
            trap::install_handler().context("cannot install the SIGSYS handler")?;
            fix_malloc_arenas();
            Some(Filters {
                kinds,
                clone3,
                refused,
            })
        }
        Mode::Off => None,
    };
    let _ = FILTERS.set(filters);
    Ok(())
}

/// What the filters do with a forbidden call in this run (off before
/// [`init`]).
pub fn mode() -> Mode {
    MODE.get().copied().unwrap_or(Mode::Off)
}

/// glibc's malloc, on the first thread that wants a ninth arena, reads
/// `/sys/devices/system/cpu/online` to size its arena limit: an `openat`
/// on whatever thread that is, long after the filters. Setting the limit
/// it would compute (8 per CPU) before the filters spares it that read.
fn fix_malloc_arenas() {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let arenas = i32::try_from(cpus.saturating_mul(8)).unwrap_or(i32::MAX);
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX takes
    // any positive count. A refusal (0) leaves glibc's own default.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
}

/// Whether [`init`] asked for filters.
pub fn enabled() -> bool {
    matches!(FILTERS.get(), Some(Some(_)))
}

/// Installs `kind`'s filter on the calling thread; nothing without
/// [`init`] or with `--no-seccomp`.
pub fn install(kind: ThreadKind) -> Result<()> {
    let Some(Some(filters)) = FILTERS.get() else {
        return Ok(());
    };
    trap::set_thread_kind(kind);
    seccompiler::apply_filter(&filters.clone3)
        .with_context(|| format!("cannot install the clone3 filter on a {kind} thread"))?;
    seccompiler::apply_filter(&filters.refused)
        .with_context(|| format!("cannot install the EACCES filter on a {kind} thread"))?;
    seccompiler::apply_filter(&filters.kinds[&kind])
        .with_context(|| format!("cannot install the seccomp filter of a {kind} thread"))?;
    probe::run(kind);
    Ok(())
}

/// Installs `kind`'s filter on a thread that cannot return an error: a
/// thread that should be filtered and is not must not run on, so a failure
/// ends the process.
pub fn install_or_exit(kind: ThreadKind) {
    if let Err(e) = install(kind) {
        eprintln!("hugevmm: error: {e:#}");
        std::process::exit(crate::exit::EXIT_VM_FAILURE);
    }
}

/// The hook the swap engine runs on its threads.
pub fn engine_thread_setup() -> Option<swap::engine::ThreadSetup> {
    use swap::engine::EngineThread;
    enabled().then(|| {
        swap::engine::ThreadSetup(std::sync::Arc::new(|thread| {
            install_or_exit(match thread {
                EngineThread::FaultService => ThreadKind::FaultService,
                EngineThread::Evictor | EngineThread::BufferRefill => ThreadKind::Evictor,
            })
        }))
    })
}

/// The first call a filter stopped in this process, described as the
/// run's failure; None while no filter stopped one.
pub fn trapped_message() -> Option<String> {
    let trapped = trap::trapped()?;
    let mut message = String::new();
    trap::describe(&trapped, &mut message);
    Some(message)
}

/// A run's outcome with a trapped call accounted for: a run in which a
/// filter stopped a call ends with [`EXIT_TRAPPED`] and the call named
/// as its failure, also when the trap came after the run loop had ended
/// (while the run was ending), so that it did not end the loop itself.
pub fn account_for_trap(mut outcome: RunOutcome) -> RunOutcome {
    let Some(message) = trapped_message() else {
        return outcome;
    };
    outcome.failure = match outcome.failure.take() {
        Some(earlier) if earlier != message => Some(format!("{message} (after: {earlier})")),
        _ => Some(message),
    };
    outcome.exit_status = EXIT_TRAPPED;
    outcome.exit_kind = crate::exit::ExitKind::VmFailure;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_variable_chooses_the_mode_and_refuses_other_words() {
        use std::ffi::OsStr;
        assert_eq!(mode_from(None).unwrap(), Mode::Trap);
        assert_eq!(mode_from(Some(OsStr::new(""))).unwrap(), Mode::Trap);
        assert_eq!(mode_from(Some(OsStr::new("0"))).unwrap(), Mode::Trap);
        assert_eq!(mode_from(Some(OsStr::new("1"))).unwrap(), Mode::Log);
        let refused = mode_from(Some(OsStr::new("yes"))).unwrap_err().to_string();
        assert!(
            refused.starts_with("HUGEVMM_SECCOMP_LOG=yes: give 1"),
            "{refused}"
        );
        // Only the trap goes unsaid.
        assert_eq!(Mode::Trap.warning(), None);
        assert!(Mode::Log
            .warning()
            .unwrap()
            .contains("HUGEVMM_SECCOMP_LOG=1"));
        assert!(Mode::Off.warning().unwrap().contains("--no-seccomp"));
        let names = [Mode::Trap, Mode::Log, Mode::Off].map(Mode::name);
        assert_eq!(names, ["trap", "log", "off"]);
    }

    /// On a filtered thread, open and openat fail with EACCES and clone3
    /// with ENOSYS, while allowed calls work; other threads are untouched.
    #[test]
    fn refused_calls_fail_quietly_on_a_filtered_thread() {
        init(true).unwrap();
        let results = std::thread::spawn(|| {
            install(ThreadKind::Vcpu).unwrap();
            let open = std::fs::File::open("/proc/self/status").map(drop);
            // SAFETY: clone3 with a null argument block creates nothing: the
            // filter answers it, or the kernel refuses the pointer.
            let clone3 = unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
            let clone3_errno = std::io::Error::last_os_error().raw_os_error();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            (
                open.map_err(|e| e.raw_os_error()),
                clone3,
                clone3_errno,
                tid,
            )
        })
        .join()
        .unwrap();
        assert_eq!(results.0, Err(Some(libc::EACCES)));
        assert_eq!((results.1, results.2), (-1, Some(libc::ENOSYS)));
        assert!(results.3 > 0);
        assert!(std::fs::File::open("/proc/self/status").is_ok());
    }
}
