//! Evicted huge pages reused as restore buffers: the data of one chunk
//! never shows up in another, zero fills read zero even in a reused page,
//! and the reused pages stay within the pool's bound.

mod common;

use std::sync::Mutex;

use common::*;
use guestmem::addr::RegionOffset;
use swap::engine::{EngineConfig, SwapStats, SwapUnit};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;
const WORDS_PER_CHUNK: u64 = CHUNK / 8;

/// The bound test measures the whole process's huge pages: the tests of
/// this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The word at `word` of chunk `chunk` in round `round`: different for
/// every chunk, word and round, never zero.
fn pattern(chunk: u64, word: u64, round: u64) -> u64 {
    (((chunk + 1) << 48) ^ (word << 8) ^ (round + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// Writes the round's pattern into every word of a chunk (guest memory).
fn write_chunk(base: u64, chunk: u64, round: u64) {
    let start = base + chunk * CHUNK;
    for word in 0..WORDS_PER_CHUNK {
        put(start + word * 8, pattern(chunk, word, round));
    }
}

/// Checks every word of a chunk against the round's pattern.
fn check_chunk(base: u64, chunk: u64, round: u64) {
    let start = base + chunk * CHUNK;
    for word in 0..WORDS_PER_CHUNK {
        let got = get(start + word * 8);
        let want = pattern(chunk, word, round);
        assert_eq!(
            got, want,
            "chunk {chunk} word {word} round {round}: {got:#x}, want {want:#x}"
        );
    }
}

/// `0..n` in an order fixed by `seed` (xorshift, Fisher-Yates).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

fn print_buffers(what: &str, st: &SwapStats) {
    println!(
        "{what}: faults {:?}, buffers recycled {} (uncleared {}) fresh {} dropped {}, idle max {} of {}, huge {} split {}, install busy retries {}",
        st.faults,
        st.buffers.recycled,
        st.buffers.recycled_uncleared,
        st.buffers.fresh,
        st.buffers.recycle_dropped,
        st.buffers.idle_max,
        st.buffers.bound,
        st.restored_huge,
        st.restored_split,
        st.install_busy_retries
    );
}

#[test]
fn recycled_buffers_never_leak_one_chunks_data_into_another() {
    let _serial = serial();
    let store = VecStore::new(CHUNK as usize);
    let chunks = 40u64;
    let limit = 16 * MB;
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.mem_limit_bytes = Some(limit);
    let g = start_guest(chunks * CHUNK, store.clone(), cfg);
    let base = g.base();
    // Each round rewrites every chunk (write faults: store restores, the
    // first round zero fills) and then reads every chunk back (read faults:
    // restores installed write-protected, clean drops), in shuffled orders,
    // so that reused pages always held some other chunk's older data.
    std::thread::spawn(move || {
        for round in 0..3 {
            for c in shuffled(chunks, 11 + round) {
                write_chunk(base, c, round);
            }
            for c in shuffled(chunks, 101 + round) {
                check_chunk(base, c, round);
            }
        }
    })
    .join()
    .unwrap();
    // Evict everything (many pages recycled at once) and read it all back.
    g.engine().evict_all().unwrap();
    std::thread::spawn(move || {
        for c in shuffled(chunks, 7) {
            check_chunk(base, c, 2);
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    print_buffers("rewrite and reread under a 16 MiB limit", &st);
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
    assert!(st.buffers.recycled > 0, "evicted pages were reused: {st:?}");
    assert!(st.buffers.idle_max <= st.buffers.bound, "{st:?}");
    assert!(
        st.resident_bytes_max <= limit + 2 * CHUNK,
        "max resident {} over limit {limit}",
        st.resident_bytes_max
    );
}

#[test]
fn zero_fills_read_zero_even_in_a_reused_page() {
    let _serial = serial();
    let store = VecStore::new(CHUNK as usize);
    let mut cfg: EngineConfig = config(SwapUnit::Huge2M);
    // No refill thread: no fresh buffer is ready and no reused page is
    // cleared in the background, so a zero fill has to clear a reused page
    // itself.
    cfg.refill_buffers = false;
    cfg.buffer_count = Some(4);
    let g = start_guest(64 * MB, store.clone(), cfg);
    let base = g.base();
    let e = g.engine();

    // Chunks 0..12 hold data; evicting them leaves up to 4 of their pages,
    // full of that data, as restore buffers.
    std::thread::spawn(move || (0..12).for_each(|c| write_chunk(base, c, 0)))
        .join()
        .unwrap();
    e.evict_range(RegionOffset::ZERO, 12 * CHUNK).unwrap();
    let before = e.stats();
    print_buffers("after evicting 12 data chunks", &before);
    assert!(
        before.buffers.recycle_dropped < 12,
        "some pages were kept: {before:?}"
    );

    // Never-written chunks 12..20 are zero fills now.
    std::thread::spawn(move || {
        for c in 12..20 {
            assert!(all_equal(base + c * CHUNK, CHUNK, 0), "chunk {c} not zero");
        }
    })
    .join()
    .unwrap();
    let st = e.stats();
    print_buffers("after 8 zero fills", &st);
    assert!(
        st.buffers.recycled_uncleared > 0,
        "a zero fill cleared a reused page itself: {st:?}"
    );

    // Chunks 20..24 are written and then zeroed again by the guest: they
    // are dropped as zero on eviction (no write), and their pages kept as
    // buffers too.
    std::thread::spawn(move || {
        for c in 20..24 {
            fill(base + c * CHUNK, CHUNK, 0x5a);
            fill(base + c * CHUNK, CHUNK, 0);
        }
    })
    .join()
    .unwrap();
    let report = e
        .evict_range(RegionOffset::new(12 * CHUNK), 12 * CHUNK)
        .unwrap();
    assert_eq!(report.zero_units, 12, "{report:?}");
    std::thread::spawn(move || {
        for c in shuffled(32, 5) {
            if c >= 12 {
                assert!(all_equal(base + c * CHUNK, CHUNK, 0), "chunk {c} not zero");
            }
        }
        // The data chunks are intact too.
        for c in shuffled(12, 9) {
            check_chunk(base, c, 0);
        }
    })
    .join()
    .unwrap();
    let st = e.stats();
    print_buffers("after refaulting everything", &st);
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
    assert!(st.buffers.idle_max <= 4, "{st:?}");
}

#[test]
fn reused_pages_stay_within_the_pool_bound() {
    let _serial = serial();
    let store = VecStore::new(CHUNK as usize);
    let chunks = 32u64;
    let bound = 3u64;
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.buffer_count = Some(bound as usize);
    cfg.fault_threads = 1;
    cfg.mem_limit_bytes = Some(16 * MB);
    let g = start_guest(chunks * CHUNK, store.clone(), cfg);
    let base = g.base();
    std::thread::spawn(move || {
        for round in 0..2 {
            (0..chunks).for_each(|c| write_chunk(base, c, round));
        }
    })
    .join()
    .unwrap();
    // Evicting everything hands back 16 MiB of pages at once: at most
    // `bound` are kept.
    g.engine().evict_all().unwrap();
    let st = g.engine().stats();
    print_buffers("after evict_all", &st);
    assert_eq!(st.buffers.bound, bound);
    assert!(st.buffers.idle_max <= bound, "{st:?}");
    assert!(st.buffers.recycled > 0, "{st:?}");
    assert!(
        st.buffers.recycle_dropped > 0,
        "the rest were freed: {st:?}"
    );
    assert_eq!(st.resident_bytes, 0);

    // Host memory: guest RAM is empty, so the process's huge pages are the
    // idle buffers, at most `bound` of them. Only meaningful when THP is
    // `madvise` (with `always`, the test's own heap may be huge).
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[madvise]") {
        let held = || smaps_anon_huge_bytes_total();
        assert!(
            eventually(|| held() <= bound * CHUNK),
            "{} MiB of huge pages held, bound {} MiB",
            held() / MB,
            bound * CHUNK / MB
        );
        println!("huge pages held after evict_all: {} MiB", held() / MB);
    } else {
        println!(
            "THP is not `madvise` ({}): host memory check skipped",
            thp.trim()
        );
    }
    std::thread::spawn(move || (0..chunks).for_each(|c| check_chunk(base, c, 1)))
        .join()
        .unwrap();
    assert!(g.fatal_messages().is_empty(), "{:?}", g.fatal_messages());
}

/// `AnonHugePages` of the whole process, bytes.
fn smaps_anon_huge_bytes_total() -> u64 {
    common::smaps::huge_and_rss_bytes(0, u64::MAX).0
}
