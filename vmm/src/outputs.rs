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

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

/// Checks that `path` can be an output file for `option`: not a
/// directory, and in a directory that exists. Touches nothing.
pub fn check_output_path(option: &str, path: &Path) -> Result<()> {
    let shown = path.display();
    match std::fs::metadata(path) {
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
    /// Opens (creating, not truncating) `path` for `option`.
    pub fn open(option: &'static str, path: &Path) -> Result<Self> {
        let created = std::fs::symlink_metadata(path).is_err();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot open {option} {} for writing; give a writable path",
                    path.display()
                )
            })?;
        Ok(Self {
            option,
            path: path.to_path_buf(),
            file: Some(file),
            created,
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
