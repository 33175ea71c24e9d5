//! The SIGSYS handler: a forbidden call ends the process with a message
//! naming the call and the kind of thread that made it.
//!
//! The handler runs on the offending thread, under its filter, so it uses
//! only calls every filter allows (`write`, `exit_group`) and allocates
//! nothing: the message is assembled in a stack buffer.

use std::cell::Cell;
use std::io;

use super::rules::{syscall_name, ThreadKind};
use super::TRAPPED_STATUS;

thread_local! {
    /// This thread's kind, for the message; const-initialized, so reading
    /// it in a signal handler allocates nothing.
    static KIND: Cell<Option<ThreadKind>> = const { Cell::new(None) };
}

/// Records the calling thread's kind for the handler.
pub(super) fn set_thread_kind(kind: ThreadKind) {
    KIND.with(|k| k.set(Some(kind)));
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

/// The line the handler prints.
pub(super) fn message(kind: Option<ThreadKind>, nr: i64, out: &mut impl std::fmt::Write) {
    let kind = kind.map_or("unfiltered", ThreadKind::name);
    let _ = match syscall_name(nr) {
        Some(name) => writeln!(
            out,
            "hugevmm: seccomp: forbidden system call {name} ({nr}) on a thread of kind {kind}; ending the VM (--no-seccomp runs without the filters, docs/SECURITY.md)"
        ),
        None => writeln!(
            out,
            "hugevmm: seccomp: forbidden system call number {nr} on a thread of kind {kind}; ending the VM (--no-seccomp runs without the filters, docs/SECURITY.md)"
        ),
    };
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

extern "C" fn on_sigsys(_signo: i32, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler;
    // for SIGSYS it is laid out as SigsysInfo, which is no larger than
    // siginfo_t (128 bytes).
    let nr = unsafe { (*info.cast::<SigsysInfo>()).syscall };
    let mut line = StackLine {
        bytes: [0; 256],
        len: 0,
    };
    message(KIND.with(Cell::get), i64::from(nr), &mut line);
    // SAFETY: write and _exit are async-signal-safe and every filter allows
    // them; the buffer is valid for `len` bytes. A failed write has
    // nowhere to go.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(TRAPPED_STATUS);
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
        let mut s = String::new();
        message(Some(ThreadKind::Control), 9999, &mut s);
        assert!(
            s.contains("system call number 9999 on a thread of kind control"),
            "{s}"
        );
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
