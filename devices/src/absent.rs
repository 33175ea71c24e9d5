//! Legacy PC hardware this machine does not have, answered the way an
//! empty ISA bus answers: reads return all ones, writes go nowhere.
//!
//! Linux probes these ports on every boot (PCI configuration mechanism 1,
//! the CMOS clock, the other three COM ports). Registering them keeps those
//! expected probes out of the VMM's "unknown port" log, which is then left
//! for accesses that point at a real problem.

use crate::bus::PioDevice;

/// Port ranges (first port, count) that a Linux guest probes and that
/// hugevmm leaves empty, with why the guest touches them.
pub const LINUX_PROBED_PORTS: [(u64, u64, &str); 5] = [
    (
        0x70,
        2,
        "CMOS clock and NMI mask (the FADT says no CMOS RTC)",
    ),
    (0x2e8, 8, "COM4"),
    (0x2f8, 8, "COM2"),
    (0x3e8, 8, "COM3"),
    (
        0xcf8,
        8,
        "PCI configuration mechanism 1 (there is no PCI bus)",
    ),
];

/// An absent device: a port range nobody answers.
#[derive(Debug, Default)]
pub struct AbsentPorts;

impl PioDevice for AbsentPorts {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_float_high_and_ranges_do_not_overlap() {
        let mut dev = AbsentPorts;
        let mut data = [0u8; 4];
        dev.read(0, &mut data);
        assert_eq!(data, [0xff; 4]);
        dev.write(0, &[1, 2, 3, 4]);
        let mut ranges: Vec<_> = LINUX_PROBED_PORTS
            .iter()
            .map(|r| (r.0, r.0 + r.1))
            .collect();
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
        // Clear of the devices hugevmm does have: COM1, the i8042, the
        // ACPI sleep registers.
        for (start, end) in ranges {
            for port in [0x3f8, 0x60, 0x64, 0x600] {
                assert!(!(start..end).contains(&port), "{port:#x}");
            }
        }
    }
}
