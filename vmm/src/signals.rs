//! SIGTERM, SIGINT and SIGHUP during a run: the first ends the VM the way
//! `quit` does (a line saying so, statistics written, terminal restored,
//! control socket removed, exit status 128 + the signal); a second one,
//! at least [`SECOND_SIGNAL_AFTER`] later, ends the process at once, for
//! a run whose clean end hangs. Signals closer to the first are the same
//! request delivered twice: GNU `timeout` sends SIGTERM to its child and
//! then to its whole process group, and a process manager may do the
//! same, so two signals microseconds apart must not cut the clean end
//! short (no statistics, no status file).
//!
//! signal-hook's handlers only write to a pipe; a thread reads it and
//! turns the signal into an event for the run loop, so nothing but the
//! write runs in signal context.

use crate::event::RunEvent;
use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

/// How long after the first stop signal a second one means "now".
pub const SECOND_SIGNAL_AFTER: Duration = Duration::from_secs(1);

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
    /// [`RunEvent::Signal`] and exits the process on the second.
    pub fn forward(mut self, events: Sender<RunEvent>) -> Result<()> {
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Device);
                let mut rule = SecondSignal::default();
                for signo in self.signals.forever() {
                    match rule.on_signal(Instant::now()) {
                        SignalMeaning::First => {
                            let _ = events.send(RunEvent::Signal { signo });
                            continue;
                        }
                        SignalMeaning::Repeat => continue,
                        SignalMeaning::Insist => {}
                    }
                    eprintln!(
                        "hugevmm: second signal ({}): ending at once (if the terminal looks wrong, run `reset`)",
                        signal_name(signo)
                    );
                    std::process::exit(crate::exit::signal_status(signo));
                }
            })
            .context("cannot spawn the signal thread")?;
        Ok(())
    }
}

/// What a stop signal means, given the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SignalMeaning {
    /// The first: end the VM cleanly.
    First,
    /// Within [`SECOND_SIGNAL_AFTER`] of the first: the same request again.
    Repeat,
    /// Later: the clean end is taking too long, end at once.
    Insist,
}

/// Tells a second request to stop from the first one delivered twice.
#[derive(Debug, Default)]
struct SecondSignal {
    first_at: Option<Instant>,
}

impl SecondSignal {
    fn on_signal(&mut self, now: Instant) -> SignalMeaning {
        match self.first_at {
            None => {
                self.first_at = Some(now);
                SignalMeaning::First
            }
            Some(first) if now.saturating_duration_since(first) < SECOND_SIGNAL_AFTER => {
                SignalMeaning::Repeat
            }
            Some(_) => SignalMeaning::Insist,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_repeated_at_once_is_the_first_one_again() {
        let mut rule = SecondSignal::default();
        let t0 = Instant::now();
        assert_eq!(rule.on_signal(t0), SignalMeaning::First);
        assert_eq!(
            rule.on_signal(t0 + Duration::from_micros(50)),
            SignalMeaning::Repeat
        );
        assert_eq!(
            rule.on_signal(t0 + Duration::from_millis(999)),
            SignalMeaning::Repeat
        );
        assert_eq!(
            rule.on_signal(t0 + SECOND_SIGNAL_AFTER),
            SignalMeaning::Insist
        );
    }
}
