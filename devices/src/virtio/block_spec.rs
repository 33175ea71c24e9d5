//! The `--disk PATH[,readonly]` argument, or an NBD export:
//! `--disk nbd://HOST[:PORT]/EXPORT[,readonly][,timeout=SECONDS]` or
//! `--disk nbd+unix:///EXPORT?socket=PATH[,readonly][,timeout=SECONDS]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use blockio::nbd::{NbdUri, NbdUriError};

/// A disk to attach: image path (or NBD export) and access mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpec {
    /// The raw image (regular file or block device); for an NBD export,
    /// its URI (for messages).
    pub path: PathBuf,
    /// Attach read-only: the guest sees a read-only disk and the image is
    /// opened without write access.
    pub readonly: bool,
    /// The NBD export, when the disk is one.
    pub nbd: Option<NbdDisk>,
}

/// An NBD export attached as a disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdDisk {
    /// The server and export.
    pub uri: NbdUri,
    /// `timeout=`: seconds a dropped connection is retried before requests
    /// fail (the guest then sees I/O errors); `None`: the default (30 s).
    pub timeout_secs: Option<u64>,
}

/// Why a `--disk` argument was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiskSpecError {
    /// No path before the options.
    #[error("--disk needs an image path, as in --disk PATH or --disk PATH,readonly")]
    MissingPath,
    /// An NBD URI that does not parse.
    #[error("--disk {0}")]
    BadNbdUri(#[from] NbdUriError),
    /// An option of an NBD disk that is not one.
    #[error("--disk {spec:?}: {reason}; an NBD disk is nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH, then optionally ,readonly and ,timeout=SECONDS (a comma inside the URI is written %2C)")]
    BadNbdOption {
        /// The text given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
}

impl FromStr for DiskSpec {
    type Err = DiskSpecError;

    /// Parses `PATH` or `PATH,readonly`. Only a trailing `,readonly` is an
    /// option, so paths may contain commas.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if NbdUri::looks_like(s) {
            return parse_nbd(s);
        }
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
            nbd: None,
        })
    }
}

/// `URI[,readonly][,timeout=SECONDS]`.
fn parse_nbd(s: &str) -> Result<DiskSpec, DiskSpecError> {
    let mut parts = s.split(',');
    let uri: NbdUri = parts.next().unwrap_or("").parse()?;
    let mut readonly = false;
    let mut timeout_secs = None;
    for part in parts {
        let bad = |reason: String| DiskSpecError::BadNbdOption {
            spec: s.to_string(),
            reason,
        };
        match part.split_once('=') {
            None if part == "readonly" => readonly = true,
            Some(("timeout", value)) => {
                timeout_secs = Some(
                    value
                        .parse::<u64>()
                        .ok()
                        .filter(|&t| t > 0 && t <= 86_400)
                        .ok_or_else(|| {
                            bad(format!(
                                "timeout= takes whole seconds from 1 to 86400, got {value:?}"
                            ))
                        })?,
                );
            }
            _ => return Err(bad(format!("unknown option {part:?}"))),
        }
    }
    Ok(DiskSpec {
        path: PathBuf::from(uri.to_string()),
        readonly,
        nbd: Some(NbdDisk { uri, timeout_secs }),
    })
}

impl fmt::Display for DiskSpec {
    /// The spec in the form it parses from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.nbd {
            Some(nbd) => {
                write!(f, "{}", nbd.uri)?;
                if let Some(t) = nbd.timeout_secs {
                    write!(f, ",timeout={t}")?;
                }
            }
            None => write!(f, "{}", self.path.display())?,
        }
        if self.readonly {
            f.write_str(",readonly")?;
        }
        Ok(())
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

    #[test]
    fn parses_nbd_disks() {
        let spec: DiskSpec = "nbd+unix:///d?socket=/s,timeout=9,readonly"
            .parse()
            .unwrap();
        assert!(spec.readonly);
        let nbd = spec.nbd.clone().unwrap();
        assert_eq!(nbd.timeout_secs, Some(9));
        assert_eq!(nbd.uri.export, "d");
        assert_eq!(spec.path, PathBuf::from("nbd+unix:///d?socket=/s"));
        assert_eq!(spec.to_string().parse::<DiskSpec>().unwrap(), spec);
        let spec: DiskSpec = "nbd://10.0.0.1/vol".parse().unwrap();
        assert!(!spec.readonly && spec.nbd.is_some());
        for (bad, why) in [
            ("nbd:///vol", "needs a host"),
            ("nbd://h/vol,timeout=x", "whole seconds"),
            ("nbd://h/vol,direct", "unknown option"),
        ] {
            let err = bad.parse::<DiskSpec>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(
                err.contains("nbd+unix:///EXPORT?socket=PATH"),
                "{bad}: {err}"
            );
        }
    }
}
