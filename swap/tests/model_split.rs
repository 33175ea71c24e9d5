//! The split-chunk protocol, model-checked with shuttle on the engine
//! itself, as `model.rs` does for whole units: the fault service's
//! `handle` (and through it the splitter), the page evictor and the
//! collapser run on shuttle threads over the real chunk and page tables and
//! the kernel model of `swap::engine::model`. Each scenario builds its
//! starting state with the engine's own calls (writes, a split, page
//! evictions), then races threads on pages A (page 0) and B (page 1) of
//! one chunk; the chunk's other 510 pages stay resident zero pages.
//! Invariants: the kernel model refuses an install onto a mapped page and
//! a move from a missing one (the engine then fails, which fails the
//! schedule), a store read never misses (the store's own error), every
//! page reads what was last written, and nothing is left in flight.
//!
//! Run: `cargo test -p swap --features model-check --test model_split`
//! (`MODEL_ITERATIONS` sets the schedules per scheduler; the default is
//! lower than `model.rs`'s because a collapse locks 512 pages, each a
//! scheduling point).
#![cfg(feature = "model-check")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use swap::chunk::{PageTag, Tag, PAGES_PER_CHUNK};
use swap::engine::model::{self, spawn, ModelEngine};
use swap::engine::EngineConfig;

const A: usize = 0;
const B: usize = 1;

/// A page's starting state: `None` absent, `Some((true, v))` resident
/// holding `v`, `Some((false, v))` stored holding `v` (not 0: a zero page
/// is dropped, not stored).
type Start = Option<(bool, u64)>;

/// One chunk, split, with pages A and B as `a` and `b` say. The chunk has
/// a store slot once one of them was stored (the first page write gives
/// it one).
fn split(a: Start, b: Start) -> Arc<ModelEngine> {
    let model = Arc::new(ModelEngine::new(1, EngineConfig::default()));
    for (page, start) in [(A, a), (B, b)] {
        model.write_value(0, page, start.map_or(0, |(_, value)| value));
    }
    model.split(0);
    for (page, start) in [(A, a), (B, b)] {
        // A stored page is written back; an absent one is found zero and
        // dropped.
        if !matches!(start, Some((true, _))) {
            model.evict_page(0, page);
        }
        let want = match start {
            None => PageTag::Absent,
            Some((true, _)) => PageTag::Resident,
            Some((false, _)) => PageTag::Stored,
        };
        assert_eq!(
            model.page_tag(0, page),
            want,
            "the starting state of page {page}"
        );
    }
    model
}

/// One chunk, stored whole, with `a` in page A and `b` in page B.
fn stored(a: u64, b: u64) -> Arc<ModelEngine> {
    let model = Arc::new(ModelEngine::new(1, EngineConfig::default()));
    model.write_value(0, A, a);
    model.write_value(0, B, b);
    model.evict(0);
    assert_eq!(model.state(0).tag(), Tag::Stored, "the starting state");
    model
}

/// Each scenario under both schedulers, 300 schedules each by default.
fn check(scenario: fn()) {
    model::check(scenario, 300);
}

#[test]
fn a_fault_on_page_a_while_page_b_is_evicted_loses_nothing() {
    check(|| {
        let model = split(Some((true, 1)), Some((true, 1)));
        let writer = spawn(&model, |m| {
            m.write(0, A);
            m.write(0, A);
        });
        let evictor = spawn(&model, |m| {
            m.evict_page(0, B);
            m.evict_page(0, A);
        });
        let reader = spawn(&model, |m| assert_eq!(m.read(0, B), 1));
        writer.join().unwrap();
        evictor.join().unwrap();
        reader.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 3);
        assert_eq!(model.read(0, B), 1);
    });
}

/// Two readers fault on the same stored page: one restores it, the
/// other's message finds it resident, while an evictor moves it out and
/// back. Without the resident fault owning the page, the second reader's
/// zero install lands in the slot the evictor just emptied (engine
/// before 99e5016).
#[test]
fn a_duplicate_fault_on_a_page_an_evictor_moves_out_reads_its_content() {
    check(|| {
        let model = split(Some((false, 5)), None);
        let readers: Vec<_> = (0..2)
            .map(|_| spawn(&model, |m| assert_eq!(m.read(0, A), 5)))
            .collect();
        let evictor = spawn(&model, |m| {
            m.evict_page(0, A);
            m.evict_page(0, A);
        });
        for r in readers {
            r.join().unwrap();
        }
        evictor.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 5);
    });
}

#[test]
fn a_fault_during_a_split_sees_the_stored_content() {
    check(|| {
        let model = stored(5, 7);
        // The reader's fault or the writer's, whichever claims the chunk,
        // splits it on its restore; the other waits and faults its page.
        model.split_restores(true);
        let splitter = spawn(&model, |m| assert_eq!(m.read(0, B), 7));
        let writer = spawn(&model, |m| m.write(0, A));
        splitter.join().unwrap();
        writer.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 6);
        assert_eq!(model.read(0, B), 7);
    });
}

/// Schedules of `an_eviction_racing_a_collapse_loses_nothing` that ended
/// with the chunk merged: the race is only checked if some did.
static MERGED: AtomicUsize = AtomicUsize::new(0);

