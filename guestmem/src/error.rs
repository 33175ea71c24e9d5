//! The error type of guest-memory operations.
//!
//! Each message names the operation, the OS error if any, and what the user
//! can do about it. Causes are part of the message rather than a `source()`
//! chain, so the text is complete however the caller prints it.

use std::io;

use crate::size::format_size;

/// An error setting up, registering, accessing or observing guest RAM.
#[derive(Debug, thiserror::Error)]
pub enum GuestMemError {
    /// The host mapping of guest RAM could not be created.
    #[error(
        "cannot map {} of guest RAM ({backing} backing): {error}; lower --mem or free host memory",
        format_size(*len_bytes)
    )]
    Mmap {
        /// Size of the mapping attempted.
        len_bytes: u64,
        /// Backing name (`thp`, `hugetlb`, `4k`).
        backing: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// `madvise(MADV_HUGEPAGE)` was refused: the kernel has no THP support.
    #[error(
        "transparent huge pages are unavailable on this host (madvise(MADV_HUGEPAGE): {error}); \
         use --backing hugetlb or --backing 4k"
    )]
    ThpUnavailable {
        /// The OS error.
        error: io::Error,
    },
    /// Another `madvise` on guest RAM failed.
    #[error("madvise({advice}) on guest RAM failed: {error}; this host kernel lacks a feature hugevmm needs")]
    Madvise {
        /// The advice name, e.g. `MADV_NOHUGEPAGE`.
        advice: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The host offers no 2 MiB hugetlb pages at all.
    #[error("hugetlb backing is unavailable: {reason}; use --backing thp")]
    HugetlbUnavailable {
        /// What is missing.
        reason: String,
    },
    /// The hugetlb pool has fewer free 2 MiB pages than guest RAM needs.
    #[error(
        "hugetlb backing needs {needed_pages} free 2 MiB huge pages for {}, but only {free_pages} are free \
         (pool size nr_hugepages = {pool_pages}); reserve more as root: \
         `echo {suggested_pool_pages} > {pool_file}` (or use --backing thp)",
        format_size(*needed_pages * crate::CHUNK_BYTES)
    )]
    HugePagesShort {
        /// Pages needed for guest RAM.
        needed_pages: u64,
        /// Pages free and not reserved by other mappings.
        free_pages: u64,
        /// Current size of the pool.
        pool_pages: u64,
        /// Pool size that would leave enough free pages.
        suggested_pool_pages: u64,
        /// The file to write the pool size to.
        pool_file: &'static str,
    },
    /// `memfd_create` or `ftruncate` of the hugetlb memfd failed.
    #[error("cannot create the hugetlb memfd for guest RAM ({step}): {error}; use --backing thp")]
    Memfd {
        /// Which step failed.
        step: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The kernel placed the hugetlb mapping at an address that is not
    /// 2 MiB aligned.
    #[error("the hugetlb mapping of guest RAM is at {hva:#x}, which is not 2 MiB aligned; use --backing thp")]
    Misaligned {
        /// Where the mapping landed.
        hva: u64,
    },
    /// The vm-memory view over guest RAM could not be built.
    #[error("cannot build the vm-memory view of guest RAM: {reason}; this is a bug in hugevmm, please report it")]
    MemoryView {
        /// What vm-memory refused.
        reason: String,
    },
    /// A memslot's guest-physical and host addresses are not congruent
    /// modulo 2 MiB, so KVM could never map it with huge pages.
    #[error(
        "memslot {slot}: guest-physical {gpa:#x} and host {hva:#x} differ modulo 2 MiB, which would \
         force 4 KiB stage-2 mappings; this is a bug in hugevmm, please report it"
    )]
    Incongruent {
        /// The memslot number.
        slot: u32,
        /// Guest-physical start.
        gpa: u64,
        /// Host-virtual start.
        hva: u64,
    },
    /// KVM refused a memslot.
    #[error(
        "KVM refused memslot {slot} (guest-physical {gpa:#x}, {}): {error}; another memslot \
         already uses this slot number or address range (is other guest RAM registered with this \
         VM?), or the host's memslot limit is reached",
        format_size(*len_bytes)
    )]
    Memslot {
        /// The memslot number.
        slot: u32,
        /// Guest-physical start.
        gpa: u64,
        /// Size of the slot.
        len_bytes: u64,
        /// The KVM error.
        error: kvm_ioctls::Error,
    },
    /// The VM fd could not be duplicated to keep the memslots removable.
    #[error("cannot duplicate the KVM VM fd: {error}; raise the open-file limit (ulimit -n)")]
    DupVmFd {
        /// The OS error.
        error: io::Error,
    },
    /// An access fell outside guest RAM.
    #[error(
        "guest-physical range {gpa:#x}..{:#x} ({len_bytes} bytes) is not inside guest RAM ({ram}); \
         place it inside one RAM range",
        gpa.saturating_add(*len_bytes)
    )]
    OutOfRam {
        /// Start of the access.
        gpa: u64,
        /// Length of the access.
        len_bytes: u64,
        /// The RAM ranges, for the message.
        ram: String,
    },
    /// vm-memory failed an access that the layout said was in RAM.
    #[error(
        "cannot access guest RAM at {gpa:#x}: {error}; this is a bug in hugevmm, please report it"
    )]
    Access {
        /// Start of the access.
        gpa: u64,
        /// What vm-memory reported.
        error: vm_memory::GuestMemoryError,
    },
    /// `KVM_GET_STATS_FD` failed.
    #[error(
        "KVM binary statistics are unavailable (KVM_GET_STATS_FD on the VM: {error}); \
         they need Linux 5.14 or later on the host"
    )]
    StatsUnavailable {
        /// The OS error.
        error: io::Error,
    },
    /// Releasing guest memory (free chunks) failed.
    #[error("cannot release guest RAM at offset {offset:#x} (+{len_bytes:#x}): {error}")]
    Discard {
        /// Offset in the guest RAM mapping.
        offset: u64,
        /// Length.
        len_bytes: u64,
        /// The OS error.
        error: std::io::Error,
    },
    /// A release request that is not whole chunks inside guest RAM.
    #[error("cannot release guest RAM at offset {offset:#x} (+{len_bytes:#x}): not whole 2 MiB chunks inside guest RAM")]
    DiscardRange {
        /// Offset in the guest RAM mapping.
        offset: u64,
        /// Length.
        len_bytes: u64,
    },
    /// Reading the stats fd failed.
    #[error("cannot read KVM statistics ({what}): {error}")]
    StatsRead {
        /// What was being read.
        what: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The stats fd contents did not make sense.
    #[error("KVM statistics are malformed: {reason}; please report this host kernel to hugevmm")]
    StatsFormat {
        /// What was wrong.
        reason: String,
    },
    /// Stage-2 page statistics are missing from this host's KVM.
    #[error(
        "this host's KVM does not report the VM statistics {}; it offers: {}",
        missing.join(", "),
        offered.join(", ")
    )]
    StatsMissing {
        /// The names not found.
        missing: Vec<String>,
        /// The names the host offers.
        offered: Vec<String>,
    },
}
