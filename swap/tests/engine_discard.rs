//! Dropping memory the guest declared free: resident and stored chunks
//! become absent without a write, read back as zero, and the chunks around
//! them keep their data.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::hugetlb::start_hugetlb_guest;
use common::*;
use guestmem::addr::RegionOffset;
use swap::chunk::Tag;
use swap::engine::{DiscardReport, SwapEngine, SwapUnit};
use swap::store::Store;

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

fn discard_drops_whole_units_only(unit: SwapUnit) {
    let store = VecStore::new(unit.bytes() as usize);
    let g = start_guest(32 * MB, store.clone(), config(unit));
    let base = g.base();
    std::thread::spawn(move || (0..16).for_each(|c| fill(base + c * CHUNK, CHUNK, c as u8 + 1)))
        .join()
        .unwrap();
    // Chunks 4..8 go to the store first, so the discard meets both states.
    g.engine()
        .evict_range(RegionOffset::new(4 * CHUNK), 4 * CHUNK)
        .unwrap();
    let used_before = store.used_slots();
    assert!(used_before > 0);
    let resident_before = g.engine().stats().resident_bytes;

    // Chunks [2, 6.5): resident 2..4, stored 4..6, and the first half of
    // stored chunk 6, which only 4 KiB units may drop.
    let report = g
        .engine()
        .discard_range(RegionOffset::new(2 * CHUNK), 4 * CHUNK + CHUNK / 2)
        .unwrap();
    println!("{unit}: {report:?}");
    let per_chunk = CHUNK / unit.bytes();
    let half_chunk = if unit == SwapUnit::Small4K {
        per_chunk / 2
    } else {
        0
    };
    assert_eq!(report.resident_units, 2 * per_chunk);
    assert_eq!(report.stored_units, 2 * per_chunk + half_chunk);
    assert_eq!(
        g.engine().unit_state(RegionOffset::new(2 * CHUNK)).tag(),
        Tag::Absent
    );
    assert_eq!(
        g.engine().unit_state(RegionOffset::new(5 * CHUNK)).tag(),
        Tag::Absent
    );
    assert!(
        store.used_slots() < used_before,
        "store slots of dropped chunks are freed"
    );
    assert!(g.engine().stats().resident_bytes < resident_before);

    std::thread::spawn(move || {
        for c in 0..16u64 {
            let dropped = (2..6).contains(&c);
            let want = if dropped { 0 } else { c as u8 + 1 };
            // With 4 KiB units the first half of chunk 6 was dropped too.
            if unit == SwapUnit::Small4K && c == 6 {
                assert!(all_equal(base + c * CHUNK, CHUNK / 2, 0));
                assert!(all_equal(base + c * CHUNK + CHUNK / 2, CHUNK / 2, want));
                continue;
            }
            assert!(
                all_equal(base + c * CHUNK, CHUNK, want),
                "chunk {c} should read {want}"
            );
        }
    })
    .join()
    .unwrap();
}

#[test]
fn discard_with_2m_units() {
    discard_drops_whole_units_only(SwapUnit::Huge2M);
}

#[test]
fn discard_with_4k_units() {
    discard_drops_whole_units_only(SwapUnit::Small4K);
}

