//! Which resident units to evict: a policy seam with one implementation,
//! CLOCK over the referenced bit.
//!
//! The referenced bit is set when a unit is restored (a fault on a unit
//! that was evicted shortly before marks it hot: staged eviction doubles as
//! an access sample) and on its first write after a restore (the
//! write-protect fault). The engine sees no other accesses: reading
//! hardware accessed bits would need page-table scans that split nothing
//! but cost a walk per epoch; left for later.

use std::sync::Mutex;

use crate::chunk::{ChunkTable, Tag};

/// Chooses eviction victims.
pub trait EvictionPolicy: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// Appends up to `want` `Resident`, unpinned units to `out`, coldest
    /// first. Candidates may change state before the evictor claims them
    /// (it then skips them).
    fn pick(&self, table: &ChunkTable, want: usize, out: &mut Vec<usize>);
}

/// CLOCK: sweep a hand over the table; a referenced unit gets its bit
/// cleared and a second chance, an unreferenced one is picked.
#[derive(Default)]
pub struct Clock {
    hand: Mutex<usize>,
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn pick(&self, table: &ChunkTable, want: usize, out: &mut Vec<usize>) {
        let units = table.units();
        if units == 0 || want == 0 {
            return;
        }
        let mut hand = self.hand.lock().unwrap_or_else(|e| e.into_inner());
        let start_len = out.len();
        // Two sweeps: the first may only clear bits.
        for _ in 0..2 * units {
            let unit = *hand;
            *hand = (*hand + 1) % units;
            let state = table.load(unit);
            if state.tag() != Tag::Resident || state.pinned() {
                continue;
            }
            if state.referenced() {
                table.set_referenced(unit, false);
                continue;
            }
            out.push(unit);
            if out.len() - start_len >= want {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{Restored, UnitState};

    #[test]
    fn clock_gives_referenced_units_a_second_chance() {
        let table = ChunkTable::new(4, 2 << 20, false);
        for unit in 0..4 {
            let loading = table.begin_fault(unit.into(), UnitState::ABSENT).unwrap();
            let restored = Restored {
                huge: true,
                clean_slot: None,
                write_protected: false,
            };
            table.finish_restore(unit.into(), loading, restored);
            table.set_referenced(unit, unit % 2 == 0);
        }
        let clock = Clock::default();
        let mut out = Vec::new();
        clock.pick(&table, 2, &mut out);
        assert_eq!(out, vec![1, 3]);
        out.clear();
        clock.pick(&table, 4, &mut out);
        assert_eq!(
            out.len(),
            4,
            "bits were cleared by the first sweep: {out:?}"
        );
    }
}
