//! Pinning pages the way device DMA pins them (`FOLL_PIN | FOLL_LONGTERM`),
//! so that tests can put the swap engine before what a guest's device I/O
//! does to it: `UFFDIO_MOVE` refuses pinned pages with `EBUSY`.
//!
//! The pin is an io_uring fixed-buffer registration: the one way to hold a
//! long-term pin from user space without a device. The ring is created
//! disabled and never enabled, so no request can ever be submitted on it
//! and the kernel never reads or writes the pinned memory: the pin only
//! holds the pages. That is why [`PinnedPages::pin`] is safe even though
//! the registration's contract ("the memory stays valid while
//! registered") is about I/O on the buffer: there is none. Unmapping the
//! range while pinned only leaves the pages allocated until the unpin.

use std::io;

use io_uring::IoUring;

/// Pages pinned until this is dropped (or [`PinnedPages::unpin`]).
pub struct PinnedPages {
    ring: IoUring,
}

impl std::fmt::Debug for PinnedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPages").finish_non_exhaustive()
    }
}

impl PinnedPages {
    /// Pins the pages of `[addr, addr + len_bytes)`, which must be mapped
    /// and populated (pinning faults missing pages in, and a range
    /// registered with userfaultfd would wait for its fault service).
    pub fn pin(addr: u64, len_bytes: usize) -> io::Result<PinnedPages> {
        // Disabled: until `register_enable_rings`, which is never called,
        // nothing can be submitted.
        let ring = IoUring::builder().setup_r_disabled().build(1)?;
        let iovec = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len_bytes,
        };
        // SAFETY: the registration's contract protects I/O on the buffer;
        // the ring is disabled and never enabled, so no fixed-buffer read
        // or write can be submitted and the kernel never touches the
        // memory (see the module docs). The pages stay allocated while
        // pinned even if the caller unmaps them.
        unsafe { ring.submitter().register_buffers(&[iovec]) }?;
        Ok(PinnedPages { ring })
    }

    /// Unpins now and says whether the kernel took the pin off (it does at
    /// once when no request uses the buffer, which none can here).
    pub fn unpin(self) -> io::Result<()> {
        self.ring.submitter().unregister_buffers()
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        // Explicitly, rather than with the ring's teardown, which the
        // kernel runs later from a worker: the caller expects the pages
        // unpinned when this returns.
        let _ = self.ring.submitter().unregister_buffers();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_unpins_populated_memory() {
        let mut buf = vec![1u8; 64 << 10];
        let pin = PinnedPages::pin(buf.as_mut_ptr() as u64, buf.len()).unwrap();
        pin.unpin().unwrap();
        // Pinning twice at once is fine too (two registrations).
        let a = PinnedPages::pin(buf.as_mut_ptr() as u64, buf.len()).unwrap();
        let b = PinnedPages::pin(buf.as_mut_ptr() as u64, buf.len()).unwrap();
        drop((a, b));
        assert!(buf.iter().all(|&b| b == 1));
    }
}
