//! The memory limit as the engine accepts it: checked once, with one
//! message whichever way it arrives (the command line, a config file, the
//! API), and never rounded silently afterwards.

use guestmem::{format_size, format_size_arg, CHUNK_BYTES};

/// A memory limit that passed [`MemLimit::new`]: whole swap units, at most
/// guest RAM, at least what the vCPUs need to make progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLimit {
    bytes: u64,
    unit_bytes: u64,
}

/// Why a memory limit is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemLimitError {
    /// Not a whole number of swap units.
    #[error("{} is not a multiple of the swap unit ({}): give {}", format_size(*limit_bytes), format_size(*unit_bytes), whole_unit_choices(*limit_bytes, *unit_bytes))]
    NotWholeUnits {
        /// The limit asked for.
        limit_bytes: u64,
        /// The unit.
        unit_bytes: u64,
    },
    /// More than the guest has.
    #[error("{} is more than the guest's {} of RAM: the limit caps resident guest RAM, so give at most {} (or `none` / no --mem-limit for no cap)", format_size(*limit_bytes), format_size(*mem_bytes), format_size(*mem_bytes))]
    AboveRam {
        /// The limit asked for.
        limit_bytes: u64,
        /// Guest RAM.
        mem_bytes: u64,
    },
    /// No unit at all.
    #[error("a limit of 0 holds no guest memory at all: give at least one swap unit ({}), or `none` for no cap", format_size(*unit_bytes))]
    Zero {
        /// The unit.
        unit_bytes: u64,
    },
    /// Too small for the guest to make progress.
    #[error("{} is below the {} {vcpus} vCPU(s) need to make progress (8 MiB per vCPU + 8 MiB): one guest instruction can touch several chunks (code, data, stack, page tables), and a limit below that evicts one of them to restore another, for ever", format_size(*limit_bytes), format_size(*min_bytes))]
    TooSmall {
        /// The limit asked for.
        limit_bytes: u64,
        /// The smallest accepted.
        min_bytes: u64,
        /// vCPUs of the VM.
        vcpus: u32,
    },
}

/// The whole-unit limits nearest to `limit_bytes`, spelt as the command
/// line takes them ("152M or 154M"), so the message names a limit that
/// works rather than an example unrelated to the one given.
fn whole_unit_choices(limit_bytes: u64, unit_bytes: u64) -> String {
    let below = limit_bytes / unit_bytes * unit_bytes;
    let above = below + unit_bytes;
    if below == 0 {
        format_size_arg(above)
    } else {
        format!("{} or {}", format_size_arg(below), format_size_arg(above))
    }
}

impl MemLimit {
    /// The smallest limit accepted for `vcpus` vCPUs: four chunks per vCPU
    /// faulting at once plus four (measured: a 1-vCPU guest held to one or
    /// two chunks restores and evicts for ever without retiring an
    /// instruction).
    pub fn min_bytes(vcpus: u32) -> u64 {
        CHUNK_BYTES * (4 * u64::from(vcpus) + 4)
    }

    /// Checks `limit_bytes` for a VM of `vcpus` vCPUs and `mem_bytes` of
    /// RAM swapping in `unit_bytes` units.
    pub fn new(
        limit_bytes: u64,
        unit_bytes: u64,
        vcpus: u32,
        mem_bytes: u64,
    ) -> Result<MemLimit, MemLimitError> {
        if limit_bytes > mem_bytes {
            return Err(MemLimitError::AboveRam {
                limit_bytes,
                mem_bytes,
            });
        }
        if limit_bytes.checked_rem(unit_bytes) != Some(0) {
            return Err(MemLimitError::NotWholeUnits {
                limit_bytes,
                unit_bytes,
            });
        }
        let min_bytes = MemLimit::min_bytes(vcpus);
        if limit_bytes < min_bytes {
            return Err(MemLimitError::TooSmall {
                limit_bytes,
                min_bytes,
                vcpus,
            });
        }
        Ok(MemLimit {
            bytes: limit_bytes,
            unit_bytes,
        })
    }

    /// A limit of `units` whole units of `unit_bytes`, without the VMM's
    /// checks (guest RAM, vCPUs): for callers that count in units, such as
    /// engine tests and the fuzzer.
    pub fn whole_units(units: u64, unit_bytes: u64) -> Result<MemLimit, MemLimitError> {
        if units == 0 {
            return Err(MemLimitError::Zero { unit_bytes });
        }
        Ok(MemLimit {
            bytes: units * unit_bytes,
            unit_bytes,
        })
    }

    /// Checks raw bytes for whole units only (the engine's own condition).
    pub fn of_bytes(limit_bytes: u64, unit_bytes: u64) -> Result<MemLimit, MemLimitError> {
        if limit_bytes == 0 {
            return Err(MemLimitError::Zero { unit_bytes });
        }
        if limit_bytes.checked_rem(unit_bytes) != Some(0) {
            return Err(MemLimitError::NotWholeUnits {
                limit_bytes,
                unit_bytes,
            });
        }
        Ok(MemLimit {
            bytes: limit_bytes,
            unit_bytes,
        })
    }

    /// The unit the limit was checked for.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// The limit in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn limits_are_whole_units_within_ram_and_above_the_vcpus_floor() {
        assert_eq!(
            MemLimit::new(16 * MIB, 2 * MIB, 1, GIB).map(|l| l.bytes()),
            Ok(16 * MIB)
        );
        assert!(MemLimit::new(40 * MIB, 2 * MIB, 4, GIB).is_ok());
        assert!(matches!(
            MemLimit::new(14 * MIB, 2 * MIB, 1, GIB),
            Err(MemLimitError::TooSmall { min_bytes, .. }) if min_bytes == 16 * MIB
        ));
        assert!(matches!(
            MemLimit::new(39 * MIB, 2 * MIB, 4, GIB),
            Err(MemLimitError::NotWholeUnits { .. })
        ));
        assert!(MemLimit::new(16 * MIB + 4096, 4096, 1, GIB).is_ok());
        assert!(matches!(
            MemLimit::new(1 << 40, 2 * MIB, 1, GIB),
            Err(MemLimitError::AboveRam { .. })
        ));
        let message = MemLimit::new(153 * MIB, 2 * MIB, 1, GIB)
            .unwrap_err()
            .to_string();
        assert!(message.contains("give 152M or 154M"), "{message}");
    }
}