/// Schedules of the same scenario in which the page eviction lost the race
/// (the merge had begun when the page needed the chunk's slot) and put the
/// page back: that path is only checked if some did.
static GIVEN_UP: AtomicUsize = AtomicUsize::new(0);

#[test]
fn an_eviction_racing_a_collapse_loses_nothing() {
    check(|| {
        let model = split(Some((true, 3)), Some((false, 4)));
        let collapser = spawn(&model, |m| m.collapse(0));
        let evictor = spawn(&model, |m| m.evict_page(0, A));
        let writer = spawn(&model, |m| m.write(0, B));
        collapser.join().unwrap();
        evictor.join().unwrap();
        writer.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 3);
        assert_eq!(model.read(0, B), 5);
        let state = model.state(0);
        assert!(
            matches!(state.tag(), Tag::Resident | Tag::Split),
            "{state:?}"
        );
        if state.tag() == Tag::Resident {
            MERGED.fetch_add(1, Ordering::Relaxed);
        }
        if model.stats().split.pages_given_up > 0 {
            GIVEN_UP.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert!(
        MERGED.load(Ordering::Relaxed) > 0,
        "no schedule merged the chunk: the collapse was never raced"
    );
    assert!(
        GIVEN_UP.load(Ordering::Relaxed) > 0,
        "no schedule gave the page eviction up: its race with the merge was never run"
    );
}

#[test]
fn a_page_eviction_drops_a_stray_zero_page_in_its_parking_page() {
    check(|| {
        let model = split(Some((true, 3)), Some((true, 4)));
        // Every parking page holds the zero page a late stray fault would
        // leave: the move out finds its destination present (EEXIST).
        model.strew_zero_pages_in_parking();
        let evictor = spawn(&model, |m| m.evict_page(0, A));
        let writer = spawn(&model, |m| m.write(0, B));
        evictor.join().unwrap();
        writer.join().unwrap();
        assert_eq!(model.page_tag(0, A), PageTag::Stored);
        model.check_quiescent();
        assert_eq!(model.read(0, A), 3);
        assert_eq!(model.read(0, B), 5);
    });
}

/// Schedules of `evicting_a_split_chunk_whole_racing_a_collapse_loses_nothing`
/// that ended with the chunk merged.
static MERGED_WHOLE: AtomicUsize = AtomicUsize::new(0);

#[test]
fn evicting_a_split_chunk_whole_racing_a_collapse_loses_nothing() {
    // The evictor's sweep over every page of the chunk (`evict_split`)
    // against a merge: whatever it took before the merge began stays
    // consistent with what the merge reads back, and the pages it reaches
    // after are left to the merge or put back.
    check(|| {
        let model = split(Some((true, 3)), Some((false, 4)));
        let collapser = spawn(&model, |m| m.collapse(0));
        let evictor = spawn(&model, |m| m.evict(0));
        collapser.join().unwrap();
        evictor.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 3);
        assert_eq!(model.read(0, B), 4);
        if model.state(0).tag() == Tag::Resident {
            MERGED_WHOLE.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert!(
        MERGED_WHOLE.load(Ordering::Relaxed) > 0,
        "no schedule merged the chunk: the collapse was never raced"
    );
}

#[test]
fn faults_during_a_collapse_wait_and_keep_every_write() {
    check(|| {
        let model = split(Some((false, 10)), None);
        let collapser = spawn(&model, |m| m.collapse(0));
        let a = spawn(&model, |m| m.write(0, A));
        let b = spawn(&model, |m| {
            m.write(0, B);
            m.evict_page(0, B);
        });
        collapser.join().unwrap();
        a.join().unwrap();
        b.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 11);
        assert_eq!(model.read(0, B), 1);
        // Pages of a chunk that is not split are locked.
        if model.state(0).tag() == Tag::Resident {
            for p in [0, PAGES_PER_CHUNK - 1] {
                assert_eq!(model.page_tag(0, p), PageTag::Locked);
            }
        }
    });
}

#[test]
fn the_first_page_write_gives_the_chunk_its_slot_even_racing_a_collapse() {
    check(|| {
        let model = split(Some((true, 2)), Some((true, 9)));
        let evictor = spawn(&model, |m| {
            m.evict_page(0, A);
            m.evict_page(0, B);
        });
        let collapser = spawn(&model, |m| m.collapse(0));
        evictor.join().unwrap();
        collapser.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 2);
        assert_eq!(model.read(0, B), 9);
    });
}

/// A fault on a split chunk's stored page whose thread read the chunk
/// word as `Split` before another thread collapsed the chunk, evicted it
/// whole and split it again on its restore: the page it then takes may be
/// one the new split unlocked before publishing its word.
#[test]
fn a_fault_racing_a_collapse_an_eviction_and_a_split_on_restore_reads_its_page() {
    check(|| {
        let model = split(Some((false, 1)), Some((true, 2)));
        let reader = spawn(&model, |m| assert_eq!(m.read(0, A), 1));
        let churner = spawn(&model, |m| {
            m.collapse(0);
            m.evict(0);
            m.split_restores(true);
            assert_eq!(m.read(0, B), 2);
        });
        reader.join().unwrap();
        churner.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(0, A), 1);
        assert_eq!(model.read(0, B), 2);
    });
}
