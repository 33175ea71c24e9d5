//! seccomp filters, one per kind of thread (docs/SECURITY.md).
//!
//! Each thread installs its kind's filter itself ([`install`]) once it has
//! made what it needs (KVM fds, rings, sockets, the threads it spawns):
//! a filter is inherited by threads spawned later and can only narrow, so
//! the main thread installs its own last, after every other thread
//! started. A system call outside the kind's list raises SIGSYS; the
//! handler ([`trap`]) prints the call and the thread kind, parks the
//! thread and has the run loop end the VM as after a failure ([`watch`]:
//! statistics and status file written, status [`TRAPPED_STATUS`]).
//! `clone3` fails with ENOSYS (a second, tiny filter) so that
//! glibc's `pthread_create` falls back to `clone`, whose flags a filter
//! can read (`clone3` passes them in memory, out of a filter's reach);
//! `open` and `openat` fail with EACCES (a third), see `rules::REFUSED`.
//!
//! `--no-seccomp` ([`init`] with `false`) installs nothing.
//! `HUGEVMM_SECCOMP_LOG=1` installs the filters with the `log` action
//! instead of the trap: forbidden calls go through and the kernel logs
//! them (`dmesg`, `type=1326 ... comm="vcpu0" ... syscall=N`), which is
//! how the lists in `rules.rs` were found.

mod rules;
mod trap;
mod watch;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

pub use rules::ThreadKind;
pub use watch::forward_traps;

/// Exit status of a process that a filter stopped: the shell's status for
/// death by SIGSYS.
pub const TRAPPED_STATUS: i32 = 128 + libc::SIGSYS;

/// The compiled filters: one per kind, and the clone3 one every thread
/// installs first.
struct Filters {
    kinds: BTreeMap<ThreadKind, BpfProgram>,
    clone3: BpfProgram,
    refused: BpfProgram,
}

/// `None` with `--no-seccomp`; set once by [`init`].
static FILTERS: OnceLock<Option<Filters>> = OnceLock::new();

fn target_arch() -> TargetArch {
    TargetArch::x86_64
}

/// Compiles the filters (or, with `enabled` false, records that there are
/// none) and installs the SIGSYS handler. Call once, on the main thread,
/// before any thread that installs a filter starts.
pub fn init(enabled: bool) -> Result<()> {
    let filters = if enabled {
        let mismatch = if std::env::var_os("HUGEVMM_SECCOMP_LOG").is_some_and(|v| v == "1") {
            SeccompAction::Log
        } else {
            SeccompAction::Trap
        };
        let mut kinds = BTreeMap::new();
        for kind in ThreadKind::ALL {
            let filter = SeccompFilter::new(
                rules::rules(kind),
                mismatch.clone(),
                SeccompAction::Allow,
                target_arch(),
            )
            .with_context(|| format!("cannot build the seccomp filter of the {kind} threads"))?;
            let program: BpfProgram = filter.try_into().with_context(|| {
                format!("cannot compile the seccomp filter of the {kind} threads")
            })?;
            kinds.insert(kind, program);
        }
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::<SeccompRule>::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            target_arch(),
        )
        .context("cannot build the clone3 seccomp filter")?
        .try_into()
        .context("cannot compile the clone3 seccomp filter")?;
        let refused = SeccompFilter::new(
            rules::REFUSED.iter().map(|&nr| (nr, Vec::new())).collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EACCES as u32),
            target_arch(),
        )
        .context("cannot build the EACCES seccomp filter")?
        .try_into()
        .context("cannot compile the EACCES seccomp filter")?;
        trap::install_handler().context("cannot install the SIGSYS handler")?;
        fix_malloc_arenas();
        Some(Filters {
            kinds,
            clone3,
            refused,
        })
    } else {
        None
    };
    // A second call (tests running vm::run more than once) keeps the first.
    let _ = FILTERS.set(filters);
    Ok(())
}

/// glibc's malloc, on the first thread that wants a ninth arena, reads
/// `/sys/devices/system/cpu/online` to size its arena limit: an `openat`
/// on whatever thread that is, long after the filters. Setting the limit
/// it would compute (8 per CPU) now skips that read.
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
    probe(kind);
    Ok(())
}

/// Installs `kind`'s filter on a thread that cannot return an error: a
/// thread that should be filtered and is not must not run on, so a failure
/// ends the process.
pub fn install_or_exit(kind: ThreadKind) {
    if let Err(e) = install(kind) {
        eprintln!("hugevmm: error: {e:#}");
        std::process::exit(crate::vm::EXIT_VM_FAILURE);
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

/// A run's outcome with a trapped call accounted for: a run in which a
/// filter stopped a call ends with [`TRAPPED_STATUS`] and the call named
/// as its failure, also when the trap came after the run loop had ended
/// (while the run was ending), so that it did not end the loop itself.
pub fn account_for_trap(mut outcome: crate::vm::RunOutcome) -> crate::vm::RunOutcome {
    let Some((nr, kind)) = trap::trapped() else {
        return outcome;
    };
    let mut message = String::new();
    trap::describe(kind, nr, &mut message);
    outcome.failure = match outcome.failure.take() {
        Some(earlier) if earlier != message => Some(format!("{message} (after: {earlier})")),
        _ => Some(message),
    };
    outcome.exit_status = TRAPPED_STATUS;
    outcome.exit_kind = crate::exit::ExitKind::VmFailure;
    outcome
}

/// Test aid: `HUGEVMM_SECCOMP_PROBE=KIND` (a [`ThreadKind`] name, e.g.
/// `vcpu`) makes every thread of that kind issue a call no filter allows
/// (`execve`) right after installing its filter, so that a test sees the
/// trap end the run with its message. A parked thread never gets past it.
fn probe(kind: ThreadKind) {
    let Some(wanted) = std::env::var_os("HUGEVMM_SECCOMP_PROBE") else {
        return;
    };
    if wanted.to_str() != Some(kind.name()) {
        return;
    }
    // SAFETY: execve with a null path changes nothing: without a filter it
    // fails with EFAULT; with one it never runs.
    let r = unsafe { libc::syscall(libc::SYS_execve, 0usize, 0usize, 0usize) };
    eprintln!(
        "hugevmm: seccomp probe: execve on a {kind} thread was not stopped (returned {r}, {})",
        std::io::Error::last_os_error()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

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
