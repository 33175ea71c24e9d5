//! The SIGSYS handler: a forbidden call never runs; the handler names it
//! and the kind of thread that made it, and the run ends.
//!
//! The handler runs on the offending thread, under its filter, so it uses
//! only calls every filter allows (`write`, `nanosleep`, `gettid`,
//! `getpid`, `exit_group`) and allocates nothing: the message is assembled
//! in a stack buffer. The first trap prints its line and is recorded.
//! Once the watcher runs ([`super::watch`]), the handler wakes it and
//! parks the offending thread for good (it never returns to the code that
//! made the call): the run loop then ends the VM as after a failure, so
//! the statistics and the status file are written, and the process exits
//! with [`TRAPPED_STATUS`]. The end of the run happens on the main thread,
//! so a trap there, on the watcher itself, or before the watcher exists
//! ends the process at once, as does a SIGSYS that no filter raised.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

use super::rules::{syscall_name, ThreadKind};
use super::TRAPPED_STATUS;

thread_local! {
    /// This thread's kind, for the message; const-initialized, so reading
    /// it in a signal handler allocates nothing.
    static KIND: Cell<Option<ThreadKind>> = const { Cell::new(None) };
    /// Whether this is the watcher thread, which must not park.
    static WATCHER: Cell<bool> = const { Cell::new(false) };
}

/// The first trapped call's number, or -1.
static TRAPPED_CALL: AtomicI64 = AtomicI64::new(-1);
/// The kind of thread that made it: 0 unknown, else 1 + its index in
/// [`ThreadKind::ALL`].
static TRAPPED_KIND: AtomicU8 = AtomicU8::new(0);

/// `si_code` of a SIGSYS raised by a seccomp filter (`SYS_SECCOMP`).
const SYS_SECCOMP: i32 = 1;

/// Records the calling thread's kind for the handler.
pub(super) fn set_thread_kind(kind: ThreadKind) {
    KIND.with(|k| k.set(Some(kind)));
}

/// Marks the calling thread as the watcher.
pub(super) fn set_watcher() {
    WATCHER.with(|w| w.set(true));
}

/// The first call a filter stopped in this process, and the kind of thread
/// that made it (None: a thread that inherited its filter, such as an API
/// client thread).
pub(super) fn trapped() -> Option<(i64, Option<ThreadKind>)> {
    let nr = TRAPPED_CALL.load(Ordering::Acquire);
    (nr >= 0).then(|| {
        let kind = match TRAPPED_KIND.load(Ordering::Acquire) {
            0 => None,
            k => ThreadKind::ALL.get(usize::from(k) - 1).copied(),
        };
        (nr, kind)
    })
}

/// Installs [`on_sigsys`] for SIGSYS.
pub(super) fn install_handler() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value to fill in; the handler
    // is an extern "C" fn of the SA_SIGINFO signature and async-signal-safe
    // (see its comment).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A byte buffer on the stack that [`std::fmt::Write`] can fill.
struct StackLine {
    bytes: [u8; 256],
    len: usize,
}

impl std::fmt::Write for StackLine {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.bytes.len() - self.len;
        let n = s.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// What was stopped, e.g. `seccomp: forbidden system call fchmod (91) on
/// a thread of kind evictor`: the run's failure message.
pub(super) fn describe(kind: Option<ThreadKind>, nr: i64, out: &mut impl std::fmt::Write) {
    let kind = kind.map_or(
        "unknown (a thread that inherited its filter)",
        ThreadKind::name,
    );
    let _ = match syscall_name(nr) {
        Some(name) => write!(
            out,
            "seccomp: forbidden system call {name} ({nr}) on a thread of kind {kind}"
        ),
        None => write!(
            out,
            "seccomp: forbidden system call number {nr} on a thread of kind {kind}"
        ),
    };
}

/// The line the handler prints.
pub(super) fn message(kind: Option<ThreadKind>, nr: i64, out: &mut impl std::fmt::Write) {
    let _ = out.write_str("hugevmm: ");
    describe(kind, nr, out);
    let _ = writeln!(
        out,
        "; ending the VM (--no-seccomp runs without the filters, docs/SECURITY.md)"
    );
}

/// `siginfo_t` for SIGSYS: the `_sigsys` member of the union after the
/// three ints and their padding (include/uapi/asm-generic/siginfo.h).
#[repr(C)]
struct SigsysInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    call_addr: *mut libc::c_void,
    syscall: i32,
    arch: u32,
}

