//! The unit table: one packed state word per swap unit (a 2 MiB chunk, or a
//! 4 KiB page with `--swap-unit 4k`), and the rules for changing it.
//!
//! # States
//!
//! | state | meaning | `index` field |
//! | --- | --- | --- |
//! | `Absent` | never written or known zero; reads as zero, no store space | - |
//! | `Resident` | mapped in the guest; flags `HUGE` (restored as one PMD), `CLEAN` (the store slot holds an identical copy), `WP` (write-protected to detect the first write) | store slot if `CLEAN` |
//! | `Staged` | taken from the guest, content in the parking area; `WRITING` while the store write is in flight | parking slot |
//! | `Stored` | content only in the store | store slot |
//! | `Loading` | in flight towards `Resident`; one fault thread owns it | parking slot if `WRITING` |
//! | `Evicting` | in flight away from `Resident`; one evicting thread owns it | store slot if `CLEAN` |
//!
//! Other flags: `REFERENCED` (CLOCK bit, set on restore and on a
//! write-protect fault), `WAITERS` (someone sleeps on this unit's wait
//! shard), `PINNED` (never evicted, e.g. the VMM's boot area).
//!
//! # Transitions and who takes them
//!
//! "Fault thread" is a fault-service thread; "evictor" is whichever thread
//! evicts (background evictor, a fault thread making room under the memory
//! limit, or the caller of `evict_range`); the evictor also writes what it
//! staged, so "writer" is that same thread.
//!
//! | from | to | who | why |
//! | --- | --- | --- | --- |
//! | Absent | Loading | fault thread | zero fill |
//! | Stored(s) | Loading | fault thread | read from the store |
//! | Staged(p) | Loading | fault thread | hand back (move p back; copy if `WRITING`) |
//! | Loading | Resident | the fault thread that took it | restored and woken |
//! | Resident+WP | Resident-WP-CLEAN | fault thread | first write: unprotect, free slot |
//! | Resident | Evicting | evictor | (CAS; losers skip the unit) |
//! | Evicting | Resident | that evictor | the move out failed (e.g. pinned) |
//! | Evicting | Absent / Stored(s) / Staged(p) | that evictor | zero / clean drop / dirty |
//! | Staged(p) | Staged(p)+WRITING | evictor (writer) | write submitted |
//! | Staged(p)+WRITING | Stored(s) | writer | write done; parking slot released |
//! | Staged(p)+WRITING | Staged(p) | writer | write failed (fatal, content kept) |
//!
//! Only the thread that moved a unit into `Loading` or `Evicting` may move it
//! out, so an in-flight word changes only by that owner (plus waiters
//! setting `WAITERS`). A fault on an in-flight unit waits on the unit's
//! wait shard until the owner finishes: it never sees stale or zero data.
//! A `Loading` unit whose store read failed stays `Loading` forever: the
//! faulting threads stay blocked and `on_fatal` tells the VMM to exit.
//! A writer whose `Staged(p)+WRITING` unit was handed back meanwhile waits
//! while the unit is `Loading` (the fault thread is still copying out of
//! `p`) before it releases `p`.
//!
//! # Size
//!
//! 8 bytes per unit in the state word, plus 8 bytes of content hash per
//! unit when the hash guard is on (2 MiB anonymous units, see
//! `engine::evict`): with 2 MiB units 4 KiB (8 KiB with hashes) per GiB
//! of guest, a 1 TiB guest needs 4 MiB (8 MiB). With 4 KiB units 2 MiB per
//! GiB.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

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
}

impl Tag {
    fn from_bits(bits: u64) -> Tag {
        match bits & TAG_MASK {
            0 => Tag::Absent,
            1 => Tag::Resident,
            2 => Tag::Staged,
            3 => Tag::Stored,
            4 => Tag::Loading,
            _ => Tag::Evicting,
        }
    }

    /// In-flight states are owned by one thread; faults wait on them.
    pub fn in_flight(self) -> bool {
        matches!(self, Tag::Loading | Tag::Evicting)
    }

    /// States that hold guest memory on the host (count against the limit).
    pub fn holds_memory(self) -> bool {
        matches!(
            self,
            Tag::Resident | Tag::Staged | Tag::Loading | Tag::Evicting
        )
    }
}

