//! What a virtio device implements for the transport.

use std::sync::Arc;

use virtio_queue::Queue;

use super::error::VirtioError;
use super::interrupt::VirtioInterrupt;
use crate::memory::GuestMemoryHandle;

/// A virtio device (the part behind the transport).
///
/// Lifecycle, driven by [`super::MmioTransport`]: the driver reads
/// [`features`](Self::features) and the configuration space, then says
/// DRIVER_OK, and the transport calls [`activate`](Self::activate) with the
/// negotiated features and the queues as the driver set them up. Each
/// notification of a queue calls [`process_queue`](Self::process_queue).
/// A driver reset calls [`reset`](Self::reset), after which the device must
/// be as new (and may be activated again).
pub trait VirtioDevice: Send {
    /// The virtio device ID (2 = block, 5 = balloon).
    fn device_type(&self) -> u32;

    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// Feature bits the device offers. The transport adds
    /// `VIRTIO_F_VERSION_1` and refuses drivers that do not accept it.
    fn features(&self) -> u64;

    /// Reads the device-specific configuration space at `offset`. Bytes
    /// past its end read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes the device-specific configuration space at `offset`.
    /// Read-only fields ignore writes.
    fn write_config(&mut self, offset: u64, data: &[u8]);

    /// The driver is ready: start working with these queues (all of them,
    /// whether the driver made them ready or not). Queues marked ready have
    /// been checked to lie inside guest RAM. An error leaves the device
    /// needing a reset.
    fn activate(
        &mut self,
        acked_features: u64,
        memory: GuestMemoryHandle,
        queues: Vec<Queue>,
        interrupt: Arc<VirtioInterrupt>,
    ) -> Result<(), VirtioError>;

    /// The driver notified queue `index`: process what it made available.
    /// Called only between activation and reset. An error leaves the device
    /// needing a reset.
    fn process_queue(&mut self, index: usize) -> Result<(), VirtioError>;

    /// Back to the state before activation: drop queues and memory, forget
    /// negotiated features; keep the backend (disk, sink) and the
    /// host-side settings.
    fn reset(&mut self);
}

/// Copies `config[offset..]` into `data`, zero-filling whatever lies past
/// the end of `config`: the helper for [`VirtioDevice::read_config`].
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(available) = config.get(start..) {
        let count = available.len().min(data.len());
        data[..count].copy_from_slice(&available[..count]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_zero_fill_past_the_end() {
        let config = [1u8, 2, 3, 4];
        let mut data = [9u8; 4];
        read_config_bytes(&config, 2, &mut data);
        assert_eq!(data, [3, 4, 0, 0]);
        read_config_bytes(&config, 100, &mut data);
        assert_eq!(data, [0; 4]);
        read_config_bytes(&config, u64::MAX, &mut data);
        assert_eq!(data, [0; 4]);
    }
}
