//! The host-memory layer: safe wrappers over the memory-management
//! syscalls that guest RAM (this crate) and the swap engine use on this
//! process's own memory: anonymous 2 MiB-aligned mappings, madvise,
//! mincore, hole punching, and the `PAGEMAP_SCAN` query of how a range is
//! mapped.
//!
//! Guest RAM, the swap engine's parking area and its buffer pool are never
//! accessed through Rust references that outlive a call: the kernel moves
//! pages in and out of them behind our back (UFFDIO_MOVE, MADV_DONTNEED), so
//! they are described by [`RawRange`], whose constructor is where the caller
//! promises that.
//!
//! - [`range`]: [`RawRange`], a raw address range and the advice, residency
//!   and copy operations on it.
//! - [`anon`]: [`AnonMapping`] and [`map_anonymous_aligned`], anonymous
//!   memory aligned to 2 MiB.
//! - [`punch`]: [`punch_hole`] in a (hugetlbfs) file.
//! - [`pagemap`]: [`PagemapScanner`], whether a range is mapped by huge pages.
//! - [`secret`]: [`SecretPage`], a locked page kept out of core dumps for
//!   key material.

pub mod anon;
pub mod pagemap;
pub mod punch;
pub mod range;
pub mod secret;

pub use anon::{map_anonymous_aligned, unmap, AnonMapping, ANON_FLAGS};
pub use pagemap::PagemapScanner;
pub use punch::punch_hole;
pub use range::RawRange;
pub use secret::{SecretPage, SecretPageError};

/// 2 MiB, the PMD size on x86-64.
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;
/// The base page size of x86-64.
pub const PAGE_BYTES: u64 = 4096;
