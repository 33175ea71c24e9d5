//! Stores keep chunk images (one unit each: 2 MiB, or 4 KiB for the
//! baseline unit) in numbered slots. The engine only sees this trait.

use crate::index::{PageIndex, StoreKey};
use std::sync::Arc;

mod bounce;
mod capacity;
pub mod codec;
pub mod faulty;
pub mod file;
pub mod mem;
mod open_error;
pub mod paged;
pub mod retry;
pub mod seal;
#[cfg(test)]
mod seal_tests;
mod slots;
pub mod spec;
#[cfg(test)]
mod test_support;

pub use capacity::{required_capacity_bytes, CapacityNeed};
pub use codec::Codec;
pub use faulty::{Faults, FaultyStore};
pub use file::{FileOptions, FileStore};
pub use mem::MemStore;
pub use open_error::StoreOpenError;
pub use retry::{InjectedFaults, RetryCounts, RetryPolicy, RetryingStore, StoreReport};
pub use seal::{Integrity, SealKeyError, Sealer};
pub use spec::{StoreSpec, StoreSpecError};

/// A store slot number. Slots are reused after [`Store::free`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId(u32);

impl SlotId {
    /// The largest slot number (the state word keeps 32 bits of index).
    pub const MAX: SlotId = SlotId(u32::MAX);

    /// Slot number `n`.
    pub const fn new(n: u32) -> SlotId {
        SlotId(n)
    }

    /// The slot's number.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The slot's number as an index into a table of slots.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<SlotId> for u64 {
    fn from(slot: SlotId) -> u64 {
        u64::from(slot.0)
    }
}

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One image to write: the unit's guest address (for error messages) and
/// its bytes (exactly [`Store::unit_bytes`] long, 4 KiB aligned in memory so
/// that `O_DIRECT` stores can write it without a bounce buffer).
pub struct WriteRequest<'a> {
    /// The unit's key (its guest-physical address, where it has one), used
    /// only to name it in errors and to bind a sealed image to it.
    pub gpa: StoreKey,
    /// The unit's content.
    pub data: &'a [u8],
}

/// One page of a split chunk, written in place into the chunk's slot
/// ([`Store::write_pages`]).
pub struct PageWrite<'a> {
    /// The page's index in the chunk.
    pub page: PageIndex,
    /// The page's key (its guest-physical address, where it has one), used
    /// only to name it in errors and to bind a sealed image to it.
    pub gpa: StoreKey,
    /// The page's 4 KiB, 4 KiB aligned in memory.
    pub data: &'a [u8],
}

/// Bytes of one page of a split chunk.
pub const PAGE_BYTES: usize = 4096;

/// The error a store without page support returns for page operations
/// (the engine never splits chunks on such a store).
fn pages_unsupported(store: &str, gpa: StoreKey, slot: SlotId) -> StoreError {
    StoreError::Io {
        gpa,
        slot,
        source: std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{store} keeps no split chunks (an engine bug)"),
        ),
    }
}

/// Why a store operation failed. Every variant names the guest address so
/// the operator can tell which chunk was affected.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The underlying read or write failed.
    #[error("swap store I/O error on chunk at guest address {gpa:#x} (slot {slot}): {source}")]
    Io {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// Slot involved.
        slot: SlotId,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A read returned fewer bytes than a unit.
    #[error("swap store short read on chunk at guest address {gpa:#x} (slot {slot}): got {got_bytes} of {want_bytes} bytes")]
    ShortRead {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// Slot involved.
        slot: SlotId,
        /// Bytes the read returned.
        got_bytes: usize,
        /// Bytes expected.
        want_bytes: usize,
    },
    /// The content read back does not match the checksum taken at write time.
    #[error("swap store checksum mismatch on chunk at guest address {gpa:#x} (slot {slot}): stored {expected:#010x}, read {found:#010x}")]
    Checksum {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// Slot involved.
        slot: SlotId,
        /// Checksum recorded at write time.
        expected: u32,
        /// Checksum of what was read.
        found: u32,
    },
    /// A sealed image (`--swap-encrypt`) failed to open: it is not the
    /// image this store sealed for that slot, address and write generation
    /// (a bit changed, a slot copied over another, an older image written
    /// back). It was not decrypted into the guest.
    #[error("swap store authentication failed on chunk at guest address {gpa:#x} (slot {slot}, write generation {generation}): the stored image is not the one sealed there (changed, copied from another slot, or an older image written back); nothing of it reaches the guest")]
    Authentication {
        /// Guest address of the unit (or page).
        gpa: StoreKey,
        /// Slot involved.
        slot: SlotId,
        /// The generation the store expected.
        generation: u64,
    },
    /// No free slot for the unit: the store's own capacity is used up (a
    /// full filesystem is [`StoreError::FilesystemFull`]).
    #[error("swap store is full writing chunk at guest address {gpa:#x}: capacity {capacity_bytes} bytes ({capacity_slots} slots); give a larger store (e.g. --swap-store file:PATH,size=SIZE) or raise --mem-limit")]
    Full {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// Store capacity in bytes.
        capacity_bytes: u64,
        /// Store capacity in slots.
        capacity_slots: u64,
    },
    /// The filesystem holding a file store ran out of space (`ENOSPC`, or
    /// `EDQUOT`) before the store's own capacity did.
    #[error("no space left on the filesystem holding the swap store {} ({source}) writing chunk at guest address {gpa:#x}: that filesystem has {} bytes free, while the store itself is not full ({used_slots} of {capacity_slots} slots in use). Free space on that filesystem, put the store on another one (--swap-store file:PATH, or TMPDIR for the default store), or add ,reserve to the store to claim its space at start", path.display(), free_bytes.map_or_else(|| "an unknown number of".to_string(), |b| b.to_string()))]
    FilesystemFull {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// The store's file (the directory, for a temporary store).
        path: std::path::PathBuf,
        /// Free bytes on that filesystem after the failure (`statvfs`).
        free_bytes: Option<u64>,
        /// Slots in use when the write failed.
        used_slots: u64,
        /// Store capacity in slots.
        capacity_slots: u64,
        /// The OS error (`ENOSPC` or `EDQUOT`).
        #[source]
        source: std::io::Error,
    },
    /// A slot that is not allocated was read or freed (an engine bug).
    #[error("swap store slot {slot} is not allocated (chunk at guest address {gpa:#x})")]
    BadSlot {
        /// Guest address of the unit.
        gpa: StoreKey,
        /// Slot involved.
        slot: SlotId,
    },
}

