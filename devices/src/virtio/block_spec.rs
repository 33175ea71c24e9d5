//! The `--disk PATH[,readonly]` argument, or an NBD export:
//! `--disk nbd://HOST[:PORT]/EXPORT[,readonly][,timeout=SECONDS]` or
//! `--disk nbd+unix:///EXPORT?socket=PATH[,readonly][,timeout=SECONDS]`,
//! or a vhost-user-blk backend's device:
//! `--disk vhost-user-blk:SOCKET[,readonly][,timeout=SECONDS]`.

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
    /// The vhost-user-blk backend, when the disk is one.
    pub vhost_user: Option<VhostUserDisk>,
}

/// A vhost-user-blk backend's device attached as a disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostUserDisk {
    /// The backend's Unix socket.
    pub socket: PathBuf,
    /// `timeout=`: seconds a request may go unanswered, and a lost backend
    /// is retried, before requests fail (the guest then sees I/O errors);
    /// `None`: the default (30 s).
    pub timeout_secs: Option<u64>,
}

/// The prefix of a vhost-user-blk disk.
const VHOST_USER_PREFIX: &str = "vhost-user-blk:";

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
    /// A vhost-user-blk disk that does not parse.
    #[error("--disk {spec:?}: {reason}; a vhost-user-blk disk is vhost-user-blk:SOCKET, then optionally ,readonly and ,timeout=SECONDS")]
    BadVhostUserOption {
        /// The text given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
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
        if let Some(rest) = s.strip_prefix(VHOST_USER_PREFIX) {
            return parse_vhost_user(s, rest);
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
            vhost_user: None,
        })
    }
}

/// `SOCKET[,readonly][,timeout=SECONDS]` after `vhost-user-blk:`.
fn parse_vhost_user(s: &str, rest: &str) -> Result<DiskSpec, DiskSpecError> {
    let bad = |reason: String| DiskSpecError::BadVhostUserOption {
        spec: s.to_string(),
        reason,
    };
    let mut parts = rest.split(',');
    let socket = parts.next().unwrap_or("");
    if socket.is_empty() {
        return Err(bad("no socket path".into()));
    }
    let mut readonly = false;
    let mut timeout_secs = None;
    for part in parts {
        match part.split_once('=') {
            None if part == "readonly" => readonly = true,
            Some(("timeout", value)) => timeout_secs = Some(parse_timeout(value).map_err(bad)?),
            _ => return Err(bad(format!("unknown option {part:?}"))),
        }
    }
    Ok(DiskSpec {
        path: PathBuf::from(socket),
        readonly,
        nbd: None,
        vhost_user: Some(VhostUserDisk {
            socket: PathBuf::from(socket),
            timeout_secs,
        }),
    })
}

/// `timeout=SECONDS`: whole seconds from 1 to a day.
fn parse_timeout(value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&t| t > 0 && t <= 86_400)
        .ok_or_else(|| format!("timeout= takes whole seconds from 1 to 86400, got {value:?}"))
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
            Some(("timeout", value)) => timeout_secs = Some(parse_timeout(value).map_err(bad)?),
            _ => return Err(bad(format!("unknown option {part:?}"))),
        }
    }
    Ok(DiskSpec {
        path: PathBuf::from(uri.to_string()),
        readonly,
        nbd: Some(NbdDisk { uri, timeout_secs }),
        vhost_user: None,
    })
}

impl fmt::Display for DiskSpec {
    /// The spec in the form it parses from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.nbd, &self.vhost_user) {
            (Some(nbd), _) => {
                write!(f, "{}", nbd.uri)?;
                if let Some(t) = nbd.timeout_secs {
                    write!(f, ",timeout={t}")?;
                }
            }
            (None, Some(vu)) => {
                write!(f, "{VHOST_USER_PREFIX}{}", vu.socket.display())?;
                if let Some(t) = vu.timeout_secs {
                    write!(f, ",timeout={t}")?;
                }
            }
            (None, None) => write!(f, "{}", self.path.display())?,
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
    fn vhost_user_disks_parse_print_back_and_say_what_is_wrong() {
        let spec: DiskSpec = "vhost-user-blk:/run/qsd.sock,readonly,timeout=5"
            .parse()
            .unwrap();
        assert!(spec.readonly && spec.nbd.is_none());
        assert_eq!(
            spec.vhost_user,
            Some(VhostUserDisk {
                socket: "/run/qsd.sock".into(),
                timeout_secs: Some(5)
            })
        );
        assert_eq!(spec.to_string().parse::<DiskSpec>().unwrap(), spec);
        for (bad, why) in [
            ("vhost-user-blk:", "no socket path"),
            ("vhost-user-blk:/s,timeout=0", "timeout= takes"),
            ("vhost-user-blk:/s,queues=2", "unknown option"),
        ] {
            let err = bad.parse::<DiskSpec>().unwrap_err().to_string();
            assert!(
                err.contains(why) && err.contains("vhost-user-blk:SOCKET"),
                "{bad}: {err}"
            );
        }
    }

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
