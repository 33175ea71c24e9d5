//! The fault / evict / write-back / discard protocol, model-checked with
//! shuttle on the engine itself: the fault service's `handle`, the
//! evictor and the discarder run on shuttle threads, over the real unit
//! table (built with shuttle's atomics and locks under `--features
//! model-check`) and a model of the kernel behind the trait the
//! userfaultfd wrapper implements (`swap::engine::model`). A change to
//! the engine's steps is what the model checks; nothing here restates
//! their order.
//!
//! The invariants: the kernel model refuses a restore onto a mapped unit
//! and a move from a missing one (the engine then fails, which fails the
//! schedule); the guest reads what it last wrote; after the threads end
//! nothing is in flight and no store or parking slot is held by nobody.
//!
//! Run: `cargo test -p swap --features model-check --test model`
//! (`MODEL_ITERATIONS` sets the schedules per scheduler; CI runs the
//! default). Each test explores that many random schedules and as many PCT
//! schedules (priority-based, depth 3: finds bugs that need up to three
//! ill-timed preemptions with a known probability).
#![cfg(feature = "model-check")]

use std::sync::Arc;
use swap::engine::model::{self, spawn, ModelEngine};
use swap::engine::EngineConfig;

/// An engine of one 2 MiB unit, all absent.
fn one_unit() -> Arc<ModelEngine> {
    Arc::new(ModelEngine::new(1, EngineConfig::default()))
}

/// Each scenario under both schedulers, 2000 schedules each by default.
fn check(scenario: fn()) {
    model::check(scenario, 2000);
}

fn write(model: &ModelEngine) {
    model.write(0, 0);
}

fn evict(model: &ModelEngine) {
    model.evict(0);
}

fn discard(model: &ModelEngine) {
    model.discard(0);
}

#[test]
fn two_faults_on_one_unit_restore_it_once_and_keep_both_writes() {
    check(|| {
        let model = one_unit();
        let a = spawn(&model, write);
        let b = spawn(&model, write);
        a.join().unwrap();
        b.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, 0), 2);
    });
}

#[test]
fn faults_racing_evictions_at_every_step_lose_no_write() {
    check(|| {
        let model = one_unit();
        model.write(0, 0);
        let writer = spawn(&model, |m| {
            m.write(0, 0);
            m.write(0, 0);
        });
        let evictor = spawn(&model, |m| {
            m.evict(0);
            m.evict(0);
        });
        writer.join().unwrap();
        evictor.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, 0), 3);
    });
}

#[test]
fn a_write_back_completing_while_the_unit_is_handed_back_loses_nothing() {
    check(|| {
        let model = one_unit();
        model.write(0, 0);
        // Two evictors, so one writes back while the unit is handed back
        // and evicted again by the other.
        let evictors = [spawn(&model, evict), spawn(&model, evict)];
        let reader = spawn(&model, |m| {
            assert_eq!(m.read(0, 0), 1);
            m.write(0, 0);
        });
        for e in evictors {
            e.join().unwrap();
        }
        reader.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, 0), 2);
    });
}

#[test]
fn a_discard_racing_faults_and_evictions_leaves_zero_and_no_slot() {
    check(|| {
        let model = one_unit();
        for _ in 0..5 {
            model.write(0, 0);
        }
        let reader = spawn(&model, |m| {
            let seen = m.read(0, 0);
            assert!(seen == 5 || seen == 0, "read {seen}");
        });
        let evictor = spawn(&model, evict);
        let discarder = spawn(&model, discard);
        reader.join().unwrap();
        evictor.join().unwrap();
        discarder.join().unwrap();
        // Discarded last (the guest wrote nothing after): zero, and neither
        // a parked nor a stored copy left behind — unless the evictor took
        // it after the discard, which finds it zero and keeps nothing.
        model.check_quiescent();
        assert_eq!(model.read(0, 0), 0);
    });
}
