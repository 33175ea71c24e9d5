//! The background evictor: whenever memory held exceeds the limit minus
//! headroom, evict the policy's victims in batches, so that faults rarely
//! have to evict for themselves.

use std::time::Duration;

use super::{EvictService, PAGE_BATCH};

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
            let want = background_want_pages(
                excess,
                limiter.headroom_pages(),
                evictor.batch_units as u64 * limiter.unit_pages(),
            );
            if evictor.evict_for_room(want) == 0 {
                // Nothing evictable right now (all pinned or in flight).
                std::thread::sleep(Duration::from_millis(1));
                break;
            }
        }
    }
}

/// Pages one background pass frees, for `excess` pages over the limit
/// minus headroom: at least a page batch (within the headroom), at most a
/// unit batch.
///
/// Why at least a page batch: at the limit every fault claims a page and
/// pushes memory one page over, so a pass that frees only the excess
/// evicts one page per fault, and each page then costs its own store
/// write and its own discard of the parking page (with a TLB shootdown
/// of every vCPU). The key-value workload under `auto` made 57,000
/// madvise and 163,000 io_uring_enter calls for 124,000 page evictions
/// that way. Freeing a batch below the mark leaves the next faults room
/// and writes the batch in one submission; the kernel's kswapd does the
/// same between its low and high watermarks. Whole units are at least a
/// batch anyway (512 pages for a 2 MiB unit).
fn background_want_pages(excess: u64, headroom_pages: u64, unit_batch_pages: u64) -> u64 {
    let floor = (PAGE_BATCH as u64).min(headroom_pages);
    excess.max(floor).min(unit_batch_pages.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_frees_at_least_a_page_batch_within_the_headroom() {
        assert_eq!(background_want_pages(1, 1024, 4096), PAGE_BATCH as u64);
        assert_eq!(background_want_pages(700, 1024, 4096), 700);
        assert_eq!(
            background_want_pages(10_000, 1024, 4096),
            4096,
            "a pass never frees more than a unit batch"
        );
        assert_eq!(
            background_want_pages(1, 2, 256),
            2,
            "a small limit's headroom bounds the batch"
        );
        assert_eq!(background_want_pages(1, 1024, 0), 1, "never nothing");
    }
}
