//! How large a store a run can need, so that a store sized too small is
//! refused at start rather than when it fills.
//!
//! The memory limit counts every unit that holds guest memory (resident,
//! staged, in flight), so at most `guest RAM − limit` of the guest is
//! outside memory at once, and only that has to be in the store. Units
//! being written are both in memory and in a store slot: at most the
//! parking area (`EngineConfig::parking_units_or_default`) is, so that is
//! the in-flight margin. Without a limit nothing is evicted except by
//! `--pageout` and the balloon, which can push out the whole guest: the
//! need is guest RAM.
//!
//! Not covered: a unit restored clean keeps its slot while resident (so a
//! later clean eviction writes nothing), and a lower limit set at run time
//! (`ctl mem-limit`) needs more than the start limit did. The need is the
//! least store that can work for the start limit, not a guarantee.

use super::StoreOpenError;

/// Bytes of store a run can need: `(guest_ram_bytes − mem_limit_bytes) +
/// in_flight_units` units, at most the guest's RAM, rounded up to whole
/// units; without a limit, the guest's RAM. See the module docs.
pub fn required_capacity_bytes(
    guest_ram_bytes: u64,
    mem_limit_bytes: Option<u64>,
    unit_bytes: u64,
    in_flight_units: u64,
) -> u64 {
    let unit_bytes = unit_bytes.max(1);
    let guest_bytes = round_up(guest_ram_bytes, unit_bytes);
    match mem_limit_bytes {
        None => guest_bytes,
        Some(limit_bytes) => {
            let outside_bytes = guest_ram_bytes.saturating_sub(limit_bytes);
            let margin_bytes = in_flight_units.saturating_mul(unit_bytes);
            round_up(outside_bytes.saturating_add(margin_bytes), unit_bytes).min(guest_bytes)
        }
    }
}

/// The inputs of [`required_capacity_bytes`], kept so that a refusal can
/// say where the figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapacityNeed {
    /// Guest RAM.
    pub guest_ram_bytes: u64,
    /// `--mem-limit`, if any.
    pub mem_limit_bytes: Option<u64>,
    /// The swap unit.
    pub unit_bytes: u64,
    /// Units that can be in a store slot and in memory at once.
    pub in_flight_units: u64,
}

impl CapacityNeed {
    /// [`required_capacity_bytes`] of these inputs.
    pub fn bytes(&self) -> u64 {
        required_capacity_bytes(
            self.guest_ram_bytes,
            self.mem_limit_bytes,
            self.unit_bytes,
            self.in_flight_units,
        )
    }

    /// Refuses `capacity_bytes` (of the store described by `what`) when
    /// fewer whole units fit than the run can need.
    pub fn check(&self, what: &str, capacity_bytes: u64) -> Result<(), StoreOpenError> {
        let need_bytes = self.bytes();
        let unit_bytes = self.unit_bytes.max(1);
        if capacity_bytes / unit_bytes * unit_bytes >= need_bytes {
            return Ok(());
        }
        let why = match self.mem_limit_bytes {
            None => "without --mem-limit, --pageout and the balloon can evict all guest RAM"
                .to_string(),
            Some(limit_bytes) => format!(
                "guest RAM {} minus --mem-limit {limit_bytes}, plus {} units of {unit_bytes} bytes that can be in flight",
                self.guest_ram_bytes, self.in_flight_units
            ),
        };
        Err(StoreOpenError::TooSmallForRun {
            what: what.to_string(),
            capacity_bytes,
            need_bytes,
            why,
        })
    }
}

/// `value` rounded up to a multiple of `to` (saturating).
fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to).saturating_mul(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn need_is_the_overcommit_plus_what_is_in_flight() {
        // 4 GiB guest held to 1 GiB, 2 MiB units, 32 parked units.
        assert_eq!(
            required_capacity_bytes(4 * GIB, Some(GIB), 2 * MIB, 32),
            3 * GIB + 64 * MIB
        );
        // Never more than the guest has.
        assert_eq!(
            required_capacity_bytes(64 * MIB, Some(60 * MIB), 2 * MIB, 32),
            64 * MIB
        );
        // Without a limit, all of guest RAM can be paged out.
        assert_eq!(
            required_capacity_bytes(192 * GIB, None, 2 * MIB, 32),
            192 * GIB
        );
        // Rounded up to whole units.
        assert_eq!(
            required_capacity_bytes(10 * 4096 + 100, Some(4096), 4096, 1),
            11 * 4096
        );
    }

    #[test]
    fn check_names_the_needed_size() {
        let need = CapacityNeed {
            guest_ram_bytes: 256 * MIB,
            mem_limit_bytes: Some(64 * MIB),
            unit_bytes: 2 * MIB,
            in_flight_units: 32,
        };
        assert_eq!(need.bytes(), 256 * MIB);
        assert!(need.check("size=268435456", 256 * MIB).is_ok());
        let err = need.check("size=134217728", 128 * MIB).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("268435456"), "{text}");
        assert!(text.contains("size=134217728"), "{text}");
        assert!(text.contains("--mem-limit"), "{text}");
        // A size that is not whole units counts only whole units.
        assert!(need.check("x", 256 * MIB - 1).is_err());
    }
}
