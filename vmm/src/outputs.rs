//! The files a run writes its results to (`--stats-json`,
//! `--stats-timeline`, `--status-file`, and `--console-log` while it
//! runs): checked before anything else is acquired, opened before the
//! guest starts, written at the end.
//!
//! Checking at the start means a typo in an output path fails in a second
//! instead of after a long run, and never replaces the guest's exit status
//! with an error at the end. The files are opened without truncation
//! (nothing the user had there is lost if the run fails to start) and
//! replaced through the same descriptor when the run has its figures.
//!
//! An output is written to the path itself, never through a symbolic link
//! to a file (`O_NOFOLLOW`): a link planted in a shared directory such as
//! /tmp would otherwise have hugevmm overwrite whatever it points to. A
//! link to a terminal, pipe or device (`/dev/stdout`) is followed: the
//! descriptor is checked once open. A file hugevmm creates has mode 0600
//! (the console log holds whatever the guest prints); one that exists
//! keeps its mode. The console log is capped ([`ConsoleLog`]).

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most bytes of guest output `--console-log` keeps unless
/// `--console-log-max` says otherwise.
pub const DEFAULT_CONSOLE_LOG_MAX_BYTES: u64 = 64 << 20;

/// Mode of an output file hugevmm creates.
const CREATED_MODE: u32 = 0o600;

fn symlink_refused(option: &str, path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{option} {} is a symbolic link to a file (or to nothing): outputs are not written through links, so that one planted in a shared directory cannot redirect them; give the file's own path",
        path.display()
    )
}

/// Checks that `path` can be an output file for `option`: not a
/// directory, not a symbolic link to a file, and in a directory that
/// exists. Touches nothing.
pub fn check_output_path(option: &str, path: &Path) -> Result<()> {
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_symlink() => match std::fs::metadata(path) {
            // A terminal, a pipe, a device (/dev/stdout): written to.
            Ok(target) if !target.is_file() && !target.is_dir() => Ok(()),
            _ => Err(symlink_refused(option, path)),
        },
        Ok(meta) if meta.is_dir() => {
            bail!("{option} {shown} is a directory: give a file path")
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            match std::fs::metadata(&parent) {
                Ok(meta) if meta.is_dir() => Ok(()),
                Ok(_) => bail!(
                    "{option} {shown}: {} is not a directory",
                    parent.display()
                ),
                Err(e) => bail!(
                    "{option} {shown}: its directory {} cannot be used ({e}); create it or give another path",
                    parent.display()
                ),
            }
        }
        Err(e) => bail!("{option} {shown} cannot be inspected: {e}"),
    }
}

/// Opens `path` for writing without truncating it: created (mode 0600)
/// if it does not exist, never through a symbolic link to a file. Returns
/// the file and whether it was created.
fn open_for_writing(option: &str, path: &Path) -> Result<(File, bool)> {
    let unusable = |e: std::io::Error| {
        anyhow::Error::new(e).context(format!(
            "cannot open {option} {} for writing; give a writable path",
            path.display()
        ))
    };
    let no_follow = |create: bool| {
        let mut options = OpenOptions::new();
        options.write(true).custom_flags(libc::O_NOFOLLOW);
        if create {
            options.create_new(true).mode(CREATED_MODE);
        }
        options.open(path)
    };
    let existing = match no_follow(true) {
        Ok(file) => return Ok((file, true)),
        // O_EXCL: whatever is there, a symbolic link included, is left.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => no_follow(false),
        Err(e) => return Err(unusable(e)),
    };
    match existing {
        Ok(file) => Ok((file, false)),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            // A symbolic link: followed only to what is not a file, which
            // the open descriptor shows (no race with the link changing).
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|_| symlink_refused(option, path))?;
            let meta = file.metadata().map_err(unusable)?;
            if meta.is_file() {
                return Err(symlink_refused(option, path));
            }
            Ok((file, false))
        }
        Err(e) => Err(unusable(e)),
    }
}

