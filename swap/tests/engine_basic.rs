//! Zero fill, eviction to a store, refault, clean drops and the unit state
//! transitions, with 2 MiB units on THP memory.

mod common;

use common::smaps::huge_and_rss_bytes;
use common::*;
use guestmem::addr::RegionOffset;
use swap::chunk::Tag;
use swap::engine::SwapUnit;
use swap::store::Store;

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

#[test]
fn zero_fill_restores_whole_huge_chunks() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(64 * MB, store.clone(), config(SwapUnit::Huge2M));
    let base = g.base();
    std::thread::spawn(move || {
        for c in 0..32 {
            put(base + c * CHUNK + 4096 * (c % 512), c + 1);
        }
    })
    .join()
    .unwrap();
    // A fault's latency is recorded by its fault thread after the wake, so
    // the writer can finish before the last one is: wait for the engine to
    // have recorded every fault it counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let st = loop {
        let st = g.engine().stats();
        if st.fault_latency.count() == st.faults.total || std::time::Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let (huge, rss) = huge_and_rss_bytes(g.base(), g.len());
    println!(
        "zero fill: faults {:?}, restored huge {} split {}, AnonHugePages {} MiB of Rss {} MiB, latency p50 {} us p99 {} us max {} us",
        st.faults, st.restored_huge, st.restored_split, huge / MB, rss / MB,
        st.fault_latency.p50(), st.fault_latency.p99(), st.fault_latency.max()
    );
    assert_eq!(st.faults.zero, 32, "one fault per chunk");
    assert_eq!(st.fault_latency.count(), st.faults.total);
    assert!(
        st.restored_huge * 10 >= 32 * 9,
        "huge restores {}",
        st.restored_huge
    );
    assert!(huge * 10 >= rss * 9, "AnonHugePages {huge} of Rss {rss}");
    assert_eq!(st.resident_bytes, 64 * MB);
    // State word and content hash per chunk, and the split-page directory
    // (one pointer per 16 chunks, no page group allocated: nothing split).
    assert_eq!(st.metadata_bytes, 32 * 16 + 2 * 8);
    assert_eq!(store.writes(), 0);
}

