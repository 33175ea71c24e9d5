//! The engine over the real stores: the O_DIRECT file store (io_uring) and
//! the compressed memory store, including faults that race the writes
//! (parked pages pinned by O_DIRECT are handed back by copy).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::smaps::huge_and_rss_bytes;
use common::*;
use swap::engine::SwapUnit;
use swap::store::{Codec, FileStore, MemStore, SharedStore};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

fn round_trip(store: SharedStore, what: &str) {
    let g = start_guest(128 * MB, store, config(SwapUnit::Huge2M));
    let base = g.base();
    let chunks = 64u64;
    std::thread::spawn(move || {
        for c in 0..chunks {
            fill(base + c * CHUNK, CHUNK, c as u8 + 1);
            put(base + c * CHUNK + 4096, c * 7919);
        }
    })
    .join()
    .unwrap();
    let t = Instant::now();
    let report = g.engine().evict_all().unwrap();
    let out = t.elapsed();
    assert_eq!(report.written_units, chunks);
    let t = Instant::now();
    std::thread::spawn(move || {
        for c in 0..chunks {
            assert_eq!(get(base + c * CHUNK + 4096), c * 7919);
            assert!(
                all_equal(base + c * CHUNK + 8192, CHUNK - 8192, c as u8 + 1),
                "chunk {c}"
            );
        }
    })
    .join()
    .unwrap();
    let back = t.elapsed();
    let st = g.engine().stats();
    let (huge, rss) = huge_and_rss_bytes(g.base(), g.len());
    println!(
        "{what}: swap out 128 MiB in {out:?}, back in {back:?} ({} build); faults {:?}; huge {} split {}; AnonHugePages {} of {} MiB; latency p50 {} p99 {} max {} us",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        st.faults, st.restored_huge, st.restored_split, huge / MB, rss / MB, st.fault_latency.p50(), st.fault_latency.p99(), st.fault_latency.max()
    );
    assert_eq!(st.faults.store, chunks);
    assert!(huge * 10 >= rss * 9);
    assert!(g.fatal_messages().is_empty());
}

#[test]
fn file_store_round_trip() {
    let store = match FileStore::temporary(&std::env::temp_dir(), CHUNK as usize, 256 * MB) {
        Ok(store) => store,
        Err(e) => {
            test_resources::skip(
                module_path!(),
                test_resources::Resource::ODirect,
                format!("no O_DIRECT file store in the temporary directory: {e}"),
            );
            return;
        }
    };
    let desc = swap::store::Store::describe(&store);
    round_trip(Arc::new(store), &desc);
}

#[test]
fn mem_zstd_store_round_trip() {
    round_trip(
        Arc::new(MemStore::new(Codec::Zstd, CHUNK as usize, 128, None).unwrap()),
        "mem:zstd",
    );
}

#[test]
fn faults_racing_file_store_writes_keep_every_write() {
    let store = match FileStore::temporary(&std::env::temp_dir(), CHUNK as usize, 256 * MB) {
        Ok(store) => Arc::new(store),
        Err(e) => {
            test_resources::skip(
                module_path!(),
                test_resources::Resource::ODirect,
                format!("no O_DIRECT file store in the temporary directory: {e}"),
            );
            return;
        }
    };
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.batch_units = Some(16);
    let g = start_guest(64 * MB, store, cfg);
    let base = g.base();
    let chunks = 32u64;
    std::thread::spawn(move || (0..chunks).for_each(|c| fill(base + c * CHUNK, CHUNK, 0xc0)))
        .join()
        .unwrap();
    // At least 10 rounds, and on until faults met units whose write was in
    // flight (handed back by a copy) often enough: the race is proven, not
    // hoped for. The cap bounds a run that never meets it (a failure).
    const MIN_WRITING: u64 = 8;
    const MAX_ROUNDS: u64 = 400;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rounds = 0u64;
    while rounds < 10
        || (g.engine().stats().faults.staging_writing < MIN_WRITING
            && rounds < MAX_ROUNDS
            && Instant::now() < deadline)
    {
        rounds += 1;
        let round = rounds;
        // Touch every chunk while the eviction of all of them is written.
        let toucher = std::thread::spawn(move || {
            for c in 0..chunks {
                put(base + c * CHUNK + 8 * round, round);
            }
        });
        g.engine().evict_all().unwrap();
        toucher.join().unwrap();
    }
    std::thread::spawn(move || {
        for c in 0..chunks {
            for round in 1..=rounds {
                assert_eq!(
                    get(base + c * CHUNK + 8 * round),
                    round,
                    "chunk {c} round {round}"
                );
            }
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!(
        "file store race: {rounds} rounds, faults {:?}, written {} units, stale {}",
        st.faults, st.units_written, st.stale_faults
    );
    assert!(g.fatal_messages().is_empty());
    assert!(
        st.faults.staging_writing >= MIN_WRITING,
        "faults met a unit whose write was in flight only {} times in {rounds} rounds (wanted {MIN_WRITING}): the race was not hit",
        st.faults.staging_writing
    );
}
