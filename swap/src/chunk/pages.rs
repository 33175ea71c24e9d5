//! The pages of split chunks: 512 page states of 4 bits per chunk, their
//! named transitions, and waiting for a page in flight.
//!
//! A split chunk's word (in [`super::ChunkTable`]) says `Split`; what each
//! of its pages holds is here. A page is `Absent` (reads as zero),
//! `Resident` (mapped 4 KiB in the guest, or still part of the chunk's huge
//! mapping until its first move splits the PMD), `Stored` (its content
//! lives in the chunk's store slot at the page's offset), or in flight:
//! `Loading` (one fault thread restores it) or `Evicting` (one evictor
//! moved it out and is writing it; a fault on it waits for the write, so a
//! page needs no parking index of its own). `Locked` is the value of every
//! page of a chunk that is not split, or whose owner is merging it back
//! (collapse, discard): no page transition starts from it, so a thread
//! that saw the chunk split a moment ago can never act on a page the chunk
//! owner has taken.
//!
//! # Size
//!
//! 4 bits per page (3 of state, 1 CLOCK bit): 256 B per split chunk, in
//! groups of 16 chunks (one 4 KiB allocation) made when the group's first
//! chunk splits and kept (reused by the group's chunks) until the engine
//! stops. Beside them, the access signal's metadata (`engine::access`),
//! advisory and outside the protocol: per page a 32-bit eviction stamp
//! and its CLOCK chances (5 B), per chunk the page hand (2 B); 40 KiB more
//! per group, 2.5 KiB per split chunk (0.12 % of its 2 MiB). The group
//! directory costs 8 B per 16 chunks of the guest (0.5 B per chunk),
//! allocated or not.

use std::sync::atomic::AtomicPtr;
use std::time::Duration;

use super::sync::{AtomicU32, AtomicU64, Condvar, Mutex, Ordering};
use crate::index::{PageIndex, UnitIndex};
pub use crate::index::{PageRef, PAGES_PER_CHUNK};

const PAGES_PER_WORD: usize = 16;
const WORDS_PER_CHUNK: usize = PAGES_PER_CHUNK / PAGES_PER_WORD;
const GROUP_CHUNKS: usize = 16;
const NIBBLE_MASK: u64 = 0xf;
const TAG_BITS: u8 = 0x7;
const REFERENCED: u8 = 0x8;

/// A page's lifecycle state (the tag of [`PageState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageTag {
    /// Never written or known zero.
    Absent = 0,
    /// Mapped in the guest.
    Resident = 1,
    /// Content only in the chunk's store slot, at the page's offset.
    Stored = 2,
    /// Being restored by one fault thread.
    Loading = 3,
    /// Being taken away and written by one evictor.
    Evicting = 4,
    /// Owned by the chunk (not split, or being merged back).
    Locked = 7,
}

impl PageTag {
    fn from_bits(bits: u8) -> PageTag {
        match bits & TAG_BITS {
            0 => PageTag::Absent,
            1 => PageTag::Resident,
            2 => PageTag::Stored,
            3 => PageTag::Loading,
            4 => PageTag::Evicting,
            _ => PageTag::Locked,
        }
    }

    /// Owned by one thread; faults wait on them.
    pub fn in_flight(self) -> bool {
        matches!(self, PageTag::Loading | PageTag::Evicting)
    }

    /// Holds a page of guest memory on the host (counts against the limit).
    pub fn holds_memory(self) -> bool {
        matches!(
            self,
            PageTag::Resident | PageTag::Loading | PageTag::Evicting
        )
    }
}

/// One page's state: a tag and the CLOCK bit, in 4 bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PageState(u8);

impl std::fmt::Debug for PageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.tag())?;
        if self.referenced() {
            write!(f, "+ref")?;
        }
        Ok(())
    }
}

impl PageState {
    /// The state of every page of a chunk that is not split.
    pub const LOCKED: PageState = PageState(PageTag::Locked as u8);

