//! Working-set estimation by sampling: with an active set known by
//! construction (some chunks touched all the time, the rest never again
//! after they were written), the estimate is that set, the idle chunks
//! end up in the store, and no guest data changes on the way.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use swap::engine::{SwapUnit, WorkingSetConfig};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;
const CHUNKS: u64 = 64;

/// Writes every chunk, then keeps reading `active` of them (one word per
/// page, all the time) while the sampler runs for `run`; returns the stats
/// at the end.
fn sampled(active: u64, run: Duration) -> swap::engine::SwapStats {
    let store = VecStore::new(CHUNK as usize);
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.working_set = Some(WorkingSetConfig {
        units_per_second: 200.0,
        window: Duration::from_millis(200),
        horizon: Duration::from_secs(1),
    });
    let g = start_guest(CHUNKS * CHUNK, store, cfg);
    let base = g.base();
    std::thread::spawn(move || {
        for c in 0..CHUNKS {
            fill(base + c * CHUNK, CHUNK, c as u8 + 1);
        }
    })
    .join()
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let toucher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut passes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for c in CHUNKS - active..CHUNKS {
                    for page in (0..CHUNK).step_by(4096) {
                        // SAFETY: inside the guest mapping the test owns.
                        let byte = unsafe {
                            std::ptr::read_volatile((base + c * CHUNK + page) as *const u8)
                        };
                        assert_eq!(byte, c as u8 + 1, "chunk {c} page {page} changed");
                    }
                }
                passes += 1;
            }
            passes
        })
    };
    let started = Instant::now();
    while started.elapsed() < run {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = g.engine().stats();
    stop.store(true, Ordering::Relaxed);
    let passes = toucher.join().unwrap();
    assert!(passes > 10, "the active set was touched: {passes} passes");
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
    // The idle chunks are intact in the store.
    std::thread::spawn(move || {
        for c in 0..CHUNKS {
            assert!(all_equal(base + c * CHUNK, CHUNK, c as u8 + 1), "chunk {c}");
        }
    })
    .join()
    .unwrap();
    stats
}

#[test]
fn the_estimate_is_the_active_set_and_idle_chunks_leave() {
    let active = 24;
    let stats = sampled(active, Duration::from_secs(3));
    let ws = &stats.working_set;
    println!("{ws:?}, resident {} MiB", stats.resident_bytes / MB);
    assert!(ws.sampling);
    assert!(
        ws.samples >= 100,
        "{} samples in 3 s at 200 a second",
        ws.samples
    );
    assert!(ws.returned > 0 && ws.returned < ws.samples, "{ws:?}");
    let estimate = ws.estimate_bytes.expect("enough samples for an estimate") as f64;
    let want = (active * CHUNK) as f64;
    assert!(
        (estimate - want).abs() <= 0.15 * want,
        "estimate {:.1} MiB, active set {:.0} MiB",
        estimate / MB as f64,
        want / MB as f64
    );
    // Idle samples stayed out: resident memory is the active set, give or
    // take a chunk on its way back.
    let resident_chunks = stats.resident_bytes / CHUNK;
    assert!(
        resident_chunks <= active + 3,
        "{resident_chunks} chunks resident, {active} active"
    );
    assert!(ws.sample_wait_us > 0, "active samples cost waits: {ws:?}");
    assert_eq!(
        ws.cold.idle_10s_bytes, None,
        "no sample is 10 s old after 3 s"
    );
}

#[test]
fn without_sampling_the_figures_say_so() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(8 * CHUNK, store, config(SwapUnit::Huge2M));
    let ws = g.engine().stats().working_set;
    assert!(!ws.sampling);
    assert_eq!(ws.samples, 0);
    assert_eq!(ws.estimate_bytes, None);
}
