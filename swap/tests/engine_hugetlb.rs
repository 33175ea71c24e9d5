//! Hugetlb backing (MAP_SHARED memfd with MFD_HUGETLB): restore by
//! UFFDIO_COPY of 2 MiB, eviction by write-protect + copy + hole punch.
//! Skips (printing why) when 2 MiB hugetlb pages cannot be reserved.

mod common;

use common::hugetlb::{meminfo, start_hugetlb_guest};
use common::*;
use swap::engine::SwapUnit;

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

#[test]
fn hugetlb_chunks_round_trip_through_the_store() {
    let chunks = 16u64;
    let store = VecStore::new(CHUNK as usize);
    let Some(g) = start_hugetlb_guest(
        "hugetlb_chunks_round_trip_through_the_store",
        chunks,
        store.clone(),
        config(SwapUnit::Huge2M),
    ) else {
        return;
    };
    let base = g.base();
    let engine = g.engine();
    std::thread::spawn(move || {
        (0..chunks).for_each(|c| {
            if c % 4 != 3 {
                fill(base + c * CHUNK, CHUNK, c as u8 + 1)
            } else {
                get(base + c * CHUNK);
            }
        })
    })
    .join()
    .unwrap();
    let free_before = meminfo("HugePages_Free:");
    let report = engine.evict_all().unwrap();
    let free_after = meminfo("HugePages_Free:");
    println!("hugetlb evict_all: {report:?}; free huge pages {free_before} -> {free_after}");
    assert_eq!(report.written_units, chunks * 3 / 4);
    assert_eq!(report.zero_units, chunks / 4);
    std::thread::spawn(move || {
        for c in 0..chunks {
            assert!(
                all_equal(
                    base + c * CHUNK,
                    CHUNK,
                    if c % 4 != 3 { c as u8 + 1 } else { 0 }
                ),
                "chunk {c}"
            );
        }
    })
    .join()
    .unwrap();
    let st = engine.stats();
    println!(
        "hugetlb refault: faults {:?}, huge {} split {}, latency p50 {} p99 {} us",
        st.faults,
        st.restored_huge,
        st.restored_split,
        st.fault_latency.p50(),
        st.fault_latency.p99()
    );
    assert_eq!(st.faults.store, chunks * 3 / 4);
    // Write one chunk: only that one is written again.
    std::thread::spawn(move || put(base + 8, 42))
        .join()
        .unwrap();
    let report = engine.evict_all().unwrap();
    println!("hugetlb after one write: {report:?}");
    assert_eq!(report.written_units, 1);
    assert_eq!(report.clean_dropped_units, chunks * 3 / 4 - 1);
    std::thread::spawn(move || assert_eq!(get(base + 8), 42))
        .join()
        .unwrap();
    assert!(g.fatal_messages().is_empty());
}