    /// A state with tag `tag`, CLOCK bit clear.
    pub fn new(tag: PageTag) -> PageState {
        PageState(tag as u8)
    }

    /// The tag.
    pub fn tag(self) -> PageTag {
        PageTag::from_bits(self.0)
    }

    /// Accessed since the CLOCK hand last passed.
    pub fn referenced(self) -> bool {
        self.0 & REFERENCED != 0
    }

    /// This state with the CLOCK bit set to `on`.
    pub fn with_referenced(self, on: bool) -> PageState {
        PageState(if on {
            self.0 | REFERENCED
        } else {
            self.0 & !REFERENCED
        })
    }

    /// Same CLOCK bit, new tag.
    pub fn to(self, tag: PageTag) -> PageState {
        PageState((self.0 & REFERENCED) | tag as u8)
    }
}

/// One named change of a page's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageTransition {
    /// Absent → Loading: a fault thread zero-fills the page.
    BeginZeroFill,
    /// Stored → Loading: a fault thread reads the page from the store.
    BeginRead,
    /// Loading → Resident: the owning fault thread installed the page.
    FinishRestore,
    /// Resident → Evicting: an evictor (or discard) takes the page.
    BeginEvict,
    /// Evicting → Resident: the move out did not happen (pinned).
    AbortEvict,
    /// Evicting → Absent: all zero, or discarded.
    SettleZero,
    /// Evicting → Stored: written to the chunk's slot.
    SettleWritten,
    /// Stored → Absent: discarded (the guest freed it).
    DiscardStored,
    /// Resident → Resident with the CLOCK bit changed.
    Reference,
    /// Resident → Loading: a fault thread takes a resident page to resolve
    /// a message for it (a duplicate, a write-protect fault, a hole), so
    /// that no evictor moves it out meanwhile.
    BeginResidentFault,
    /// Loading → Resident: that fault thread is done with the page.
    EndResidentFault,
    /// Absent/Resident/Stored → Locked: the chunk owner takes the page to
    /// merge the chunk back.
    Lock,
    /// Locked → Absent/Resident/Stored: the chunk owner hands the page to
    /// the split chunk (at a split, or when a merge is given up).
    Unlock,
}

impl PageTransition {
    /// Every page transition, for the tests that walk the table.
    pub const ALL: [PageTransition; 13] = [
        PageTransition::BeginZeroFill,
        PageTransition::BeginRead,
        PageTransition::FinishRestore,
        PageTransition::BeginEvict,
        PageTransition::AbortEvict,
        PageTransition::SettleZero,
        PageTransition::SettleWritten,
        PageTransition::DiscardStored,
        PageTransition::Reference,
        PageTransition::BeginResidentFault,
        PageTransition::EndResidentFault,
        PageTransition::Lock,
        PageTransition::Unlock,
    ];

    /// (from tags, to tag; `None`: unchanged).
    fn rule(self) -> (&'static [PageTag], Option<PageTag>) {
        use PageTag::*;
        match self {
            PageTransition::BeginZeroFill => (&[Absent], Some(Loading)),
            PageTransition::BeginRead => (&[Stored], Some(Loading)),
            PageTransition::FinishRestore => (&[Loading], Some(Resident)),
            PageTransition::BeginEvict => (&[Resident], Some(Evicting)),
            PageTransition::AbortEvict => (&[Evicting], Some(Resident)),
            PageTransition::SettleZero => (&[Evicting], Some(Absent)),
            PageTransition::SettleWritten => (&[Evicting], Some(Stored)),
            PageTransition::DiscardStored => (&[Stored], Some(Absent)),
            PageTransition::Reference => (&[Resident], None),
            PageTransition::BeginResidentFault => (&[Resident], Some(Loading)),
            PageTransition::EndResidentFault => (&[Loading], Some(Resident)),
            PageTransition::Lock => (&[Absent, Resident, Stored], Some(Locked)),
            PageTransition::Unlock => (&[Locked], None),
        }
    }

