//! The 4 KiB baseline unit runs through the same engine: state per page,
//! single-page COPY / ZEROPAGE / MOVE, 4 KiB store slots.

mod common;

use common::*;
use swap::engine::SwapUnit;

const MB: u64 = 1 << 20;
const PAGE: u64 = 4096;

#[test]
fn small_units_round_trip_and_track_clean_pages() {
    let store = VecStore::new(PAGE as usize);
    let len = 4 * MB;
    let g = start_guest(len, store.clone(), config(SwapUnit::Small4K));
    let base = g.base();
    let pages = len / PAGE;
    std::thread::spawn(move || {
        for p in 0..pages {
            if p % 4 != 0 {
                put(base + p * PAGE + 8, p);
            } else {
                get(base + p * PAGE);
            }
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    assert_eq!(st.faults.zero, pages, "one fault per page");
    assert_eq!(st.metadata_bytes, pages * 8);
    let report = g.engine().evict_all().unwrap();
    println!("4k evict_all: {report:?}");
    assert_eq!(report.written_units, pages * 3 / 4);
    assert_eq!(report.zero_units, pages / 4);
    std::thread::spawn(move || {
        for p in 0..pages {
            assert_eq!(
                get(base + p * PAGE + 8),
                if p % 4 != 0 { p } else { 0 },
                "page {p}"
            );
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!(
        "4k refault: faults {:?}, huge {} split {}, latency p50 {} p99 {} us",
        st.faults,
        st.restored_huge,
        st.restored_split,
        st.fault_latency.p50(),
        st.fault_latency.p99()
    );
    assert_eq!(st.faults.store, pages * 3 / 4);
    assert_eq!(st.restored_huge, 0);
    // Nothing written since the refault: all clean.
    let report = g.engine().evict_all().unwrap();
    assert_eq!(report.clean_dropped_units, pages * 3 / 4, "{report:?}");
    assert_eq!(store.writes(), pages * 3 / 4);
}

#[test]
fn small_units_respect_the_memory_limit() {
    let store = VecStore::new(PAGE as usize);
    let mut cfg = config(SwapUnit::Small4K);
    let limit = MB;
    cfg.mem_limit_bytes = Some(limit);
    let g = start_guest(4 * MB, store, cfg);
    let base = g.base();
    std::thread::spawn(move || {
        for p in 0..1024 {
            put(base + p * PAGE, p + 1);
        }
        for p in 0..1024 {
            assert_eq!(get(base + p * PAGE), p + 1);
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!(
        "4k limit 1 MiB: max resident {} KiB, faults {:?}, evict waits {}",
        st.resident_bytes_max / 1024,
        st.faults,
        st.evict_waits
    );
    assert!(st.resident_bytes_max <= limit + 2 * PAGE);
}
