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
