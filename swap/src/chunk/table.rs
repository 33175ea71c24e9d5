//! The table of unit states, its wait shards, and the named transitions
//! the engine takes (each checked against [`super::Transition`]'s table).

use std::sync::Arc;
use std::time::Duration;

use super::pages::{PageState, PageTable};
use super::state::{Tag, UnitState};
use super::sync::{AtomicU64, Condvar, Mutex, Ordering};
use super::transition::Transition;
use crate::index::{PageIndex, ParkingSlot, UnitIndex, UnitRange};
use crate::store::SlotId;

/// Which unit a transition acts on. Names a whole unit today; once chunks
/// can be split it will also name one page of a split chunk (see
/// `transition.rs`), without changing the methods that take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitRef {
    unit: UnitIndex,
}

impl UnitRef {
    /// The whole unit `unit`.
    pub fn unit(unit: UnitIndex) -> UnitRef {
        UnitRef { unit }
    }

    /// The unit's index in the table.
    pub fn index(self) -> UnitIndex {
        self.unit
    }
}

impl From<UnitIndex> for UnitRef {
    fn from(unit: UnitIndex) -> UnitRef {
        UnitRef::unit(unit)
    }
}

/// How a fault thread restored a unit ([`ChunkTable::finish_restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Installed as one huge mapping.
    pub huge: bool,
    /// The store slot that still holds an identical copy, if any.
    pub clean_slot: Option<SlotId>,
    /// Write-protected to catch the first write.
    pub write_protected: bool,
    /// Restored by a prefetch, before any fault asked for it.
    pub prefetched: bool,
}

/// Where an evicted unit went ([`ChunkTable::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// All zero: nothing kept.
    Zero,
    /// Clean: its store slot (the `Evicting` state's index) holds it.
    Clean,
    /// Dirty: parked in this parking slot until written.
    Dirty {
        /// The parking slot.
        parking: ParkingSlot,
    },
    /// Discarded (freed by the guest): nothing kept.
    Discarded,
}

/// Panics (in debug builds) on a change the transition table does not
/// allow: an engine bug that would corrupt the state machine.
fn checked(transition: Transition, from: UnitState, to: UnitState) {
    if cfg!(debug_assertions) {
        if let Err(e) = transition.check(from, to) {
            panic!("{e}");
        }
    }
}

/// A condvar shard; units hash onto shards so waiting costs no per-unit
/// memory.
struct WaitShard {
    lock: Mutex<()>,
    cond: Condvar,
}

const WAIT_SHARDS: usize = 64;

/// How many units are in each state (not an atomic snapshot: units move
/// while they are counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TagCounts {
    /// `Absent` units.
    pub absent: u64,
    /// `Resident` units.
    pub resident: u64,
    /// `Staged` units.
    pub staged: u64,
    /// `Stored` units.
    pub stored: u64,
    /// `Loading` units.
    pub loading: u64,
    /// `Evicting` units.
    pub evicting: u64,
    /// `Split` chunks.
    pub split: u64,
}

impl TagCounts {
    /// Units counted.
    pub fn total(&self) -> u64 {
        self.absent
            + self.resident
            + self.staged
            + self.stored
            + self.loading
            + self.evicting
            + self.split
    }
}

/// The table of unit states.
pub struct ChunkTable {
    words: Box<[AtomicU64]>,
    hashes: Option<Box<[AtomicU64]>>,
    shards: Box<[WaitShard]>,
    unit_bytes: u64,
    /// The pages of split chunks (2 MiB units only: a 4 KiB unit is a page).
    pages: Option<Arc<PageTable>>,
}

