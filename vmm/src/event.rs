//! What ends a run, as the threads that see it report it: the vCPUs, the
//! swap engine, the signal and seccomp-trap watchers, the API and the host
//! terminal send [`RunEvent`]s on one channel, which the run loop reads.

/// What the run's threads report to the run loop (`vm::run`).
#[derive(Debug)]
pub enum RunEvent {
    /// The payload wrote its status to the finish port.
    Finished {
        /// vCPU index.
        index: u32,
        /// Status written.
        status: u32,
    },
    /// The swap engine cannot serve guest memory (store failure); the run
    /// ends.
    SwapFatal {
        /// What happened, naming the chunk's guest address.
        message: String,
    },
    /// The guest asked to be reset or powered off (Linux: reboot through
    /// the i8042 or a triple fault); the run ends normally.
    GuestReset {
        /// How it asked.
        how: &'static str,
    },
    /// The operator ended the VM (`quit` on the control socket, Ctrl-A x
    /// on the console); the run ends normally, status 0.
    Quit {
        /// How.
        how: &'static str,
    },
    /// A stop signal (SIGTERM, SIGINT, SIGHUP) ends the run cleanly.
    Signal {
        /// The signal's number.
        signo: i32,
    },
    /// A seccomp filter stopped a system call (`seccomp::trap`); the run
    /// ends as after a failure, with status 159.
    Forbidden {
        /// The call and the kind of thread, for the user.
        message: String,
    },
    /// The vCPU cannot continue; the whole run ends.
    Fatal {
        /// vCPU index.
        index: u32,
        /// What happened, for the user.
        message: String,
    },
}
