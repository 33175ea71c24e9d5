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
//! with [`EXIT_TRAPPED`]. The end of the run happens on the main thread,
//! so a trap there, on the watcher itself, or before the watcher exists
//! ends the process at once, as does a SIGSYS that no filter raised.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use vmm_sys_util::eventfd::EventFd;

use super::ioctls;
use super::rules::{sys, syscall_name, ThreadKind};
use crate::exit::EXIT_TRAPPED;

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
/// Its six arguments, as the filter saw them.
static TRAPPED_ARGS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// The watcher's doorbell ([`super::watch`]), which the handler rings;
/// set once, before any filter.
static DOORBELL: OnceLock<EventFd> = OnceLock::new();

/// Gives the handler the watcher's doorbell (a second one is dropped).
pub(super) fn set_doorbell(doorbell: EventFd) {
    let _ = DOORBELL.set(doorbell);
}

/// Whether the handler has a watcher's doorbell.
pub(super) fn has_doorbell() -> bool {
    DOORBELL.get().is_some()
}

/// Rings the watcher; false when there is no watcher. Async-signal-safe:
/// an atomic load and a `write`.
fn wake() -> bool {
    match DOORBELL.get() {
        Some(doorbell) => doorbell.write(1).is_ok(),
        None => false,
    }
}

/// A trapped call: its number, the kind of thread that made it and its
/// arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Trapped {
    pub nr: i64,
    pub kind: Option<ThreadKind>,
    pub args: [u64; 6],
}

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

