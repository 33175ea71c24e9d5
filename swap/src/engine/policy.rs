//! Which resident units to evict: a policy seam with one implementation,
//! CLOCK over the referenced bit and the chances the access signal gives
//! ([`super::access`]). A split chunk offers its pages one by one: its
//! own page hand sweeps them with the same rule.
//!
//! The referenced bit is set when a unit (or page) is restored and on a
//! unit's first write after a restore (the write-protect fault): the hand
//! clears it and passes on. A unit (or page) that faulted back soon after
//! its eviction holds chances besides: each pass over it unreferenced
//! spends one. Only an unreferenced unit without chances is picked. The
//! engine sees no other accesses (no accessed bits on this kernel; see
//! docs/GRANULARITY.md).

use std::sync::Mutex;

use crate::chunk::{ChunkTable, PageRef, PageTag, Tag, UnitState, PAGES_PER_CHUNK};
use crate::index::UnitIndex;

/// One eviction candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victim {
    /// A whole unit.
    Unit(UnitIndex),
    /// One page of a split chunk.
    Page(PageRef),
}

/// Chooses eviction victims.
pub trait EvictionPolicy: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// Appends `Resident`, unpinned units (and resident pages of split
    /// chunks) to `out`, coldest first, until they hold `want_pages` pages
    /// (`unit_pages` per unit, one per page). Candidates may change state
    /// before the evictor claims them (it then skips them).
    fn pick(&self, table: &ChunkTable, want_pages: u64, unit_pages: u64, out: &mut Vec<Victim>);
}

/// CLOCK: sweep a hand over the table; a referenced unit gets its bit
/// cleared and a second chance, an unreferenced one is picked.
pub struct Clock {
    hand: Mutex<UnitIndex>,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            hand: Mutex::new(UnitIndex::FIRST),
        }
    }
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn pick(&self, table: &ChunkTable, want_pages: u64, unit_pages: u64, out: &mut Vec<Victim>) {
        let units = table.units();
        if units == 0 || want_pages == 0 {
            return;
        }
        let mut hand = self.hand.lock().unwrap_or_else(|e| e.into_inner());
        let mut picked = 0;
        // Enough sweeps to clear every bit and spend every chance.
        for _ in 0..(2 + usize::from(UnitState::MAX_CHANCES)) * units {
            let unit = *hand;
            *hand = hand.wrapping_next(units);
            let state = table.load(unit);
            if state.tag() == Tag::Split {
                picked += pick_pages(table, unit, want_pages - picked, out);
            } else if state.tag() != Tag::Resident || state.pinned() {
                continue;
            } else if state.referenced() {
                table.set_referenced(unit, false);
                continue;
            } else if table.spend_chance(unit) {
                continue;
            } else {
                out.push(Victim::Unit(unit));
                picked += unit_pages;
            }
            if picked >= want_pages {
                return;
            }
        }
    }
}

/// One turn of a split chunk's page hand (from where it stopped last):
/// second chance and chances over its pages; returns the pages picked.
fn pick_pages(table: &ChunkTable, chunk: UnitIndex, want_pages: u64, out: &mut Vec<Victim>) -> u64 {
    let Some(pages) = table.pages() else {
        return 0;
    };
    let mut picked = 0;
    let start = pages.hand(chunk);
    for step in 0..PAGES_PER_CHUNK {
        let at = chunk.page(start.wrapping_add(step));
        let state = pages.load(at);
        if state.tag() != PageTag::Resident {
            continue;
        }
        if state.referenced() {
            pages.set_referenced(at, false);
            continue;
        }
        if pages.spend_chance(at) {
            continue;
        }
        out.push(Victim::Page(at));
        picked += 1;
        if picked >= want_pages {
            pages.set_hand(chunk, at.page.wrapping_next());
            return picked;
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{Restored, UnitState};
    use crate::index::UnitRange;

    #[test]
    fn clock_gives_referenced_units_a_second_chance() {
        let table = ChunkTable::new(4, 2 << 20, false);
        for unit in UnitRange::all(4) {
            let loading = table.begin_fault(unit.into(), UnitState::ABSENT).unwrap();
            let restored = Restored {
                huge: true,
                clean_slot: None,
                write_protected: false,
                prefetched: false,
            };
            table.finish_restore(unit.into(), loading, restored);
            table.set_referenced(unit, unit.get() % 2 == 0);
        }
        let clock = Clock::default();
        let mut out = Vec::new();
        clock.pick(&table, 2 * 512, 512, &mut out);
        assert_eq!(
            out,
            vec![
                Victim::Unit(UnitIndex::new(1)),
                Victim::Unit(UnitIndex::new(3))
            ]
        );
        out.clear();
        clock.pick(&table, 4 * 512, 512, &mut out);
        assert_eq!(
            out.len(),
            4,
            "bits were cleared by the first sweep: {out:?}"
        );
    }
}