    /// Whether `from -> to` is this transition.
    pub fn allows(self, from: PageState, to: PageState) -> bool {
        let (froms, to_tag) = self.rule();
        let to_ok = match (self, to_tag) {
            (PageTransition::Unlock, _) => {
                matches!(
                    to.tag(),
                    PageTag::Absent | PageTag::Resident | PageTag::Stored
                )
            }
            (_, Some(tag)) => to.tag() == tag,
            (_, None) => to.tag() == from.tag(),
        };
        froms.contains(&from.tag()) && to_ok
    }

    /// The transition a fault takes from a settled page, or `None` when the
    /// fault must wait (in flight, or locked by the chunk owner) or has
    /// nothing to restore (resident).
    pub fn for_fault(from: PageState) -> Option<PageTransition> {
        match from.tag() {
            PageTag::Absent => Some(PageTransition::BeginZeroFill),
            PageTag::Stored => Some(PageTransition::BeginRead),
            _ => None,
        }
    }
}

/// A change of page state that the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal page state transition {transition:?} on page {page} of chunk {chunk}: {from:?} -> {to:?}")]
pub struct IllegalPageTransition {
    /// The transition named.
    pub transition: PageTransition,
    /// The chunk.
    pub chunk: UnitIndex,
    /// The page.
    pub page: PageIndex,
    /// The state it was taken from.
    pub from: PageState,
    /// The state it led to.
    pub to: PageState,
}

fn checked(transition: PageTransition, at: PageRef, from: PageState, to: PageState) {
    if cfg!(debug_assertions) && !transition.allows(from, to) {
        panic!(
            "{}",
            IllegalPageTransition {
                transition,
                chunk: at.chunk,
                page: at.page,
                from,
                to,
            }
        );
    }
}

/// The page states of 16 chunks (one 4 KiB allocation), and their access
/// metadata.
struct Group {
    words: [AtomicU64; GROUP_CHUNKS * WORDS_PER_CHUNK],
    access: Box<GroupAccess>,
}

/// The access signal's metadata of a group's pages: plain atomics, not the
/// model checker's, as nothing is ordered by them (a lost update costs a
/// page one CLOCK pass, never content).
struct GroupAccess {
    /// Per page: the page-eviction count when it was last evicted, plus
    /// one (0: not evicted since its chunk split).
    stamps: [std::sync::atomic::AtomicU32; GROUP_CHUNKS * PAGES_PER_CHUNK],
    /// Per page: CLOCK passes left before it may be picked unreferenced.
    chances: [std::sync::atomic::AtomicU8; GROUP_CHUNKS * PAGES_PER_CHUNK],
    /// Per chunk: the page the CLOCK hand looks at next.
    hands: [std::sync::atomic::AtomicU16; GROUP_CHUNKS],
}

/// Every nibble `Locked`.
const ALL_LOCKED: u64 = 0x7777_7777_7777_7777;

impl Group {
    fn new() -> Group {
        Group {
            words: std::array::from_fn(|_| AtomicU64::new(ALL_LOCKED)),
            access: GroupAccess::new(),
        }
    }
}

impl GroupAccess {
    /// All zero, built on the heap (40 KiB would be a large stack frame
    /// on the fault threads).
    fn new() -> Box<GroupAccess> {
        // SAFETY: the atomics of GroupAccess are integers with no invalid
        // bit pattern, so all zero bytes are a valid value; the layout is
        // GroupAccess's own and non-zero-sized.
        unsafe {
            let layout = std::alloc::Layout::new::<GroupAccess>();
            let raw = std::alloc::alloc_zeroed(layout).cast::<GroupAccess>();
            if raw.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(raw)
        }
    }
}

struct WaitShard {
    lock: Mutex<()>,
    cond: Condvar,
    /// Threads waiting on this shard: publishers skip the lock and the
    /// notify when nobody waits.
    waiting: AtomicU32,
}