/// The first call a filter stopped in this process (its kind None: a
/// thread that installed no filter of its own).
pub(super) fn trapped() -> Option<Trapped> {
    let nr = TRAPPED_CALL.load(Ordering::Acquire);
    (nr >= 0).then(|| {
        let kind = match TRAPPED_KIND.load(Ordering::Acquire) {
            0 => None,
            k => ThreadKind::ALL.get(usize::from(k) - 1).copied(),
        };
        Trapped {
            nr,
            kind,
            args: std::array::from_fn(|i| TRAPPED_ARGS[i].load(Ordering::Acquire)),
        }
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
/// a thread of kind evictor`, and for a call the filters check by
/// argument the argument that failed, e.g. `...ioctl (16) on a thread of
/// kind vcpu: request TIOCSTI (0x5412)`: the run's failure message.
pub(super) fn describe(trapped: &Trapped, out: &mut impl std::fmt::Write) {
    let Trapped { nr, kind, args } = *trapped;
    let kind = kind.map_or(
        "unknown (a thread with no filter of its own)",
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
    describe_arguments(nr, &args, out);
}

/// The arguments the filters check of call `nr`, as `: ...`; nothing for
/// the other calls.
fn describe_arguments(nr: i64, args: &[u64; 6], out: &mut impl std::fmt::Write) {
    let _ = match nr {
        sys::ioctl => {
            let request = args[1] as u32;
            match ioctls::name(request) {
                Some(name) => write!(out, ": request {name} ({request:#x})"),
                None => write!(out, ": request {request:#x}"),
            }
        }
        sys::mmap | sys::mprotect if args[2] & libc::PROT_EXEC as u64 != 0 => {
            write!(out, ": protection {:#x} (PROT_EXEC)", args[2])
        }
        sys::mmap | sys::mprotect => write!(out, ": protection {:#x}", args[2]),
        sys::tgkill => write!(out, ": to process {}", args[0] as i32),
        sys::socket => write!(
            out,
            ": family {}, type {:#x}",
            args[0] as i32, args[1] as u32
        ),
        sys::clone => write!(out, ": flags {:#x}", args[0]),
        sys::prctl => write!(out, ": option {}", args[0] as i32),
        sys::seccomp => write!(out, ": operation {}, flags {:#x}", args[0], args[1]),
        sys::sendto => write!(out, ": to an address"),
        sys::fcntl => write!(out, ": command {}", args[1] as i32),
        sys::getsockopt => write!(out, ": level {}, option {}", args[1] as i32, args[2] as i32),
        _ => Ok(()),
    };
}

/// The line the handler prints.
pub(super) fn message(trapped: &Trapped, out: &mut impl std::fmt::Write) {
    let _ = out.write_str("hugevmm: ");
    describe(trapped, out);
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
    unsafe { libc::_exit(EXIT_TRAPPED) }
}

/// The arguments of the call that raised SIGSYS: a filter's trap skips
/// the call and leaves the registers as they were at its entry (rdi,
/// rsi, rdx, r10, r8, r9 on x86_64).
///
/// # Safety
///
/// `context` must be the `ucontext_t` the kernel passed to a SA_SIGINFO
/// handler.
unsafe fn call_arguments(context: *const libc::c_void) -> [u64; 6] {
    // SAFETY: the caller passes the handler's context, a valid ucontext_t.
    let registers = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    [
        libc::REG_RDI,
        libc::REG_RSI,
        libc::REG_RDX,
        libc::REG_R10,
        libc::REG_R8,
        libc::REG_R9,
    ]
    .map(|r| registers[r as usize] as u64)
}

extern "C" fn on_sigsys(_signo: i32, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
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
        // SAFETY: `context` is the handler's third argument.
        let args = unsafe { call_arguments(context) };
        for (slot, value) in TRAPPED_ARGS.iter().zip(args) {
            slot.store(value, Ordering::Release);
        }
        let index = kind.and_then(|k| ThreadKind::ALL.iter().position(|&a| a == k));
        TRAPPED_KIND.store(index.map_or(0, |i| i as u8 + 1), Ordering::Release);
        let mut line = StackLine {
            bytes: [0; 256],
            len: 0,
        };
        message(&Trapped { nr, kind, args }, &mut line);
        write_stderr(&line.bytes[..line.len]);
    }
    // SAFETY: gettid and getpid have no preconditions; every filter
    // allows both.
    let on_main_thread = unsafe { libc::gettid() == libc::getpid() };
    if on_main_thread || WATCHER.with(Cell::get) || !wake() {
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

    fn trapped(kind: Option<ThreadKind>, nr: i64, args: [u64; 6]) -> Trapped {
        Trapped { nr, kind, args }
    }

    #[test]
    fn the_message_names_the_call_and_the_kind() {
        let mut s = String::new();
        message(
            &trapped(Some(ThreadKind::Vcpu), libc::SYS_execve, [0; 6]),
            &mut s,
        );
        assert!(
            s.starts_with(
                "hugevmm: seccomp: forbidden system call execve (59) on a thread of kind vcpu;"
            ),
            "{s}"
        );
        assert!(s.ends_with("docs/SECURITY.md)\n"), "{s}");
        let mut s = String::new();
        message(
            &trapped(Some(ThreadKind::Evictor), libc::SYS_fchmod, [0; 6]),
            &mut s,
        );
        assert!(
            s.contains("forbidden system call fchmod (91) on a thread of kind evictor;"),
            "{s}"
        );
        let mut s = String::new();
        describe(&trapped(Some(ThreadKind::Control), 9999, [0; 6]), &mut s);
        assert_eq!(
            s,
            "seccomp: forbidden system call number 9999 on a thread of kind control"
        );
        let mut s = String::new();
        describe(&trapped(None, libc::SYS_fork, [0; 6]), &mut s);
        assert!(s.contains("fork (57) on a thread of kind unknown"), "{s}");
    }

    /// For the calls allowed with some arguments only, the message says
    /// which argument failed.
    #[test]
    fn the_message_names_the_argument_that_failed() {
        let said = |kind, nr, args| {
            let mut s = String::new();
            describe(&trapped(Some(kind), nr, args), &mut s);
            s
        };
        assert_eq!(
            said(ThreadKind::Vcpu, libc::SYS_ioctl, [0, 0x5412, 0, 0, 0, 0]),
            "seccomp: forbidden system call ioctl (16) on a thread of kind vcpu: request TIOCSTI (0x5412)"
        );
        assert!(said(
            ThreadKind::Main,
            libc::SYS_ioctl,
            [3, 0x4020_ae46, 0, 0, 0, 0]
        )
        .ends_with(": request KVM_SET_USER_MEMORY_REGION (0x4020ae46)"));
        assert!(
            said(ThreadKind::Main, libc::SYS_ioctl, [3, 0x1234, 0, 0, 0, 0])
                .ends_with(": request 0x1234")
        );
        assert!(said(
            ThreadKind::Evictor,
            libc::SYS_mmap,
            [0, 4096, 5, 0x22, 0, 0]
        )
        .ends_with("mmap (9) on a thread of kind evictor: protection 0x5 (PROT_EXEC)"));
        assert!(
            said(ThreadKind::Nbd, libc::SYS_tgkill, [1, 1, 0, 0, 0, 0]).ends_with(": to process 1")
        );
        assert!(
            said(ThreadKind::Nbd, libc::SYS_socket, [2, 0x80002, 0, 0, 0, 0])
                .ends_with(": family 2, type 0x80002")
        );
        assert!(said(ThreadKind::Nbd, libc::SYS_fchmod, [1, 2, 3, 0, 0, 0])
            .ends_with("fchmod (91) on a thread of kind nbd"));
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
