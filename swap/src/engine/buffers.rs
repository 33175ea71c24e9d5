//! Restore buffers: unregistered anonymous memory the fault service fills
//! (from the store, from the parking area, or left zero) before installing
//! it in the guest.
//!
//! Two modes:
//! - `Thp` (2 MiB units on anonymous memory): each buffer is a 2 MiB aligned
//!   THP, moved into the guest with UFFDIO_MOVE, so it leaves the pool empty
//!   and is refilled by touching it (a fresh THP is zero, which is also the
//!   zero-fill path). Hugeness is checked with MADV_COLLAPSE on the touched
//!   buffer: it returns at once for a PMD-mapped range and otherwise tries
//!   to build one; if that fails the buffer is fully touched and counted as
//!   split when used. Chosen over reading /proc/self/smaps (one file read
//!   per buffer) or pagemap+kpageflags (needs root).
//! - `Reusable` (hugetlb and 4 KiB units): buffers are UFFDIO_COPY sources;
//!   they stay populated and go straight back to the pool.
//!
//! Buffers are never registered with the userfaultfd, so any thread may
//! touch them.

use std::sync::{Condvar, Mutex};

use super::mapping::{AnonMapping, RawRange, HUGE_PAGE_BYTES, PAGE_BYTES};

/// How the pool's buffers are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// THP buffers consumed by UFFDIO_MOVE.
    Thp,
    /// Copy sources, reused as they are.
    Reusable,
}

/// A buffer taken from the pool. Give it back with [`BufferPool::put_moved`]
/// or [`BufferPool::put_used`].
#[derive(Debug)]
pub struct Buffer {
    index: usize,
    /// Address of the buffer.
    pub addr: u64,
    /// The buffer is backed by one huge page.
    pub huge: bool,
}

struct Lists {
    ready: Vec<(usize, bool)>,
    empty: Vec<usize>,
}

/// A fixed set of unit-sized buffers.
pub struct BufferPool {
    mapping: AnonMapping,
    buf_bytes: u64,
    mode: PoolMode,
    lists: Mutex<Lists>,
    refill_wanted: Condvar,
}

impl BufferPool {
    /// Maps `count` buffers of `buf_bytes`.
    pub fn new(count: usize, buf_bytes: u64, mode: PoolMode) -> std::io::Result<BufferPool> {
        let count = count.max(1);
        let mapping = AnonMapping::new(count as u64 * buf_bytes)?;
        match mode {
            PoolMode::Thp => mapping.range().advise_hugepage(0, mapping.range().len())?,
            PoolMode::Reusable => {}
        }
        let pool = BufferPool {
            mapping,
            buf_bytes,
            mode,
            lists: Mutex::new(Lists {
                ready: Vec::new(),
                empty: (0..count).collect(),
            }),
            refill_wanted: Condvar::new(),
        };
        Ok(pool)
    }

    fn range(&self) -> &RawRange {
        self.mapping.range()
    }

    /// Bytes per buffer.
    pub fn buf_bytes(&self) -> u64 {
        self.buf_bytes
    }

    /// The buffer's memory, for filling or reading.
    pub fn raw(&self) -> &RawRange {
        self.range()
    }

    /// Offset of a buffer within [`BufferPool::raw`].
    pub fn offset_of(&self, buf: &Buffer) -> u64 {
        buf.index as u64 * self.buf_bytes
    }

    /// Populates buffer `index`; returns whether it is one huge page.
    fn fill(&self, index: usize) -> bool {
        let offset = index as u64 * self.buf_bytes;
        match self.mode {
            PoolMode::Reusable => {
                self.range().touch(offset, self.buf_bytes);
                false
            }
            PoolMode::Thp => {
                // The first touch of a MADV_HUGEPAGE range allocates a THP
                // when the kernel has one; MADV_COLLAPSE confirms (cheaply
                // when it already is) or builds one.
                self.range().touch(offset, PAGE_BYTES);
                if self.buf_bytes == HUGE_PAGE_BYTES
                    && self.range().collapse(offset, self.buf_bytes).is_ok()
                {
                    return true;
                }
                // Not huge: populate every page so a move leaves no hole.
                self.range().touch(offset, self.buf_bytes);
                false
            }
        }
    }

    /// Takes a filled buffer, filling one inline when none is ready.
    pub fn take(&self) -> Buffer {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((index, huge)) = lists.ready.pop() {
                if lists.ready.is_empty() {
                    self.refill_wanted.notify_all();
                }
                return Buffer {
                    index,
                    addr: self.range().base() + index as u64 * self.buf_bytes,
                    huge,
                };
            }
            if let Some(index) = lists.empty.pop() {
                drop(lists);
                let huge = self.fill(index);
                return Buffer {
                    index,
                    addr: self.range().base() + index as u64 * self.buf_bytes,
                    huge,
                };
            }
            // Every buffer is in use by another thread: wait for one.
            lists = self
                .refill_wanted
                .wait(lists)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Returns a buffer whose pages were moved away (now empty).
    pub fn put_moved(&self, buf: Buffer) {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        lists.empty.push(buf.index);
        self.refill_wanted.notify_all();
    }

    /// Returns a buffer that still holds its pages. THP buffers are
    /// discarded (they must come back zero); reusable ones are ready.
    pub fn put_used(&self, buf: Buffer) {
        match self.mode {
            PoolMode::Thp => {
                let _ = self.range().discard(self.offset_of(&buf), self.buf_bytes);
                self.put_moved(buf);
            }
            PoolMode::Reusable => {
                let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
                lists.ready.push((buf.index, buf.huge));
                self.refill_wanted.notify_all();
            }
        }
    }

    /// Refills empty buffers until all are ready or `stop` says so; waits
    /// up to `wait` for work. Runs on the refill thread.
    pub fn refill_some(&self, wait: std::time::Duration) {
        let index = {
            let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
            if lists.empty.is_empty() {
                lists = self
                    .refill_wanted
                    .wait_timeout(lists, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            match lists.empty.pop() {
                Some(index) => index,
                None => return,
            }
        };
        let huge = self.fill(index);
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        lists.ready.push((index, huge));
        self.refill_wanted.notify_all();
    }
}