/// One output file, open for writing since the run started. Dropped
/// without [`OutputFile::replace_with`] (the run failed to start), a file
/// that did not exist before is removed again: a failed run leaves no
/// empty result file behind, and one that existed keeps its content.
pub struct OutputFile {
    option: &'static str,
    path: PathBuf,
    file: Option<File>,
    created: bool,
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.file.is_some() && self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl OutputFile {
    /// Opens (creating with mode 0600, not truncating) `path` for
    /// `option`; a symbolic link to a file is refused.
    pub fn open(option: &'static str, path: &Path) -> Result<Self> {
        let (file, created) = open_for_writing(option, path)?;
        Ok(Self {
            option,
            path: path.to_path_buf(),
            file: Some(file),
            created,
        })
    }

    /// The serial console's writer into this file (`--console-log`),
    /// keeping at most `max_bytes` of output ([`DEFAULT_CONSOLE_LOG_MAX_BYTES`]
    /// if None). Through the descriptor opened at the start: the path is
    /// not opened again.
    pub fn console_log(&self, max_bytes: Option<u64>) -> Result<ConsoleLog> {
        let file = self
            .file
            .as_ref()
            .expect("an output file is open until written");
        let file = file
            .try_clone()
            .with_context(|| format!("cannot use {} {}", self.option, self.path.display()))?;
        Ok(ConsoleLog {
            file: Arc::new(file),
            path: self.path.clone(),
            max_bytes: max_bytes.unwrap_or(DEFAULT_CONSOLE_LOG_MAX_BYTES),
        })
    }

    /// Keeps the file as the run left it: for a file written while the
    /// guest runs (`--console-log`), once the run has started.
    pub fn keep(mut self) {
        self.file = None;
    }

    /// Replaces the file's content with `text` (a regular file is
    /// truncated first; a pipe or device such as /dev/stdout just gets the
    /// text).
    pub fn replace_with(mut self, text: &str) -> Result<()> {
        let write = |file: &mut File| -> std::io::Result<()> {
            if file.metadata()?.is_file() {
                file.set_len(0)?;
                file.rewind()?;
            }
            file.write_all(text.as_bytes())?;
            file.flush()
        };
        let mut file = self.file.take().expect("an output file is written once");
        write(&mut file)
            .with_context(|| format!("cannot write {} {}", self.option, self.path.display()))
    }
}

/// The `--console-log` file as the devices get it: opened at the start,
/// emptied when the serial device is made, capped at `max_bytes`.
#[derive(Debug, Clone)]
pub struct ConsoleLog {
    file: Arc<File>,
    path: PathBuf,
    max_bytes: u64,
}

impl ConsoleLog {
    /// Empties the file (a regular one; a pipe or device just gets the
    /// output) and returns the writer the serial device writes through.
    pub fn writer(&self) -> Result<Box<dyn Write + Send>> {
        let shown = self.path.display();
        let mut file = self
            .file
            .try_clone()
            .with_context(|| format!("cannot use --console-log {shown}"))?;
        let empty = |file: &mut File| -> std::io::Result<()> {
            if file.metadata()?.is_file() {
                file.set_len(0)?;
                file.rewind()?;
            }
            Ok(())
        };
        empty(&mut file).with_context(|| format!("cannot empty --console-log {shown}"))?;
        Ok(Box::new(Capped::new(file, self.max_bytes)))
    }
}

/// A writer that passes on at most `left` more bytes, then one line
/// saying the rest was dropped, then nothing: a guest that prints for
/// ever cannot fill the host's disk. Dropped bytes count as written, so
/// the guest's UART never sees an error.
struct Capped<W: Write> {
    out: W,
    max_bytes: u64,
    left: u64,
    cut: bool,
}

impl<W: Write> Capped<W> {
    fn new(out: W, max_bytes: u64) -> Self {
        Capped {
            out,
            max_bytes,
            left: max_bytes,
            cut: false,
        }
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.cut {
            return Ok(buf.len());
        }
        let kept = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        self.out.write_all(&buf[..kept])?;
        self.left -= kept as u64;
        if kept < buf.len() {
            self.cut = true;
            let line = format!(
                "\n[hugevmm: console log truncated: it reached --console-log-max ({} bytes); the rest of the guest's output is dropped]\n",
                self.max_bytes
            );
            self.out.write_all(line.as_bytes())?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_output_paths_are_refused_before_anything_is_written() {
        let err = check_output_path("--stats-json", Path::new("/proc/x")).map(|_| ());
        // /proc/x does not exist and /proc exists: only opening can tell.
        assert!(err.is_ok());
        assert!(OutputFile::open("--stats-json", Path::new("/proc/x")).is_err());
        let message = check_output_path("--stats-json", Path::new("/nonexistent-dir/s.json"))
            .unwrap_err()
            .to_string();
        assert!(message.contains("/nonexistent-dir"), "{message}");
        let message = check_output_path("--status-file", Path::new("/tmp"))
            .unwrap_err()
            .to_string();
        assert!(message.contains("is a directory"), "{message}");
    }

    fn temp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hugevmm-output-{}-{tag}", std::process::id()))
    }

    #[test]
    fn a_symbolic_link_to_a_file_is_refused_and_the_file_left_alone() {
        use std::os::unix::fs::symlink;
        let target = temp("link-target");
        let link = temp("link");
        let dangling = temp("dangling");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&dangling);
        std::fs::write(&target, "precious").unwrap();
        symlink(&target, &link).unwrap();
        symlink(temp("nowhere"), &dangling).unwrap();
        for path in [&link, &dangling] {
            let checked = check_output_path("--stats-json", path)
                .unwrap_err()
                .to_string();
            assert!(checked.contains("is a symbolic link"), "{checked}");
            let opened = OutputFile::open("--stats-json", path)
                .err()
                .unwrap()
                .to_string();
            assert!(opened.contains("is a symbolic link"), "{opened}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert!(
            !temp("nowhere").exists(),
            "nothing created through the link"
        );
        // A link to a device is written to: /dev/stdout, /dev/null.
        let to_null = temp("to-null");
        let _ = std::fs::remove_file(&to_null);
        symlink("/dev/null", &to_null).unwrap();
        check_output_path("--stats-json", &to_null).unwrap();
        OutputFile::open("--stats-json", &to_null)
            .unwrap()
            .replace_with("gone\n")
            .unwrap();
        for path in [&target, &link, &dangling, &to_null] {
            std::fs::remove_file(path).unwrap();
        }
    }

    #[test]
    fn a_created_output_is_its_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp("mode");
        let _ = std::fs::remove_file(&path);
        let out = OutputFile::open("--status-file", &path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        out.replace_with("{}\n").unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_console_log_is_emptied_then_capped_with_a_last_line() {
        let path = temp("console");
        std::fs::write(&path, "the last run's log, longer than the cap").unwrap();
        let out = OutputFile::open("--console-log", &path).unwrap();
        let log = out.console_log(Some(10)).unwrap();
        let mut writer = log.writer().unwrap();
        // As the UART writes: a byte at a time, and never an error.
        for b in b"0123456789abc" {
            assert_eq!(writer.write(&[*b]).unwrap(), 1);
        }
        assert_eq!(writer.write(&[b'x'; 1000]).unwrap(), 1000);
        writer.flush().unwrap();
        out.keep();
        let text = std::fs::read_to_string(&path).unwrap();
        let (kept, rest) = text.split_at(10);
        assert_eq!(kept, "0123456789");
        assert_eq!(
            rest,
            "\n[hugevmm: console log truncated: it reached --console-log-max (10 bytes); the rest of the guest's output is dropped]\n"
        );
        std::fs::remove_file(&path).unwrap();
        // The default cap.
        let out = OutputFile::open("--console-log", &path).unwrap();
        assert_eq!(
            out.console_log(None).unwrap().max_bytes,
            DEFAULT_CONSOLE_LOG_MAX_BYTES
        );
    }

    #[test]
    fn a_file_is_kept_until_replaced_and_then_holds_only_the_new_text() {
        let path = std::env::temp_dir().join(format!("hugevmm-output-{}", std::process::id()));
        std::fs::write(&path, "old content that is longer").unwrap();
        let out = OutputFile::open("--stats-json", &path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "old content that is longer"
        );
        out.replace_with("new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        // A run that fails to start leaves a file it created no trace...
        std::fs::remove_file(&path).unwrap();
        drop(OutputFile::open("--stats-json", &path).unwrap());
        assert!(!path.exists());
        // ...and one that was there untouched.
        std::fs::write(&path, "kept").unwrap();
        drop(OutputFile::open("--stats-json", &path).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept");
        std::fs::remove_file(&path).unwrap();
        // A file written while the run goes on, once it started: kept.
        let log = OutputFile::open("--console-log", &path).unwrap();
        std::fs::write(&path, "guest output").unwrap();
        log.keep();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "guest output");
        std::fs::remove_file(&path).unwrap();
    }
}
