//! Restore buffers: memory the fault service fills (from the store, from
//! the parking area, or left zero) before installing it in the guest.
//!
//! Two modes:
//! - `Thp` (2 MiB units on anonymous memory): each buffer is a 2 MiB aligned
//!   THP, moved into the guest with UFFDIO_MOVE, so it leaves the pool empty
//!   and is refilled by touching it (a fresh THP is zero, which is also the
//!   zero-fill path). Hugeness is checked with `PAGEMAP_SCAN` on the
//!   touched buffer (a page-table walk); only the refill thread, when the
//!   first touch did not get a huge page, tries MADV_COLLAPSE to build one.
//!   A fault thread filling a buffer inline never calls MADV_COLLAPSE:
//!   it drains every CPU's LRU batches through their workqueues
//!   (`lru_add_drain_all`) and waits for all of them, so one CPU whose
//!   kworkers are starved held a fault for over a minute (the fuzz
//!   target's hang report: dmesg showed "workqueue lockup - pool cpus=0
//!   stuck for 34s" at the same second, with the refill thread and a fault
//!   thread both in `madvise_collapse` -> `__lru_add_drain_all`). A buffer
//!   that is not huge is fully touched and counted as split when used.
//!   Without `PAGEMAP_SCAN` (kernels before 6.7) only the refill thread's
//!   MADV_COLLAPSE tells, and inline fills count as split.
//! - `Reusable` (hugetlb and 4 KiB units): buffers are UFFDIO_COPY sources;
//!   they stay populated and go straight back to the pool.
//!
//! The pool's own buffers are never registered with the userfaultfd, so any
//! thread may touch them.
//!
//! In `Thp` mode the pool also keeps *recycled* buffers: huge pages of
//! evicted units whose content is no longer needed, still sitting in their
//! parking slot (see the `recycle` module, which decides what may be
//! recycled and how they are used). The pool only holds their slot
//! numbers: *raw* as evicted, then *cleared* (zeroed) by the refill
//! thread, which clears raw pages before it fills any fresh buffer.
//!
//! Bound: the idle buffers (fresh ones ready, recycled ones, and those the
//! refill thread is filling or clearing) never exceed the pool's count, so
//! recycling holds no more host memory than the pre-touched pool did
//! before it.

use std::sync::{Condvar, Mutex};

use crate::index::ParkingSlot;
use guestmem::addr::{Hva, RegionOffset};
use guestmem::host::{AnonMapping, PagemapScanner, RawRange, HUGE_PAGE_BYTES, PAGE_BYTES};

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
    pub addr: Hva,
    /// The buffer is backed by one huge page.
    pub huge: bool,
}

/// Work for the refill thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefillJob {
    /// Clear the recycled page in this parking slot, then
    /// [`BufferPool::finish_clear`] (or [`BufferPool::abandon_clear`]).
    Clear(ParkingSlot),
    /// Fill this empty fresh buffer ([`BufferPool::fill_job`]).
    Fill(usize),
}

struct Lists {
    ready: Vec<(usize, bool)>,
    empty: Vec<usize>,
    /// Recycled pages as evicted (parking slots).
    raw: Vec<ParkingSlot>,
    /// Recycled pages the refill thread has cleared (parking slots).
    cleared: Vec<ParkingSlot>,
    /// Buffers the refill thread is filling or clearing (idle, not yet
    /// ready).
    busy: usize,
    idle_max: usize,
}

impl Lists {
    /// Buffers holding memory that no restore is using.
    fn idle(&self) -> usize {
        self.ready.len() + self.raw.len() + self.cleared.len() + self.busy
    }

    fn note_idle(&mut self) {
        self.idle_max = self.idle_max.max(self.idle());
    }
}

/// A fixed set of unit-sized buffers.
pub struct BufferPool {
    mapping: AnonMapping,
    buf_bytes: u64,
    count: usize,
    mode: PoolMode,
    lists: Mutex<Lists>,
    refill_wanted: Condvar,
    /// Tells a huge buffer from a small one without MADV_COLLAPSE (`None`:
    /// not `Thp` mode, or a kernel without `PAGEMAP_SCAN`).
    pagemap: Option<PagemapScanner>,
}

/// Who fills a buffer, which decides whether MADV_COLLAPSE may be tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filler {
    /// The refill thread: may wait for every CPU (see the module docs).
    Refill,
    /// A fault thread, inline: must not.
    Fault,
}

