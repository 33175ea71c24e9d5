//! Whether the process is dumpable (`prctl(PR_SET_DUMPABLE)`).
//!
//! A dumpable process leaves a core dump when it crashes, and any other
//! process of the same user may ptrace it or read its `/proc/PID/mem` and
//! `/proc/PID/environ`: all of guest RAM and whatever key is in memory.
//! Non-dumpable, it leaves no core and its `/proc/PID` files belong to
//! root, so only root (`CAP_SYS_PTRACE`) reaches its memory. hugevmm makes
//! itself non-dumpable once the machine is built (`--dumpable` keeps the
//! process as it started, for `gdb -p` or a core when debugging).
//!
//! Not earlier: a non-dumpable process of an unprivileged user cannot open
//! its own `/proc/self/pagemap` (mode 0400, then owned by root), which the
//! swap engine opens when it starts. What is in memory before (the
//! sealing key) is in a page left out of core dumps (`MADV_DONTDUMP`).

use anyhow::{bail, Result};
use std::io;

/// Makes the process non-dumpable, unless `dumpable` asks to leave it as
/// it is.
pub fn set(dumpable: bool) -> Result<()> {
    if dumpable {
        return Ok(());
    }
    // SAFETY: PR_SET_DUMPABLE takes an integer argument and touches no
    // memory of ours.
    let ret = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if ret != 0 {
        bail!(
            "cannot make the process non-dumpable (prctl PR_SET_DUMPABLE: {}); run with --dumpable to go on without it",
            io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Whether the process is dumpable now.
#[cfg(test)]
pub fn get() -> io::Result<bool> {
    // SAFETY: PR_GET_DUMPABLE takes no argument and touches no memory of
    // ours; it returns the state or -1.
    let ret = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set only in the child process of the test below.
    const PROBE_VAR: &str = "HUGEVMM_DUMPABLE_PROBE";

    /// Run as the probe: makes its process non-dumpable, as a run does.
    /// A no-op otherwise (the test process keeps its /proc files).
    #[test]
    fn probe_set_false() {
        if std::env::var_os(PROBE_VAR).is_some() {
            assert!(get().unwrap(), "a test process starts dumpable");
            set(true).unwrap();
            assert!(get().unwrap(), "--dumpable leaves it dumpable");
            set(false).unwrap();
            assert!(!get().unwrap(), "set(false) made it non-dumpable");
        }
    }

    #[test]
    fn set_false_makes_the_process_non_dumpable() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "dumpable::tests::probe_set_false", "--nocapture"])
            .env(PROBE_VAR, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
