//! Why a store could not be created, and the unit-size rule every store
//! checks at creation.

use std::path::PathBuf;

use blockio::lockfile::LockError;
use blockio::BlockIoError;

/// Why creating a store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    /// The store's file or device could not be opened or set up.
    #[error(transparent)]
    Block(#[from] BlockIoError),
    /// The unit size cannot be stored.
    #[error("swap store unit of {unit_bytes} bytes is not supported: it must be a non-zero multiple of 4096 (4 KiB pages or 2 MiB chunks)")]
    BadUnit {
        /// The unit size asked for.
        unit_bytes: usize,
    },
    /// The capacity holds not even one unit.
    #[error("swap store {what} has room for no {unit_bytes}-byte unit ({capacity_bytes} bytes); give a larger size, e.g. size=1G")]
    TooSmall {
        /// What was too small (the requested size, a device, a budget).
        what: String,
        /// Capacity found.
        capacity_bytes: u64,
        /// Unit size.
        unit_bytes: usize,
    },
    /// `file:PATH` names something that exists, and `,overwrite` was not
    /// given: the store would destroy its content.
    #[error("--swap-store file:{} names an existing {what}; the store would destroy its content, so it was left untouched: give a path that does not exist (the store creates it), or add ,overwrite (--swap-store file:{},overwrite) if that content may be lost", path.display(), path.display())]
    Exists {
        /// The path.
        path: PathBuf,
        /// What is there, e.g. `regular file of 67108864 bytes`.
        what: String,
    },
    /// `file:PATH` names something no store can live in.
    #[error("--swap-store file:{} is a {what}, not a regular file or block device; give a new file's path", path.display())]
    NotStorable {
        /// The path.
        path: PathBuf,
        /// What it is, e.g. `directory`.
        what: &'static str,
    },
    /// `file:PATH` is a symbolic link to something other than a block
    /// device: the store would truncate and overwrite whatever the link
    /// points to when it opens, which whoever can write the link's
    /// directory could change.
    #[error("--swap-store file:{} is a symbolic link to {target}; a store follows a link only to a block device (a link to a file can be pointed anywhere before the store truncates what it names): give {target} itself", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
        /// Where the link points (as read, or `an unreadable target`).
        target: String,
    },
    /// `--swap-encrypt` was asked for a store kind that does not seal.
    #[error("swap store {store} cannot seal what it keeps, so --swap-encrypt cannot be used with it; use a file:, default or mem: store")]
    CannotSeal {
        /// The store's description.
        store: String,
    },
    /// The store's file is locked by another user.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// `,reserve` could not allocate the capacity.
    #[error("cannot reserve {need_bytes} bytes for the swap store in {} (,reserve): {source}; the filesystem has {} bytes free. Free space there, use another directory (--swap-store file:PATH elsewhere, or TMPDIR for the default store), give a smaller size= if the memory limit allows, or drop ,reserve (the store then grows as it fills)", path.display(), free_bytes.map_or_else(|| "an unknown number of".to_string(), |b| b.to_string()))]
    Reserve {
        /// The store's file (the directory, for a temporary store).
        path: PathBuf,
        /// The capacity asked for.
        need_bytes: u64,
        /// Free bytes on that filesystem (`statvfs`), if known.
        free_bytes: Option<u64>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The store holds fewer units than the run can need.
    #[error("swap store {what} holds {capacity_bytes} bytes but this run can need {need_bytes} ({why}); give size={need_bytes} or more, or raise --mem-limit")]
    TooSmallForRun {
        /// What is too small (the `size=` given, or the device).
        what: String,
        /// Its capacity.
        capacity_bytes: u64,
        /// What the run can need ([`super::required_capacity_bytes`]).
        need_bytes: u64,
        /// Where the need comes from.
        why: String,
    },
    /// The name of a store file this run created could not be removed
    /// ([`super::FileStore::remove_created_name`]).
    #[error("cannot remove the name of the swap store file {} that this run created ({reason}), so the run does not start: it would leave guest memory there; give a path in a directory only this user writes to, or add ,keep to keep the file (it then holds guest memory after the run)", path.display())]
    RemoveName {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No candidate directory could hold the temporary store file.
    #[error("no directory could hold the temporary swap store file ({tried}); set TMPDIR to a directory on a disk filesystem, or give --swap-store file:PATH")]
    NoTemporaryDir {
        /// Each directory tried and why it failed.
        tried: String,
    },
}

/// Checks that `unit_bytes` can be a store unit: a whole number of pages, so
/// that units stay aligned for `O_DIRECT` and for the guest's page tables.
pub(crate) fn check_unit_bytes(unit_bytes: usize) -> Result<(), StoreOpenError> {
    if unit_bytes == 0 || !blockio::is_aligned(unit_bytes as u64, 4096) {
        return Err(StoreOpenError::BadUnit { unit_bytes });
    }
    Ok(())
}
