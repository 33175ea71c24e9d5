//! Test aid: `HUGEVMM_SECCOMP_PROBE=KIND[:CALL]` (a [`ThreadKind`] name,
//! e.g. `vcpu`, and optionally one of [`PROBES`]) makes every thread of
//! that kind issue a call its filter must stop right after installing it,
//! so that a test sees the trap end the run with its message. A parked
//! thread never gets past it. Each call is harmless when no filter stops
//! it (`--no-seccomp`): descriptors are -1, signals 0, and what it maps
//! or opens is released.

use std::time::Duration;

use super::ioctls;
use super::kind::ThreadKind;

/// The calls a probe can make, by name: `execve` (the default), and one
/// for each kind of argument the filters check.
pub const PROBES: &[&str] = &[
    "execve",
    "tiocsti",
    "memslot",
    "mmap-exec",
    "mprotect-exec",
    "tgkill",
    "socket-dgram",
];

/// Test aid: `HUGEVMM_SECCOMP_WATCH_DELAY_MS=N` holds a trap for N ms
/// (at most 60 s) in the watcher before it reaches the run loop, as a
/// busy host may, so that a test can make a trap arrive after the vCPUs
/// have finished.
pub fn watch_delay() -> Option<Duration> {
    let ms: u64 = std::env::var("HUGEVMM_SECCOMP_WATCH_DELAY_MS")
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms.min(60_000)))
}

/// Issues the probe asked for, if `kind` is the kind it names.
pub fn run(kind: ThreadKind) {
    let Some(wanted) = std::env::var_os("HUGEVMM_SECCOMP_PROBE") else {
        return;
    };
    let Some(wanted) = wanted.to_str() else {
        return;
    };
    let (wanted_kind, call) = wanted.split_once(':').unwrap_or((wanted, "execve"));
    if wanted_kind != kind.name() {
        return;
    }
    // `HUGEVMM_SECCOMP_PROBE_DELAY_MS=N` (at most 60 s): the call comes N
    // ms after the filter, as from a thread that started late, e.g. once
    // the run has begun to end.
    if let Some(ms) = std::env::var("HUGEVMM_SECCOMP_PROBE_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
    let Some(returned) = issue(call) else {
        eprintln!(
            "hugevmm: seccomp probe: no probe {call:?}; the probes are {}",
            PROBES.join(", ")
        );
        return;
    };
    eprintln!(
        "hugevmm: seccomp probe: {call} on a {kind} thread was not stopped (returned {returned}, {})",
        std::io::Error::last_os_error()
    );
}

/// A raw system call (the filter sees exactly these arguments).
fn syscall(nr: i64, args: [u64; 6]) -> i64 {
    // SAFETY: the callers pass arguments that make the call harmless
    // (see the module's comment); whatever it creates they release.
    unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) }
}

const PAGE_BYTES: u64 = 4096;

fn unmap(addr: i64) {
    if addr != -1 {
        // SAFETY: the page was mapped by the probe just before and nothing
        // else knows of it.
        unsafe { libc::munmap(addr as *mut libc::c_void, PAGE_BYTES as usize) };
    }
}

/// Makes call `name`; its return value, or None for a name no probe has.
fn issue(name: &str) -> Option<i64> {
    let anonymous = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let executable = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    let writable = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let returned = match name {
        // execve with a null path: EFAULT without a filter.
        "execve" => syscall(libc::SYS_execve, [0; 6]),
        // On fd -1: EBADF without a filter, whatever the terminal.
        "tiocsti" => {
            let byte = b'x';
            let request = u64::from(ioctls::TIOCSTI.nr);
            syscall(
                libc::SYS_ioctl,
                [u64::MAX, request, &byte as *const u8 as u64, 0, 0, 0],
            )
        }
        "memslot" => {
            let request = u64::from(ioctls::KVM_SET_USER_MEMORY_REGION.nr);
            syscall(libc::SYS_ioctl, [u64::MAX, request, 0, 0, 0, 0])
        }
        "mmap-exec" => {
            let addr = syscall(
                libc::SYS_mmap,
                [0, PAGE_BYTES, executable, anonymous, u64::MAX, 0],
            );
            unmap(addr);
            addr
        }
        "mprotect-exec" => {
            let addr = syscall(
                libc::SYS_mmap,
                [0, PAGE_BYTES, writable, anonymous, u64::MAX, 0],
            );
            let returned = syscall(
                libc::SYS_mprotect,
                [addr as u64, PAGE_BYTES, executable, 0, 0, 0],
            );
            unmap(addr);
            returned
        }
        // Signal 0 to pid 1 only checks that it exists.
        "tgkill" => syscall(libc::SYS_tgkill, [1, 1, 0, 0, 0, 0]),
        "socket-dgram" => {
            let kind = (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64;
            let fd = syscall(libc::SYS_socket, [libc::AF_INET as u64, kind, 0, 0, 0, 0]);
            if fd >= 0 {
                // SAFETY: the socket was just made here and is not used.
                unsafe { libc::close(fd as i32) };
            }
            fd
        }
        _ => return None,
    };
    Some(returned)
}
