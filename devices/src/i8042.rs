//! Just enough of the i8042 keyboard controller for the guest to reboot.
//!
//! Linux's default reboot path pulses the CPU reset line by writing command
//! 0xFE to port 0x64, after polling the status register until the input
//! buffer is empty. This model answers every read with 0 (no data, input
//! buffer empty, so nothing is ever awaited) and turns the reset command
//! into a call to the VMM. No keyboard is emulated: Linux's i8042 probe
//! times out and carries on without one.

use crate::bus::PioDevice;

/// First port of the range to register: the data port 0x60.
pub const I8042_PORT_BASE: u64 = 0x60;
/// Ports to register from [`I8042_PORT_BASE`], up to and including the
/// command/status port 0x64. Ports 0x61-0x63 read as 0; port 0x61 (the PC
/// speaker gate) is normally served inside KVM by its in-kernel PIT and
/// never reaches this device.
pub const I8042_PORT_COUNT: u64 = 5;

/// Offset of the data port (0x60) from [`I8042_PORT_BASE`].
#[cfg(test)]
const DATA_OFFSET: u64 = 0;
/// Offset of the command (write) / status (read) port (0x64).
const COMMAND_OFFSET: u64 = 4;
/// The "pulse output line 0" command: bit 0 of the output port is the CPU
/// reset line, and pulsing it low resets the CPU.
const CMD_RESET_CPU: u8 = 0xfe;

/// The i8042 controller as a port-I/O device at [`I8042_PORT_BASE`].
pub struct I8042 {
    on_reset: Box<dyn FnMut() + Send>,
    resets: u64,
}

impl std::fmt::Debug for I8042 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("I8042")
            .field("resets", &self.resets)
            .finish_non_exhaustive()
    }
}

impl I8042 {
    /// A controller that calls `on_reset` each time the guest asks for a
    /// CPU reset (the VMM typically writes an exit eventfd there). The
    /// guest repeats the command until it is reset, so `on_reset` may run
    /// several times.
    pub fn new(on_reset: Box<dyn FnMut() + Send>) -> Self {
        Self {
            on_reset,
            resets: 0,
        }
    }

    /// How many reset commands the guest has sent.
    pub fn reset_count(&self) -> u64 {
        self.resets
    }
}

impl PioDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty. Data 0.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // Other commands, and keyboard data, have nobody to go to.
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            self.resets += 1;
            (self.on_reset)();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use vmm_sys_util::eventfd::EventFd;

    use super::*;

    #[test]
    fn reset_command_signals_the_vmm() {
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let signal = event.try_clone().unwrap();
        let mut dev = I8042::new(Box::new(move || {
            signal.write(1).unwrap();
        }));
        // The guest's kb_wait(): status must show an empty input buffer.
        let mut status = [0xffu8];
        dev.read(COMMAND_OFFSET, &mut status);
        assert_eq!(status[0] & 0x02, 0);
        dev.write(COMMAND_OFFSET, &[CMD_RESET_CPU]);
        assert_eq!(event.read().unwrap(), 1);
        assert_eq!(dev.reset_count(), 1);
    }

    #[test]
    fn other_writes_do_not_reset() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let mut dev = I8042::new(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        dev.write(DATA_OFFSET, &[CMD_RESET_CPU]);
        dev.write(COMMAND_OFFSET, &[0xaa]);
        dev.write(COMMAND_OFFSET, &[]);
        let mut data = [0xffu8; 2];
        dev.read(DATA_OFFSET, &mut data);
        assert_eq!(data, [0, 0]);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(dev.reset_count(), 0);
    }
}