impl BufferPool {
    /// Maps `count` buffers of `buf_bytes`.
    pub fn new(count: usize, buf_bytes: u64, mode: PoolMode) -> std::io::Result<BufferPool> {
        let count = count.max(1);
        let mapping = AnonMapping::new(count as u64 * buf_bytes)?;
        // Restore buffers hold guest memory read (and decrypted) from the
        // store: kept out of core dumps like the parking area.
        mapping
            .range()
            .dont_dump(RegionOffset::ZERO, mapping.range().len())?;
        match mode {
            PoolMode::Thp => mapping
                .range()
                .advise_hugepage(RegionOffset::ZERO, mapping.range().len())?,
            PoolMode::Reusable => {}
        }
        let pool = BufferPool {
            mapping,
            buf_bytes,
            count,
            mode,
            lists: Mutex::new(Lists {
                ready: Vec::new(),
                empty: (0..count).collect(),
                raw: Vec::new(),
                cleared: Vec::new(),
                busy: 0,
                idle_max: 0,
            }),
            refill_wanted: Condvar::new(),
            pagemap: match mode {
                PoolMode::Thp => PagemapScanner::open().ok(),
                PoolMode::Reusable => None,
            },
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

    /// Most buffers ever idle at once (fresh and recycled); never above
    /// [`BufferPool::bound`].
    pub fn idle_max(&self) -> usize {
        self.lock().idle_max
    }

    /// Advises the buffers `MADV_NOHUGEPAGE` (the `small_restore_buffers`
    /// test hook): they fill with small pages and every restore takes the
    /// small-page path.
    pub fn refuse_huge_pages(&self) -> std::io::Result<()> {
        self.range()
            .advise_nohugepage(RegionOffset::ZERO, self.range().len())
    }

    /// The pool's size: the bound on idle buffers.
    pub fn bound(&self) -> usize {
        self.count
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The buffer's memory, for filling or reading.
    pub fn raw(&self) -> &RawRange {
        self.range()
    }

    /// Offset of a buffer within [`BufferPool::raw`].
    pub fn offset_of(&self, buf: &Buffer) -> RegionOffset {
        RegionOffset::new(buf.index as u64 * self.buf_bytes)
    }

    /// Populates buffer `index`; returns whether it is one huge page.
    fn fill(&self, index: usize, filler: Filler) -> bool {
        let offset = RegionOffset::new(index as u64 * self.buf_bytes);
        match self.mode {
            PoolMode::Reusable => {
                self.range().touch(offset, self.buf_bytes);
                false
            }
            PoolMode::Thp => {
                // The first touch of a MADV_HUGEPAGE range allocates a THP
                // when the kernel has one; PAGEMAP_SCAN confirms it, and
                // only the refill thread tries MADV_COLLAPSE to build one
                // when it did not.
                self.range().touch(offset, PAGE_BYTES);
                if self.buf_bytes == HUGE_PAGE_BYTES {
                    let huge = self.pagemap.as_ref().is_some_and(|scanner| {
                        scanner
                            .is_huge(self.range(), offset, self.buf_bytes)
                            .unwrap_or(false)
                    });
                    if huge
                        || (filler == Filler::Refill
                            && self.range().collapse(offset, self.buf_bytes).is_ok())
                    {
                        return true;
                    }
                }
                // Not huge: populate every page so a move leaves no hole.
                self.range().touch(offset, self.buf_bytes);
                false
            }
        }
    }

    /// Takes a filled buffer, filling one inline when none is ready (without
    /// MADV_COLLAPSE: see the module docs).
    pub fn take(&self) -> Buffer {
        let mut lists = self.lock();
        loop {
            if let Some((index, huge)) = lists.ready.pop() {
                // The refill thread may be below its target now.
                self.refill_wanted.notify_all();
                return Buffer {
                    index,
                    addr: Hva::new(self.range().base() + index as u64 * self.buf_bytes),
                    huge,
                };
            }
            if let Some(index) = lists.empty.pop() {
                drop(lists);
                let huge = self.fill(index, Filler::Fault);
                return Buffer {
                    index,
                    addr: Hva::new(self.range().base() + index as u64 * self.buf_bytes),
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

    /// Takes a ready fresh buffer, if one is ready (never fills inline).
    pub fn try_take_ready(&self) -> Option<Buffer> {
        let mut lists = self.lock();
        let (index, huge) = lists.ready.pop()?;
        self.refill_wanted.notify_all();
        Some(Buffer {
            index,
            addr: Hva::new(self.range().base() + index as u64 * self.buf_bytes),
            huge,
        })
    }

    /// Keeps the recycled page in parking slot `slot` (raw) if that stays
    /// within the bound; `false`: the pool is full and the caller frees the
    /// page.
    pub fn offer_recycled(&self, slot: ParkingSlot) -> bool {
        let mut lists = self.lock();
        if self.mode != PoolMode::Thp || lists.idle() >= self.count {
            return false;
        }
        lists.raw.push(slot);
        lists.note_idle();
        self.refill_wanted.notify_all();
        true
    }

    /// Takes a recycled page the refill thread has cleared.
    pub fn take_cleared(&self) -> Option<ParkingSlot> {
        let slot = self.lock().cleared.pop()?;
        self.refill_wanted.notify_all();
        Some(slot)
    }

    /// Takes a recycled page not cleared yet.
    pub fn take_raw(&self) -> Option<ParkingSlot> {
        self.lock().raw.pop()
    }

    /// Returns a buffer whose pages were moved away (now empty).
    pub fn put_moved(&self, buf: Buffer) {
        let mut lists = self.lock();
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
                let mut lists = self.lock();
                lists.ready.push((buf.index, buf.huge));
                self.refill_wanted.notify_all();
            }
        }
    }

    /// The refill thread's next job, waiting up to `wait` for one: clear a
    /// raw recycled page (always: it is memory already held, and cheaper
    /// than a fresh page), else fill an empty buffer while fewer than
    /// `target` buffers are ready for use (fresh ready plus cleared) and
    /// the idle buffers are below the bound.
    pub fn next_refill_job(&self, wait: std::time::Duration, target: usize) -> Option<RefillJob> {
        let job = |l: &mut Lists| {
            if let Some(slot) = l.raw.pop() {
                return Some(RefillJob::Clear(slot));
            }
            let usable = l.ready.len() + l.cleared.len() + l.busy;
            if usable < target && l.idle() < self.count {
                return l.empty.pop().map(RefillJob::Fill);
            }
            None
        };
        let mut lists = self.lock();
        let mut next = job(&mut lists);
        if next.is_none() {
            lists = self
                .refill_wanted
                .wait_timeout(lists, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            next = job(&mut lists);
        }
        if next.is_some() {
            // Counted as idle while the job runs, so recycling cannot push
            // the pool over its bound meanwhile.
            lists.busy += 1;
            lists.note_idle();
        }
        next
    }

    /// Runs a [`RefillJob::Fill`]: fills the buffer and makes it ready.
    pub fn fill_job(&self, index: usize) {
        let huge = self.fill(index, Filler::Refill);
        let mut lists = self.lock();
        lists.busy -= 1;
        lists.ready.push((index, huge));
        self.refill_wanted.notify_all();
    }

    /// Ends a [`RefillJob::Clear`]: the page is cleared and ready for use.
    pub fn finish_clear(&self, slot: ParkingSlot) {
        let mut lists = self.lock();
        lists.busy -= 1;
        lists.cleared.push(slot);
        self.refill_wanted.notify_all();
    }

    /// Ends a [`RefillJob::Clear`] whose page was not kept (the caller
    /// freed it).
    pub fn abandon_clear(&self) {
        self.lock().busy -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn recycled_and_fresh_buffers_share_the_bound() {
        let pool = BufferPool::new(3, HUGE_PAGE_BYTES, PoolMode::Thp).unwrap();
        let wait = Duration::from_millis(1);
        // One fresh buffer ready, then recycled pages up to the bound.
        let Some(RefillJob::Fill(index)) = pool.next_refill_job(wait, 1) else {
            panic!("a fill is wanted below the target");
        };
        pool.fill_job(index);
        assert_eq!(pool.next_refill_job(wait, 1), None, "target reached");
        assert!(pool.offer_recycled(ParkingSlot::new(7)));
        assert!(pool.offer_recycled(ParkingSlot::new(8)));
        assert!(
            !pool.offer_recycled(ParkingSlot::new(9)),
            "bound of 3 reached"
        );
        // Raw pages are cleared before anything else; while one is being
        // cleared it still counts against the bound.
        assert_eq!(
            pool.next_refill_job(wait, 3),
            Some(RefillJob::Clear(ParkingSlot::new(8)))
        );
        assert!(!pool.offer_recycled(ParkingSlot::new(9)));
        pool.finish_clear(ParkingSlot::new(8));
        assert_eq!(pool.take_cleared(), Some(ParkingSlot::new(8)));
        assert_eq!(pool.take_raw(), Some(ParkingSlot::new(7)));
        assert!(pool.try_take_ready().is_some());
        assert_eq!(pool.take_raw(), None);
        assert_eq!(pool.idle_max(), 3);
        assert!(pool.offer_recycled(ParkingSlot::new(9)), "room again");
        assert_eq!(
            pool.next_refill_job(wait, 3),
            Some(RefillJob::Clear(ParkingSlot::new(9)))
        );
        pool.abandon_clear();
        assert_eq!(pool.idle_max(), 3);
    }
}
