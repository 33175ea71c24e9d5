//! Split chunks on the real engine without KVM: every split and collapse
//! transition, page-by-page eviction into the chunk's slot, and the races
//! the issue names, on both stores that keep pages (mem and file). Guest
//! accesses are host threads touching the registered range; every test
//! checks every word it wrote.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{config, get, put, start_guest, Guest};
use guestmem::addr::RegionOffset;
use guestmem::host::{PagemapScanner, HUGE_PAGE_BYTES, PAGE_BYTES};
use swap::chunk::PageTag;
use swap::engine::{EngineConfig, SwapUnit};
use swap::store::{Codec, Faults, FaultyStore, FileStore, MemStore, SharedStore};

const CHUNK: u64 = HUGE_PAGE_BYTES;
const PAGES: u64 = CHUNK / PAGE_BYTES;
const MB: u64 = 1 << 20;

/// The stores that keep split chunks' pages.
fn stores(chunks: u64) -> Vec<(&'static str, SharedStore)> {
    vec![
        (
            "mem:lz4",
            Arc::new(MemStore::new(Codec::Lz4, CHUNK as usize, 4 * chunks, None).unwrap()),
        ),
        (
            "file",
            Arc::new(
                FileStore::temporary(&std::env::temp_dir(), CHUNK as usize, 4 * chunks * CHUNK)
                    .unwrap(),
            ),
        ),
    ]
}

fn value(page: u64, round: u64) -> u64 {
    (page << 20) ^ (round.wrapping_mul(0x9e37_79b9)) ^ 0x5157
}

/// Writes `value(page, round)` into the first word of every page (from
/// another thread: the test thread must not fault on a missing page while
/// it also waits for the engine, which is fine, but keep one style).
fn write_all(g: &Guest, pages: std::ops::Range<u64>, round: u64) {
    let base = g.base();
    std::thread::spawn(move || {
        for page in pages {
            put(base + page * PAGE_BYTES, value(page, round));
        }
    })
    .join()
    .unwrap();
}

fn check_all(g: &Guest, pages: std::ops::Range<u64>, round: u64) {
    let base = g.base();
    std::thread::spawn(move || {
        for page in pages {
            assert_eq!(
                get(base + page * PAGE_BYTES),
                value(page, round),
                "page {page} round {round}"
            );
        }
    })
    .join()
    .unwrap();
}

fn is_huge(g: &Guest, chunk: u64) -> bool {
    PagemapScanner::open()
        .unwrap()
        .is_huge(g.mem.range(), RegionOffset::new(chunk * CHUNK), CHUNK)
        .unwrap()
}

