//! Dropping memory the guest declared free: resident and stored chunks
//! become absent without a write, read back as zero, and the chunks around
//! them keep their data.

mod common;

use common::*;
use swap::chunk::Tag;
use swap::engine::SwapUnit;
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
    g.engine().evict_range(4 * CHUNK, 4 * CHUNK).unwrap();
    let used_before = store.used_slots();
    assert!(used_before > 0);
    let resident_before = g.engine().stats().resident_bytes;

    // Chunks [2, 6.5): resident 2..4, stored 4..6, and the first half of
    // stored chunk 6, which only 4 KiB units may drop.
    let report = g
        .engine()
        .discard_range(2 * CHUNK, 4 * CHUNK + CHUNK / 2)
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
    assert_eq!(g.engine().unit_state(2 * CHUNK).tag(), Tag::Absent);
    assert_eq!(g.engine().unit_state(5 * CHUNK).tag(), Tag::Absent);
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
/// write-protected) while an evictor takes them away and the discards drop
/// the last two chunks again and again, so a discard meets units that are
/// loading, evicting, staged, stored and clean-resident. Every read sees
/// the chunk's data or, for the dropped chunks, zero; at the end nothing is
/// in flight, the dropped chunks read zero, the others their data, and the
/// store's slot count matches the units that hold one (the test store
/// panics on a double free).
#[test]
fn discards_racing_faults_and_evictions_keep_the_rest_and_leak_no_slot() {
    let store = VecStore::new(CHUNK as usize);
    let chunks = 8u64;
    let g = start_guest(chunks * CHUNK, store.clone(), config(SwapUnit::Huge2M));
    let base = g.base();
    std::thread::spawn(move || {
        (0..chunks).for_each(|c| fill(base + c * CHUNK, CHUNK, c as u8 + 1))
    })
    .join()
    .unwrap();
    g.engine().evict_all().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for c in 0..chunks {
                    let got = get(base + c * CHUNK + 8 * 4096);
                    let want = u64::from_ne_bytes([c as u8 + 1; 8]);
                    assert!(
                        got == want || (c >= 6 && got == 0),
                        "chunk {c} read {got:#x}"
                    );
                    if c >= 6 {
                        // Written again, so that the discards meet these
                        // chunks with data: resident, staged or stored.
                        put(base + c * CHUNK + 8 * 4096, want);
                    }
                    reads += 1;
                }
            }
            reads
        })
    };
    let mut dropped = 0;
    for round in 0..200 {
        if round % 2 == 0 {
            g.engine().evict_range(0, chunks * CHUNK).unwrap();
        }
        let report = g.engine().discard_range(6 * CHUNK, 2 * CHUNK).unwrap();
        dropped += report.resident_units + report.stored_units;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    println!("discard race: {reads} reads, {dropped} resident or stored drops");
    assert!(dropped > 0, "some discards met a chunk holding data");
    // The last word on chunks 6 and 7 is a discard.
    g.engine().discard_range(6 * CHUNK, 2 * CHUNK).unwrap();
    let states = g.engine().unit_states();
    assert_eq!(
        (states[4], states[5]),
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
    g.engine().evict_all().unwrap();
    let stored = g.engine().unit_states()[3];
    assert_eq!(
        store.used_slots(),
        stored,
        "one slot per stored unit, none leaked"
    );
    assert!(g.fatal_messages().is_empty());
}
