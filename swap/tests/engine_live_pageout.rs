//! Evicting everything (`evict_all`, the control socket's `pageout`) while
//! writers run and the background evictor holds a memory limit, over the
//! O_DIRECT file store: every write must survive.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use swap::engine::{EngineConfig, SwapUnit};
use swap::store::FileStore;

const MB: u64 = 1 << 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `sweeps` sweeps at least, and on (within a generous bound) until
/// faults met a staged unit `min_staged` times: the race is proven.
fn live_pageout(unit: SwapUnit, len: u64, limit: u64, sweeps: u64, min_staged: u64) {
    let store = match FileStore::temporary(&std::env::temp_dir(), unit.bytes() as usize, 2 * len) {
        Ok(store) => store,
        Err(e) => {
            test_resources::skip(
                module_path!(),
                test_resources::Resource::ODirect,
                format!("no O_DIRECT file store in the temporary directory: {e}"),
            );
            return;
        }
    };
    let g = start_guest(
        len,
        Arc::new(store),
        EngineConfig {
            mem_limit_bytes: Some(limit),
            ..config(unit)
        },
    );
    let base = g.base();
    let pages = len / 4096;
    let stop = Arc::new(AtomicBool::new(false));
    let raced = Arc::new(AtomicBool::new(false));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    // One writer sweeping like the verify payload: every page gets a value
    // that depends on the sweep; each sweep checks the previous one.
    let writer = {
        let stop = stop.clone();
        let raced = raced.clone();
        std::thread::spawn(move || {
            let value = |p: u64, gen: u64| (p << 20) ^ gen.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut gen = 0;
            while gen < sweeps
                || (!raced.load(Ordering::SeqCst) && std::time::Instant::now() < deadline)
            {
                gen += 1;
                for p in 0..pages {
                    let at = base + p * 4096;
                    if gen > 1 {
                        let got = get(at);
                        assert_eq!(
                            got,
                            value(p, gen - 1),
                            "page {p} lost sweep {} (found {got:#x})",
                            gen - 1
                        );
                    }
                    put(at, value(p, gen));
                }
            }
            stop.store(true, Ordering::SeqCst);
        })
    };
    let mut rng = Rng(12345);
    let mut rounds = 0;
    while !stop.load(Ordering::SeqCst) && !writer.is_finished() {
        g.engine().evict_all().unwrap();
        rounds += 1;
        if g.engine().stats().faults.staging >= min_staged {
            raced.store(true, Ordering::SeqCst);
        }
        std::thread::sleep(std::time::Duration::from_micros(rng.next() % 3000));
    }
    writer.join().unwrap();
    let faults = g.engine().stats().faults;
    println!("{unit}: {rounds} live pageouts; stats {faults:?}");
    assert!(g.fatal_messages().is_empty());
    assert!(
        faults.staging >= min_staged,
        "faults met a staged unit only {} times in {rounds} pageouts (wanted {min_staged}): the race was not hit",
        faults.staging
    );
}

#[test]
fn writes_survive_live_pageout_over_the_file_store_2m() {
    live_pageout(SwapUnit::Huge2M, 64 * MB, 48 * MB, 30, 20);
}

#[test]
fn writes_survive_live_pageout_over_the_file_store_4k() {
    live_pageout(SwapUnit::Small4K, 8 * MB, 6 * MB, 30, 200);
}
