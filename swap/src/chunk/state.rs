//! A unit's state packed in one word: tag, flags and a 32-bit index.

use crate::index::ParkingSlot;
use crate::store::SlotId;

/// A unit's lifecycle state (the tag of [`UnitState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// Never written or known zero.
    Absent = 0,
    /// Mapped in the guest.
    Resident = 1,
    /// Parked, content in memory, maybe being written.
    Staged = 2,
    /// Content only in the store.
    Stored = 3,
    /// Being restored.
    Loading = 4,
    /// Being taken away.
    Evicting = 5,
    /// Split into 512 pages with states of their own (see `pages`); the
    /// index names the chunk's store slot when `CLEAN` is set.
    Split = 6,
}

impl Tag {
    pub(super) fn from_bits(bits: u64) -> Tag {
        match bits & TAG_MASK {
            0 => Tag::Absent,
            1 => Tag::Resident,
            2 => Tag::Staged,
            3 => Tag::Stored,
            4 => Tag::Loading,
            5 => Tag::Evicting,
            _ => Tag::Split,
        }
    }

    /// In-flight states are owned by one thread; faults wait on them.
    pub fn in_flight(self) -> bool {
        matches!(self, Tag::Loading | Tag::Evicting)
    }

    /// States that hold guest memory on the host as a whole unit (count
    /// against the limit; a split chunk's pages count one by one).
    pub fn holds_memory(self) -> bool {
        matches!(
            self,
            Tag::Resident | Tag::Staged | Tag::Loading | Tag::Evicting
        )
    }
}

const TAG_MASK: u64 = 0x7;
const MERGING: u64 = 1 << 3;
const HUGE: u64 = 1 << 4;
const CLEAN: u64 = 1 << 5;
const WP: u64 = 1 << 6;
const REFERENCED: u64 = 1 << 7;
const WAITERS: u64 = 1 << 8;
const WRITING: u64 = 1 << 9;
const PINNED: u64 = 1 << 10;
const COLLAPSED: u64 = 1 << 11;
const PREFETCHED: u64 = 1 << 12;
const EPOCH_SHIFT: u32 = 13;
const EPOCH_MASK: u64 = 0xffff << EPOCH_SHIFT;
const SHORT_REFAULT: u64 = 1 << 29;
const CHANCES_SHIFT: u32 = 30;
const CHANCES_MASK: u64 = 0b11 << CHANCES_SHIFT;
const INDEX_SHIFT: u32 = 32;

/// One unit's packed state: tag, flags and a 32-bit index (store slot or
/// parking slot, see the module table).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UnitState(pub(super) u64);

impl std::fmt::Debug for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}(index={}", self.tag(), self.index())?;
        for (bit, name) in [
            (MERGING, "merging"),
            (HUGE, "huge"),
            (CLEAN, "clean"),
            (WP, "wp"),
            (REFERENCED, "ref"),
            (WAITERS, "waiters"),
            (WRITING, "writing"),
            (PINNED, "pinned"),
            (COLLAPSED, "collapsed"),
            (PREFETCHED, "prefetched"),
            (SHORT_REFAULT, "short-refault"),
        ] {
            if self.0 & bit != 0 {
                write!(f, " {name}")?;
            }
        }
        if self.chances() > 0 {
            write!(f, " chances={}", self.chances())?;
        }
        write!(f, ")")
    }
}

macro_rules! flag {
    ($get:ident, $with:ident, $bit:ident, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(self) -> bool {
            self.0 & $bit != 0
        }
        #[doc = concat!("This state with the flag set to `on`: ", $doc)]
        pub fn $with(self, on: bool) -> UnitState {
            UnitState(if on { self.0 | $bit } else { self.0 & !$bit })
        }
    };
}

impl UnitState {
    /// The initial state.
    pub const ABSENT: UnitState = UnitState(Tag::Absent as u64);

    /// The tag.
    pub fn tag(self) -> Tag {
        Tag::from_bits(self.0)
    }

    /// The index field (store slot or parking slot; see module docs).
    pub fn index(self) -> u32 {
        (self.0 >> INDEX_SHIFT) as u32
    }

    /// The store slot in the index field: of a `Stored` unit, or of a
    /// clean one (its store copy) while resident or in flight.
    pub fn store_slot(self) -> SlotId {
        debug_assert!(
            self.tag() == Tag::Stored || (self.clean() && self.tag() != Tag::Staged),
            "{self:?} names no store slot"
        );
        SlotId::new(self.index())
    }

