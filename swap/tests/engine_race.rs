//! Concurrency: many threads faulting on one chunk, and guest writes racing
//! live evictions (every write must survive).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use guestmem::addr::RegionOffset;
use swap::engine::SwapUnit;

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

#[test]
fn concurrent_faults_on_one_chunk_are_resolved_once() {
    let store = VecStore::new(CHUNK as usize);
    let mut cfg = config(SwapUnit::Huge2M);
    cfg.fault_threads = 3;
    let g = start_guest(8 * MB, store.clone(), cfg);
    let base = g.base() + CHUNK;
    let threads = 16u64;
    let run = |write: bool| {
        let barrier = Arc::new(Barrier::new(threads as usize));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let at = base + t * 4096 * 31;
                    if write {
                        put(at, 0x1000 + t);
                    }
                    get(at)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    };
    let first = run(true);
    assert!(
        first
            .iter()
            .enumerate()
            .all(|(t, &v)| v == 0x1000 + t as u64),
        "{first:x?}"
    );
    let st = g.engine().stats();
    println!(
        "16 threads on one absent chunk: {:?}, stale {}",
        st.faults, st.stale_faults
    );
    assert_eq!(st.faults.zero, 1, "restored once");
    assert_eq!(g.engine().evict_all().unwrap().written_units, 1);
    let second = run(false);
    assert!(
        second
            .iter()
            .enumerate()
            .all(|(t, &v)| v == 0x1000 + t as u64),
        "{second:x?}"
    );
    let st = g.engine().stats();
    println!(
        "16 threads on one stored chunk: {:?}, stale {}",
        st.faults, st.stale_faults
    );
    assert_eq!(st.faults.store, 1, "read from the store once");
    assert_eq!(store.reads.load(Ordering::SeqCst), 1);
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// How long the writers keep going past their writes while the race has
/// not been hit often enough: a bound, not a measurement (the race
/// usually needs well under a second).
const RACE_CAP: Duration = Duration::from_secs(120);

/// Writers keep writing (and reading back) while the main thread evicts
/// everything over and over; the store is slowed so faults land on staged
/// units before and during their writes. The writers go on past
/// `writes_per_thread` until faults met a staged unit `min_staged` times,
/// so the race the test names is proven to have happened.
fn writes_survive(unit: SwapUnit, len: u64, writes_per_thread: u64, min_staged: u64) {
    let unit_bytes = unit.bytes();
    let store = VecStore::new(unit_bytes as usize);
    store.write_delay_us.store(1000, Ordering::SeqCst);
    let g = start_guest(len, store.clone(), config(unit));
    let base = g.base();
    let pages = len / 4096;
    let done = Arc::new(AtomicU64::new(0));
    let raced = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + RACE_CAP;
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let done = done.clone();
            let raced = raced.clone();
            std::thread::spawn(move || {
                // Writer t owns pages p with p % 2 == t; expected[p/2] is the
                // last value written at the start of page p (0: untouched).
                let mut expected = vec![0u64; (pages / 2) as usize];
                let mut rng = Rng(0x9e37_79b9 + t);
                let mut n = 0u64;
                while n < writes_per_thread
                    || (!raced.load(Ordering::SeqCst) && Instant::now() < deadline)
                {
                    let i = (rng.next() % (pages / 2)) as usize;
                    let p = i as u64 * 2 + t;
                    let at = base + p * 4096;
                    if rng.next() & 3 == 0 {
                        assert_eq!(get(at), expected[i], "page {p} lost a write");
                    } else {
                        n += 1;
                        let v = (t << 60) | n;
                        put(at, v);
                        expected[i] = v;
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
                (expected, n)
            })
        })
        .collect();
    let mut reports = Vec::new();
    let mut round = 0;
    // Evict for as long as the writers run.
    while done.load(Ordering::SeqCst) < 2 {
        round += 1;
        let r = if round % 2 == 0 {
            g.engine().evict_all().unwrap()
        } else {
            g.engine()
                .evict_range(
                    RegionOffset::new((round as u64 * 8 * unit_bytes) % len),
                    len / 2,
                )
                .unwrap()
        };
        reports.push(r);
        if g.engine().stats().faults.staging >= min_staged {
            raced.store(true, Ordering::SeqCst);
        }
    }
    let rounds = round;
    let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    println!(
        "{unit}: states after the writers {:?}, rss {:?}",
        g.engine().unit_states(),
        common::smaps::huge_and_rss_bytes(base, len)
    );
    g.engine().evict_all().unwrap();
    let checked = std::thread::spawn(move || {
        let mut checked = 0;
        for (t, (expected, _)) in results.iter().enumerate() {
            for (i, &want) in expected.iter().enumerate() {
                let p = i as u64 * 2 + t as u64;
                assert_eq!(get(base + p * 4096), want, "page {p} after the race");
                checked += 1;
            }
        }
        checked
    })
    .join()
    .unwrap();
    let st = g.engine().stats();
    let written: u64 = reports.iter().map(|r| r.written_units).sum();
    let clean: u64 = reports.iter().map(|r| r.clean_dropped_units).sum();
    assert!(
        rounds >= 3,
        "evictions overlapped the writers only {rounds} times"
    );
    let busy_rounds = reports.iter().filter(|r| r.released_units() > 0).count();
    println!(
        "{unit}: {busy_rounds} rounds released memory; latency p50 {} p99 {} max {} us",
        st.fault_latency.p50(),
        st.fault_latency.p99(),
        st.fault_latency.max()
    );
    println!(
        "{unit}: {rounds} eviction rounds, {written} units written, {clean} clean drops; faults {:?}, wp {}, stale {}, hash mismatches {}, busy {}; {checked} pages verified",
        st.faults, st.wp_faults, st.stale_faults, st.clean_hash_mismatches, st.evict_busy
    );
    assert!(g.fatal_messages().is_empty());
    assert!(
        st.faults.staging >= min_staged,
        "faults met a staged unit only {} times in {rounds} rounds (wanted {min_staged}): the race was not hit",
        st.faults.staging
    );
}

#[test]
fn writes_survive_racing_evictions_2m() {
    writes_survive(SwapUnit::Huge2M, 64 * MB, 400_000, 20);
}

#[test]
fn writes_survive_racing_evictions_4k() {
    writes_survive(SwapUnit::Small4K, 4 * MB, 100_000, 200);
}