impl ChunkTable {
    /// A table of `units` units of `unit_bytes`, all `Absent`. With
    /// `with_hashes`, keeps a content hash per unit. Units of 2 MiB can be
    /// split into pages.
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
        let pages = (unit_bytes == (super::PAGES_PER_CHUNK as u64) << 12)
            .then(|| Arc::new(PageTable::new(units)));
        ChunkTable {
            words,
            hashes,
            shards,
            unit_bytes,
            pages,
        }
    }

    /// The pages of split chunks (`None` for 4 KiB units).
    pub fn pages(&self) -> Option<&PageTable> {
        self.pages.as_deref()
    }

    /// A handle on the pages of split chunks, for the components that
    /// split, collapse and evict pages (`None` for 4 KiB units, whose
    /// units never split).
    pub fn page_table(&self) -> Option<Arc<PageTable>> {
        self.pages.clone()
    }

    /// The page table of a table whose chunks are split (only 2 MiB units
    /// split, so a split chunk proves it exists).
    fn split_pages(&self) -> &PageTable {
        self.pages.as_deref().expect("only 2 MiB chunks split")
    }

    /// Number of units.
    pub fn units(&self) -> usize {
        self.words.len()
    }

    /// Bytes per unit.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// Bytes of per-unit metadata (state words, hashes, page states).
    pub fn metadata_bytes(&self) -> u64 {
        let per_unit = 8 + if self.hashes.is_some() { 8 } else { 0 };
        (self.words.len() * per_unit) as u64 + self.pages.as_ref().map_or(0, |p| p.metadata_bytes())
    }

    /// Current state of unit `unit`.
    pub fn load(&self, unit: UnitIndex) -> UnitState {
        UnitState(self.words[unit.get()].load(Ordering::Acquire))
    }

    /// Atomically replaces `from` with `to`; on failure returns the current
    /// state. For transitions out of a non-in-flight state (several
    /// threads may race; exactly one wins).
    fn cas(&self, unit: UnitIndex, from: UnitState, to: UnitState) -> Result<(), UnitState> {
        self.words[unit.get()]
            .compare_exchange(from.0, to.0, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(UnitState)
    }

    /// Takes `transition` by compare-and-swap from `from` to `to`.
    fn take(
        &self,
        at: UnitRef,
        transition: Transition,
        from: UnitState,
        to: UnitState,
    ) -> Result<(), UnitState> {
        checked(transition, from, to);
        self.cas(at.index(), from, to)
    }

    /// Publishes `to` for a unit this thread owns (in flight since it took
    /// it to `owned`), checked as `transition`, and wakes its waiters.
    fn publish(&self, at: UnitRef, transition: Transition, owned: UnitState, to: UnitState) {
        checked(transition, owned, to);
        self.swap_and_wake(at.index(), to);
    }

    /// A fault takes the unit in `from` (not in flight) into `Loading`,
    /// keeping its index (the store slot of a `Stored` unit, the parking
    /// slot of a `Staged` one): [`Transition::for_fault`] names which
    /// transition. Returns the `Loading` state, or the current one if
    /// another thread changed it first.
    pub fn begin_fault(&self, at: UnitRef, from: UnitState) -> Result<UnitState, UnitState> {
        let transition = Transition::for_fault(from).expect("a fault waits on in-flight units");
        let loading = from.to(Tag::Loading, from.index());
        self.take(at, transition, from, loading).map(|()| loading)
    }

    /// The owning fault thread publishes the restored unit.
    pub fn finish_restore(&self, at: UnitRef, loading: UnitState, how: Restored) -> UnitState {
        let resident = loading
            .to(Tag::Resident, how.clean_slot.map_or(0, SlotId::get))
            .with_huge(how.huge)
            .with_clean(how.clean_slot.is_some())
            .with_wp(how.write_protected)
            .with_writing(false)
            .with_prefetched(how.prefetched)
            .with_referenced(!how.prefetched);
        self.publish(at, Transition::FinishRestore, loading, resident);
        resident
    }

    /// The owning fault thread ends a fault on a resident unit: `resident`
    /// as it was before, `first_write` when the fault unprotected it (its
    /// store copy, if any, is stale now: the caller freed the slot).
    pub fn end_resident_fault(
        &self,
        at: UnitRef,
        loading: UnitState,
        resident: UnitState,
        first_write: bool,
    ) {
        // A fault on a prefetched unit is the prefetch's hit: no longer
        // marked.
        let next = if first_write {
            resident
                .to(Tag::Resident, 0)
                .with_clean(false)
                .with_wp(false)
                .with_referenced(true)
        } else {
            resident
        }
        .with_prefetched(false);
        self.publish(
            at,
            Transition::EndResidentFault,
            loading,
            next.with_waiters(false),
        );
    }

    /// An evictor (or discard) takes a resident, unpinned unit; returns the
    /// `Evicting` state (CLOCK bit cleared), or the current state if it
    /// changed first.
    pub fn begin_evict(&self, at: UnitRef, resident: UnitState) -> Result<UnitState, UnitState> {
        self.begin_evict_at(at, resident, resident.evict_epoch())
    }

    /// [`ChunkTable::begin_evict`], stamping eviction epoch `epoch` (the
    /// engine's eviction count) on the unit.
    pub fn begin_evict_at(
        &self,
        at: UnitRef,
        resident: UnitState,
        epoch: u16,
    ) -> Result<UnitState, UnitState> {
        let evicting = resident
            .to(Tag::Evicting, resident.index())
            .with_referenced(false)
            .with_prefetched(false)
            .with_chances(0)
            .with_evict_epoch(epoch);
        self.take(at, Transition::BeginEvict, resident, evicting)
            .map(|()| evicting)
    }

    /// The owner of an `Evicting` unit puts it back as it was (`resident`).
    pub fn abort_evict(&self, at: UnitRef, evicting: UnitState, resident: UnitState) {
        self.publish(at, Transition::AbortEvict, evicting, resident);
    }

    /// The owner of an `Evicting` unit publishes where it went; returns the
    /// new state.
    pub fn settle(&self, at: UnitRef, evicting: UnitState, how: Settled) -> UnitState {
        let outside = |tag: Tag, index: u32| {
            evicting
                .to(tag, index)
                .with_clean(false)
                .with_wp(false)
                .with_huge(false)
                .with_referenced(false)
                .with_writing(false)
        };
        let (transition, next) = match how {
            Settled::Zero => (Transition::SettleZero, outside(Tag::Absent, 0)),
            Settled::Discarded => (Transition::SettleDiscarded, outside(Tag::Absent, 0)),
            Settled::Clean => (
                Transition::SettleClean,
                outside(Tag::Stored, evicting.index()),
            ),
            Settled::Dirty { parking } => (
                Transition::SettleDirty,
                outside(Tag::Staged, parking.get()).with_huge(evicting.huge()),
            ),
        };
        self.publish(at, transition, evicting, next);
        next
    }

    /// An evictor claims a staged unit for writing (sets `WRITING`).
    pub fn begin_write(&self, at: UnitRef, staged: UnitState) -> Result<(), UnitState> {
        self.take(
            at,
            Transition::BeginWrite,
            staged,
            staged.with_writing(true),
        )
    }

    /// The writer settles a written unit in store slot `slot`.
    pub fn finish_write(
        &self,
        at: UnitRef,
        writing: UnitState,
        slot: SlotId,
    ) -> Result<(), UnitState> {
        let stored = writing
            .to(Tag::Stored, slot.get())
            .with_clean(false)
            .with_wp(false)
            .with_huge(false)
            .with_referenced(false)
            .with_writing(false);
        self.take(at, Transition::FinishWrite, writing, stored)
    }

    /// The writer keeps a unit whose write failed staged (its content
    /// stays parked; the failure ends the VM).
    pub fn fail_write(&self, at: UnitRef, writing: UnitState) -> Result<(), UnitState> {
        self.take(
            at,
            Transition::FailWrite,
            writing,
            writing.with_writing(false),
        )
    }

    /// Discard of a stored unit: it becomes absent (the caller frees the
    /// slot once this succeeded).
    pub fn discard_stored(&self, at: UnitRef, stored: UnitState) -> Result<(), UnitState> {
        let absent = stored
            .to(Tag::Absent, 0)
            .with_clean(false)
            .with_wp(false)
            .with_huge(false)
            .with_referenced(false)
            .with_writing(false);
        self.take(at, Transition::DiscardStored, stored, absent)
    }

    /// Pins a unit (never evicted from now on).
    pub fn pin(&self, at: UnitRef) -> Result<(), UnitState> {
        let state = self.load(at.index());
        self.take(at, Transition::Pin, state, state.with_pinned(true))
    }

    /// The owner of a `Loading` chunk splits it: every page gets its first
    /// state from `state_of`, then the chunk word says `Split` (pages in
    /// `slot`, if the chunk has one).
    pub fn finish_split(
        &self,
        at: UnitRef,
        loading: UnitState,
        slot: Option<SlotId>,
        state_of: &dyn Fn(PageIndex) -> PageState,
    ) -> UnitState {
        self.split_pages().unlock_all(at.index(), state_of);
        let split = loading
            .to(Tag::Split, slot.map_or(0, SlotId::get))
            .with_clean(slot.is_some())
            .with_huge(false)
            .with_wp(false)
            .with_writing(false)
            .with_referenced(true);
        self.publish(at, Transition::FinishSplit, loading, split);
        split
    }

    /// Gives a split chunk without a store slot the slot its pages are
    /// written into; fails with the current word if it changed (another
    /// writer gave it one first: the caller frees its own).
    pub fn assign_split_slot(
        &self,
        at: UnitRef,
        split: UnitState,
        slot: SlotId,
    ) -> Result<UnitState, UnitState> {
        let with_slot = split.to(Tag::Split, slot.get()).with_clean(true);
        self.take(at, Transition::AssignSplitSlot, split, with_slot)
            .map(|()| with_slot)
    }

    /// Takes a split chunk to merge it back (collapse or discard); the
    /// caller then locks its pages. Returns the `Loading` word (keeping the
    /// slot), or the current word if it changed first.
    pub fn begin_merge(&self, at: UnitRef, split: UnitState) -> Result<UnitState, UnitState> {
        let loading = split.to(Tag::Loading, split.index()).with_merging(true);
        self.take(at, Transition::BeginMerge, split, loading)
            .map(|()| loading)
    }

    /// The merging thread gives up: the chunk is split again (its pages
    /// unlocked by the caller first).
    pub fn abort_merge(&self, at: UnitRef, loading: UnitState) -> UnitState {
        let split = loading.to(Tag::Split, loading.index()).with_merging(false);
        self.publish(at, Transition::AbortMerge, loading, split);
        split
    }

    /// The merging thread installed the chunk as one unit again (`huge`:
    /// PAGEMAP_SCAN saw one huge mapping). Its store slot, if any, was
    /// freed by the caller: the content is in memory only.
    pub fn finish_collapse(&self, at: UnitRef, loading: UnitState, huge: bool) -> UnitState {
        let resident = loading
            .to(Tag::Resident, 0)
            .with_merging(false)
            .with_clean(false)
            .with_wp(false)
            .with_huge(huge)
            .with_collapsed(true)
            .with_referenced(true);
        self.publish(at, Transition::FinishCollapse, loading, resident);
        resident
    }

    /// The merging thread found every page absent: the chunk is absent
    /// again (the caller freed its slot).
    pub fn finish_merge_absent(&self, at: UnitRef, loading: UnitState) {
        let absent = loading
            .to(Tag::Absent, 0)
            .with_merging(false)
            .with_clean(false)
            .with_wp(false)
            .with_huge(false)
            .with_referenced(false);
        self.publish(at, Transition::FinishMergeAbsent, loading, absent);
    }

    /// Swaps in `to` and wakes the unit's waiters.
    fn swap_and_wake(&self, unit: UnitIndex, to: UnitState) {
        let old =
            UnitState(self.words[unit.get()].swap(to.with_waiters(false).0, Ordering::AcqRel));
        if old.waiters() {
            let shard = &self.shards[unit.get() % WAIT_SHARDS];
            // Taking the lock orders this notify after any waiter that set
            // WAITERS has started waiting (it set the flag under the lock).
            let _guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
            shard.cond.notify_all();
        }
    }

    /// Blocks while the unit is in flight; returns the first state seen that
    /// is not. Gives up (returning the in-flight state) when `give_up`
    /// returns true, checked every 100 ms.
    pub fn wait_settled(&self, unit: UnitIndex, give_up: &dyn Fn() -> bool) -> UnitState {
        self.wait_while(unit, &|s| s.tag().in_flight(), give_up)
    }

    /// Blocks while `busy(state)` holds for an in-flight unit; returns the
    /// first state for which it does not (or the current one when `give_up`
    /// says so, checked every 100 ms).
    pub fn wait_while(
        &self,
        unit: UnitIndex,
        busy: &dyn Fn(UnitState) -> bool,
        give_up: &dyn Fn() -> bool,
    ) -> UnitState {
        let shard = &self.shards[unit.get() % WAIT_SHARDS];
        let mut guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let state = self.load(unit);
            if !state.tag().in_flight() || !busy(state) {
                return state;
            }
            if !state.waiters()
                && self
                    .take(
                        UnitRef::unit(unit),
                        Transition::AddWaiter,
                        state,
                        state.with_waiters(true),
                    )
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
    pub fn set_referenced(&self, unit: UnitIndex, on: bool) {
        let state = self.load(unit);
        if state.referenced() != on && state.tag() == Tag::Resident {
            let _ = self.take(
                UnitRef::unit(unit),
                Transition::Reference,
                state,
                state.with_referenced(on),
            );
        }
    }

    /// One pass of the CLOCK hand over an unreferenced `Resident` unit:
    /// true if it had a chance left (now one fewer) and stays. Advisory,
    /// as [`ChunkTable::set_referenced`]: a lost race keeps the chance.
    pub fn spend_chance(&self, unit: UnitIndex) -> bool {
        let state = self.load(unit);
        if state.tag() != Tag::Resident || state.chances() == 0 {
            return false;
        }
        let _ = self.take(
            UnitRef::unit(unit),
            Transition::Reference,
            state,
            state.with_chances(state.chances() - 1),
        );
        true
    }

    /// Records the content hash of a unit's stored copy.
    pub fn set_hash(&self, unit: UnitIndex, hash: u64) {
        if let Some(hashes) = &self.hashes {
            hashes[unit.get()].store(hash, Ordering::Release);
        }
    }

    /// The recorded content hash, if the table keeps hashes.
    pub fn hash(&self, unit: UnitIndex) -> Option<u64> {
        self.hashes
            .as_ref()
            .map(|h| h[unit.get()].load(Ordering::Acquire))
    }

    /// Counts resident units mapped huge (for stats); not a snapshot.
    pub fn count_huge_resident(&self) -> u64 {
        UnitRange::all(self.units())
            .filter(|&u| {
                let s = self.load(u);
                s.tag() == Tag::Resident && s.huge()
            })
            .count() as u64
    }

    /// Counts units per tag (for stats and tests); not a snapshot.
    pub fn count_tags(&self) -> TagCounts {
        let mut counts = TagCounts::default();
        for unit in UnitRange::all(self.units()) {
            let count = match self.load(unit).tag() {
                Tag::Absent => &mut counts.absent,
                Tag::Resident => &mut counts.resident,
                Tag::Staged => &mut counts.staged,
                Tag::Stored => &mut counts.stored,
                Tag::Loading => &mut counts.loading,
                Tag::Evicting => &mut counts.evicting,
                Tag::Split => &mut counts.split,
            };
            *count += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::PageTag;
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
    fn only_a_split_word_or_a_merges_loading_word_names_the_pages_slot() {
        let table = ChunkTable::new(1, 2 << 20, true);
        let chunk = UnitIndex::new(0);
        let loading = table.begin_fault(chunk.into(), UnitState::ABSENT).unwrap();
        let restored = Restored {
            huge: true,
            clean_slot: Some(SlotId::new(5)),
            write_protected: true,
            prefetched: false,
        };
        let resident = table.finish_restore(chunk.into(), loading, restored);
        // A fault on the clean resident chunk: its Loading word is CLEAN
        // with the whole chunk's copy, which is no slot of pages.
        let loading = table.begin_fault(chunk.into(), resident).unwrap();
        assert!(loading.clean() && !loading.merging());
        assert_eq!(loading.split_slot(), None, "{loading:?}");
        let split = table.finish_split(chunk.into(), loading, Some(SlotId::new(7)), &|_| {
            PageState::new(PageTag::Stored)
        });
        assert_eq!(split.split_slot(), Some(SlotId::new(7)));
        let merging = table.begin_merge(chunk.into(), split).unwrap();
        assert!(merging.merging());
        assert_eq!(merging.split_slot(), Some(SlotId::new(7)), "{merging:?}");
        let split = table.abort_merge(chunk.into(), merging);
        assert!(!split.merging(), "ending the merge clears MERGING");
        assert_eq!(split.split_slot(), Some(SlotId::new(7)));
    }

    #[test]
    fn only_one_thread_wins_a_transition() {
        let table = ChunkTable::new(1, 2 << 20, false);
        let from = table.load(UnitIndex::new(0));
        let loading = table.begin_fault(UnitIndex::new(0).into(), from).unwrap();
        assert_eq!(loading.tag(), Tag::Loading);
        assert_eq!(
            table.begin_fault(UnitIndex::new(0).into(), from),
            Err(loading)
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "illegal chunk state transition BeginEvict")]
    fn an_illegal_transition_is_caught() {
        let table = ChunkTable::new(1, 2 << 20, false);
        // Absent units are not evicted: an engine bug.
        let _ = table.begin_evict(UnitIndex::new(0).into(), table.load(UnitIndex::new(0)));
    }

    #[test]
    fn waiters_wake_when_the_owner_finishes() {
        let table = Arc::new(ChunkTable::new(4, 2 << 20, true));
        let loading = table
            .begin_fault(UnitIndex::new(3).into(), UnitState::ABSENT)
            .unwrap();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let table = table.clone();
                std::thread::spawn(move || table.wait_settled(UnitIndex::new(3), &|| false))
            })
            .collect();
        // At least one waiter sleeps on the unit before the owner
        // finishes (the others may come after, and see it settled).
        while !table.load(UnitIndex::new(3)).waiters() {
            std::thread::yield_now();
        }
        let restored = Restored {
            huge: true,
            clean_slot: None,
            write_protected: false,
            prefetched: false,
        };
        table.finish_restore(UnitIndex::new(3).into(), loading, restored);
        for w in waiters {
            let s = w.join().unwrap();
            assert_eq!(s.tag(), Tag::Resident);
            assert!(s.huge() && !s.waiters());
        }
        // State word and hash per chunk, and the (empty) page directory.
        let directory = table.pages().unwrap().metadata_bytes();
        assert_eq!(directory, 8, "one group pointer for 4 chunks");
        assert_eq!(table.metadata_bytes(), 4 * 16 + directory);
    }
}
