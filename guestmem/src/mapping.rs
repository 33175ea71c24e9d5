//! The single host mapping that holds all guest RAM, 2 MiB aligned (see
//! [`crate::host::anon`] for why), on the host-memory layer
//! ([`crate::host`]).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use crate::addr::RegionOffset;
use crate::host::{self, RawRange, ANON_FLAGS};
use crate::hugepool::HugePool;
use crate::{GuestMemError, CHUNK_BYTES};

/// An owned, 2 MiB-aligned, read-write host mapping; unmapped on drop.
#[derive(Debug)]
pub(crate) struct HostMapping {
    /// The whole mapping.
    range: RawRange,
    /// The hugetlb memfd behind the mapping, kept so that the swap engine
    /// can punch holes into it.
    memfd: Option<OwnedFd>,
    /// Set when the mapping must outlive this object (see [`Self::leak`]).
    leaked: bool,
}

// SAFETY: the mapping is plain process memory that is never handed out as a
// Rust reference; every access goes through raw pointers (vm-memory's
// volatile accessors, KVM, userfaultfd), so sharing the base pointer between
// threads introduces no aliasing that a single thread would not also have.
unsafe impl Send for HostMapping {}
// SAFETY: as for `Send`: `&HostMapping` only exposes the address and length.
unsafe impl Sync for HostMapping {}

const PROT_RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

impl HostMapping {
    /// Maps `len_bytes` of anonymous memory at a 2 MiB-aligned address, with
    /// transparent huge pages requested (`thp == true`) or refused. The
    /// memory is not populated: it is faulted in on first touch.
    pub fn anonymous(len_bytes: u64, thp: bool) -> Result<HostMapping, GuestMemError> {
        let backing = if thp { "thp" } else { "4k" };
        let map_error = |error| GuestMemError::Mmap {
            len_bytes,
            backing,
            error,
        };
        let base = host::map_anonymous_aligned(len_bytes).map_err(map_error)?;
        let mapping = HostMapping {
            // SAFETY: the mapping was just created and is owned by this
            // value until drop; guest RAM is only ever reached through raw
            // pointers (see the `Send` impl).
            range: unsafe { RawRange::new(base, len_bytes) },
            memfd: None,
            leaked: false,
        };

        if thp {
            mapping
                .range
                .advise_hugepage(RegionOffset::ZERO, len_bytes)
                .map_err(|error| GuestMemError::ThpUnavailable { error })?;
        } else {
            mapping
                .range
                .advise_nohugepage(RegionOffset::ZERO, len_bytes)
                .map_err(|error| GuestMemError::Madvise {
                    advice: "MADV_NOHUGEPAGE",
                    error,
                })?;
        }
        mapping.dont_fork()?;
        Ok(mapping)
    }

    /// Maps `len_bytes` of a fresh hugetlb memfd of 2 MiB pages, after
    /// checking that the host's pool can hold them. The pages are reserved
    /// by the mapping but not populated.
    pub fn hugetlb(len_bytes: u64) -> Result<HostMapping, GuestMemError> {
        let needed_pages = len_bytes.div_ceil(CHUNK_BYTES);
        HugePool::read()?.ensure_available(needed_pages)?;

        const NAME: &CStr = c"hugevmm-guest-ram";
        // SAFETY: NAME is a valid NUL-terminated string; the call creates a
        // new fd and touches no memory of ours.
        let raw_fd = unsafe {
            libc::memfd_create(
                NAME.as_ptr(),
                libc::MFD_HUGETLB | libc::MFD_HUGE_2MB | libc::MFD_CLOEXEC,
            )
        };
        if raw_fd < 0 {
            return Err(GuestMemError::Memfd {
                step: "memfd_create(MFD_HUGETLB | MFD_HUGE_2MB)",
                error: io::Error::last_os_error(),
            });
        }
        // SAFETY: memfd_create just returned this fd and nothing else owns it.
        let memfd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
        let file_len =
            libc::off_t::try_from(len_bytes).expect("guest RAM size is bounded by the layout");
        // SAFETY: ftruncate on an fd we own; no memory is involved.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), file_len) } < 0 {
            return Err(GuestMemError::Memfd {
                step: "ftruncate",
                error: io::Error::last_os_error(),
            });
        }

        // The kernel aligns hugetlb mappings to the huge page size by
        // itself, so no over-allocation is needed; the check below catches
        // a kernel that would not.
        // SAFETY: a fresh shared mapping of our own memfd at a kernel-chosen
        // address cannot alias any existing memory.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                to_usize(len_bytes),
                PROT_RW,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENOMEM) {
                // The mapping reserves its pages; ENOMEM means the pool ran
                // short, e.g. because another process took pages meanwhile.
                let pool = HugePool::read()?;
                return Err(pool.shortage(needed_pages));
            }
            return Err(GuestMemError::Mmap {
                len_bytes,
                backing: "hugetlb",
                error,
            });
        }
        let mapping = HostMapping {
            // SAFETY: as in `anonymous`: a fresh mapping owned by this value.
            range: unsafe { RawRange::new(raw as u64, len_bytes) },
            memfd: Some(memfd),
            leaked: false,
        };
        if mapping.range.base() % CHUNK_BYTES != 0 {
            return Err(GuestMemError::Misaligned {
                hva: mapping.range.base(),
            });
        }
        mapping.dont_fork()?;
        Ok(mapping)
    }

    /// Start of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.range.base() as *mut u8
    }

    /// Size of the mapping.
    pub fn len_bytes(&self) -> u64 {
        self.range.len()
    }

    /// The whole mapping as a [`RawRange`], for madvise and discards.
    pub fn range(&self) -> &RawRange {
        &self.range
    }

    /// The `mmap` flags the mapping was created with.
    pub fn mmap_flags(&self) -> libc::c_int {
        if self.memfd.is_some() {
            libc::MAP_SHARED
        } else {
            ANON_FLAGS
        }
    }

    /// The hugetlb memfd, if the mapping is backed by one.
    pub fn memfd(&self) -> Option<&OwnedFd> {
        self.memfd.as_ref()
    }

    /// Keeps the memory mapped forever instead of unmapping it on drop.
    ///
    /// For when something outside this process's control (a KVM memslot that
    /// could not be removed) may still use the range: unmapping would let a
    /// later, unrelated mapping at the same address be exposed to it.
    pub fn leak(&mut self) {
        self.leaked = true;
    }

    /// Keeps guest RAM out of child processes: a fork would make private
    /// pages copy-on-write shared, which both costs a copy on the next guest
    /// write and makes the swap engine's `UFFDIO_MOVE` fail (the folio is no
    /// longer exclusive).
    fn dont_fork(&self) -> Result<(), GuestMemError> {
        self.range
            .dont_fork(RegionOffset::ZERO, self.range.len())
            .map_err(|error| GuestMemError::Madvise {
                advice: "MADV_DONTFORK",
                error,
            })
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        if self.leaked {
            return;
        }
        // SAFETY: the range is the mapping this object created and owns; the
        // vm-memory view and KVM memslots over it are gone by now (GuestRam
        // drops them first), so nothing uses the range any more.
        unsafe { host::unmap(self.range.base(), self.range.len()) };
    }
}

/// Host sizes are at most the 192 GiB the layout allows, so they always fit
/// a 64-bit `usize`.
pub(crate) fn to_usize(bytes: u64) -> usize {
    usize::try_from(bytes).expect("guest RAM sizes fit in usize on 64-bit hosts")
}