#[test]
fn evicted_chunks_come_back_whole_huge_and_intact() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(128 * MB, store.clone(), config(SwapUnit::Huge2M));
    let base = g.base();
    let chunks = 64u64;
    // Even chunks get data, odd chunks are touched but stay zero.
    std::thread::spawn(move || {
        for c in 0..chunks {
            if c % 2 == 0 {
                fill(base + c * CHUNK, CHUNK, c as u8 + 1);
            } else {
                get(base + c * CHUNK);
            }
        }
    })
    .join()
    .unwrap();
    let report = g.engine().evict_all().unwrap();
    println!("evict_all: {report:?}");
    assert_eq!(report.written_units, chunks / 2);
    assert_eq!(
        report.zero_units,
        chunks / 2,
        "zero chunks are never written"
    );
    assert_eq!(store.writes(), chunks / 2);
    assert_eq!(g.engine().stats().resident_bytes, 0);
    let (_, rss) = huge_and_rss_bytes(g.base(), g.len());
    assert_eq!(rss, 0, "guest RAM is empty after evict_all");

    std::thread::spawn(move || {
        for c in 0..chunks {
            let want = if c % 2 == 0 { c as u8 + 1 } else { 0 };
            assert!(
                all_equal(base + c * CHUNK, CHUNK, want),
                "chunk {c} content"
            );
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    let (huge, rss) = huge_and_rss_bytes(g.base(), g.len());
    println!(
        "refault: faults {:?}, huge {} split {}, AnonHugePages {} MiB of Rss {} MiB, bytes read {} MiB, latency p50 {} p90 {} p99 {} max {} us",
        st.faults, st.restored_huge, st.restored_split, huge / MB, rss / MB, st.bytes_read / MB,
        st.fault_latency.p50(), st.fault_latency.p90(), st.fault_latency.p99(), st.fault_latency.max()
    );
    assert_eq!(st.faults.store, chunks / 2);
    assert_eq!(st.faults.zero, chunks + chunks / 2);
    assert!(
        huge * 10 >= rss * 9,
        "AnonHugePages {huge} of Rss {rss} after refault"
    );
}

#[test]
fn clean_chunks_are_dropped_without_a_write_and_writes_are_tracked() {
    let store = VecStore::new(CHUNK as usize);
    let g = start_guest(32 * MB, store.clone(), config(SwapUnit::Huge2M));
    let base = g.base();
    let chunks = 16u64;
    std::thread::spawn(move || {
        (0..chunks).for_each(|c| fill(base + c * CHUNK, CHUNK, 0x40 + c as u8))
    })
    .join()
    .unwrap();
    assert_eq!(g.engine().evict_all().unwrap().written_units, chunks);
    // Read everything back: restored clean and write-protected.
    std::thread::spawn(move || {
        (0..chunks).for_each(|c| {
            assert_eq!(
                get(base + c * CHUNK + 8),
                u64::from_ne_bytes([0x40 + c as u8; 8])
            )
        })
    })
    .join()
    .unwrap();
    let s = g.engine().unit_state(RegionOffset::ZERO);
    assert_eq!(s.tag(), Tag::Resident);
    assert!(s.clean() && s.wp() && s.huge(), "{s:?}");
    let report = g.engine().evict_all().unwrap();
    println!("after read-only refault: {report:?}");
    assert_eq!(report.clean_dropped_units, chunks);
    assert_eq!(store.writes(), chunks, "clean chunks are not written again");

    // Read again, then write into half of them: those are written, the rest dropped.
    std::thread::spawn(move || {
        for c in 0..chunks {
            get(base + c * CHUNK);
            if c % 2 == 0 {
                put(base + c * CHUNK + 100 * 4096, 0xdead_0000 + c);
            }
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    assert_eq!(st.wp_faults, chunks / 2);
    let d = g.engine().unit_state(RegionOffset::ZERO);
    assert!(!d.clean() && !d.wp() && d.tag() == Tag::Resident, "{d:?}");
    let (huge, _) = huge_and_rss_bytes(g.base(), g.len());
    assert_eq!(huge, chunks * CHUNK, "unprotecting keeps the PMDs");
    let report = g.engine().evict_all().unwrap();
    println!("after writing half: {report:?}");
    assert_eq!(report.written_units, chunks / 2);
    assert_eq!(report.clean_dropped_units, chunks / 2);
    assert_eq!(store.writes(), chunks + chunks / 2);
    assert_eq!(store.used_slots(), chunks, "stale copies were freed");
    std::thread::spawn(move || {
        for c in 0..chunks {
            let at = base + c * CHUNK + 100 * 4096;
            let want = if c % 2 == 0 {
                0xdead_0000 + c
            } else {
                u64::from_ne_bytes([0x40 + c as u8; 8])
            };
            assert_eq!(get(at), want, "chunk {c}");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn unit_states_follow_the_documented_transitions() {
    let store = VecStore::new(CHUNK as usize);
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.pinned_offsets = vec![(RegionOffset::ZERO, CHUNK)];
    let g = start_guest(8 * MB, store.clone(), cfg);
    let e = g.engine();
    let base = g.base();
    let at = |o: u64| e.unit_state(RegionOffset::new(o));
    assert_eq!(at(CHUNK).tag(), Tag::Absent);
    assert!(at(0).pinned());
    std::thread::spawn(move || {
        put(base, 1);
        put(base + CHUNK, 2);
    })
    .join()
    .unwrap();
    // Absent -> Loading -> Resident (huge, dirty, referenced)
    let s = at(CHUNK);
    assert_eq!(s.tag(), Tag::Resident);
    assert!(s.huge() && !s.clean() && s.referenced(), "{s:?}");
    // Resident -> Evicting -> Staged -> Stored
    let r = e.evict_all().unwrap();
    assert_eq!(r.written_units, 1, "the pinned chunk stays: {r:?}");
    assert_eq!(at(0).tag(), Tag::Resident);
    assert_eq!(at(CHUNK).tag(), Tag::Stored);
    // Stored -> Loading -> Resident clean + wp
    std::thread::spawn(move || assert_eq!(get(base + CHUNK), 2))
        .join()
        .unwrap();
    let s = at(CHUNK);
    assert!(s.tag() == Tag::Resident && s.clean() && s.wp(), "{s:?}");
    // Resident clean -> (write) Resident dirty; zeroing it -> Evicting -> Absent
    std::thread::spawn(move || put(base + CHUNK, 0))
        .join()
        .unwrap();
    assert!(!at(CHUNK).clean(), "{:?} {:?}", at(CHUNK), e.stats());
    let r = e.evict_all().unwrap();
    assert_eq!(r.zero_units, 1);
    assert_eq!(at(CHUNK).tag(), Tag::Absent);
    // Absent chunks never reach the store.
    assert_eq!(store.used_slots(), 0);
    assert_eq!(
        e.unit_states(),
        swap::chunk::TagCounts {
            absent: 3,
            resident: 1,
            ..Default::default()
        }
    );
}