#[test]
fn a_split_chunk_swaps_page_by_page_and_collapses_back_huge_on_every_store() {
    let chunks = 16;
    for (name, store) in stores(chunks) {
        let g = start_guest(chunks * CHUNK, store.clone(), config(SwapUnit::Huge2M));
        let e = g.engine();
        write_all(&g, 0..chunks * PAGES, 1);
        assert_eq!(
            e.split_range(RegionOffset::ZERO, chunks * CHUNK).unwrap(),
            chunks
        );
        assert_eq!(e.unit_states().split, chunks, "{name}: all split");
        let report = e.evict_all().unwrap();
        assert_eq!(report.written_pages, chunks * PAGES, "{name}: {report:?}");
        assert_eq!(e.stats().resident_bytes, 0, "{name}");
        assert_eq!(store.used_slots(), chunks, "{name}: one slot per chunk");
        // One page back: 4 KiB of memory and 4 KiB read, not 2 MiB.
        let read_before = e.stats().bytes_read;
        check_all(&g, 5 * PAGES + 7..5 * PAGES + 8, 1);
        let st = e.stats();
        assert_eq!(st.resident_bytes, PAGE_BYTES, "{name}");
        assert_eq!(st.bytes_read - read_before, PAGE_BYTES, "{name}");
        assert_eq!(st.split.page_faults.store, 1, "{name}");
        assert_eq!(
            e.page_state(RegionOffset::new(5 * CHUNK + 7 * PAGE_BYTES))
                .unwrap()
                .tag(),
            PageTag::Resident
        );
        assert_eq!(
            e.page_state(RegionOffset::new(5 * CHUNK + 8 * PAGE_BYTES))
                .unwrap()
                .tag(),
            PageTag::Stored
        );
        // Collapse it: the other 511 pages come from the store.
        assert_eq!(
            e.collapse_range(RegionOffset::new(5 * CHUNK), CHUNK)
                .unwrap(),
            1,
            "{name}"
        );
        assert!(is_huge(&g, 5), "{name}: PAGEMAP_SCAN sees one huge mapping");
        assert_eq!(e.stats().resident_bytes, CHUNK, "{name}");
        assert_eq!(store.used_slots(), chunks - 1, "{name}: its slot was freed");
        check_all(&g, 0..chunks * PAGES, 1);
        let st = e.stats();
        assert_eq!(st.split.collapses_verified, 1, "{name}");
        assert_eq!(
            st.split.splits_by_origin,
            swap::engine::SplitsByOrigin {
                resident: chunks,
                ..Default::default()
            },
            "{name}"
        );
        // Page metadata: 8 B of directory and one group per 16 chunks: its
        // words (4 KiB) and its access tables (per page a 4-byte stamp and
        // a chance byte, per chunk a 2-byte hand).
        assert_eq!(
            st.metadata_bytes,
            chunks * 16 + 8 + 4096 + 16 * 512 * (4 + 1) + 16 * 2,
            "{name}"
        );
        assert!(g.fatal_messages().is_empty());
        println!("{name}: {:?}", st.split);
    }
}

#[test]
fn a_stored_chunk_splits_on_its_first_fault_and_reads_one_page() {
    for (name, store) in stores(8) {
        let g = start_guest(8 * CHUNK, store.clone(), config(SwapUnit::Huge2M));
        let e = g.engine();
        write_all(&g, 0..8 * PAGES, 2);
        e.evict_all().unwrap();
        assert_eq!(e.unit_states().stored, 8, "{name}: stored whole");
        assert_eq!(
            e.split_range(RegionOffset::new(2 * CHUNK), CHUNK).unwrap(),
            1
        );
        assert_eq!(
            e.page_state(RegionOffset::new(2 * CHUNK)).unwrap().tag(),
            PageTag::Stored,
            "{name}: the pages stay where they were"
        );
        let read_before = e.stats().bytes_read;
        check_all(&g, 2 * PAGES + 300..2 * PAGES + 302, 2);
        assert_eq!(e.stats().bytes_read - read_before, 2 * PAGE_BYTES, "{name}");
        assert_eq!(e.stats().resident_bytes, 2 * PAGE_BYTES, "{name}");
        // Written pages go back into the same slot.
        write_all(&g, 2 * PAGES + 300..2 * PAGES + 301, 3);
        e.evict_all().unwrap();
        assert_eq!(store.used_slots(), 8, "{name}");
        check_all(&g, 2 * PAGES + 300..2 * PAGES + 301, 3);
        check_all(&g, 2 * PAGES + 301..3 * PAGES, 2);
        check_all(&g, 0..2 * PAGES, 2);
        assert!(g.fatal_messages().is_empty());
    }
}

#[test]
fn an_absent_chunk_splits_into_absent_pages_and_zero_pages_are_dropped() {
    let (_, store) = stores(4).remove(0);
    let g = start_guest(4 * CHUNK, store.clone(), config(SwapUnit::Huge2M));
    let e = g.engine();
    assert_eq!(e.split_range(RegionOffset::ZERO, CHUNK).unwrap(), 1);
    check_all(&g, 0..0, 0);
    let base = g.base();
    std::thread::spawn(move || assert_eq!(get(base + 3 * PAGE_BYTES), 0))
        .join()
        .unwrap();
    assert_eq!(e.stats().resident_bytes, PAGE_BYTES, "one zero page");
    let report = e.evict_all().unwrap();
    assert_eq!(report.zero_pages, 1, "{report:?}");
    assert_eq!(store.used_slots(), 0, "nothing written, no slot");
    // The discard of a split chunk makes it absent whole.
    write_all(&g, 10..12, 4);
    e.evict_all().unwrap();
    assert_eq!(store.used_slots(), 1);
    let discarded = e.discard_range(RegionOffset::ZERO, CHUNK).unwrap();
    assert_eq!(discarded.split_units, 1);
    assert_eq!(e.unit_states().absent, 4, "all absent");
    assert_eq!(store.used_slots(), 0, "the slot was freed");
    std::thread::spawn(move || assert_eq!(get(base + 10 * PAGE_BYTES), 0))
        .join()
        .unwrap();
    assert_eq!(e.stats().split.merged_absent, 1);
}

