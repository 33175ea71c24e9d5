//! Device models of hugevmm: the buses the VMM dispatches guest I/O on,
//! an 8250 serial port, enough of an i8042 for the guest's reboot path,
//! and virtio-mmio devices (block, balloon) built on `virtio-queue`.
//!
//! - [`absent`]: [`AbsentPorts`], legacy ports Linux probes and finds empty.
//! - [`bus`]: [`MmioBus`] and [`PioBus`], address ranges to devices.
//! - [`interrupt`]: [`InterruptLine`], how a device raises its IRQ.
//! - [`serial`]: [`SerialPort`], the 8250 UART at 0x3f8.
//! - [`i8042`]: [`I8042`], the keyboard controller's CPU-reset command.
//! - [`sleep_control`]: [`SleepControl`], the ACPI sleep registers a guest
//!   powers off through.
//! - [`memory`]: [`GuestMemoryHandle`], how devices reach guest RAM.
//! - [`chunk_accumulator`]: free 4 KiB pages gathered into whole 2 MiB
//!   chunks for the swap engine.
//! - [`virtio`]: the virtio-mmio transport and the virtio devices.
//!
//! Nothing here trusts the guest: every guest-supplied address, length and
//! descriptor chain is checked, and a malformed request fails that request
//! or marks the device as needing a reset; it never panics the VMM.
#![deny(missing_docs)]

pub mod absent;
pub mod bus;
pub mod chunk_accumulator;
pub mod i8042;
pub mod interrupt;
pub mod memory;
pub mod serial;
pub mod sleep_control;
pub mod virtio;

pub use absent::AbsentPorts;
pub use bus::{BusError, MmioBus, MmioDevice, PioBus, PioDevice};
pub use chunk_accumulator::{ChunkAccumulator, FreeMemorySink};
pub use i8042::I8042;
pub use interrupt::{CountingLine, EventFdLine, InterruptLine};
pub use memory::{GuestMemoryHandle, GuestMemorySource};
pub use serial::SerialPort;
pub use sleep_control::SleepControl;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The VMM shares devices between vCPU threads through the buses.
    #[test]
    fn devices_fit_on_the_buses() {
        fn on_mmio<T: MmioDevice + 'static>(device: T) -> Arc<Mutex<dyn MmioDevice>> {
            Arc::new(Mutex::new(device))
        }
        fn on_pio<T: PioDevice + 'static>(device: T) -> Arc<Mutex<dyn PioDevice>> {
            Arc::new(Mutex::new(device))
        }
        fn shareable<T: Send + Sync>() {}
        shareable::<Mutex<virtio::MmioTransport<virtio::Block>>>();
        shareable::<ChunkAccumulator>();
        let line: Arc<dyn InterruptLine> = Arc::new(CountingLine::new());
        let memory: GuestMemoryHandle = virtio::test_support::memory();
        struct NoSink;
        impl FreeMemorySink for NoSink {
            fn free_range(&self, _gpa: guestmem::GuestAddress, _len_bytes: u64) {}
            fn reclaim_range(&self, _gpa: guestmem::GuestAddress, _len_bytes: u64) {}
        }
        let balloon = virtio::Balloon::new(Arc::new(NoSink));
        let mut mmio = MmioBus::new();
        mmio.insert(
            0xd000_0000,
            virtio::MMIO_WINDOW_BYTES,
            on_mmio(virtio::MmioTransport::new(balloon, memory, line.clone())),
        )
        .unwrap();
        let mut pio = PioBus::new();
        pio.insert(
            serial::SERIAL_PORT_BASE,
            serial::SERIAL_PORT_COUNT,
            on_pio(SerialPort::new(line, Box::new(std::io::sink()))),
        )
        .unwrap();
        pio.insert(
            i8042::I8042_PORT_BASE,
            i8042::I8042_PORT_COUNT,
            on_pio(I8042::new(Box::new(|| {}))),
        )
        .unwrap();
        let mut magic = [0u8; 4];
        assert!(mmio.read(0xd000_0000, &mut magic));
        assert_eq!(&magic, b"virt");
    }
}
