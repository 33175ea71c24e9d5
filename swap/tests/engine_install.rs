//! The install paths a host forces on the engine, forced here rather than
//! left to chance: restore buffers that are not huge (a host out of huge
//! pages: the small-page fallback) and restore buffers pinned by someone
//! else (device DMA, a deferred unpin after O_DIRECT: the EBUSY retry).

mod common;

use common::*;
use swap::engine::{EngineConfig, SwapUnit};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;
const CHUNKS: u64 = 12;

/// Fills every chunk, evicts them all, reads them back (checking every
/// byte), writes them again and does it once more, so that chunks mapped
/// by whichever pages the install gave are evicted and restored too.
fn round_trips(config: EngineConfig) -> (Guest, swap::engine::SwapStats) {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(CHUNKS * CHUNK, store, config);
    let base = g.base();
    for round in 0..2u8 {
        std::thread::spawn(move || {
            (0..CHUNKS).for_each(|c| fill(base + c * CHUNK, CHUNK, c as u8 + 1 + 16 * round))
        })
        .join()
        .unwrap();
        let report = g.engine().evict_all().unwrap();
        assert_eq!(report.written_units, CHUNKS, "round {round}: {report:?}");
        std::thread::spawn(move || {
            for c in 0..CHUNKS {
                assert!(
                    all_equal(base + c * CHUNK, CHUNK, c as u8 + 1 + 16 * round),
                    "round {round}: chunk {c}"
                );
            }
        })
        .join()
        .unwrap();
    }
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
    let stats = g.engine().stats();
    (g, stats)
}

#[test]
fn restores_take_the_small_page_fallback_when_no_buffer_is_huge() {
    let (g, stats) = round_trips(EngineConfig {
        hooks: std::sync::Arc::new(swap::engine::BufferKnobs {
            small_restore_buffers: true,
            ..Default::default()
        }),
        ..config(SwapUnit::Huge2M)
    });
    println!(
        "small buffers: restored huge {} small {}, faults {:?}",
        stats.restored_huge, stats.restored_split, stats.faults
    );
    assert_eq!(stats.faults.store, 2 * CHUNKS);
    // Every install: the first touch of each chunk (a zero fill) and the
    // two restores from the store.
    assert_eq!(stats.faults.zero, CHUNKS);
    assert_eq!(stats.restored_huge, 0, "no restore may claim a huge page");
    assert_eq!(stats.restored_split, 3 * CHUNKS);
    // The host maps the restored chunks with small pages, as the stats say.
    let (huge_bytes, rss_bytes) = common::smaps::huge_and_rss_bytes(g.base(), g.len());
    assert_eq!(rss_bytes, CHUNKS * CHUNK, "every chunk resident");
    assert_eq!(
        huge_bytes, 0,
        "restored chunks mapped huge: {huge_bytes} bytes"
    );
}

#[test]
fn huge_restore_buffers_are_installed_huge() {
    // The control for the test above: the same run without the knob
    // installs huge pages, so the zero above is the knob's doing.
    let (_g, stats) = round_trips(config(SwapUnit::Huge2M));
    println!(
        "default buffers: restored huge {} small {}",
        stats.restored_huge, stats.restored_split
    );
    assert_eq!(stats.faults.store, 2 * CHUNKS);
    assert!(
        stats.restored_huge > 0,
        "no huge install at all: THP unavailable? {stats:?}"
    );
}

#[test]
fn installs_wait_out_pinned_restore_buffers() {
    let (_g, stats) = round_trips(EngineConfig {
        hooks: std::sync::Arc::new(swap::engine::BufferKnobs {
            pin_restore_buffers_us: Some(2000),
            ..Default::default()
        }),
        ..config(SwapUnit::Huge2M)
    });
    println!(
        "pinned buffers: {} EBUSY retries over {} restores",
        stats.install_busy_retries, stats.faults.store
    );
    assert_eq!(stats.faults.store, 2 * CHUNKS);
    assert!(
        stats.install_busy_retries >= stats.faults.store + stats.faults.zero,
        "every install met a pinned buffer at least once: {} retries for {} installs",
        stats.install_busy_retries,
        stats.faults.store + stats.faults.zero
    );
}