const WAIT_SHARDS: usize = 64;

/// The page states of every split chunk.
///
/// The directory holds one pointer per group (null until the group's
/// first chunk splits) rather than a `OnceLock<Box<..>>`, which would take
/// twice the memory per group for every chunk of the guest.
pub struct PageTable {
    groups: Box<[AtomicPtr<Group>]>,
    groups_allocated: AtomicU64,
    shards: Box<[WaitShard]>,
}

impl PageTable {
    /// A directory for `chunks` chunks, no group allocated yet.
    pub fn new(chunks: usize) -> PageTable {
        PageTable {
            groups: (0..chunks.div_ceil(GROUP_CHUNKS))
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            groups_allocated: AtomicU64::new(0),
            shards: (0..WAIT_SHARDS)
                .map(|_| WaitShard {
                    lock: Mutex::new(()),
                    cond: Condvar::new(),
                    waiting: AtomicU32::new(0),
                })
                .collect(),
        }
    }

    /// Bytes of page metadata: the directory and the allocated groups.
    pub fn metadata_bytes(&self) -> u64 {
        let directory = (self.groups.len() * std::mem::size_of::<AtomicPtr<Group>>()) as u64;
        let per_group =
            (GROUP_CHUNKS * WORDS_PER_CHUNK * 8 + std::mem::size_of::<GroupAccess>()) as u64;
        directory + self.groups_allocated.load(Ordering::Relaxed) * per_group
    }

