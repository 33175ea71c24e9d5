//! Anonymous private memory aligned to 2 MiB, so that each 2 MiB of it can
//! be one huge page.
//!
//! Alignment is what lets a 2 MiB range be one huge page: the kernel only
//! installs a PMD for a 2 MiB-aligned virtual range (and KVM only maps 2 MiB
//! at stage 2 when host-virtual and guest-physical addresses agree modulo
//! 2 MiB).

use std::io;
use std::ptr;

use super::{RawRange, HUGE_PAGE_BYTES};

/// The flags of every anonymous mapping made here. `MAP_NORESERVE`: guest
/// RAM may be larger than host RAM plus swap (the swap engine overcommits
/// it), and the kernel's overcommit heuristic would otherwise refuse such a
/// mapping up front although most of it is never resident at once.
pub const ANON_FLAGS: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;

const PROT_RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

/// Maps `len_bytes` of read-write anonymous memory ([`ANON_FLAGS`]) at a
/// 2 MiB-aligned address and returns that address. The memory is not
/// populated: it is faulted in on first touch. The caller owns the mapping
/// and gives it back with [`unmap`].
pub fn map_anonymous_aligned(len_bytes: u64) -> io::Result<u64> {
    let enomem = || io::Error::from_raw_os_error(libc::ENOMEM);
    let len = usize::try_from(len_bytes).map_err(|_| enomem())?;
    let chunk = HUGE_PAGE_BYTES as usize;
    // Over-allocate by one huge page so that a 2 MiB-aligned range of the
    // wanted size is certainly inside, then give back the slack.
    let padded = len.checked_add(chunk).ok_or_else(enomem)?;
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address cannot
    // alias any existing memory.
    let raw = unsafe { libc::mmap(ptr::null_mut(), padded, PROT_RW, ANON_FLAGS, -1, 0) };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let raw_addr = raw as usize;
    let aligned_addr = raw_addr.next_multiple_of(chunk);
    let head = aligned_addr - raw_addr;
    let tail = chunk - head;
    if head > 0 {
        // SAFETY: [raw, raw + head) is the unused start of the mapping we
        // just created; nothing refers to it.
        unsafe { libc::munmap(raw, head) };
    }
    if tail > 0 {
        // SAFETY: [aligned + len, raw + padded) is the unused end of the
        // mapping we just created; nothing refers to it.
        unsafe { libc::munmap((aligned_addr + len) as *mut libc::c_void, tail) };
    }
    Ok(aligned_addr as u64)
}

/// Unmaps `[base, base + len_bytes)`.
///
/// # Safety
///
/// The range must be memory this process mapped and owns (e.g. from
/// [`map_anonymous_aligned`]), and nothing may use it any more: no Rust
/// reference, no KVM memslot, no pointer that will be dereferenced later.
pub unsafe fn unmap(base: u64, len_bytes: u64) {
    // SAFETY: the caller owns the range and nothing uses it any more.
    unsafe { libc::munmap(base as *mut libc::c_void, len_bytes as usize) };
}

/// An anonymous private mapping owned by the swap engine (parking area,
/// buffers), aligned to 2 MiB; unmapped on drop.
#[derive(Debug)]
pub struct AnonMapping {
    range: RawRange,
}

impl AnonMapping {
    /// Maps `len` bytes (rounded up to 2 MiB) of anonymous memory aligned to
    /// 2 MiB.
    pub fn new(len: u64) -> io::Result<AnonMapping> {
        let len = len.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        let base = map_anonymous_aligned(len)?;
        // SAFETY: the mapping was just created and is owned by this value
        // until drop; nothing references it yet.
        let range = unsafe { RawRange::new(base, len) };
        Ok(AnonMapping { range })
    }

    /// The aligned usable range.
    pub fn range(&self) -> &RawRange {
        &self.range
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, which no one
        // uses any more (the owner is being dropped).
        unsafe { unmap(self.range.base(), self.range.len()) };
    }
}
