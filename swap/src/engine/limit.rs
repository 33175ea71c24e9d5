//! The memory limit: accounting of units that hold guest memory, and the
//! background evictor that keeps some headroom below the limit so faults
//! rarely have to evict themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::stats::bump;

const NO_LIMIT: u64 = u64::MAX;

/// Counts units in `Resident`, `Staged`, `Loading` and `Evicting`.
pub struct Limiter {
    limit_units: AtomicU64,
    held_units: AtomicU64,
    held_units_max: AtomicU64,
    kick: Mutex<bool>,
    kicked: Condvar,
}

impl Limiter {
    /// A limiter with the limit in units (`None`: unlimited).
    pub fn new(limit_units: Option<u64>) -> Limiter {
        Limiter {
            limit_units: AtomicU64::new(limit_units.unwrap_or(NO_LIMIT)),
            held_units: AtomicU64::new(0),
            held_units_max: AtomicU64::new(0),
            kick: Mutex::new(false),
            kicked: Condvar::new(),
        }
    }

    /// Changes the limit (at run time) and wakes the background evictor.
    pub fn set_limit_units(&self, limit_units: Option<u64>) {
        self.limit_units
            .store(limit_units.unwrap_or(NO_LIMIT), Ordering::Release);
        self.kick();
    }

    /// The limit in units, if any.
    pub fn limit_units(&self) -> Option<u64> {
        let l = self.limit_units.load(Ordering::Acquire);
        (l != NO_LIMIT).then_some(l)
    }

    /// Units the background evictor keeps free below the limit:
    /// max(2 units, 1/32 of the limit).
    pub fn headroom_units(&self) -> u64 {
        self.limit_units().map_or(0, |l| (l / 32).max(2).min(l / 2))
    }

    /// True when memory held is within two headrooms of the limit: from
    /// here on restores are paired with evictions.
    pub fn near_limit(&self) -> bool {
        self.limit_units()
            .is_some_and(|limit| self.held_units() + 2 * self.headroom_units() >= limit)
    }

    /// Units holding memory now.
    pub fn held_units(&self) -> u64 {
        self.held_units.load(Ordering::Acquire)
    }

    /// Largest [`Limiter::held_units`] seen.
    pub fn held_units_max(&self) -> u64 {
        self.held_units_max.load(Ordering::Acquire)
    }

    /// Claims one unit if that stays within the limit.
    pub fn try_reserve(&self) -> bool {
        let limit = self.limit_units.load(Ordering::Acquire);
        let claimed = self
            .held_units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < limit).then_some(held + 1)
            });
        match claimed {
            Ok(held) => {
                self.held_units_max.fetch_max(held + 1, Ordering::AcqRel);
                if limit != NO_LIMIT && held + 1 + self.headroom_units() > limit {
                    self.kick();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Claims one unit regardless of the limit (nothing could be evicted).
    pub fn force_reserve(&self) {
        let held = self.held_units.fetch_add(1, Ordering::AcqRel) + 1;
        self.held_units_max.fetch_max(held, Ordering::AcqRel);
    }

    /// Gives back one unit (it left memory).
    pub fn release(&self) {
        self.held_units.fetch_sub(1, Ordering::AcqRel);
    }

    /// Units to evict to get back to the limit minus headroom.
    pub fn excess_units(&self) -> u64 {
        match self.limit_units() {
            Some(limit) => self
                .held_units()
                .saturating_sub(limit.saturating_sub(self.headroom_units())),
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

/// Body of the background evictor thread: whenever memory held exceeds the
/// limit minus headroom, evict the policy's victims in batches.
/// Reserves one unit of memory, evicting first when at the limit.
pub(crate) fn claim_memory(s: &super::Shared) {
    if s.limiter.try_reserve() {
        return;
    }
    bump(&s.counters.evict_waits);
    loop {
        let released = super::evict::evict_for_room(s, 1);
        if s.limiter.try_reserve() {
            return;
        }
        if (released == 0 && super::evict::nothing_in_flight(s)) || s.stopping() {
            // Nothing can be evicted (all pinned, or the limit is below
            // what is in use by in-flight restores): go over rather than
            // deadlock the guest.
            s.limiter.force_reserve();
            return;
        }
        if released == 0 {
            std::thread::yield_now();
        }
    }
}

pub(crate) fn run_background_evictor(s: &super::Shared) {
    while !s.stopping() {
        s.limiter.wait_for_work(Duration::from_millis(50));
        while !s.stopping() {
            let excess = s.limiter.excess_units();
            if excess == 0 {
                break;
            }
            let want = (excess as usize).min(s.batch_units);
            if super::evict::evict_for_room(s, want) == 0 {
                // Nothing evictable right now (all pinned or in flight).
                std::thread::sleep(Duration::from_millis(1));
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit() {
        let l = Limiter::new(Some(4));
        assert!((0..4).all(|_| l.try_reserve()));
        assert!(!l.try_reserve());
        assert_eq!(l.excess_units(), 2, "headroom is 2 units");
        l.release();
        assert!(l.try_reserve());
        l.set_limit_units(None);
        assert!(l.try_reserve());
        assert_eq!(l.held_units_max(), 5);
        assert!(!l.near_limit(), "no limit");
        l.set_limit_units(Some(32));
        assert!(!l.near_limit(), "5 + 2 * 2 < 32");
        l.set_limit_units(Some(9));
        assert!(l.near_limit(), "5 + 2 * 2 >= 9");
    }
}
