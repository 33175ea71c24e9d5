//! Buses: which device answers a guest access to an address.
//!
//! A vCPU exit names an address (a guest-physical address for MMIO, a port
//! for port I/O); the bus finds the device whose range holds it and hands
//! the device the offset inside its range. Devices sit behind
//! `Arc<Mutex<..>>` so that the VMM can keep its own handle (to feed serial
//! input, to set a balloon target) while vCPU threads dispatch to them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A device reached through memory-mapped I/O.
pub trait MmioDevice: Send {
    /// The guest reads `data.len()` bytes at `offset` inside the device's
    /// range; fill `data`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset` inside the device's range.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A device reached through port I/O (`in`/`out`).
pub trait PioDevice: Send {
    /// The guest reads `data.len()` bytes from port `base + offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` to port `base + offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Why a device could not be placed on a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or wraps around the address space.
    #[error(
        "bus range at {base:#x} of {len_bytes:#x} bytes is empty or wraps around the address space"
    )]
    InvalidRange {
        /// First address of the range.
        base: u64,
        /// Length of the range.
        len_bytes: u64,
    },
    /// The range overlaps one that a device already has.
    #[error("bus range [{base:#x}, {end:#x}) overlaps the device already at [{other_base:#x}, {other_end:#x})")]
    Overlap {
        /// First address of the new range.
        base: u64,
        /// End (exclusive) of the new range.
        end: u64,
        /// First address of the range already taken.
        other_base: u64,
        /// End (exclusive) of the range already taken.
        other_end: u64,
    },
}

/// One device's place on a bus.
struct Entry<D: ?Sized> {
    len_bytes: u64,
    device: Arc<Mutex<D>>,
}

/// Address ranges mapped to devices; see [`MmioBus`] and [`PioBus`].
pub struct Bus<D: ?Sized> {
    /// Keyed by the first address of each range; ranges never overlap, so
    /// the entry with the greatest base not above an address is the only
    /// candidate for it.
    entries: BTreeMap<u64, Entry<D>>,
}

/// Guest-physical address ranges to [`MmioDevice`]s.
pub type MmioBus = Bus<dyn MmioDevice>;

/// Port ranges to [`PioDevice`]s.
pub type PioBus = Bus<dyn PioDevice>;

impl<D: ?Sized> Default for Bus<D> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
        }
    }
}

impl<D: ?Sized> std::fmt::Debug for Bus<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.entries
                    .iter()
                    .map(|(base, e)| (*base, base + e.len_bytes)),
            )
            .finish()
    }
}

impl<D: ?Sized> Bus<D> {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Places `device` at `[base, base + len_bytes)`. Refuses empty or
    /// wrapping ranges and ranges that overlap a device already present.
    pub fn insert(
        &mut self,
        base: u64,
        len_bytes: u64,
        device: Arc<Mutex<D>>,
    ) -> Result<(), BusError> {
        let end = match base.checked_add(len_bytes) {
            Some(end) if len_bytes > 0 => end,
            _ => return Err(BusError::InvalidRange { base, len_bytes }),
        };
        // The only ranges that can overlap are the last one starting before
        // `end` (all ranges are disjoint, so earlier ones end before it).
        if let Some((&other_base, other)) = self.entries.range(..end).next_back() {
            let other_end = other_base + other.len_bytes;
            if other_end > base {
                return Err(BusError::Overlap {
                    base,
                    end,
                    other_base,
                    other_end,
                });
            }
        }
        self.entries.insert(base, Entry { len_bytes, device });
        Ok(())
    }

