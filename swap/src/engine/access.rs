//! The access signal for resident memory: which resident units and pages
//! are hot, from the one thing the engine sees of them without accessed
//! bits (docs/GRANULARITY.md, "Signals"): how soon they fault back after
//! an eviction.
//!
//! Every eviction stamps what it took with the engine's eviction count
//! (units in their chunk word, 16 bits; pages of split chunks beside
//! their state, 32 bits). A refault reads how many evictions ago it left.
//! Fewer than the limit holds means the eviction was a mistake an LRU
//! with the accessed bits would not have made: the unit (or page) was
//! used again within one turn of the memory through the CLOCK. Such a
//! refault is an activation, in the manner of the kernel's workingset
//! refault detection (the shadow entry's distance against the active
//! list): the restored unit gets [`ACTIVE_CHANCES`] extra passes of the
//! CLOCK hand before it may be picked unreferenced, where a unit seen
//! once gets none. A pass over more memory than the limit brings nothing
//! back within that distance and protects nothing.
//!
//! Cost: no fault and no system call; a subtraction per restore, and for
//! split chunks 5 bytes of metadata per page (in the page table's
//! groups, allocated with them).

use crate::chunk::UnitState;

/// CLOCK passes a refault at a short distance earns (the most a unit word
/// holds).
pub(crate) const ACTIVE_CHANCES: u8 = UnitState::MAX_CHANCES;

/// The widest distance a 16-bit unit stamp tells apart from a wrapped
/// one: half its range.
const UNIT_STAMP_HORIZON: u64 = 1 << 15;

/// CLOCK passes a unit earns by faulting back `distance_evictions` unit
/// evictions after its own, under a limit of `limit_units` units (none:
/// nothing is evicted for room, so nothing is protected).
pub(crate) fn unit_chances(distance_evictions: u64, limit_units: Option<u64>) -> u8 {
    match limit_units {
        Some(limit) if distance_evictions < limit.min(UNIT_STAMP_HORIZON) => ACTIVE_CHANCES,
        _ => 0,
    }
}

/// CLOCK passes a page of a split chunk earns by faulting back from the
/// store `distance_evictions` page evictions after its own (`None`: it
/// was never evicted as a page, e.g. stored since its chunk split), under
/// a limit of `limit_pages` pages.
pub(crate) fn page_chances(distance_evictions: Option<u64>, limit_pages: Option<u64>) -> u8 {
    match (distance_evictions, limit_pages) {
        (Some(distance), Some(limit)) if distance < limit => ACTIVE_CHANCES,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refault_within_one_turn_of_the_limit_is_an_activation() {
        assert_eq!(unit_chances(10, Some(48)), ACTIVE_CHANCES);
        assert_eq!(unit_chances(48, Some(48)), 0, "a whole turn later");
        assert_eq!(unit_chances(0, None), 0, "no limit: nothing to protect");
        // A 16-bit stamp cannot tell 40,000 from 40,000 - 65,536.
        assert_eq!(unit_chances(40_000, Some(100_000)), 0);
        assert_eq!(unit_chances(30_000, Some(100_000)), ACTIVE_CHANCES);
        assert_eq!(page_chances(Some(100), Some(24_576)), ACTIVE_CHANCES);
        assert_eq!(page_chances(Some(30_000), Some(24_576)), 0);
        assert_eq!(page_chances(None, Some(24_576)), 0, "never evicted alone");
    }
}