/// Writes `bytes` to stderr from signal context.
fn write_stderr(bytes: &[u8]) {
    // SAFETY: write is async-signal-safe and every filter allows it; the
    // buffer is valid for its length. A failed write has nowhere to go.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Ends the process from signal context.
fn exit_now() -> ! {
    // SAFETY: _exit is async-signal-safe and every filter allows
    // exit_group; it runs no destructor or handler that could block.
    unsafe { libc::_exit(TRAPPED_STATUS) }
}

extern "C" fn on_sigsys(_signo: i32, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler;
    // for SIGSYS it is laid out as SigsysInfo, which is no larger than
    // siginfo_t (128 bytes).
    let (code, nr) = unsafe {
        let info = &*info.cast::<SigsysInfo>();
        (info.code, i64::from(info.syscall))
    };
    if code != SYS_SECCOMP {
        write_stderr(b"hugevmm: SIGSYS received, not from a seccomp filter: ending at once\n");
        exit_now();
    }
    let kind = KIND.with(Cell::get);
    let first = TRAPPED_CALL
        .compare_exchange(-1, nr, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if first {
        let index = kind.and_then(|k| ThreadKind::ALL.iter().position(|&a| a == k));
        TRAPPED_KIND.store(index.map_or(0, |i| i as u8 + 1), Ordering::Release);
        let mut line = StackLine {
            bytes: [0; 256],
            len: 0,
        };
        message(kind, nr, &mut line);
        write_stderr(&line.bytes[..line.len]);
    }
    // SAFETY: gettid and getpid have no preconditions; every filter
    // allows both.
    let on_main_thread = unsafe { libc::gettid() == libc::getpid() };
    if on_main_thread || WATCHER.with(Cell::get) || !super::watch::wake() {
        exit_now();
    }
    // Parked: the code that made the call never runs on, and whatever it
    // holds stays held; the run ends around this thread (the watcher ends
    // the process if that takes too long).
    loop {
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: nanosleep with a valid timespec and no remainder; every
        // filter allows it. Signals (vCPU kicks) only wake it early.
        unsafe { libc::nanosleep(&second, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_call_and_the_kind() {
        let mut s = String::new();
        message(Some(ThreadKind::Vcpu), libc::SYS_execve, &mut s);
        assert!(
            s.starts_with(
                "hugevmm: seccomp: forbidden system call execve (59) on a thread of kind vcpu;"
            ),
            "{s}"
        );
        assert!(s.ends_with("docs/SECURITY.md)\n"), "{s}");
        let mut s = String::new();
        message(Some(ThreadKind::Evictor), libc::SYS_fchmod, &mut s);
        assert!(
            s.contains("forbidden system call fchmod (91) on a thread of kind evictor"),
            "{s}"
        );
        let mut s = String::new();
        describe(Some(ThreadKind::Control), 9999, &mut s);
        assert_eq!(
            s,
            "seccomp: forbidden system call number 9999 on a thread of kind control"
        );
        let mut s = String::new();
        describe(None, libc::SYS_fork, &mut s);
        assert!(s.contains("fork (57) on a thread of kind unknown"), "{s}");
    }

    #[test]
    fn the_stack_line_cuts_long_messages() {
        use std::fmt::Write;
        let mut line = StackLine {
            bytes: [0; 256],
            len: 0,
        };
        for _ in 0..100 {
            line.write_str("0123456789").unwrap();
        }
        assert_eq!(line.len, 256);
    }
}