/// A place to keep evicted units. Implementations are shared between the
/// fault-service and eviction threads, so every method takes `&self`.
pub trait Store: Send + Sync {
    /// Size of one unit (slot payload) in bytes.
    fn unit_bytes(&self) -> usize;
    /// Number of slots the store can hold.
    fn capacity_slots(&self) -> u64;
    /// Short description for logs and stats, e.g. `file:/tmp/x` or `mem:lz4`.
    fn describe(&self) -> String;
    /// Writes a batch of units, each into a newly allocated slot, submitted
    /// together. Returns one result per request, in order; a failed request
    /// holds no slot.
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>>;
    /// Reads the unit in `slot` into `buf` (exactly `unit_bytes` long, 4 KiB
    /// aligned) and verifies its checksum. `gpa` only names the unit in
    /// errors. Never returns `Ok` with anything but the written bytes.
    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError>;
    /// Releases a slot for reuse. Its content is forgotten.
    fn free(&self, slot: SlotId);
    /// Slots currently allocated.
    fn used_slots(&self) -> u64;
    /// Bytes the allocated slots take in the store's medium, for stats: the
    /// compressed size for a compressed store. The default is
    /// `used_slots * unit_bytes`, right for stores that keep units as they are.
    fn stored_bytes(&self) -> u64 {
        self.used_slots() * self.unit_bytes() as u64
    }
    /// Whether the store keeps the pages of split chunks: a *paged* slot
    /// holds a 2 MiB chunk's pages at their offsets, each written and read
    /// alone and verified by its own checksum (the integrity unit of a
    /// split chunk is its page, of a huge one its slot). Without it the
    /// engine never splits a chunk.
    fn supports_pages(&self) -> bool {
        false
    }
    /// Allocates a paged slot with no page written yet, for a split chunk
    /// that has none. `gpa` (the chunk's) only names it in errors.
    fn allocate_paged(&self, gpa: StoreKey) -> Result<SlotId, StoreError> {
        Err(pages_unsupported(&self.describe(), gpa, SlotId::new(0)))
    }
    /// Reads the whole unit in `slot` into `buf` as [`Store::read`] does
    /// (verified against the slot's checksum) and turns the slot into a
    /// paged one holding those pages, each with its own checksum from now
    /// on: the chunk was split and its pages are stored where they were.
    fn read_and_split(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let _ = buf;
        Err(pages_unsupported(&self.describe(), gpa, slot))
    }
    /// Writes pages of the paged `slot` in place, submitted together; one
    /// result per page, in order. A failed page keeps its old content and
    /// checksum (or none).
    fn write_pages(&self, slot: SlotId, pages: &[PageWrite<'_>]) -> Vec<Result<(), StoreError>> {
        pages
            .iter()
            .map(|p| Err(pages_unsupported(&self.describe(), p.gpa, slot)))
            .collect()
    }
    /// Reads the whole paged `slot` into `buf` (one unit) in one go, and
    /// verifies every page written to it against its checksum (the others'
    /// bytes are unspecified): a collapse of a chunk with many stored pages
    /// reads them in one I/O instead of one each. `gpa` is the chunk's.
    fn read_paged_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let _ = buf;
        Err(pages_unsupported(&self.describe(), gpa, slot))
    }
    /// Reads page `page` of the paged `slot` into `buf` (4 KiB) and
    /// verifies its checksum. `gpa` (the page's) names it in errors.
    fn read_page(
        &self,
        slot: SlotId,
        page: PageIndex,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let _ = (page, buf);
        Err(pages_unsupported(&self.describe(), gpa, slot))
    }
    /// Test aid: damages the stored image in `slot` in place, so that the
    /// next [`Store::read`] of it fails its checksum as real corruption
    /// would. Used by [`FaultyStore`]. The default reports `Unsupported`.
    fn corrupt_slot(&self, slot: SlotId) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{} cannot corrupt slot {slot} for tests", self.describe()),
        ))
    }
    /// Whether the store seals what it keeps (`--swap-encrypt`): encrypted
    /// and authenticated per integrity unit instead of a crc32
    /// ([`seal`]). Wrappers answer for their inner store.
    fn sealed(&self) -> bool {
        false
    }
    /// What the wrappers of this store did so far (retries, injected
    /// faults), their inner store's counts included; stores that wrap
    /// nothing report zeros.
    fn report(&self) -> StoreReport {
        StoreReport::default()
    }
}

/// Shared handle to a store.
pub type SharedStore = Arc<dyn Store>;