#[test]
fn faults_on_one_page_race_evictions_of_its_neighbours_and_collapses() {
    let chunks = 4;
    for (name, store) in stores(chunks) {
        let g = start_guest(chunks * CHUNK, store, config(SwapUnit::Huge2M));
        let e = g.engine();
        write_all(&g, 0..chunks * PAGES, 0);
        e.split_range(RegionOffset::ZERO, chunks * CHUNK).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let base = g.base();
        // Writers on even pages of every chunk, each keeping its own count.
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut round = 0;
                    while !stop.load(Ordering::Relaxed) {
                        round += 1;
                        for page in (t * 2..chunks * PAGES).step_by(4) {
                            put(base + page * PAGE_BYTES, value(page, round));
                        }
                    }
                    round
                })
            })
            .collect();
        let mut collapses = 0;
        for i in 0..48u64 {
            let chunk = (i / 4) % chunks;
            match i % 4 {
                0 | 1 => drop(
                    e.evict_range(RegionOffset::new(chunk * CHUNK), CHUNK)
                        .unwrap(),
                ),
                2 => {
                    collapses += e
                        .collapse_range(RegionOffset::new(chunk * CHUNK), CHUNK)
                        .unwrap()
                }
                _ => drop(
                    e.split_range(RegionOffset::new(chunk * CHUNK), CHUNK)
                        .unwrap(),
                ),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let rounds: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        e.evict_all().unwrap();
        // Every page the writers touched holds its last round; the others
        // the first write.
        std::thread::spawn(move || {
            for page in 0..chunks * PAGES {
                let t = (page % 4) / 2;
                let want = if page % 2 == 0 {
                    value(page, rounds[t as usize])
                } else {
                    value(page, 0)
                };
                assert_eq!(get(base + page * PAGE_BYTES), want, "page {page}");
            }
        })
        .join()
        .unwrap();
        let st = e.stats();
        println!(
            "{name}: collapses {collapses}, {:?}, evictions {}",
            st.split, st.evictions
        );
        assert!(st.split.page_evictions > 0 && collapses > 0, "{name}");
        assert!(g.fatal_messages().is_empty());
    }
}