/// Discards racing faults and evictions: a reader restores chunks (clean,
/// write-protected, on every other pass written again) while an evictor
/// takes them away and the discards drop the last two chunks again and
/// again. The test goes on (up to 120 s) until the discards have met each
/// state they must handle: a unit loading, evicting and staged (each
/// waited for), stored and resident; a clean resident one is dropped
/// first, on its own. Every read sees
/// the chunk's data or, for the dropped chunks, zero; at the end nothing is
/// in flight, the dropped chunks read zero, the others their data, and the
/// store's slot count matches the units that hold one (the test store
/// panics on a double free).
fn discards_race_faults_and_evictions(base: u64, engine: &SwapEngine, store: &VecStore) {
    let chunks = RACE_CHUNKS;
    std::thread::spawn(move || {
        (0..chunks).for_each(|c| fill(base + c * CHUNK, CHUNK, c as u8 + 1))
    })
    .join()
    .unwrap();
    engine.evict_all().unwrap();
    // A clean resident chunk first, deterministically (in the race the
    // evictor drops clean chunks again within microseconds): read back
    // from the store write-protected, its slot kept, then discarded.
    std::thread::spawn(move || get(base + 6 * CHUNK))
        .join()
        .unwrap();
    let report = engine
        .discard_range(RegionOffset::new(6 * CHUNK), CHUNK)
        .unwrap();
    assert_eq!(
        (report.resident_units, report.clean_resident_units),
        (1, 1),
        "a chunk read back clean is dropped with its slot: {report:?}"
    );
    // Writes stay in flight long enough for a discard to meet a staged unit.
    store.write_delay_us.store(500, Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    let mut met = DiscardReport::default();
    let started = Instant::now();
    let mut rounds = 0u64;
    let reads = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut reads = 0u64;
            let mut pass = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for c in 0..chunks {
                    let got = get(base + c * CHUNK + 8 * 4096);
                    let want = u64::from_ne_bytes([c as u8 + 1; 8]);
                    assert!(
                        got == want || (c >= 6 && got == 0),
                        "chunk {c} read {got:#x}"
                    );
                    // Written again on even passes, so that the discards
                    // meet these chunks with data (resident, staged or
                    // stored); left as read on odd ones, so that they meet
                    // clean resident chunks too.
                    if c >= 6 && pass.is_multiple_of(2) {
                        put(base + c * CHUNK + 8 * 4096, want);
                    }
                    reads += 1;
                }
                pass += 1;
                // A pass without faults takes nanoseconds; the pause keeps
                // a restored chunk clean long enough for a discard to meet
                // it before the next pass writes it.
                std::thread::sleep(Duration::from_micros(50));
            }
            reads
        });
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                engine
                    .evict_range(RegionOffset::ZERO, chunks * CHUNK)
                    .unwrap();
                // Back to back, the evictor would drop every clean chunk
                // again (without a write) before a discard could meet it.
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        let all_met = |m: &DiscardReport| {
            m.waits_loading > 0
                && m.waits_evicting > 0
                && m.waits_staged > 0
                && m.stored_units > 0
                && m.resident_units > 0
        };
        while rounds < 200 || (!all_met(&met) && started.elapsed() < Duration::from_secs(120)) {
            let report = engine
                .discard_range(RegionOffset::new(6 * CHUNK), 2 * CHUNK)
                .unwrap();
            met.waits_loading += report.waits_loading;
            met.waits_evicting += report.waits_evicting;
            met.waits_staged += report.waits_staged;
            met.stored_units += report.stored_units;
            met.resident_units += report.resident_units;
            met.clean_resident_units += report.clean_resident_units;
            rounds += 1;
            // Back to back, most discards would find the chunks they
            // dropped still absent; a pause lets the reader and the
            // evictor take them through their states again.
            std::thread::sleep(Duration::from_micros(100));
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap()
    });
    println!(
        "discard race: {rounds} rounds in {:.1} s, {reads} reads; discards met {} loading, {} evicting, {} staged, {} stored, {} resident ({} clean)",
        started.elapsed().as_secs_f64(),
        met.waits_loading,
        met.waits_evicting,
        met.waits_staged,
        met.stored_units,
        met.resident_units,
        met.clean_resident_units
    );
    assert!(
        met.waits_loading > 0,
        "no discard met a loading unit: {met:?}"
    );
    assert!(
        met.waits_evicting > 0,
        "no discard met an evicting unit: {met:?}"
    );
    assert!(
        met.waits_staged > 0,
        "no discard met a staged unit: {met:?}"
    );
    assert!(
        met.stored_units > 0,
        "no discard met a stored unit: {met:?}"
    );
    assert!(
        met.resident_units > 0,
        "no discard met a resident unit: {met:?}"
    );
    store.write_delay_us.store(0, Ordering::Relaxed);
    // The last word on chunks 6 and 7 is a discard.
    engine
        .discard_range(RegionOffset::new(6 * CHUNK), 2 * CHUNK)
        .unwrap();
    let states = engine.unit_states();
    assert_eq!(
        (states.loading, states.evicting),
        (0, 0),
        "nothing in flight: {states:?}"
    );
    std::thread::spawn(move || {
        for c in 0..chunks {
            let want = if c >= 6 { 0 } else { c as u8 + 1 };
            assert!(all_equal(base + c * CHUNK, CHUNK, want), "chunk {c}");
        }
    })
    .join()
    .unwrap();
    engine.evict_all().unwrap();
    let stored = engine.unit_states().stored;
    assert_eq!(
        store.used_slots(),
        stored,
        "one slot per stored unit, none leaked"
    );
}

const RACE_CHUNKS: u64 = 8;

#[test]
fn discards_racing_faults_and_evictions_keep_the_rest_and_leak_no_slot() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(RACE_CHUNKS * CHUNK, store.clone(), config(SwapUnit::Huge2M));
    discards_race_faults_and_evictions(g.base(), g.engine(), &store);
    assert!(g.fatal_messages().is_empty());
}

/// The same race on hugetlb memory, where a discard punches a hole in the
/// memfd instead of zapping anonymous pages.
#[test]
fn discards_racing_faults_and_evictions_on_hugetlb() {
    let store = VecStore::new(CHUNK as usize);
    let Some(g) = start_hugetlb_guest(
        "discards_racing_faults_and_evictions_on_hugetlb",
        RACE_CHUNKS,
        store.clone(),
        config(SwapUnit::Huge2M),
    ) else {
        return;
    };
    discards_race_faults_and_evictions(g.base(), g.engine(), &store);
    assert!(g.fatal_messages().is_empty());
}
