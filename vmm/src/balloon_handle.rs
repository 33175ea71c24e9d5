//! The VMM's own handle on the virtio-balloon device: setting its target
//! from outside the vCPU threads (`--balloon-target`, the control socket)
//! and reading what the guest did with it.

use devices::virtio::{Balloon, BalloonStats, MmioTransport, VirtioError};
use guestmem::{format_size, PAGE_BYTES};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// Why a balloon target size was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BalloonTargetError {
    /// The balloon counts 4 KiB pages.
    #[error("{bytes} bytes is not a multiple of 4 KiB: give whole pages, e.g. 256M or 4K")]
    NotWholePages {
        /// The size given.
        bytes: u64,
    },
    /// A balloon cannot hold more than the guest has.
    #[error("{} is more than the guest's RAM ({}): give at most the --mem size", format_size(*bytes), format_size(*ram_bytes))]
    MoreThanRam {
        /// The size given.
        bytes: u64,
        /// Guest RAM.
        ram_bytes: u64,
    },
}

/// The balloon target in 4 KiB pages for a size in bytes, checked against
/// the guest's RAM.
pub fn target_pages(bytes: u64, ram_bytes: u64) -> Result<u32, BalloonTargetError> {
    // Not `is_multiple_of`: it needs Rust 1.87, the workspace supports 1.85.
    if bytes.checked_rem(PAGE_BYTES) != Some(0) {
        return Err(BalloonTargetError::NotWholePages { bytes });
    }
    if bytes > ram_bytes {
        return Err(BalloonTargetError::MoreThanRam { bytes, ram_bytes });
    }
    // --mem is at most 192 GiB, far below the 16 TiB a u32 of pages holds;
    // the check keeps a larger future limit from wrapping silently.
    u32::try_from(bytes / PAGE_BYTES).map_err(|_| BalloonTargetError::MoreThanRam {
        bytes,
        ram_bytes: u64::from(u32::MAX) * PAGE_BYTES,
    })
}

/// The balloon's figures at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalloonSnapshot {
    /// The target the host set, in 4 KiB pages.
    pub target_pages: u32,
    /// What the driver says the balloon holds (its `actual` field).
    pub actual_pages: u32,
    /// Pages inflated minus pages deflated, as seen on the queues.
    pub inflated_pages: u64,
    /// Whether a driver has the device running.
    pub driver_active: bool,
    /// Statistics reports received so far.
    pub stats_reports: u64,
    /// The latest statistics report, if the guest sent one.
    pub guest_stats: Option<BalloonStats>,
}

/// A shared handle on the balloon: the MMIO bus dispatches the guest's
/// accesses to the same transport.
#[derive(Clone)]
pub struct BalloonHandle {
    transport: Arc<Mutex<MmioTransport<Balloon>>>,
}

impl BalloonHandle {
    /// Wraps the transport the MMIO bus holds.
    pub fn new(transport: Arc<Mutex<MmioTransport<Balloon>>>) -> Self {
        Self { transport }
    }

    fn lock(&self) -> MutexGuard<'_, MmioTransport<Balloon>> {
        // A vCPU thread that panicked mid-access leaves the device as it
        // was; reading or setting the target is still meaningful.
        self.transport.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the target (a configuration-change interrupt tells a running
    /// driver). Fails only if the interrupt cannot be raised.
    pub fn set_target_pages(&self, pages: u32) -> std::io::Result<()> {
        self.lock().device_mut().set_target_pages(pages)
    }

    /// Asks the driver for a fresh statistics report; false when it cannot
    /// be asked now (no statistics queue, or its buffer is not back yet).
    pub fn request_stats(&self) -> Result<bool, VirtioError> {
        let mut transport = self.lock();
        if !transport.is_active() {
            return Ok(false);
        }
        transport.device_mut().request_stats()
    }

    /// The current figures.
    pub fn snapshot(&self) -> BalloonSnapshot {
        Self::figures(&self.lock())
    }

    /// The current figures, unless a vCPU is using the device right now.
    pub fn try_snapshot(&self) -> Option<BalloonSnapshot> {
        match self.transport.try_lock() {
            Ok(transport) => Some(Self::figures(&transport)),
            Err(TryLockError::Poisoned(e)) => Some(Self::figures(&e.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn figures(transport: &MmioTransport<Balloon>) -> BalloonSnapshot {
        let balloon = transport.device();
        BalloonSnapshot {
            target_pages: balloon.target_pages(),
            actual_pages: balloon.actual_pages(),
            inflated_pages: balloon.inflated_pages(),
            driver_active: transport.is_active(),
            stats_reports: balloon.stats_reports(),
            guest_stats: balloon.latest_stats().cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_whole_pages_within_ram() {
        assert_eq!(target_pages(0, 1 << 30), Ok(0));
        assert_eq!(target_pages(256 << 20, 1 << 30), Ok(65536));
        assert_eq!(target_pages(1 << 30, 1 << 30), Ok(262144));
        assert_eq!(
            target_pages(4097, 1 << 30),
            Err(BalloonTargetError::NotWholePages { bytes: 4097 })
        );
        let err = target_pages(2 << 30, 1 << 30).unwrap_err();
        assert!(matches!(err, BalloonTargetError::MoreThanRam { .. }));
        assert!(err.to_string().contains("at most the --mem size"), "{err}");
    }
}
