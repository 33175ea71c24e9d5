//! Guest physical memory for hugevmm.
//!
//! Guest RAM is handled in 2 MiB *chunks* ([`CHUNK_BYTES`]) that are aligned
//! both in guest-physical and in host-virtual space, so that the kernel can
//! back each chunk with one huge page and KVM can map it with one 2 MiB
//! stage-2 entry.
//!
//! - [`addr`]: host virtual addresses and offsets into host mappings as
//!   types, so that one is not passed where the other is meant.
//! - [`size`]: parsing and printing of sizes such as `512M` or `4G`.
//! - [`layout`]: where guest RAM sits in guest-physical space (below 3 GiB
//!   and from 4 GiB up) and where each part sits in the host mapping.
//! - [`backing`]: the kind of host memory behind guest RAM (THP, hugetlbfs,
//!   4 KiB pages).
//! - [`ram`]: [`GuestRam`], the single host mapping of all guest RAM, its
//!   KVM memslots and a `vm-memory` view for device code.
//! - [`host`]: the host-memory layer under guest RAM and the swap engine:
//!   aligned anonymous mappings, madvise, hole punching, `PAGEMAP_SCAN`.
//! - [`kvm_stats`]: KVM binary statistics, to observe how many stage-2
//!   mappings are 4 KiB, 2 MiB or 1 GiB.
#![deny(missing_docs)]

pub mod addr;
pub mod backing;
mod error;
pub mod host;
mod hugepool;
pub mod kvm_stats;
pub mod layout;
mod mapping;
mod memslot;
pub mod ram;
pub mod size;

pub use backing::{Backing, BackingParseError};
pub use error::GuestMemError;
pub use kvm_stats::{KvmStats, StageTwoPages};
pub use layout::{Layout, LayoutError, RamRegion, HIGH_RAM_START, LOW_RAM_END};
pub use ram::{GuestMemoryView, GuestRam};
pub use size::{format_size, format_size_arg, parse_size, SizeError};

/// The unit in which guest RAM is laid out, mapped and swapped: 2 MiB, the
/// x86-64 huge page size.
pub const CHUNK_BYTES: u64 = host::HUGE_PAGE_BYTES;

pub use host::PAGE_BYTES;

/// A guest-physical address, as the layout and [`GuestRam`] take it
/// (re-exported so that callers need not depend on vm-memory to name it).
pub use vm_memory::GuestAddress;
