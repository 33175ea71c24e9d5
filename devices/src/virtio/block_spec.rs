//! The `--disk PATH[,readonly]` argument.

use std::path::PathBuf;
use std::str::FromStr;

/// A disk to attach: image path and access mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpec {
    /// The raw image (regular file or block device).
    pub path: PathBuf,
    /// Attach read-only: the guest sees a read-only disk and the image is
    /// opened without write access.
    pub readonly: bool,
}

/// Why a `--disk` argument was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiskSpecError {
    /// No path before the options.
    #[error("--disk needs an image path, as in --disk PATH or --disk PATH,readonly")]
    MissingPath,
}

impl FromStr for DiskSpec {
    type Err = DiskSpecError;

    /// Parses `PATH` or `PATH,readonly`. Only a trailing `,readonly` is an
    /// option, so paths may contain commas.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (path, readonly) = match s.strip_suffix(",readonly") {
            Some(path) => (path, true),
            None => (s, false),
        };
        if path.is_empty() {
            return Err(DiskSpecError::MissingPath);
        }
        Ok(DiskSpec {
            path: PathBuf::from(path),
            readonly,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_path_and_readonly() {
        let spec: DiskSpec = "/img/a.raw".parse().unwrap();
        assert_eq!(spec.path, PathBuf::from("/img/a.raw"));
        assert!(!spec.readonly);
        let spec: DiskSpec = "/img/a,b.raw,readonly".parse().unwrap();
        assert_eq!(spec.path, PathBuf::from("/img/a,b.raw"));
        assert!(spec.readonly);
        assert_eq!("".parse::<DiskSpec>(), Err(DiskSpecError::MissingPath));
        assert_eq!(
            ",readonly".parse::<DiskSpec>(),
            Err(DiskSpecError::MissingPath)
        );
    }
}
