//! Stall accounting: a store that takes a known time per read shows up as
//! that much waiting of the thread that faulted, as "some" stall, and as
//! "full" only when every vCPU waited.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::Instant;
use swap::engine::{StallStats, SwapUnit};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;
const READ_DELAY_US: u64 = 20_000;

/// Fills 32 chunks under a limit of 4, then reads 16 of them back in one
/// thread with every store read taking `READ_DELAY_US`: returns the stall
/// figures' change, the store faults it took, and the wall time between
/// the two snapshots.
fn slow_reads(vcpus: u32) -> (StallStats, StallStats, u64, u64) {
    let store = VecStore::new(CHUNK as usize);
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.vcpus = vcpus;
    cfg.mem_limit_bytes = Some(8 * MB);
    let g = start_guest(64 * MB, store.clone(), cfg);
    let base = g.base();
    std::thread::spawn(move || {
        for c in 0..32 {
            fill(base + c * CHUNK, CHUNK, c as u8 + 1);
        }
    })
    .join()
    .unwrap();
    // The fill's last wait is recorded by its fault thread after the wake,
    // so it can still be open here, and would overlap the reads' first
    // wait (a "full" stall of two vCPUs that no two threads had). An open
    // wait grows "some" as time passes: wait until it stops growing.
    let mut some_us = g.engine().stats().stall.some_us;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let now_us = g.engine().stats().stall.some_us;
        if now_us == some_us {
            break;
        }
        some_us = now_us;
    }
    store.read_delay_us.store(READ_DELAY_US, Ordering::Relaxed);
    let before = g.engine().stats();
    let started = Instant::now();
    std::thread::spawn(move || {
        for c in 0..16 {
            assert!(all_equal(base + c * CHUNK, CHUNK, c as u8 + 1), "chunk {c}");
        }
    })
    .join()
    .unwrap();
    let after = g.engine().stats();
    let between_us = started.elapsed().as_micros() as u64;
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
    let store_faults = after.faults.store - before.faults.store;
    (before.stall, after.stall, store_faults, between_us)
}

#[test]
fn a_slow_store_is_stall_of_the_thread_that_waits_for_it() {
    let (before, after, store_faults, between_us) = slow_reads(2);
    println!("store faults {store_faults}, {before:?} -> {after:?}, {between_us} us between");
    assert!(
        store_faults >= 8,
        "the reads came from the store: {store_faults}"
    );
    let least_us = store_faults * READ_DELAY_US;
    let some_us = after.some_us - before.some_us;
    let store_us = after.by_source_us.store - before.by_source_us.store;
    assert!(
        some_us >= least_us && store_us >= least_us,
        "{store_faults} reads of {READ_DELAY_US} us each: some {some_us} us, store waits {store_us} us"
    );
    assert!(
        some_us <= between_us + 1_000,
        "stall counts only waiting time: {some_us} us within {between_us} us"
    );
    assert_eq!(after.vcpus, 2);
    assert_eq!(
        after.full_us, before.full_us,
        "one thread of two vCPUs waited: never the whole guest"
    );
}

#[test]
fn with_one_vcpu_every_stall_is_full() {
    let (before, after, store_faults, _) = slow_reads(1);
    assert!(store_faults >= 8, "{store_faults}");
    let some_us = after.some_us - before.some_us;
    let full_us = after.full_us - before.full_us;
    assert!(some_us >= store_faults * READ_DELAY_US, "{some_us}");
    assert_eq!(some_us, full_us, "one vCPU waiting is the whole guest");
}
