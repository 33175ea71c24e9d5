//! Clean tracking, model-checked with shuttle on the engine itself, as
//! `model.rs` does for whole units: an engine built with
//! `ModelEngine::tracking_clean` restores a chunk for a read
//! write-protected and keeps its store copy, and evicts it without a write
//! while it is still clean. The kernel model protects pages as anonymous
//! memory does (a `WriteProtect` fault on a write to a protected page;
//! `UFFDIO_MOVE` installs unprotected), so the window between a restore's
//! move and its protection, the first write's fault, an eviction and a
//! split race here as they do on a vCPU.
//!
//! The invariant is the one a clean drop could break: no guest write is
//! lost. After the threads, the chunk is evicted once more and read back
//! from the store, so a write that a clean drop skipped reads as the old
//! value. Nothing is left in flight, and the store holds a slot for every
//! stored chunk and every chunk that is still clean.
//!
//! Run: `cargo test -p swap --features model-check --test model_clean`
//! (`MODEL_ITERATIONS` sets the schedules per scheduler).
#![cfg(feature = "model-check")]

use std::sync::Arc;
use swap::chunk::Tag;
use swap::engine::model::{self, spawn, ModelEngine};
use swap::engine::{EngineConfig, SwapUnit};

/// Each scenario under both schedulers, 1000 schedules each by default.
fn check(scenario: fn()) {
    model::check(scenario, 1000);
}

/// One unit of `unit` holding `values` (page, value), written out to the
/// store: its copy (and for 2 MiB its content hash) are recorded.
fn stored(unit: SwapUnit, values: &[(usize, u64)]) -> Arc<ModelEngine> {
    let model = Arc::new(ModelEngine::tracking_clean(
        1,
        EngineConfig::default(),
        unit,
    ));
    for &(page, value) in values {
        model.write_value(0, page, value);
    }
    model.evict(0);
    assert_eq!(model.state(0).tag(), Tag::Stored, "the starting state");
    model
}

/// As [`stored`], then read back: resident, clean and write-protected.
fn resident_clean(unit: SwapUnit, values: &[(usize, u64)]) -> Arc<ModelEngine> {
    let model = stored(unit, values);
    assert_eq!(model.read(0, values[0].0), values[0].1);
    let state = model.state(0);
    assert!(
        state.tag() == Tag::Resident && state.clean() && state.wp(),
        "the starting state: {state:?}"
    );
    model
}

/// After the threads: nothing in flight, then the chunk goes out to the
/// store once more (a no-op if it is there) and every page of `want`
/// reads its value back from it.
fn settle_and_check(model: &ModelEngine, want: &[(usize, u64)]) {
    model.check_quiescent();
    model.evict(0);
    model.check_quiescent();
    for &(page, value) in want {
        assert_eq!(model.read(0, page), value, "page {page} after a round trip");
    }
    model.check_quiescent();
}

/// Runs `writes` on one thread against two evictors of unit 0, and waits
/// for all three.
fn race_two_evictions(model: &Arc<ModelEngine>, writes: fn(&ModelEngine)) {
    let writer = spawn(model, writes);
    let evictors = [spawn(model, |m| m.evict(0)), spawn(model, |m| m.evict(0))];
    writer.join().unwrap();
    for e in evictors {
        e.join().unwrap();
    }
}

#[test]
fn a_write_inside_a_restore_s_protection_window_is_written_back() {
    check(|| {
        let model = stored(SwapUnit::Huge2M, &[(0, 1)]);
        // The reader's restore moves the chunk in, then protects it; the
        // writer may write in between, without a fault.
        let reader = spawn(&model, |m| assert_eq!(m.read(0, 0), 1));
        let writer = spawn(&model, |m| m.write_value(0, 5, 2));
        let evictor = spawn(&model, |m| m.evict(0));
        for t in [reader, writer, evictor] {
            t.join().unwrap();
        }
        settle_and_check(&model, &[(0, 1), (5, 2)]);
    });
}

#[test]
fn a_first_write_racing_the_eviction_of_a_clean_chunk_is_not_lost() {
    check(|| {
        let model = resident_clean(SwapUnit::Huge2M, &[(0, 1)]);
        race_two_evictions(&model, |m| {
            m.write_value(0, 0, 2);
            m.write_value(0, 9, 3);
        });
        settle_and_check(&model, &[(0, 2), (9, 3)]);
    });
}

#[test]
fn a_clean_chunk_split_and_collapsed_while_written_keeps_every_write() {
    check(|| {
        let model = resident_clean(SwapUnit::Huge2M, &[(0, 1), (1, 2)]);
        let splitter = spawn(&model, |m| {
            m.split(0);
            m.collapse(0);
        });
        let writer = spawn(&model, |m| m.write_value(0, 0, 5));
        let evictor = spawn(&model, |m| {
            m.evict_page(0, 1);
            m.evict(0);
        });
        for t in [splitter, writer, evictor] {
            t.join().unwrap();
        }
        // Split or merged, the chunk's round trip below covers both pages.
        settle_and_check(&model, &[(0, 5), (1, 2)]);
    });
}

#[test]
fn a_first_write_to_a_clean_4k_unit_racing_its_eviction_is_not_lost() {
    check(|| {
        // No content hash here: only the write-protect fault marks the
        // unit dirty.
        let model = resident_clean(SwapUnit::Small4K, &[(0, 1)]);
        race_two_evictions(&model, |m| {
            m.write_value(0, 0, 2);
            m.write_value(0, 0, 3);
        });
        settle_and_check(&model, &[(0, 3)]);
    });
}

#[test]
fn a_write_racing_a_clean_4k_restore_is_not_lost() {
    check(|| {
        let model = stored(SwapUnit::Small4K, &[(0, 1)]);
        let reader = spawn(&model, |m| {
            let seen = m.read(0, 0);
            assert!(seen == 1 || seen == 2, "read {seen}");
        });
        let writer = spawn(&model, |m| m.write_value(0, 0, 2));
        let evictor = spawn(&model, |m| m.evict(0));
        for t in [reader, writer, evictor] {
            t.join().unwrap();
        }
        settle_and_check(&model, &[(0, 2)]);
    });
}
