//! Ctrl-C and SIGTERM: stop between steps and still clean up.
//!
//! The bench leaves things behind that must not outlive it (an active host
//! swap file, store files). The handler only sets a flag; the suites check
//! it between steps, return an error, and the guards that own those things
//! undo them as the error unwinds the stack. A `hugevmm run` child in the
//! foreground gets the terminal's SIGINT itself and ends, so waiting for it
//! does not hang.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: the one thing that is async-signal-safe here.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `sigaction` is given a zeroed, then filled struct with a
        // handler that only performs an atomic store, which is
        // async-signal-safe; SA_RESTART keeps blocking calls in other code
        // (waitpid of a child) from failing with EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// True once Ctrl-C or SIGTERM arrived.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// An error if the user asked to stop, for `?` between steps.
pub fn check() -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted (Ctrl-C or SIGTERM); cleaning up");
    }
    Ok(())
}
