//! Reading the files a user names as inputs (payload, kernel, initrd):
//! checked before they are read, and read with a bound.
//!
//! `std::fs::read` trusts the file: `/dev/zero` is read until the OOM
//! killer ends the process (and others with it), a FIFO blocks for ever.
//! Here a file must be a regular file no larger than what it could ever be
//! used for (each of these inputs must fit in guest RAM), and the read
//! stops at that bound even if the file grows meanwhile.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use guestmem::format_size;

/// Why an input file is refused or cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum InputFileError {
    /// It cannot be opened or inspected.
    #[error("cannot open {what} {}: {source}; check that it exists and is readable", path.display())]
    Open {
        /// Which input (`--payload-file`, ...).
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// It is not a regular file.
    #[error("{what} {} is {kind}, not a regular file: give the path of an image file", path.display())]
    NotRegular {
        /// Which input.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// What it is instead ("a character device", ...).
        kind: &'static str,
    },
    /// It is larger than it could ever be used for.
    #[error("{what} {} is {}, more than the {} it must fit in ({why}); give a smaller file or more --mem", path.display(), format_size(*size_bytes), format_size(*limit_bytes))]
    TooLarge {
        /// Which input.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Its size (or what was read before the bound).
        size_bytes: u64,
        /// The bound.
        limit_bytes: u64,
        /// What the bound is.
        why: &'static str,
    },
    /// Reading failed.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// Which input.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// What a file that is not regular is, for the message.
fn describe(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Opens `path` and checks that it is a regular file of at most
/// `limit_bytes`; returns it with its size. `O_NONBLOCK` keeps the open
/// itself from blocking on a FIFO that has no writer.
pub fn open_checked(
    what: &'static str,
    path: &Path,
    limit_bytes: u64,
    why: &'static str,
) -> Result<(File, u64), InputFileError> {
    let open_err = |source| InputFileError::Open {
        what,
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.file_type().is_file() {
        return Err(InputFileError::NotRegular {
            what,
            path: path.to_path_buf(),
            kind: describe(meta.file_type()),
        });
    }
    if meta.len() > limit_bytes {
        return Err(InputFileError::TooLarge {
            what,
            path: path.to_path_buf(),
            size_bytes: meta.len(),
            limit_bytes,
            why,
        });
    }
    Ok((file, meta.len()))
}

/// Reads the whole of `path`, a regular file of at most `limit_bytes`
/// (`why` says what the bound is, for the message).
pub fn read_bounded(
    what: &'static str,
    path: &Path,
    limit_bytes: u64,
    why: &'static str,
) -> Result<Vec<u8>, InputFileError> {
    let (file, size_bytes) = open_checked(what, path, limit_bytes, why)?;
    let mut bytes = Vec::with_capacity(size_bytes as usize);
    // One byte past the bound tells a file that grew since fstat.
    file.take(limit_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| InputFileError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > limit_bytes {
        return Err(InputFileError::TooLarge {
            what,
            path: path.to_path_buf(),
            size_bytes: bytes.len() as u64,
            limit_bytes,
            why,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("hugevmm-input-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_regular_file_within_the_bound_is_read_whole() {
        let path = temp("ok", b"0123456789");
        assert_eq!(
            read_bounded("--initrd", &path, 10, "RAM").unwrap(),
            b"0123456789"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_oversized_file_is_refused_with_both_sizes() {
        let path = temp("big", &[7u8; 4097]);
        let message = read_bounded("--payload-file", &path, 4096, "guest RAM")
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(message.contains("--payload-file"), "{message}");
        assert!(
            message.contains("more than the 4 KiB it must fit in"),
            "{message}"
        );
    }

    #[test]
    fn special_files_are_refused_by_name_without_reading() {
        let message = read_bounded("--payload-file", Path::new("/dev/zero"), 1 << 30, "RAM")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("/dev/zero is a character device"),
            "{message}"
        );
        let message = read_bounded("--kernel", Path::new("/tmp"), 1 << 30, "RAM")
            .unwrap_err()
            .to_string();
        assert!(message.contains("is a directory"), "{message}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let path = std::env::temp_dir().join(format!("hugevmm-input-{}-fifo", std::process::id()));
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let message = read_bounded("--initrd", &path, 1 << 20, "RAM")
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(message.contains("is a FIFO"), "{message}");
    }
}