    /// The device whose range holds `addr`, and `addr`'s offset in it.
    pub fn lookup(&self, addr: u64) -> Option<(&Arc<Mutex<D>>, u64)> {
        let (&base, entry) = self.entries.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < entry.len_bytes).then_some((&entry.device, offset))
    }

    /// Number of devices on the bus.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no device is on the bus.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Bus<dyn MmioDevice> {
    /// Dispatches a guest read at `addr`. Returns false, leaving `data`
    /// untouched, when no device holds the address.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.lookup(addr) {
            Some((device, offset)) => {
                // A device that panicked once must not take the VMM down
                // with every later access: use its state as it was left.
                let mut device = device.lock().unwrap_or_else(PoisonError::into_inner);
                device.read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a guest write at `addr`. Returns false when no device
    /// holds the address.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.lookup(addr) {
            Some((device, offset)) => {
                let mut device = device.lock().unwrap_or_else(PoisonError::into_inner);
                device.write(offset, data);
                true
            }
            None => false,
        }
    }
}

impl Bus<dyn PioDevice> {
    /// Dispatches a guest `in` from `port`. Returns false, leaving `data`
    /// untouched, when no device holds the port.
    pub fn read(&self, port: u64, data: &mut [u8]) -> bool {
        match self.lookup(port) {
            Some((device, offset)) => {
                let mut device = device.lock().unwrap_or_else(PoisonError::into_inner);
                device.read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a guest `out` to `port`. Returns false when no device
    /// holds the port.
    pub fn write(&self, port: u64, data: &[u8]) -> bool {
        match self.lookup(port) {
            Some((device, offset)) => {
                let mut device = device.lock().unwrap_or_else(PoisonError::into_inner);
                device.write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembers the last access and answers reads with the offset.
    #[derive(Default)]
    struct Probe {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl MmioDevice for Probe {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    impl PioDevice for Probe {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(0x80 | offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    #[test]
    fn lookup_finds_the_range_and_offset() {
        let mut bus = MmioBus::new();
        let a = Arc::new(Mutex::new(Probe::default()));
        let b = Arc::new(Mutex::new(Probe::default()));
        bus.insert(0x1000, 0x100, a.clone()).unwrap();
        bus.insert(0x2000, 0x1000, b.clone()).unwrap();
        assert_eq!(bus.len(), 2);
        assert!(bus.lookup(0xfff).is_none());
        assert_eq!(bus.lookup(0x1000).unwrap().1, 0);
        assert_eq!(bus.lookup(0x10ff).unwrap().1, 0xff);
        assert!(bus.lookup(0x1100).is_none());
        assert_eq!(bus.lookup(0x2abc).unwrap().1, 0xabc);
        assert!(bus.lookup(0x3000).is_none());

        let mut data = [0u8; 4];
        assert!(bus.read(0x1010, &mut data));
        assert_eq!(data, [0x10; 4]);
        assert!(bus.write(0x2004, &[1, 2]));
        assert_eq!(b.lock().unwrap().last_write, Some((4, vec![1, 2])));
        assert!(!bus.write(0x5000, &[1]));
        assert!(a.lock().unwrap().last_write.is_none());
    }

    #[test]
    fn insert_refuses_overlaps_and_bad_ranges() {
        let mut bus = PioBus::new();
        let dev = Arc::new(Mutex::new(Probe::default()));
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        for (base, len) in [
            (0x3f0, 9),
            (0x3ff, 1),
            (0x3f8, 8),
            (0x3fa, 1),
            (0x3f0, 0x100),
        ] {
            assert!(
                matches!(
                    bus.insert(base, len, dev.clone()),
                    Err(BusError::Overlap { .. })
                ),
                "[{base:#x}, +{len}) must overlap"
            );
        }
        assert!(matches!(
            bus.insert(0x500, 0, dev.clone()),
            Err(BusError::InvalidRange { .. })
        ));
        assert!(matches!(
            bus.insert(u64::MAX, 2, dev.clone()),
            Err(BusError::InvalidRange { .. })
        ));
        // Touching ranges are fine.
        bus.insert(0x3f0, 8, dev.clone()).unwrap();
        bus.insert(0x400, 1, dev.clone()).unwrap();
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fb, &mut data));
        assert_eq!(data[0], 0x83);
    }
}