    /// The store slot a split chunk's pages live in, if it has one yet
    /// (`CLEAN` on a `Split` word, or on a `Loading` one merging it back).
    ///
    /// `CLEAN` on any other `Loading` word means something else: the
    /// whole chunk's store copy, which a chunk split as it is restored
    /// frees. `MERGING` tells the two apart, so this never answers with
    /// a whole chunk's slot.
    pub fn split_slot(self) -> Option<SlotId> {
        let names_split_slot = match self.tag() {
            Tag::Split => true,
            Tag::Loading => self.merging(),
            _ => false,
        };
        (names_split_slot && self.clean()).then(|| self.store_slot())
    }

    /// The parking slot in the index field: of a `Staged` unit, or of one
    /// being handed back (`Loading` from `Staged`).
    pub fn parking_slot(self) -> ParkingSlot {
        debug_assert!(
            matches!(self.tag(), Tag::Staged | Tag::Loading),
            "{self:?} names no parking slot"
        );
        ParkingSlot::new(self.index())
    }

    /// Same flags, new tag and index. `WAITERS` is dropped: the caller that
    /// publishes the result wakes the waiters of the old word.
    pub fn to(self, tag: Tag, index: u32) -> UnitState {
        let flags = self.0 & !(TAG_MASK | WAITERS) & ((1 << INDEX_SHIFT) - 1);
        UnitState(flags | tag as u64 | (u64::from(index) << INDEX_SHIFT))
    }

    flag!(
        merging,
        with_merging,
        MERGING,
        "A `Loading` word of a split chunk being merged back (`BeginMerge`), whose `CLEAN` names the pages' slot."
    );
    flag!(huge, with_huge, HUGE, "Restored as one huge mapping.");
    flag!(
        clean,
        with_clean,
        CLEAN,
        "The store slot in `index` holds an identical copy."
    );
    flag!(wp, with_wp, WP, "Write-protected to catch the first write.");
    flag!(
        referenced,
        with_referenced,
        REFERENCED,
        "Accessed since the CLOCK hand last passed."
    );
    flag!(
        waiters,
        with_waiters,
        WAITERS,
        "Threads sleep waiting for this in-flight unit."
    );
    flag!(
        writing,
        with_writing,
        WRITING,
        "A store write of the parked content is in flight."
    );
    flag!(pinned, with_pinned, PINNED, "Never evicted.");
    flag!(
        collapsed,
        with_collapsed,
        COLLAPSED,
        "Collapsed back by the granularity policy once (splitting it again needs stronger evidence)."
    );
    flag!(
        prefetched,
        with_prefetched,
        PREFETCHED,
        "Restored by a prefetch and not yet written by the guest."
    );

    flag!(
        short_refault,
        with_short_refault,
        SHORT_REFAULT,
        "Its last refault came soon after its eviction (a second one splits it under `auto`)."
    );

    /// The eviction epoch stamped when the unit was last taken away (low
    /// 16 bits of the engine's eviction count): how many evictions ago it
    /// left tells the granularity policy whether it is thrashing.
    pub fn evict_epoch(self) -> u16 {
        ((self.0 & EPOCH_MASK) >> EPOCH_SHIFT) as u16
    }

    /// This state with eviction epoch `epoch`.
    pub fn with_evict_epoch(self, epoch: u16) -> UnitState {
        UnitState((self.0 & !EPOCH_MASK) | (u64::from(epoch) << EPOCH_SHIFT))
    }

    /// Extra passes of the CLOCK hand a resident unit survives without
    /// being referenced (0 to [`UnitState::MAX_CHANCES`]): given when it
    /// faulted back soon after its eviction, the access signal the
    /// engine has without accessed bits (see `engine::policy`).
    pub fn chances(self) -> u8 {
        ((self.0 & CHANCES_MASK) >> CHANCES_SHIFT) as u8
    }

    /// The most [`UnitState::chances`] a unit holds (two bits).
    pub const MAX_CHANCES: u8 = 3;

    /// This state with `chances` extra passes (at most
    /// [`UnitState::MAX_CHANCES`]).
    pub fn with_chances(self, chances: u8) -> UnitState {
        let chances = u64::from(chances.min(Self::MAX_CHANCES));
        UnitState((self.0 & !CHANCES_MASK) | (chances << CHANCES_SHIFT))
    }

    /// Raw bits (for tests and debugging).
    pub fn bits(self) -> u64 {
        self.0
    }
}
