//! The memory limit holds while the guest touches more than it allows, and
//! can be changed at run time.

mod common;

use common::*;
use swap::engine::{EngineConfig, MemLimit, SwapUnit};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

#[test]
fn memory_limit_holds_and_every_chunk_survives() {
    let store = VecStore::new(CHUNK as usize);
    let limit = 16 * MB;
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.mem_limit_bytes = Some(limit);
    let g = start_guest(128 * MB, store.clone(), cfg);
    let base = g.base();
    let chunks = 64u64;
    std::thread::spawn(move || {
        for c in 0..chunks {
            fill(base + c * CHUNK, CHUNK, c as u8 + 1);
        }
        for c in 0..chunks {
            assert!(all_equal(base + c * CHUNK, CHUNK, c as u8 + 1), "chunk {c}");
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!(
        "limit {} MiB: max resident {} MiB, now {} MiB, faults {:?}, evict waits {}, written {} units, clean drops {}, huge {} split {}, latency p50 {} p99 {} max {} us",
        limit / MB, st.resident_bytes_max / MB, st.resident_bytes / MB, st.faults, st.evict_waits, st.units_written,
        st.clean_drops, st.restored_huge, st.restored_split, st.fault_latency.p50(), st.fault_latency.p99(), st.fault_latency.max()
    );
    // Margin: one unit per fault thread may be reserved over the limit only
    // when nothing at all can be evicted; allow that, no more.
    assert!(
        st.resident_bytes_max <= limit + 2 * CHUNK,
        "max resident {} over limit {limit}",
        st.resident_bytes_max
    );
    assert!(st.faults.store >= chunks - limit / CHUNK, "{:?}", st.faults);
    assert!(g.fatal_messages().is_empty());
}

#[test]
fn lowering_the_limit_at_run_time_evicts_in_the_background() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(64 * MB, store.clone(), config(SwapUnit::Huge2M));
    let base = g.base();
    std::thread::spawn(move || (0..32).for_each(|c| fill(base + c * CHUNK, CHUNK, 0x11)))
        .join()
        .unwrap();
    assert_eq!(g.engine().stats().resident_bytes, 64 * MB);
    g.engine()
        .set_mem_limit(Some(MemLimit::of_bytes(20 * MB, CHUNK).unwrap()))
        .unwrap();
    let other_unit = MemLimit::of_bytes(20 * MB, 4096).unwrap();
    let refused = g.engine().set_mem_limit(Some(other_unit)).unwrap_err();
    assert!(
        refused.to_string().contains("checked for 4 KiB units"),
        "{refused}"
    );
    assert!(
        eventually(|| g.engine().stats().resident_bytes <= 20 * MB),
        "{:?}",
        g.engine().stats()
    );
    let st = g.engine().stats();
    println!(
        "after lowering to 20 MiB: resident {} MiB, written {} units",
        st.resident_bytes / MB,
        st.units_written
    );
    assert_eq!(st.mem_limit_bytes, Some(20 * MB));
    g.engine().set_mem_limit(None).unwrap();
    std::thread::spawn(move || {
        (0..32).for_each(|c| assert!(all_equal(base + c * CHUNK, CHUNK, 0x11)))
    })
    .join()
    .unwrap();
    assert_eq!(g.engine().stats().resident_bytes, 64 * MB);
}

#[test]
fn a_limit_that_is_not_whole_units_is_refused_not_rounded() {
    let mem = guestmem::host::AnonMapping::new(16 * MB).unwrap();
    let region = swap::engine::ManagedRegion {
        host_base: guestmem::addr::Hva::new(mem.range().base()),
        len_bytes: 16 * MB,
        kind: swap::engine::MemoryKind::Anonymous,
        gpa_ranges: vec![(
            swap::index::Gpa::new(GPA_BASE),
            guestmem::addr::RegionOffset::ZERO,
            16 * MB,
        )],
    };
    let refused = swap::engine::SwapEngine::start(
        region,
        VecStore::new(CHUNK as usize),
        EngineConfig {
            mem_limit_bytes: Some(3 * MB),
            ..config(SwapUnit::Huge2M)
        },
        Box::new(|_| {}),
    )
    .err()
    .expect("3 MiB is not a whole number of 2 MiB chunks");
    assert!(
        refused
            .to_string()
            .contains("is not a multiple of the swap unit"),
        "{refused}"
    );
}