    /// The group of `chunk`, if allocated.
    fn group(&self, chunk: UnitIndex) -> Option<&Group> {
        let group =
            self.groups[chunk.get() / GROUP_CHUNKS].load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::into_raw` in
        // `group_or_new` and is freed only in `drop`, which `&self` rules
        // out; groups are never replaced.
        (!group.is_null()).then(|| unsafe { &*group })
    }

    /// The group of `chunk`, allocated on first use.
    fn group_or_new(&self, chunk: UnitIndex) -> &Group {
        if let Some(group) = self.group(chunk) {
            return group;
        }
        let fresh = Box::into_raw(Box::new(Group::new()));
        let slot = &self.groups[chunk.get() / GROUP_CHUNKS];
        match slot.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        ) {
            Ok(_) => {
                self.groups_allocated.fetch_add(1, Ordering::Relaxed);
                // SAFETY: `fresh` is the live allocation just published; it
                // is freed only in `drop`.
                unsafe { &*fresh }
            }
            Err(existing) => {
                // SAFETY: `fresh` was never published: this thread owns it.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as in `group`: published by the winner, freed
                // only in `drop`.
                unsafe { &*existing }
            }
        }
    }

    /// The word holding `at`'s nibble and the nibble's shift; allocates the
    /// chunk's group on first use.
    fn word(&self, at: PageRef) -> (&AtomicU64, u32) {
        let group = self.group_or_new(at.chunk);
        let index =
            (at.chunk.get() % GROUP_CHUNKS) * WORDS_PER_CHUNK + at.page.get() / PAGES_PER_WORD;
        (
            &group.words[index],
            ((at.page.get() % PAGES_PER_WORD) * 4) as u32,
        )
    }

    /// The page's state (`Locked` for a chunk that never split).
    pub fn load(&self, at: PageRef) -> PageState {
        let Some(group) = self.group(at.chunk) else {
            return PageState::LOCKED;
        };
        let index =
            (at.chunk.get() % GROUP_CHUNKS) * WORDS_PER_CHUNK + at.page.get() / PAGES_PER_WORD;
        let shift = ((at.page.get() % PAGES_PER_WORD) * 4) as u32;
        PageState(((group.words[index].load(Ordering::SeqCst) >> shift) & NIBBLE_MASK) as u8)
    }

    /// Replaces `from` with `to` in the page's nibble; fails with the
    /// current state if it is not `from` (other pages of the word may
    /// change meanwhile: the loop only retries for them).
    fn cas(&self, at: PageRef, from: PageState, to: PageState) -> Result<(), PageState> {
        let (word, shift) = self.word(at);
        let mut current = word.load(Ordering::SeqCst);
        loop {
            let now = PageState(((current >> shift) & NIBBLE_MASK) as u8);
            if now != from {
                return Err(now);
            }
            let next = (current & !(NIBBLE_MASK << shift)) | (u64::from(to.0) << shift);
            match word.compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    /// Takes `transition` from `from` to `to` by compare-and-swap (checked
    /// against the table in debug builds); wakes the page's waiters when it
    /// leaves an in-flight state.
    pub fn take(
        &self,
        at: PageRef,
        transition: PageTransition,
        from: PageState,
        to: PageState,
    ) -> Result<(), PageState> {
        checked(transition, at, from, to);
        self.cas(at, from, to)?;
        if from.tag().in_flight() && !to.tag().in_flight() {
            self.wake(at);
        }
        Ok(())
    }

    /// A fault takes a settled page (`Absent` or `Stored`) into `Loading`.
    pub fn begin_fault(&self, at: PageRef, from: PageState) -> Result<PageState, PageState> {
        let transition = PageTransition::for_fault(from).expect("only absent or stored pages");
        let loading = from.to(PageTag::Loading);
        self.take(at, transition, from, loading).map(|()| loading)
    }

    /// The owning fault thread publishes the restored page (referenced).
    pub fn finish_restore(&self, at: PageRef, loading: PageState) {
        let resident = loading.to(PageTag::Resident).with_referenced(true);
        self.take(at, PageTransition::FinishRestore, loading, resident)
            .expect("only the owner changes a loading page");
    }

    /// A fault thread takes a resident page (see
    /// [`PageTransition::BeginResidentFault`]); returns the `Loading` state.
    pub fn begin_resident_fault(
        &self,
        at: PageRef,
        resident: PageState,
    ) -> Result<PageState, PageState> {
        let loading = resident.to(PageTag::Loading);
        self.take(at, PageTransition::BeginResidentFault, resident, loading)
            .map(|()| loading)
    }

    /// The fault thread that took a resident page gives it back, referenced
    /// (it was just accessed).
    pub fn end_resident_fault(&self, at: PageRef, loading: PageState) {
        let resident = loading.to(PageTag::Resident).with_referenced(true);
        self.take(at, PageTransition::EndResidentFault, loading, resident)
            .expect("only the owner changes a loading page");
    }

    /// An evictor takes a resident page; returns the `Evicting` state.
    pub fn begin_evict(&self, at: PageRef, resident: PageState) -> Result<PageState, PageState> {
        let evicting = resident.to(PageTag::Evicting).with_referenced(false);
        self.take(at, PageTransition::BeginEvict, resident, evicting)
            .map(|()| evicting)
    }

    /// The owner of an evicting page publishes where it went.
    pub fn settle(&self, at: PageRef, evicting: PageState, transition: PageTransition) {
        let to = match transition {
            PageTransition::AbortEvict => evicting.to(PageTag::Resident),
            PageTransition::SettleZero => evicting.to(PageTag::Absent),
            PageTransition::SettleWritten => evicting.to(PageTag::Stored),
            other => panic!("{other:?} does not settle an evicting page"),
        };
        self.take(at, transition, evicting, to)
            .expect("only the owner changes an evicting page");
    }

    /// Sets or clears a resident page's CLOCK bit unless it changed
    /// meanwhile (advisory, like the chunk's).
    pub fn set_referenced(&self, at: PageRef, on: bool) {
        let state = self.load(at);
        if state.tag() == PageTag::Resident && state.referenced() != on {
            let _ = self.take(
                at,
                PageTransition::Reference,
                state,
                state.with_referenced(on),
            );
        }
    }

    /// The access metadata of `at`'s page, and its index there.
    fn access(&self, at: PageRef) -> Option<(&GroupAccess, usize)> {
        let group = self.group(at.chunk)?;
        Some((
            &group.access,
            (at.chunk.get() % GROUP_CHUNKS) * PAGES_PER_CHUNK + at.page.get(),
        ))
    }

    /// Stamps a page its evictor holds `Evicting` with the page-eviction
    /// count `evictions` (see `engine::access`).
    pub fn stamp_eviction(&self, at: PageRef, evictions: u64) {
        if let Some((access, i)) = self.access(at) {
            // 0 means "never": a count whose low bits wrap to it skips to 1.
            let stamp = (evictions as u32).wrapping_add(1).max(1);
            access.stamps[i].store(stamp, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Page evictions since `at` was evicted, at a count of `evictions`
    /// now (modulo 2^32), or `None` if it was not evicted since its chunk
    /// split.
    pub fn evictions_since(&self, at: PageRef, evictions: u64) -> Option<u64> {
        let (access, i) = self.access(at)?;
        let stamp = access.stamps[i].load(std::sync::atomic::Ordering::Relaxed);
        let now = (evictions as u32).wrapping_add(1).max(1);
        (stamp != 0).then(|| u64::from(now.wrapping_sub(stamp)))
    }

    /// Gives a page `chances` CLOCK passes before it may be picked
    /// unreferenced.
    pub fn set_chances(&self, at: PageRef, chances: u8) {
        if let Some((access, i)) = self.access(at) {
            access.chances[i].store(chances, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// One pass of the CLOCK hand over an unreferenced resident page: true
    /// if it had a chance left (now one fewer) and stays.
    pub fn spend_chance(&self, at: PageRef) -> bool {
        let Some((access, i)) = self.access(at) else {
            return false;
        };
        use std::sync::atomic::Ordering::Relaxed;
        access.chances[i]
            .fetch_update(Relaxed, Relaxed, |c| c.checked_sub(1))
            .is_ok()
    }

    /// The page of `chunk` the CLOCK hand looks at next.
    pub fn hand(&self, chunk: UnitIndex) -> PageIndex {
        PageIndex::new(self.group(chunk).map_or(0, |g| {
            usize::from(
                g.access.hands[chunk.get() % GROUP_CHUNKS]
                    .load(std::sync::atomic::Ordering::Relaxed),
            ) % PAGES_PER_CHUNK
        }))
    }

    /// Moves `chunk`'s page hand to `page`.
    pub fn set_hand(&self, chunk: UnitIndex, page: PageIndex) {
        if let Some(group) = self.group(chunk) {
            group.access.hands[chunk.get() % GROUP_CHUNKS]
                .store(page.get() as u16, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The chunk owner gives every page of its chunk its first state
    /// (all were `Locked`): the split. The pages' access metadata starts
    /// afresh (a stamp from an earlier split says nothing now).
    pub fn unlock_all(&self, chunk: UnitIndex, state_of: &dyn Fn(PageIndex) -> PageState) {
        for at in chunk.pages() {
            self.stamp_fresh(at);
            self.take(
                at,
                PageTransition::Unlock,
                PageState::LOCKED,
                state_of(at.page),
            )
            .expect("the chunk owner holds every page locked");
        }
    }

    /// The chunk owner locks every page of its chunk, waiting for pages in
    /// flight to settle; returns each page's state before it was locked,
    /// or `None` when `give_up` said so (the pages locked so far are
    /// unlocked again).
    pub fn lock_all(&self, chunk: UnitIndex, give_up: &dyn Fn() -> bool) -> Option<Vec<PageState>> {
        let mut before = Vec::with_capacity(PAGES_PER_CHUNK);
        for at in chunk.pages() {
            loop {
                let state = self.wait_settled(at, give_up);
                if state.tag().in_flight() {
                    self.unlock_pages(chunk, &before);
                    return None;
                }
                if self
                    .take(at, PageTransition::Lock, state, PageState::LOCKED)
                    .is_ok()
                {
                    before.push(state);
                    break;
                }
            }
        }
        Some(before)
    }

    /// Clears a page's access metadata.
    fn stamp_fresh(&self, at: PageRef) {
        // Called while the chunk owner holds the page locked, so no
        // eviction or fault can stamp it at the same time; the group is
        // usually there already (allocated with the chunk's words).
        let group = self.group_or_new(at.chunk);
        let i = (at.chunk.get() % GROUP_CHUNKS) * PAGES_PER_CHUNK + at.page.get();
        group.access.stamps[i].store(0, std::sync::atomic::Ordering::Relaxed);
        group.access.chances[i].store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Unlocks the first `states.len()` pages of a chunk back to `states`.
    pub fn unlock_pages(&self, chunk: UnitIndex, states: &[PageState]) {
        for (at, &state) in chunk.pages().zip(states) {
            self.take(at, PageTransition::Unlock, PageState::LOCKED, state)
                .expect("the chunk owner holds these pages locked");
        }
    }

    /// Per-tag page counts of one chunk `[absent, resident, stored, loading,
    /// evicting, locked]`.
    pub fn count_tags(&self, chunk: UnitIndex) -> [u32; 6] {
        let mut counts = [0u32; 6];
        for at in chunk.pages() {
            let index = match self.load(at).tag() {
                PageTag::Absent => 0,
                PageTag::Resident => 1,
                PageTag::Stored => 2,
                PageTag::Loading => 3,
                PageTag::Evicting => 4,
                PageTag::Locked => 5,
            };
            counts[index] += 1;
        }
        counts
    }

    fn shard(&self, at: PageRef) -> &WaitShard {
        &self.shards[(at.chunk.get() * PAGES_PER_CHUNK + at.page.get()) % WAIT_SHARDS]
    }

    fn wake(&self, at: PageRef) {
        let shard = self.shard(at);
        if shard.waiting.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notify after a waiter that saw
            // the old state has started waiting.
            let _guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
            shard.cond.notify_all();
        }
    }

    /// Blocks while the page is in flight; returns the first state seen
    /// that is not, or the in-flight one once `give_up` says so (checked
    /// every 100 ms).
    pub fn wait_settled(&self, at: PageRef, give_up: &dyn Fn() -> bool) -> PageState {
        let state = self.load(at);
        if !state.tag().in_flight() {
            return state;
        }
        let shard = self.shard(at);
        let mut guard = shard.lock.lock().unwrap_or_else(|e| e.into_inner());
        shard.waiting.fetch_add(1, Ordering::SeqCst);
        let state = loop {
            let state = self.load(at);
            if !state.tag().in_flight() || give_up() {
                break state;
            }
            guard = shard
                .cond
                .wait_timeout(guard, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        shard.waiting.fetch_sub(1, Ordering::SeqCst);
        state
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        for slot in self.groups.iter() {
            let group = slot.swap(std::ptr::null_mut(), std::sync::atomic::Ordering::AcqRel);
            if !group.is_null() {
                // SAFETY: published by `group_or_new` from `Box::into_raw`
                // and taken out of the directory just now: freed once.
                drop(unsafe { Box::from_raw(group) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: [PageTag; 6] = [
        PageTag::Absent,
        PageTag::Resident,
        PageTag::Stored,
        PageTag::Loading,
        PageTag::Evicting,
        PageTag::Locked,
    ];

    /// The module docs' table written out independently of `rule()`.
    fn expected(t: PageTransition, from: PageTag, to: PageTag) -> bool {
        use PageTag::*;
        use PageTransition::*;
        matches!(
            (t, from, to),
            (BeginZeroFill, Absent, Loading)
                | (BeginRead, Stored, Loading)
                | (FinishRestore, Loading, Resident)
                | (BeginEvict, Resident, Evicting)
                | (AbortEvict, Evicting, Resident)
                | (SettleZero, Evicting, Absent)
                | (SettleWritten, Evicting, Stored)
                | (DiscardStored, Stored, Absent)
                | (Reference, Resident, Resident)
                | (BeginResidentFault, Resident, Loading)
                | (EndResidentFault, Loading, Resident)
                | (Lock, Absent | Resident | Stored, Locked)
                | (Unlock, Locked, Absent | Resident | Stored)
        )
    }

    #[test]
    fn the_page_table_allows_exactly_the_documented_transitions() {
        let mut legal = 0;
        for t in PageTransition::ALL {
            for from in TAGS {
                for to in TAGS {
                    let ok = t.allows(PageState::new(from), PageState::new(to));
                    assert_eq!(ok, expected(t, from, to), "{t:?}: {from:?} -> {to:?}");
                    legal += usize::from(ok);
                }
            }
        }
        assert_eq!(legal, 17);
    }

    #[test]
    fn a_page_state_fits_a_nibble_and_neighbours_are_independent() {
        let table = PageTable::new(40);
        assert_eq!(
            table.load(UnitIndex::new(33).page(PageIndex::new(5))),
            PageState::LOCKED
        );
        let chunk = UnitIndex::new(17);
        table.unlock_all(chunk, &|page| {
            PageState::new(if page.get() % 2 == 0 {
                PageTag::Absent
            } else {
                PageTag::Stored
            })
        });
        let at = chunk.page(PageIndex::new(3));
        let loading = table.begin_fault(at, table.load(at)).unwrap();
        assert_eq!(
            table.begin_fault(at, PageState::new(PageTag::Stored)),
            Err(loading)
        );
        table.finish_restore(at, loading);
        let resident = table.load(at);
        assert!(resident.referenced() && resident.tag() == PageTag::Resident);
        assert_eq!(
            table.load(chunk.page(PageIndex::new(2))).tag(),
            PageTag::Absent
        );
        assert_eq!(
            table.load(chunk.page(PageIndex::new(4))).tag(),
            PageTag::Absent
        );
        assert_eq!(table.count_tags(chunk), [256, 1, 255, 0, 0, 0]);
        assert_eq!(table.count_tags(chunk.next()), [0, 0, 0, 0, 0, 512]);
        // Three groups of directory (8 B each), one group allocated: its
        // words (16 chunks of 256 B) and its access tables (per page a
        // 4-byte stamp and a chance byte, per chunk a 2-byte hand).
        assert_eq!(
            table.metadata_bytes(),
            3 * 8 + 4096 + 16 * 512 * (4 + 1) + 16 * 2
        );
        let before = table.lock_all(chunk, &|| false).unwrap();
        assert_eq!(before[3].tag(), PageTag::Resident);
        assert_eq!(table.count_tags(chunk)[5], 512);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "illegal page state transition BeginEvict")]
    fn an_illegal_page_transition_is_caught() {
        let table = PageTable::new(1);
        let at = UnitIndex::new(0).page(PageIndex::new(0));
        let _ = table.begin_evict(at, PageState::LOCKED);
    }

    #[test]
    fn a_waiter_wakes_when_the_page_settles() {
        let table = std::sync::Arc::new(PageTable::new(1));
        table.unlock_all(UnitIndex::new(0), &|_| PageState::new(PageTag::Absent));
        let at = UnitIndex::new(0).page(PageIndex::new(100));
        let loading = table.begin_fault(at, table.load(at)).unwrap();
        let waiter = {
            let table = table.clone();
            std::thread::spawn(move || table.wait_settled(at, &|| false))
        };
        while table.shards[(100) % WAIT_SHARDS]
            .waiting
            .load(Ordering::SeqCst)
            == 0
        {
            std::thread::yield_now();
        }
        table.finish_restore(at, loading);
        assert_eq!(waiter.join().unwrap().tag(), PageTag::Resident);
    }
}