#[test]
fn writes_survive_forced_splits_and_collapses_under_a_tight_limit() {
    let chunks = 32;
    for (name, store) in stores(chunks) {
        let cfg = EngineConfig {
            mem_limit_bytes: Some(8 * CHUNK),
            force_split_every: Some(3),
            ..config(SwapUnit::Huge2M)
        };
        let g = start_guest(chunks * CHUNK, store, cfg);
        let base = g.base();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    // Each thread owns every 4th page; 3 passes of writes,
                    // each checking the pass before.
                    for round in 1..=3 {
                        for page in (t..chunks * PAGES).step_by(4 * 7) {
                            let addr = base + page * PAGE_BYTES;
                            if round > 1 {
                                assert_eq!(get(addr), value(page, round - 1), "page {page}");
                            }
                            put(addr, value(page, round));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = g.engine().stats();
        println!(
            "{name}: {:?} resident max {} MiB",
            st.split,
            st.resident_bytes_max / MB
        );
        let splits: u64 = st.split.splits;
        assert!(splits > 10, "{name}: {splits} splits");
        assert!(st.split.collapses_verified > 0, "{name}");
        assert!(
            st.resident_bytes_max <= 8 * CHUNK + 4 * CHUNK,
            "{name}: the limit held while chunks changed mode ({} MiB)",
            st.resident_bytes_max / MB
        );
        assert!(g.fatal_messages().is_empty());
    }
}

#[test]
fn a_store_error_on_a_split_chunks_page_names_the_page() {
    let inner: SharedStore = Arc::new(MemStore::new(Codec::Lz4, CHUNK as usize, 16, None).unwrap());
    let faults = Faults {
        read_error_after: Some(0),
        ..Faults::default()
    };
    let store: SharedStore = Arc::new(FaultyStore::new(inner, faults));
    let mut g = start_guest(4 * CHUNK, store, config(SwapUnit::Huge2M));
    write_all(&g, 0..4 * PAGES, 5);
    g.engine()
        .split_range(RegionOffset::ZERO, 4 * CHUNK)
        .unwrap();
    g.engine().evict_all().unwrap();
    let base = g.base();
    let page = 3 * PAGES + 7;
    let toucher = std::thread::spawn(move || get(base + page * PAGE_BYTES));
    let started = std::time::Instant::now();
    while g.fatal_messages().is_empty() {
        assert!(started.elapsed().as_secs() < 10, "no fatal error");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let message = g.fatal_messages().join("\n");
    let gpa = common::GPA_BASE + page * PAGE_BYTES;
    assert!(
        message.contains(&format!("page at guest address {gpa:#x}")),
        "{message}"
    );
    assert!(
        !toucher.is_finished(),
        "the toucher waits, never sees zeros"
    );
    // Shut the engine down before the memory goes: the toucher then reads
    // whatever the host gives (a fresh page) and ends.
    g.engine.take().unwrap().shutdown();
    toucher.join().unwrap();
}

/// Two threads faulting on the same page give the engine two messages for
/// it; the second finds the page resident. A fault on a resident page
/// must own the page while it resolves the message, or an eviction that
/// moves the page out in between leaves the fault thread installing a
/// zero page over it: the guest then reads zeros, and the store copy
/// comes back over later writes. Readers here only read (every page holds
/// its first write), so any other value is that bug; the evictions keep
/// moving the same pages out under them.
#[test]
fn a_page_read_by_two_threads_at_once_survives_evictions_under_them() {
    let chunks = 2;
    for (name, store) in stores(chunks) {
        let g = start_guest(chunks * CHUNK, store, config(SwapUnit::Huge2M));
        let e = g.engine();
        write_all(&g, 0..chunks * PAGES, 0);
        e.split_range(RegionOffset::ZERO, chunks * CHUNK).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let base = g.base();
        // Four readers walk the same pages in the same order, so that
        // they fault on a page together.
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for page in 0..chunks * PAGES {
                            let seen = get(base + page * PAGE_BYTES);
                            assert_eq!(seen, value(page, 0), "page {page} after {reads} reads");
                            reads += 1;
                        }
                    }
                    reads
                })
            })
            .collect();
        let started = std::time::Instant::now();
        let mut passes = 0;
        while started.elapsed() < std::time::Duration::from_secs(3)
            && !readers.iter().any(|r| r.is_finished())
        {
            for chunk in 0..chunks {
                let _report = e
                    .evict_range(RegionOffset::new(chunk * CHUNK), CHUNK)
                    .unwrap();
            }
            passes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        // A reader blocked for good (its page stuck after a fatal error)
        // fails the test instead of hanging it.
        let waited = std::time::Instant::now();
        while !readers.iter().all(|r| r.is_finished()) {
            assert!(
                waited.elapsed() < std::time::Duration::from_secs(20),
                "{name}: readers still blocked 20 s after the evictions stopped; fatal: {:?}",
                g.fatal_messages()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(
            g.fatal_messages().is_empty(),
            "{name}: {:?}",
            g.fatal_messages()
        );
        e.evict_all().unwrap();
        check_all(&g, 0..chunks * PAGES, 0);
        let st = e.stats();
        println!(
            "{name}: {passes} eviction passes, {reads} reads, stale faults {}, page evictions {}",
            st.stale_faults, st.split.page_evictions
        );
        assert!(st.split.page_evictions > 0, "{name}");
        assert!(g.fatal_messages().is_empty(), "{name}");
    }
}
