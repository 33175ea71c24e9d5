//! [`SecretPage`]: one page of this process's memory for key material,
//! locked in RAM, left out of core dumps and of child processes, and zeroed
//! before it is given back.
//!
//! Why a mapping of its own rather than a heap allocation: `mlock` and
//! `madvise` work on whole pages, and a heap allocation shares its page
//! with unrelated objects (whose pages would then be locked or hidden from
//! dumps too) and may be copied by a reallocation, leaving a key behind in
//! freed memory. A page of its own is locked, hidden and wiped as a unit.

use std::io;
use std::ptr;

use super::PAGE_BYTES;

/// One locked, non-dumpable, non-inherited page, zeroed on drop.
#[derive(Debug)]
pub struct SecretPage {
    base: *mut u8,
}

// SAFETY: the page is plain memory owned by this value; what is stored in
// it is the owner's business (the swap store's key holder makes its
// contents `Sync` itself).
unsafe impl Send for SecretPage {}
// SAFETY: as above; `&SecretPage` only hands out a raw pointer.
unsafe impl Sync for SecretPage {}

/// Why a secret page could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecretPageError {
    /// `mmap` failed.
    #[error("cannot map a page for key material: {0}")]
    Map(#[source] io::Error),
    /// `mlock` failed: usually `RLIMIT_MEMLOCK` (ulimit -l) is exhausted.
    #[error("cannot lock the page holding key material in RAM (mlock: {0}); raise the locked-memory limit (ulimit -l, at least 4 KiB free) or run as root")]
    Lock(#[source] io::Error),
    /// `madvise(MADV_DONTDUMP)` or `MADV_DONTFORK` failed.
    #[error("cannot keep key material out of core dumps and child processes (madvise: {0})")]
    Advise(#[source] io::Error),
}

impl SecretPage {
    /// Bytes of the page.
    pub const BYTES: usize = PAGE_BYTES as usize;

    /// Maps a zeroed page, locks it in RAM (never written to swap) and
    /// marks it `MADV_DONTDUMP` and `MADV_DONTFORK`.
    pub fn new() -> Result<SecretPage, SecretPageError> {
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address
        // cannot alias any existing memory.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                Self::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(SecretPageError::Map(io::Error::last_os_error()));
        }
        // From here on, drop unmaps it.
        let page = SecretPage { base: raw.cast() };
        // SAFETY: locks the page just mapped; touches no Rust memory.
        if unsafe { libc::mlock(raw, Self::BYTES) } != 0 {
            return Err(SecretPageError::Lock(io::Error::last_os_error()));
        }
        for advice in [libc::MADV_DONTDUMP, libc::MADV_DONTFORK] {
            // SAFETY: advice on the page just mapped, which holds nothing yet.
            if unsafe { libc::madvise(raw, Self::BYTES, advice) } != 0 {
                return Err(SecretPageError::Advise(io::Error::last_os_error()));
            }
        }
        Ok(page)
    }

    /// The page's first byte, page aligned. Valid for [`Self::BYTES`]
    /// bytes until the page is dropped.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for SecretPage {
    fn drop(&mut self) {
        // Volatile writes, so that the compiler cannot drop them as stores
        // to memory that is about to be unmapped. munmap unlocks the page
        // too (no munlock, which the seccomp filters need not allow).
        for i in 0..Self::BYTES {
            // SAFETY: the page is mapped read-write and owned by this
            // value; whatever lived in it was dropped by its owner first.
            unsafe { ptr::write_volatile(self.base.add(i), 0) };
        }
        // SAFETY: unmaps exactly the page mapped in `new`; nothing uses it
        // any more (its owner is being dropped).
        unsafe { libc::munmap(self.base.cast(), Self::BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_page_is_locked_and_writable() {
        let page = match SecretPage::new() {
            Ok(page) => page,
            // A host without a locked-memory allowance cannot run this;
            // CI (root) has one, so there the skip is a failure.
            Err(SecretPageError::Lock(e)) => {
                test_resources::skip(
                    "a_secret_page_is_locked_and_writable",
                    test_resources::Resource::Mlock,
                    format!("mlock refused here ({e}): no locked-memory allowance; run as root or raise `ulimit -l`"),
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        // SAFETY: the page is mapped read-write for BYTES bytes.
        unsafe {
            page.as_mut_ptr().write(0xa5);
            assert_eq!(page.as_mut_ptr().read(), 0xa5);
        }
        assert_eq!(page.as_mut_ptr() as usize % SecretPage::BYTES, 0);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let locked_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap();
        assert!(locked_kb >= 4, "VmLck {locked_kb} kB");
    }
}
