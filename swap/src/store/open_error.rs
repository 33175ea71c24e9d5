//! Why a store could not be created, and the unit-size rule every store
//! checks at creation.

use crate::blockio::BlockIoError;

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
    if unit_bytes == 0 || !crate::blockio::is_aligned(unit_bytes as u64, 4096) {
        return Err(StoreOpenError::BadUnit { unit_bytes });
    }
    Ok(())
}
