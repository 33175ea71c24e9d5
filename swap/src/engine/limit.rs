//! The memory limit: accounting of the pages that hold guest memory. The
//! limiter evicts nothing itself: a claim over the limit asks for room
//! through [`MakeRoom`] (the evictor), and the background evictor waits
//! on the limiter's kick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

const NO_LIMIT: u64 = u64::MAX;

/// Counts 4 KiB pages of guest memory held on the host: a whole unit in
/// `Resident`, `Staged`, `Loading` or `Evicting` holds all its pages, a
/// split chunk's page holds one while resident or in flight.
pub struct Limiter {
    limit_pages: AtomicU64,
    held_pages: AtomicU64,
    held_pages_max: AtomicU64,
    /// Pages of one whole unit (512 for 2 MiB chunks, 1 for 4 KiB units).
    unit_pages: u64,
    kick: Mutex<bool>,
    kicked: Condvar,
}

impl Limiter {
    /// A limiter with the limit in pages (`None`: unlimited), for units of
    /// `unit_pages` pages.
    pub fn new(limit_pages: Option<u64>, unit_pages: u64) -> Limiter {
        Limiter {
            limit_pages: AtomicU64::new(limit_pages.unwrap_or(NO_LIMIT)),
            held_pages: AtomicU64::new(0),
            held_pages_max: AtomicU64::new(0),
            unit_pages: unit_pages.max(1),
            kick: Mutex::new(false),
            kicked: Condvar::new(),
        }
    }

    /// Pages of one whole unit.
    pub fn unit_pages(&self) -> u64 {
        self.unit_pages
    }

    /// Changes the limit (at run time) and wakes the background evictor.
    pub fn set_limit_pages(&self, limit_pages: Option<u64>) {
        self.limit_pages
            .store(limit_pages.unwrap_or(NO_LIMIT), Ordering::Release);
        self.kick();
    }

    /// The limit in pages, if any.
    pub fn limit_pages(&self) -> Option<u64> {
        let l = self.limit_pages.load(Ordering::Acquire);
        (l != NO_LIMIT).then_some(l)
    }

    /// Pages the background evictor keeps free below the limit:
    /// max(2 units, 1/32 of the limit), at most half the limit.
    pub fn headroom_pages(&self) -> u64 {
        self.limit_pages()
            .map_or(0, |l| (l / 32).max(2 * self.unit_pages).min(l / 2))
    }

    /// True when memory held is within two headrooms of the limit: from
    /// here on restores are paired with evictions.
    pub fn near_limit(&self) -> bool {
        self.limit_pages()
            .is_some_and(|limit| self.held_pages() + 2 * self.headroom_pages() >= limit)
    }

    /// Pages holding memory now.
    pub fn held_pages(&self) -> u64 {
        self.held_pages.load(Ordering::Acquire)
    }

    /// Largest [`Limiter::held_pages`] seen.
    pub fn held_pages_max(&self) -> u64 {
        self.held_pages_max.load(Ordering::Acquire)
    }

    /// Claims `pages` if that stays within the limit.
    pub fn try_reserve(&self, pages: u64) -> bool {
        let limit = self.limit_pages.load(Ordering::Acquire);
        let claimed = self
            .held_pages
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + pages <= limit).then_some(held + pages)
            });
        match claimed {
            Ok(held) => {
                self.held_pages_max
                    .fetch_max(held + pages, Ordering::AcqRel);
                if limit != NO_LIMIT && held + pages + self.headroom_pages() > limit {
                    self.kick();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Claims `pages` regardless of the limit (nothing could be evicted).
    pub fn force_reserve(&self, pages: u64) {
        let held = self.held_pages.fetch_add(pages, Ordering::AcqRel) + pages;
        self.held_pages_max.fetch_max(held, Ordering::AcqRel);
    }

    /// Gives back `pages` (they left memory).
    pub fn release(&self, pages: u64) {
        self.held_pages.fetch_sub(pages, Ordering::AcqRel);
    }

    /// Pages to evict to get back to the limit minus headroom.
    pub fn excess_pages(&self) -> u64 {
        match self.limit_pages() {
            Some(limit) => self
                .held_pages()
                .saturating_sub(limit.saturating_sub(self.headroom_pages())),
            None => 0,
        }
    }

    /// Wakes the background evictor.
    pub fn kick(&self) {
        *self.kick.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.kicked.notify_all();
    }

    /// Background evictor: waits for a kick or `period`.
    pub fn wait_for_work(&self, period: Duration) {
        let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
        if !*kicked {
            kicked = self
                .kicked
                .wait_timeout(kicked, period)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *kicked = false;
    }
}

/// Frees memory on request: what a claim over the limit asks of the
/// evictor.
pub(crate) trait MakeRoom: Send + Sync {
    /// Evicts until about `pages` pages left memory; returns how many did.
    fn make_room(&self, pages: u64) -> u64;
    /// True when nothing is being evicted or written by anyone (so waiting
    /// for memory to free up would wait forever).
    fn nothing_in_flight(&self) -> bool;
    /// True when the engine stops (a claim then goes over the limit).
    fn stopping(&self) -> bool;
    /// Notes a claim that found no room and waits for an eviction.
    fn claim_waits(&self);
}

impl Limiter {
    /// Reserves `pages` of memory, asking `room` to evict first when at the
    /// limit.
    pub(crate) fn claim(&self, pages: u64, room: &dyn MakeRoom) {
        if self.try_reserve(pages) {
            return;
        }
        room.claim_waits();
        loop {
            let released = room.make_room(pages);
            if self.try_reserve(pages) {
                return;
            }
            if (released == 0 && room.nothing_in_flight()) || room.stopping() {
                // Nothing can be evicted (all pinned, or the limit is below
                // what is in use by in-flight restores): go over rather
                // than deadlock the guest.
                self.force_reserve(pages);
                return;
            }
            if released == 0 {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit() {
        let l = Limiter::new(Some(4), 1);
        assert!((0..4).all(|_| l.try_reserve(1)));
        assert!(!l.try_reserve(1));
        assert_eq!(l.excess_pages(), 2, "headroom is 2 units");
        l.release(1);
        assert!(l.try_reserve(1));
        l.set_limit_pages(None);
        assert!(l.try_reserve(1));
        assert_eq!(l.held_pages_max(), 5);
        assert!(!l.near_limit(), "no limit");
        l.set_limit_pages(Some(32));
        assert!(!l.near_limit(), "5 + 2 * 2 < 32");
        l.set_limit_pages(Some(9));
        assert!(l.near_limit(), "5 + 2 * 2 >= 9");
    }

    #[test]
    fn pages_and_whole_chunks_share_one_limit() {
        let l = Limiter::new(Some(4 * 512), 512);
        assert!((0..3).all(|_| l.try_reserve(512)));
        assert!(
            (0..512).all(|_| l.try_reserve(1)),
            "a chunk's worth of pages"
        );
        assert!(!l.try_reserve(1));
        l.release(1);
        assert!(!l.try_reserve(512), "one page free is no room for a chunk");
        assert!(l.try_reserve(1));
        assert_eq!(l.headroom_pages(), 2 * 512);
    }
}
