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
//! | `Loading` | in flight towards `Resident`; one fault thread owns it; `MERGING` when a split chunk is being merged back (`BeginMerge`), whose `CLEAN` then means "has a slot for its pages" rather than "the store holds a copy of the chunk" | parking slot if `WRITING`; the pages' store slot if `MERGING` and `CLEAN`; store slot if `CLEAN` otherwise |
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
//!
//! # Files
//!
//! `state.rs` packs a unit's state into one word; `transition.rs` is the
//! table above as code (every change of a state word names its
//! [`Transition`], checked against the table); `table.rs` holds the words,
//! the wait shards and the named transition methods the engine uses.

mod pages;
mod state;
mod sync;
mod table;
mod transition;

pub use pages::{
    IllegalPageTransition, PageRef, PageState, PageTable, PageTag, PageTransition, PAGES_PER_CHUNK,
};
pub use state::{Tag, UnitState};
pub(crate) use sync::poll_pause;
pub use table::{ChunkTable, Restored, Settled, TagCounts, UnitRef};
pub use transition::{IllegalTransition, Transition};
