//! The granularity policy (`SwapUnit::Auto`) on the real engine without
//! KVM: chunks whose hot pages are scattered split and then move page by
//! page; sequential streams stay huge; dense split chunks collapse; every
//! word written is read back.

mod common;

use std::sync::Arc;

use common::{config, get, put, start_guest};
use guestmem::addr::RegionOffset;
use guestmem::host::{HUGE_PAGE_BYTES, PAGE_BYTES};
use swap::chunk::PageTag;
use swap::engine::{EngineConfig, SwapUnit};
use swap::store::{Codec, MemStore, SharedStore};

const CHUNK: u64 = HUGE_PAGE_BYTES;
const PAGES: u64 = CHUNK / PAGE_BYTES;

fn store(chunks: u64) -> SharedStore {
    Arc::new(MemStore::new(Codec::Lz4, CHUNK as usize, 4 * chunks, None).unwrap())
}

fn auto(limit_chunks: u64) -> EngineConfig {
    EngineConfig {
        mem_limit_bytes: Some(limit_chunks * CHUNK),
        ..config(SwapUnit::Auto)
    }
}

fn value(page: u64, round: u64) -> u64 {
    (page << 24) ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa5
}

#[test]
fn scattered_hot_pages_split_their_chunks_and_move_alone() {
    // One hot page in each of 24 chunks, touched every round, over a 16
    // chunk limit: with 2 MiB units each touch would bring its chunk in.
    let chunks = 24;
    let g = start_guest(chunks * CHUNK, store(chunks), auto(16));
    let base = g.base();
    let hot = |chunk: u64| chunk * PAGES + (chunk * 37) % PAGES;
    let rounds = 12;
    std::thread::spawn(move || {
        for round in 1..=rounds {
            for chunk in 0..chunks {
                let addr = base + hot(chunk) * PAGE_BYTES;
                if round > 1 {
                    assert_eq!(get(addr), value(hot(chunk), round - 1), "chunk {chunk}");
                }
                put(addr, value(hot(chunk), round));
            }
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!(
        "hot pages: {:?}, bytes read {} KiB written {} KiB, evictions {}",
        st.split,
        st.bytes_read >> 10,
        st.bytes_written >> 10,
        st.evictions
    );
    // Enough chunks split for the hot pages to fit: at least the chunks
    // beyond the limit.
    assert!(
        st.split.splits_by_reason.thrashing >= chunks - 16,
        "thrashing chunks split: {:?}",
        st.split
    );
    assert!(st.split.page_faults.store > 0, "hot pages came back alone");
    // Each round after the splits moves 4 KiB pages, not chunks: far less
    // than a chunk read per touch.
    let per_touch = st.bytes_read / (chunks * rounds);
    assert!(
        per_touch < CHUNK / 2,
        "{per_touch} bytes read per hot-page touch"
    );
    assert!(g.fatal_messages().is_empty());
}

#[test]
fn sequential_passes_stay_huge() {
    let chunks = 32;
    let g = start_guest(chunks * CHUNK, store(chunks), auto(8));
    let base = g.base();
    std::thread::spawn(move || {
        for round in 1..=3 {
            for page in 0..chunks * PAGES {
                let addr = base + page * PAGE_BYTES;
                if round > 1 {
                    assert_eq!(get(addr), value(page, round - 1), "page {page}");
                }
                put(addr, value(page, round));
            }
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!("sequential: {:?}, evictions {}", st.split, st.evictions);
    assert!(st.evictions >= 2 * (chunks - 8), "it swapped");
    assert_eq!(
        st.split.splits_by_reason,
        swap::engine::SplitsByReason::default(),
        "a stream's chunks never split"
    );
    println!("prefetch: {:?}", st.prefetch);
    // Whether a prefetch finds headroom depends on the evictor's timing
    // (it is skipped otherwise); what must hold is that no offer was
    // counted twice and the data above was intact.
    assert!(st.prefetch.hits <= st.prefetch.issued, "{:?}", st.prefetch);
}

#[test]
fn a_split_chunk_used_densely_again_collapses() {
    // 10 chunks cycling through a limit of 8 (6 with the evictor's
    // headroom): each comes back about 4 evictions after it left, well
    // within the limit's chunks.
    let chunks = 10;
    let g = start_guest(chunks * CHUNK, store(chunks), auto(8));
    let base = g.base();
    // Thrash one page per chunk until chunks split.
    std::thread::spawn(move || {
        for round in 1..=8 {
            for chunk in 0..chunks {
                let page = chunk * PAGES + 100;
                put(base + page * PAGE_BYTES, value(page, round));
            }
        }
    })
    .join()
    .unwrap();
    // Then write every page of a chunk that split: dense again, it
    // collapses. A chunk split while staged or resident keeps its pages
    // resident until the evictor needs their room, and writes to resident
    // pages do not fault, so nothing would tell the policy the chunk is
    // dense: evict the chosen chunk first, so that every page of the dense
    // pass faults whatever the evictor did meanwhile.
    let dense = (0..chunks)
        .find(|&c| {
            g.engine()
                .page_state(RegionOffset::new(c * CHUNK))
                .is_some()
        })
        .expect("a thrashing chunk split");
    g.engine()
        .evict_range(RegionOffset::new(dense * CHUNK), CHUNK)
        .expect("evicting the split chunk");
    let resident = (0..PAGES)
        .filter(|&p| {
            g.engine()
                .page_state(RegionOffset::new(dense * CHUNK + p * PAGE_BYTES))
                .expect("the evicted chunk stays split")
                .tag()
                == PageTag::Resident
        })
        .count();
    assert_eq!(resident, 0, "chunk {dense} was evicted");
    std::thread::spawn(move || {
        for page in dense * PAGES..(dense + 1) * PAGES {
            put(base + page * PAGE_BYTES, value(page, 99));
        }
        for chunk in 0..chunks {
            let page = chunk * PAGES + 100;
            let want = if chunk == dense { 99 } else { 8 };
            assert_eq!(
                get(base + page * PAGE_BYTES),
                value(page, want),
                "chunk {chunk}"
            );
        }
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    println!("dense: {:?}", st.split);
    assert!(st.split.splits_by_reason.thrashing > 0, "{:?}", st.split);
    assert!(
        st.split.collapses_by_reason.dense > 0 && st.split.collapses_verified > 0,
        "{:?}",
        st.split
    );
    assert!(g.fatal_messages().is_empty());
}
