//! How a run ended, as a kind a caller can read (`exit_kind` in
//! `--stats-json`, and `--status-file`), because the exit status alone
//! cannot say it: a payload may exit with any status 0-255, including the
//! ones hugevmm uses itself (1, 124, 125, 159, 128 + signal).

use serde_json::json;

/// Exit status for a configuration or setup error.
pub const EXIT_CONFIG: i32 = 1;
/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the VM failed (guest exception, KVM error, swap store
/// failure).
pub const EXIT_VM_FAILURE: i32 = 125;
/// Exit status of a process that a seccomp filter stopped: the shell's
/// status for death by SIGSYS.
pub const EXIT_TRAPPED: i32 = 128 + libc::SIGSYS;

/// The exit status for a run ended by `signo`, as shells report a process
/// killed by it.
pub fn signal_status(signo: i32) -> i32 {
    128 + signo
}

/// Exit status for the statuses the vCPUs reported: the first non-zero in
/// vCPU order, squeezed into the 8 bits a process exit status has (a
/// non-zero status never becomes 0).
pub fn combined_status(statuses: &[Option<u32>]) -> i32 {
    match statuses.iter().flatten().find(|s| **s != 0) {
        None => 0,
        Some(s) if *s <= 255 => *s as i32,
        Some(_) => 255,
    }
}

/// Why the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// The guest ended the run: the payloads' statuses, or a Linux guest's
    /// power-off or reboot (status 0).
    Payload,
    /// The operator ended the run (`hugevmm ctl quit`, Ctrl-A x): status 0.
    Quit,
    /// hugevmm refused the options or could not set the VM up: status 1.
    Config,
    /// `--timeout` expired: status 124.
    Timeout,
    /// The VM failed (guest exception, KVM error, swap store failure):
    /// status 125; a system call a thread's seccomp filter forbids: 159.
    VmFailure,
    /// SIGTERM, SIGINT or SIGHUP ended the run: status 128 + the signal.
    Signal,
}

impl ExitKind {
    /// The name used in `exit_kind` and the status file.
    pub fn name(self) -> &'static str {
        match self {
            ExitKind::Payload => "payload",
            ExitKind::Quit => "quit",
            ExitKind::Config => "config",
            ExitKind::Timeout => "timeout",
            ExitKind::VmFailure => "vm-failure",
            ExitKind::Signal => "signal",
        }
    }
}

/// The end of a run: status, kind, and what went wrong if anything.
#[derive(Debug, Clone)]
pub struct RunEnd {
    /// The process exit status.
    pub status: i32,
    /// Why.
    pub kind: ExitKind,
    /// The error or failure message, if any.
    pub message: Option<String>,
}

impl RunEnd {
    /// The `--status-file` content: one JSON object and a newline.
    pub fn status_file_text(&self) -> String {
        json!({
            "exit_status": self.status,
            "exit_kind": self.kind.name(),
            "message": self.message,
        })
        .to_string()
            + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_first_nonzero_and_never_wraps_to_zero() {
        assert_eq!(combined_status(&[Some(0), Some(0)]), 0);
        assert_eq!(combined_status(&[Some(0), Some(7), Some(3)]), 7);
        assert_eq!(combined_status(&[Some(256)]), 255);
        assert_eq!(combined_status(&[Some(1), None]), 1);
    }

    #[test]
    fn the_status_file_names_the_kind_beside_the_status() {
        let end = RunEnd {
            status: 124,
            kind: ExitKind::Payload,
            message: None,
        };
        let value: serde_json::Value = serde_json::from_str(&end.status_file_text()).unwrap();
        assert_eq!(value["exit_status"], 124);
        assert_eq!(value["exit_kind"], "payload");
        assert!(value["message"].is_null());
    }
}