const TAG_MASK: u64 = 0x7;
const HUGE: u64 = 1 << 4;
const CLEAN: u64 = 1 << 5;
const WP: u64 = 1 << 6;
const REFERENCED: u64 = 1 << 7;
const WAITERS: u64 = 1 << 8;
const WRITING: u64 = 1 << 9;
const PINNED: u64 = 1 << 10;
const INDEX_SHIFT: u32 = 32;

/// One unit's packed state: tag, flags and a 32-bit index (store slot or
/// parking slot, see the module table).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UnitState(u64);

impl std::fmt::Debug for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}(index={}", self.tag(), self.index())?;
        for (bit, name) in [
            (HUGE, "huge"),
            (CLEAN, "clean"),
            (WP, "wp"),
            (REFERENCED, "ref"),
            (WAITERS, "waiters"),
            (WRITING, "writing"),
            (PINNED, "pinned"),
        ] {
            if self.0 & bit != 0 {
                write!(f, " {name}")?;
            }
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

    /// Same flags, new tag and index. `WAITERS` is dropped: the caller that
    /// publishes the result wakes the waiters of the old word.
    pub fn to(self, tag: Tag, index: u32) -> UnitState {
        let flags = self.0 & !(TAG_MASK | WAITERS) & ((1 << INDEX_SHIFT) - 1);
        UnitState(flags | tag as u64 | (u64::from(index) << INDEX_SHIFT))
    }

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

    /// Raw bits (for tests and debugging).
    pub fn bits(self) -> u64 {
        self.0
    }
}

/// A condvar shard; units hash onto shards so waiting costs no per-unit
/// memory.
struct WaitShard {
    lock: Mutex<()>,
    cond: Condvar,
}

const WAIT_SHARDS: usize = 64;

/// The table of unit states.
pub struct ChunkTable {
    words: Box<[AtomicU64]>,
    hashes: Option<Box<[AtomicU64]>>,
    shards: Box<[WaitShard]>,
    unit_bytes: u64,
}

impl ChunkTable {
    /// A table of `units` units of `unit_bytes`, all `Absent`. With
    /// `with_hashes`, keeps a content hash per unit.
    pub fn new(units: usize, unit_bytes: u64, with_hashes: bool) -> ChunkTable {
        let words = (0..units)
            .map(|_| AtomicU64::new(UnitState::ABSENT.0))
            .collect();
        let hashes = with_hashes.then(|| (0..units).map(|_| AtomicU64::new(0)).collect());
        let shards = (0..WAIT_SHARDS)
            .map(|_| WaitShard {
                lock: Mutex::new(()),
                cond: Condvar::new(),
            })
            .collect();
        ChunkTable {
            words,
            hashes,
            shards,
            unit_bytes,
        }
    }

    /// Number of units.
    pub fn units(&self) -> usize {
        self.words.len()
    }

    /// Bytes per unit.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// Bytes of per-unit metadata (state words and hashes).
    pub fn metadata_bytes(&self) -> u64 {
        let per_unit = 8 + if self.hashes.is_some() { 8 } else { 0 };
        (self.words.len() * per_unit) as u64
    }

    /// Current state of unit `unit`.
    pub fn load(&self, unit: usize) -> UnitState {
        UnitState(self.words[unit].load(Ordering::Acquire))
    }

    /// Atomically replaces `from` with `to`; on failure returns the current
    /// state. Use for transitions out of a non-in-flight state (several
    /// threads may race; exactly one wins).
    pub fn transition(&self, unit: usize, from: UnitState, to: UnitState) -> Result<(), UnitState> {
        self.words[unit]
            .compare_exchange(from.0, to.0, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(UnitState)
    }

    /// Publishes `to` for a unit this thread owns (in flight), and wakes the
    /// threads waiting for it.
    pub fn finish(&self, unit: usize, to: UnitState) {
        let old = UnitState(self.words[unit].swap(to.with_waiters(false).0, Ordering::AcqRel));
        if old.waiters() {
            let shard = &self.shards[unit % WAIT_SHARDS];
            // Taking the lock orders this notify after any waiter that set
            // WAITERS has started waiting (it set the flag under the lock).
            let _guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
            shard.cond.notify_all();
        }
    }

    /// Blocks while the unit is in flight; returns the first state seen that
    /// is not. Gives up (returning the in-flight state) when `give_up`
    /// returns true, checked every 100 ms.
    pub fn wait_settled(&self, unit: usize, give_up: &dyn Fn() -> bool) -> UnitState {
        self.wait_while(unit, &|s| s.tag().in_flight(), give_up)
    }

    /// Blocks while `busy(state)` holds for an in-flight unit; returns the
    /// first state for which it does not (or the current one when `give_up`
    /// says so, checked every 100 ms).
    pub fn wait_while(
        &self,
        unit: usize,
        busy: &dyn Fn(UnitState) -> bool,
        give_up: &dyn Fn() -> bool,
    ) -> UnitState {
        let shard = &self.shards[unit % WAIT_SHARDS];
        let mut guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let state = self.load(unit);
            if !state.tag().in_flight() || !busy(state) {
                return state;
            }
            if !state.waiters()
                && self
                    .transition(unit, state, state.with_waiters(true))
                    .is_err()
            {
                continue;
            }
            if give_up() {
                return state;
            }
            guard = shard
                .cond
                .wait_timeout(guard, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sets or clears the CLOCK bit of a `Resident` unit unless the unit
    /// changed meanwhile (the bit is advisory; losing a race is harmless).
    /// Other states are left alone so their owners' CAS never fails on it.
    pub fn set_referenced(&self, unit: usize, on: bool) {
        let state = self.load(unit);
        if state.referenced() != on && state.tag() == Tag::Resident {
            let _ = self.transition(unit, state, state.with_referenced(on));
        }
    }

    /// Records the content hash of a unit's stored copy.
    pub fn set_hash(&self, unit: usize, hash: u64) {
        if let Some(hashes) = &self.hashes {
            hashes[unit].store(hash, Ordering::Release);
        }
    }

    /// The recorded content hash, if the table keeps hashes.
    pub fn hash(&self, unit: usize) -> Option<u64> {
        self.hashes
            .as_ref()
            .map(|h| h[unit].load(Ordering::Acquire))
    }

    /// Counts units per tag (for stats and tests); not a snapshot.
    pub fn count_tags(&self) -> [u64; 6] {
        let mut counts = [0u64; 6];
        for unit in 0..self.units() {
            counts[self.load(unit).tag() as usize] += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn state_word_packs_tag_flags_and_index() {
        let s = UnitState::ABSENT
            .to(Tag::Resident, 7)
            .with_huge(true)
            .with_clean(true)
            .with_wp(true);
        assert_eq!(s.tag(), Tag::Resident);
        assert_eq!(s.index(), 7);
        assert!(s.huge() && s.clean() && s.wp() && !s.writing());
        let t = s.with_waiters(true).to(Tag::Stored, u32::MAX);
        assert_eq!(t.tag(), Tag::Stored);
        assert_eq!(t.index(), u32::MAX);
        assert!(!t.waiters(), "publishing drops WAITERS");
        assert!(t.huge() && t.clean());
    }

    #[test]
    fn only_one_thread_wins_a_transition() {
        let table = ChunkTable::new(1, 2 << 20, false);
        let from = table.load(0);
        let to = from.to(Tag::Loading, 0);
        assert!(table.transition(0, from, to).is_ok());
        assert_eq!(table.transition(0, from, to), Err(to));
    }

    #[test]
    fn waiters_wake_when_the_owner_finishes() {
        let table = Arc::new(ChunkTable::new(4, 2 << 20, true));
        let loading = table.load(3).to(Tag::Loading, 0);
        table.transition(3, UnitState::ABSENT, loading).unwrap();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let table = table.clone();
                std::thread::spawn(move || table.wait_settled(3, &|| false))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        table.finish(3, loading.to(Tag::Resident, 0).with_huge(true));
        for w in waiters {
            let s = w.join().unwrap();
            assert_eq!(s.tag(), Tag::Resident);
            assert!(s.huge() && !s.waiters());
        }
        assert_eq!(table.metadata_bytes(), 4 * 16);
    }
}
