//! SIGTERM, SIGINT and SIGHUP during a run: the first ends the VM the way
//! `quit` does (a line saying so, statistics written, terminal restored,
//! control socket removed, exit status 128 + the signal); a second one
//! ends the process at once, for a run whose clean end hangs.
//!
//! signal-hook's handlers only write to a pipe; a thread reads it and
//! turns the signal into an event for the run loop, so nothing but the
//! write runs in signal context.

use crate::vcpu::VcpuEvent;
use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::sync::mpsc::Sender;

/// The signals that end a run.
const STOP_SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// The name of a stop signal, for messages.
pub fn signal_name(signo: i32) -> &'static str {
    match signo {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// The exit status for a run ended by `signo`, as shells report a process
/// killed by it.
pub fn exit_status(signo: i32) -> i32 {
    128 + signo
}

/// Handlers installed for the stop signals; a signal that arrives before
/// [`StopSignals::forward`] waits in the pipe.
pub struct StopSignals {
    signals: Signals,
}

impl StopSignals {
    /// Installs the handlers (replacing the default action, which would end
    /// the process without statistics and leave the socket behind).
    pub fn install() -> Result<Self> {
        let signals = Signals::new(STOP_SIGNALS).context("cannot install signal handlers")?;
        Ok(Self { signals })
    }

    /// Starts the thread that sends the first signal to `events` as
    /// [`VcpuEvent::Signal`] and exits the process on the second.
    pub fn forward(mut self, events: Sender<VcpuEvent>) -> Result<()> {
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Device);
                let mut seen = 0;
                for signo in self.signals.forever() {
                    seen += 1;
                    if seen == 1 {
                        let _ = events.send(VcpuEvent::Signal { signo });
                        continue;
                    }
                    eprintln!(
                        "hugevmm: second signal ({}): ending at once (if the terminal looks wrong, run `reset`)",
                        signal_name(signo)
                    );
                    std::process::exit(exit_status(signo));
                }
            })
            .context("cannot spawn the signal thread")?;
        Ok(())
    }
}
