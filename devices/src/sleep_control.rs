//! The ACPI sleep control and sleep status registers of a hardware-reduced
//! machine (ACPI 6.5 §4.8.3.7), which is how a guest powers itself off:
//! the kernel writes SLP_TYP (from the DSDT's `\_S5` package) and SLP_EN
//! to the control register. Soft-off (S5) ends the VM; the VMM offers no
//! other sleep state, so other writes are ignored.

use crate::bus::PioDevice;

/// The control register's port; the status register is the next one.
pub const SLEEP_CONTROL_PORT: u64 = 0x600;
/// The status register's port.
pub const SLEEP_STATUS_PORT: u64 = SLEEP_CONTROL_PORT + 1;
/// Ports to register from [`SLEEP_CONTROL_PORT`].
pub const SLEEP_PORT_COUNT: u64 = 2;
/// The SLP_TYP value the DSDT's `\_S5` package gives for soft-off.
pub const S5_SLEEP_TYPE: u8 = 5;

/// Control register: SLP_TYP in bits 2-4, SLP_EN in bit 5.
const SLEEP_TYPE_SHIFT: u8 = 2;
const SLEEP_TYPE_MASK: u8 = 0b111;
const SLEEP_ENABLE: u8 = 1 << 5;

/// The two registers as one port-I/O device at [`SLEEP_CONTROL_PORT`].
pub struct SleepControl {
    on_power_off: Box<dyn FnMut() + Send>,
    power_offs: u64,
}

impl std::fmt::Debug for SleepControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SleepControl")
            .field("power_offs", &self.power_offs)
            .finish_non_exhaustive()
    }
}

impl SleepControl {
    /// Registers that call `on_power_off` when the guest enters S5. The
    /// guest may write again before the VMM stops it, so it may run more
    /// than once.
    pub fn new(on_power_off: Box<dyn FnMut() + Send>) -> Self {
        Self {
            on_power_off,
            power_offs: 0,
        }
    }

    /// How many times the guest asked for soft-off.
    pub fn power_off_count(&self) -> u64 {
        self.power_offs
    }
}

impl PioDevice for SleepControl {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Status: WAK_STS clear, nothing woke; control reads back as 0.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        // Writes to the status register only clear WAK_STS; nothing to do.
        if offset != 0 {
            return;
        }
        let sleep_type = (value >> SLEEP_TYPE_SHIFT) & SLEEP_TYPE_MASK;
        if value & SLEEP_ENABLE != 0 && sleep_type == S5_SLEEP_TYPE {
            self.power_offs += 1;
            (self.on_power_off)();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    fn counted() -> (SleepControl, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let dev = SleepControl::new(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        (dev, calls)
    }

    #[test]
    fn s5_with_sleep_enable_powers_off() {
        let (mut dev, calls) = counted();
        // What Linux's acpi_hw_extended_sleep writes for SLP_TYP 5.
        dev.write(0, &[(S5_SLEEP_TYPE << 2) | SLEEP_ENABLE]);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(dev.power_off_count(), 1);
    }

    #[test]
    fn other_writes_do_nothing() {
        let (mut dev, calls) = counted();
        // SLP_TYP 5 without SLP_EN, SLP_EN with another type, a write to the
        // status register (clearing WAK_STS), and an empty write.
        dev.write(0, &[S5_SLEEP_TYPE << 2]);
        dev.write(0, &[(3 << 2) | SLEEP_ENABLE]);
        dev.write(1, &[0x80]);
        dev.write(0, &[]);
        let mut status = [0xff];
        dev.read(1, &mut status);
        assert_eq!(status, [0]);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
