//! The background evictor: whenever memory held exceeds the limit minus
//! headroom, evict the policy's victims in batches, so that faults rarely
//! have to evict for themselves.

use std::time::Duration;

use super::EvictService;

/// Body of the background evictor thread.
pub(crate) fn run(evictor: &EvictService) {
    let limiter = &evictor.limiter;
    let life = &evictor.life;
    while !life.stopping() {
        limiter.wait_for_work(Duration::from_millis(50));
        while !life.stopping() {
            let excess = limiter.excess_pages();
            if excess == 0 {
                break;
            }
            let want = excess.min(evictor.batch_units as u64 * limiter.unit_pages());
            if evictor.evict_for_room(want) == 0 {
                // Nothing evictable right now (all pinned or in flight).
                std::thread::sleep(Duration::from_millis(1));
                break;
            }
        }
    }
}
