//! The interrupt state a virtio-mmio transport and its device share.
//!
//! The transport's InterruptStatus register says why the line was raised
//! (used buffers, configuration change); the device sets those reasons from
//! whatever thread does its work, and the driver acknowledges them through
//! the transport. The configuration generation lives here too, because it
//! changes exactly when a configuration-change interrupt is raised.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};

use crate::interrupt::InterruptLine;

/// InterruptStatus bits and the configuration generation of one device.
pub struct VirtioInterrupt {
    status: AtomicU32,
    config_generation: AtomicU32,
    line: Arc<dyn InterruptLine>,
}

impl std::fmt::Debug for VirtioInterrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioInterrupt")
            .field("status", &self.status())
            .field("config_generation", &self.config_generation())
            .finish_non_exhaustive()
    }
}

impl VirtioInterrupt {
    /// No interrupt pending, generation 0, raising `line`.
    pub fn new(line: Arc<dyn InterruptLine>) -> Self {
        Self {
            status: AtomicU32::new(0),
            config_generation: AtomicU32::new(0),
            line,
        }
    }

    /// The device put buffers in a used ring.
    pub fn signal_used_queue(&self) -> io::Result<()> {
        self.status
            .fetch_or(VIRTIO_MMIO_INT_VRING, Ordering::SeqCst);
        self.line.trigger()
    }

    /// The device changed its configuration space or status; a driver
    /// reading the configuration sees a new generation.
    pub fn signal_config_change(&self) -> io::Result<()> {
        self.config_generation.fetch_add(1, Ordering::SeqCst);
        self.status
            .fetch_or(VIRTIO_MMIO_INT_CONFIG, Ordering::SeqCst);
        self.line.trigger()
    }

    /// The InterruptStatus register.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// The driver's InterruptACK write: clears those reasons.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// The ConfigGeneration register.
    pub fn config_generation(&self) -> u32 {
        self.config_generation.load(Ordering::SeqCst)
    }

    /// Device reset: nothing pending. The generation keeps counting, so a
    /// driver never sees an old value come back.
    pub(crate) fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }
}
