//! [`RawRange`]: an address range of this process reached through raw
//! pointers only, and the madvise, mincore and copy operations on it.

use std::io;

use super::PAGE_BYTES;
use crate::addr::{Hva, RegionOffset};

/// An address range of this process managed through raw pointers only.
#[derive(Debug, Clone, Copy)]
pub struct RawRange {
    base: u64,
    len: u64,
}

impl RawRange {
    /// Describes `[base, base+len)`.
    ///
    /// # Safety
    ///
    /// The range must be mapped for as long as the value is used, and no
    /// Rust reference to it may be live while the kernel can change it
    /// (discard, move): the engine reads and writes it only via short-lived
    /// slices it creates itself while it owns the unit.
    pub unsafe fn new(base: u64, len: u64) -> RawRange {
        RawRange { base, len }
    }

    /// Start address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The address of `offset` in the range (not checked against its
    /// length: the caller hands it to the kernel, which checks).
    pub fn addr(&self, offset: RegionOffset) -> Hva {
        Hva::new(self.base + offset.get())
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn check(&self, offset: RegionOffset, len: u64) {
        let offset = offset.get();
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset:#x}+{len:#x} outside {:#x}",
            self.len
        );
    }

    fn advise(&self, offset: RegionOffset, len: u64, advice: libc::c_int) -> io::Result<()> {
        self.check(offset, len);
        // SAFETY: the range lies inside memory the constructor's caller
        // vouched for; madvise changes page state, never Rust-visible
        // references (none are live, see `new`).
        let ret = unsafe {
            libc::madvise(
                (self.base + offset.get()) as *mut libc::c_void,
                len as usize,
                advice,
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Frees the pages of a sub-range (anonymous memory reads as empty
    /// afterwards; in a userfaultfd range the next touch faults MISSING).
    pub fn discard(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_DONTNEED)
    }

    /// Asks for transparent huge pages on a sub-range.
    pub fn advise_hugepage(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_HUGEPAGE)
    }

    /// Asks for small pages only on a sub-range.
    pub fn advise_nohugepage(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_NOHUGEPAGE)
    }

    /// Keeps a sub-range out of child processes (`MADV_DONTFORK`).
    pub fn dont_fork(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_DONTFORK)
    }

    /// Leaves a sub-range out of core dumps (`MADV_DONTDUMP`): the swap
    /// engine's parking area and restore buffers hold guest memory on its
    /// way to and from the store, which an encrypted store must not leak
    /// through a dump.
    pub fn dont_dump(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_DONTDUMP)
    }

    /// Synchronously collapses a fully populated 2 MiB sub-range into a
    /// huge page (succeeds at once if it already is one).
    pub fn collapse(&self, offset: RegionOffset, len: u64) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_COLLAPSE)
    }

    /// Fills `out` with one byte per page of the sub-range, bit 0 set when
    /// the page is present. Never faults pages in.
    pub fn residency(&self, offset: RegionOffset, len: u64, out: &mut Vec<u8>) -> io::Result<()> {
        self.check(offset, len);
        let pages = len.div_ceil(PAGE_BYTES) as usize;
        out.clear();
        out.resize(pages, 0);
        // SAFETY: `out` has one byte per page of the range, as mincore
        // writes; the range is mapped (see `new`).
        let ret = unsafe {
            libc::mincore(
                (self.base + offset.get()) as *mut libc::c_void,
                len as usize,
                out.as_mut_ptr(),
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Writes one byte into every page of a sub-range so that all of it is
    /// populated (a THP-eligible range gets a huge page on the first touch).
    ///
    /// Must only be called on ranges no userfaultfd is registered on, or
    /// the calling thread could fault into its own userfaultfd.
    pub fn touch(&self, offset: RegionOffset, len: u64) {
        self.check(offset, len);
        let mut addr = self.base + offset.get();
        while addr < self.base + offset.get() + len {
            // SAFETY: the address lies in mapped, writable memory (see
            // `new`); a volatile write of a zero byte into memory that
            // nobody else uses at this time (the caller owns it).
            unsafe { std::ptr::write_volatile(addr as *mut u8, 0) };
            addr += PAGE_BYTES;
        }
    }

    /// Pointer to `offset` (for the few places that build short-lived
    /// slices while they own the memory).
    pub fn ptr(&self, offset: RegionOffset) -> *mut u8 {
        self.check(offset, 0);
        (self.base + offset.get()) as *mut u8
    }

    /// Copies `len` bytes at `src_offset` of `src` into `self` at
    /// `dst_offset`. Both must be populated (no userfaultfd faults).
    pub fn copy_from(
        &self,
        dst_offset: RegionOffset,
        src: &RawRange,
        src_offset: RegionOffset,
        len: u64,
    ) {
        self.check(dst_offset, len);
        src.check(src_offset, len);
        let (dst_start, src_start) = (self.base + dst_offset.get(), src.base + src_offset.get());
        assert!(
            dst_start + len <= src_start || src_start + len <= dst_start,
            "copy_from: [{dst_start:#x}, +{len:#x}) overlaps the source [{src_start:#x}, +{len:#x})"
        );
        // SAFETY: both ranges are mapped and populated, owned by the caller
        // for the duration (raw pointers, no references), and do not
        // overlap (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(src.ptr(src_offset), self.ptr(dst_offset), len as usize)
        };
    }

    /// A shared view of a populated sub-range the caller owns.
    ///
    /// # Safety
    ///
    /// The sub-range must be populated (no holes in a userfaultfd range) and
    /// must not be moved, discarded or written until the slice is dropped.
    pub unsafe fn slice(&self, offset: RegionOffset, len: u64) -> &[u8] {
        self.check(offset, len);
        // SAFETY: the caller guarantees the bytes are mapped, populated and
        // unchanged while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr(offset), len as usize) }
    }

    /// A mutable view of a populated sub-range the caller owns exclusively.
    ///
    /// # Safety
    ///
    /// As for [`RawRange::slice`], and no other access may happen while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: RegionOffset, len: u64) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: the caller guarantees exclusive access to mapped memory.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(offset), len as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::AnonMapping;

    #[test]
    #[should_panic(expected = "overlaps the source")]
    fn copy_from_refuses_overlapping_ranges() {
        let mapping = AnonMapping::new(2 * PAGE_BYTES).unwrap();
        let range = *mapping.range();
        range.touch(RegionOffset::ZERO, 2 * PAGE_BYTES);
        range.copy_from(
            RegionOffset::ZERO,
            &range,
            RegionOffset::new(100),
            PAGE_BYTES,
        );
    }
}
