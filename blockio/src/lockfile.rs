//! Locks on the files a VM does block I/O on (swap stores, disk images),
//! so that two VMs, or a disk and a store of one VM, never share a file.
//!
//! `flock(2)` rather than OFD locks (`F_OFD_SETLK`): both belong to the
//! open file description, so a second descriptor opened by this same
//! process conflicts (which is what catches `--disk X --swap-store
//! file:X`), and both are released when the descriptor closes, however the
//! process ends. flock also works on block devices, and `/proc/locks`
//! lists the PID that took a flock lock (OFD locks show -1 there), which
//! lets the error name the other holder.
//!
//! The lock is taken on the descriptor that then does the I/O, before
//! anything is written or truncated, so a refused file is left as it was.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Which lock to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Readers only (`--disk PATH,readonly`): several may hold it at once.
    Shared,
    /// A writer (stores, writable disks): nobody else may hold any lock.
    Exclusive,
}

/// Why a file could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else holds a conflicting lock.
    #[error("{} is in use{}: cannot take the {} lock {role} needs; it is held by another process (e.g. another hugevmm) or by this VM (the same file given as another --disk or as the swap store). The file was not changed: stop the other user or give another file (read-only disks may be shared: add ,readonly to each)", path.display(), holder_text(*holder_pid), mode_name(*mode))]
    Busy {
        /// The file.
        path: PathBuf,
        /// What wanted it, e.g. `the swap store` or `--disk`.
        role: String,
        /// The lock asked for.
        mode: LockMode,
        /// A process holding a lock on it, from `/proc/locks`, if found.
        holder_pid: Option<u32>,
    },
    /// flock itself failed (not a conflict).
    #[error("cannot lock {} for {role}: {source}", path.display())]
    Failed {
        /// The file.
        path: PathBuf,
        /// What wanted it.
        role: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn mode_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Shared => "shared (read-only)",
        LockMode::Exclusive => "exclusive",
    }
}

fn holder_text(pid: Option<u32>) -> String {
    match pid {
        Some(pid) if pid == std::process::id() => format!(" by this process (PID {pid})"),
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| format!(", {}", c.trim()))
                .unwrap_or_default();
            format!(" by PID {pid}{comm}")
        }
        None => String::new(),
    }
}

/// Locks `file` (opened from `path`) for `role` without waiting. A conflict
/// is [`LockError::Busy`]. The lock lasts as long as the open file
/// description: until `file` and every dup of it are closed.
pub fn lock(file: &File, path: &Path, mode: LockMode, role: &str) -> Result<(), LockError> {
    let op = match mode {
        LockMode::Shared => libc::LOCK_SH,
        LockMode::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    let mut waited = std::time::Duration::ZERO;
    loop {
        // SAFETY: flock on a descriptor `file` owns; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let source = io::Error::last_os_error();
        match source.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                let holder = holder_pid(file);
                // A process that has exited, even one already reaped, can
                // hold its locks a moment longer: the kernel may close its
                // files late (a deferred fput, from a kernel worker such
                // as io_uring's; seen on a loaded host after a VM with
                // restricted rings). A VM started right after another on
                // the same disk waits that moment out instead of failing.
                if holder.is_some_and(has_exited) && waited < EXITED_HOLDER_WAIT {
                    std::thread::sleep(EXITED_HOLDER_POLL);
                    waited += EXITED_HOLDER_POLL;
                    continue;
                }
                return Err(LockError::Busy {
                    path: path.to_owned(),
                    role: role.to_owned(),
                    mode,
                    holder_pid: holder,
                });
            }
            _ => {
                return Err(LockError::Failed {
                    path: path.to_owned(),
                    role: role.to_owned(),
                    source,
                })
            }
        }
    }
}

/// How long [`lock`] waits for a holder that has exited to let go.
const EXITED_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const EXITED_HOLDER_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Whether `pid` is gone or a zombie (its locks are on their way out).
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// A PID holding a flock lock on `file`'s inode, from `/proc/locks`
/// (`1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF`, device as hex
/// major:minor). Best effort: None when it cannot be read or matched.
fn holder_pid(file: &File) -> Option<u32> {
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    let wanted = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let mut words = line.split_whitespace().skip(1);
        let kind = words.next()?;
        let pid = words.nth(2)?;
        let inode = words.next()?;
        (kind == "FLOCK" && inode == wanted)
            .then(|| pid.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[test]
    fn exited_processes_are_told_from_live_ones() {
        assert!(!has_exited(std::process::id()));
        // PIDs stop well below this (pid_max is at most 2^22).
        assert!(has_exited(u32::MAX - 1));
    }

    fn temp_file(name: &str) -> (PathBuf, File) {
        let path = std::env::temp_dir().join(format!(".lockfile-{name}-{}", std::process::id()));
        std::fs::write(&path, b"content").unwrap();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    fn reopen(path: &Path) -> File {
        OpenOptions::new().read(true).open(path).unwrap()
    }

    #[test]
    fn exclusive_conflicts_with_any_other_descriptor_and_names_us() {
        let (path, first) = temp_file("ex");
        lock(&first, &path, LockMode::Exclusive, "the swap store").unwrap();
        for mode in [LockMode::Exclusive, LockMode::Shared] {
            let err = lock(&reopen(&path), &path, mode, "--disk").unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, LockError::Busy { .. }), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains("--disk"), "{text}");
            // The holder comes from /proc/locks, best effort (seen missing
            // in about one run in five when tests run in parallel): when
            // it is named, it must be this process.
            if text.contains(" in use by ") {
                assert!(
                    text.contains(&format!("by this process (PID {})", std::process::id())),
                    "{text}"
                );
            }
        }
        drop(first);
        // Closing the holder releases the lock.
        lock(&reopen(&path), &path, LockMode::Exclusive, "--disk").unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn shared_locks_coexist_but_exclude_a_writer() {
        let (path, first) = temp_file("sh");
        lock(&first, &path, LockMode::Shared, "--disk").unwrap();
        let second = reopen(&path);
        lock(&second, &path, LockMode::Shared, "--disk").unwrap();
        assert!(matches!(
            lock(&reopen(&path), &path, LockMode::Exclusive, "--disk"),
            Err(LockError::Busy { .. })
        ));
        std::fs::remove_file(&path).unwrap();
    }
}
