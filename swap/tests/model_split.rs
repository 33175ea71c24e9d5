//! The split-chunk protocol, model-checked with shuttle on the real chunk
//! and page tables (`--features model-check`), as `model.rs` does for whole
//! units: each thread runs the engine's steps (`engine/split.rs`,
//! `engine/evict.rs`, `engine/collapse.rs`) with the same named
//! transitions and waits, on a model of the kernel: each of two pages of
//! interest (A = page 0, B = page 1; the chunk's other 510 pages stay
//! absent) is a `Mutex<Option<u64>>` (mapped or not), the chunk's store
//! slot a map from page to content. Invariants: an install never lands on
//! a mapped page, a store read never misses (that would be a zero fill),
//! and after the threads end every page reads what was last written.
//!
//! Run: `cargo test -p swap --features model-check --test model_split`
//! (`MODEL_ITERATIONS` sets the schedules per scheduler; the default is
//! lower than `model.rs`'s because a collapse locks 512 pages, each a
//! scheduling point).
#![cfg(feature = "model-check")]

use shuttle::sync::Mutex;
use shuttle::thread;
use std::collections::HashMap;
use std::sync::Arc;
use swap::chunk::{
    ChunkTable, PageRef, PageState, PageTag, PageTransition, Restored, Tag, UnitRef,
    PAGES_PER_CHUNK,
};
use swap::index::{PageIndex, UnitIndex};
use swap::store::SlotId;

const A: usize = 0;
const B: usize = 1;

/// The model's one chunk.
const CHUNK: UnitIndex = UnitIndex::FIRST;

fn chunk() -> UnitRef {
    UnitRef::unit(CHUNK)
}

fn page(page: usize) -> PageRef {
    CHUNK.page(PageIndex::new(page))
}

struct Model {
    table: ChunkTable,
    memory: [Mutex<Option<u64>>; 2],
    /// The chunk's store slot: content by page (split), or both pages
    /// (stored whole, under key `usize::MAX` for "the unit").
    store: Mutex<HashMap<usize, u64>>,
}

impl Model {
    /// A split chunk whose pages A and B are as given (`None`: absent,
    /// `Some((true, v))` resident with v, `Some((false, v))` stored v).
    fn split(a: Option<(bool, u64)>, b: Option<(bool, u64)>) -> Arc<Model> {
        Model::split_with_slot(a, b, true)
    }

    /// As [`Model::split`]; `with_slot` false: the chunk has no store slot
    /// yet (its first page write gives it one).
    fn split_with_slot(
        a: Option<(bool, u64)>,
        b: Option<(bool, u64)>,
        with_slot: bool,
    ) -> Arc<Model> {
        let model = Arc::new(Model {
            table: ChunkTable::new(1, 2 << 20, false),
            memory: [Mutex::new(None), Mutex::new(None)],
            store: Mutex::new(HashMap::new()),
        });
        let start = [a, b];
        for (i, p) in start.iter().enumerate() {
            match p {
                Some((true, v)) => *model.memory[i].lock().unwrap() = Some(*v),
                Some((false, v)) => {
                    model.store.lock().unwrap().insert(i, *v);
                }
                None => {}
            }
        }
        let loading = model
            .table
            .begin_fault(chunk(), model.table.load(CHUNK))
            .unwrap();
        model
            .table
            .finish_split(chunk(), loading, with_slot.then(|| SlotId::new(0)), &|p| {
                PageState::new(match start.get(p.get()).copied().flatten() {
                    Some((true, _)) => PageTag::Resident,
                    Some((false, _)) => PageTag::Stored,
                    None => PageTag::Absent,
                })
            });
        model
    }

    /// A chunk stored whole with pages A = a, B = b.
    fn stored(a: u64, b: u64) -> Arc<Model> {
        let model = Arc::new(Model {
            table: ChunkTable::new(1, 2 << 20, false),
            memory: [Mutex::new(None), Mutex::new(None)],
            store: Mutex::new(HashMap::from([(A, a), (B, b)])),
        });
        // Absent → Loading → Resident → Evicting → Staged → written: just
        // take the named steps to Stored.
        let loading = model
            .table
            .begin_fault(chunk(), model.table.load(CHUNK))
            .unwrap();
        let restored = Restored {
            huge: true,
            clean_slot: None,
            write_protected: false,
            prefetched: false,
        };
        let resident = model.table.finish_restore(chunk(), loading, restored);
        let evicting = model.table.begin_evict(chunk(), resident).unwrap();
        let staged = model.table.settle(
            chunk(),
            evicting,
            swap::chunk::Settled::Dirty {
                parking: swap::index::ParkingSlot::new(0),
            },
        );
        model.table.begin_write(chunk(), staged).unwrap();
        let writing = model.table.load(CHUNK);
        model
            .table
            .finish_write(chunk(), writing, SlotId::new(0))
            .unwrap();
        model
    }

    fn install(&self, p: usize, value: u64) {
        let mut memory = self.memory[p].lock().unwrap();
        assert!(memory.is_none(), "an install landed on mapped page {p}");
        *memory = Some(value);
    }

    fn read_store(&self, p: usize) -> u64 {
        *self
            .store
            .lock()
            .unwrap()
            .get(&p)
            .unwrap_or_else(|| panic!("page {p}'s store copy is missing"))
    }

    /// A fault on page `p`, as `fault.rs` `handle` and `split::page_fault`
    /// take it.
    fn fault(&self, p: usize) {
        let pages = self.table.pages().unwrap();
        loop {
            let state = self.table.load(CHUNK);
            match state.tag() {
                Tag::Loading | Tag::Evicting => {
                    self.table.wait_settled(CHUNK, &|| false);
                }
                Tag::Resident => return,
                Tag::Stored => {
                    // Restored whole (the split lost the race).
                    if let Ok(loading) = self.table.begin_fault(chunk(), state) {
                        for q in [A, B] {
                            let v = self.read_store(q);
                            self.install(q, v);
                        }
                        self.store.lock().unwrap().clear();
                        let restored = Restored {
                            huge: true,
                            clean_slot: None,
                            write_protected: false,
                            prefetched: false,
                        };
                        self.table.finish_restore(chunk(), loading, restored);
                        return;
                    }
                }
                Tag::Split => {
                    let at = page(p);
                    let ps = pages.load(at);
                    match ps.tag() {
                        PageTag::Locked => continue,
                        PageTag::Loading | PageTag::Evicting => {
                            pages.wait_settled(at, &|| false);
                        }
                        PageTag::Resident => {
                            // As `Splitter::page_fault`: the message is
                            // resolved with the page owned, so no evictor
                            // moves it out meanwhile; a hole (nothing
                            // mapped) reads as zero, a mapped page is left
                            // as it is (the kernel's EEXIST).
                            if let Ok(owned) = pages.begin_resident_fault(at, ps) {
                                if self.memory[p].lock().unwrap().is_none() {
                                    self.install(p, 0);
                                }
                                pages.end_resident_fault(at, owned);
                                return;
                            }
                        }
                        PageTag::Absent | PageTag::Stored => {
                            if let Ok(loading) = pages.begin_fault(at, ps) {
                                let v = if ps.tag() == PageTag::Stored {
                                    self.read_store(p)
                                } else {
                                    0
                                };
                                self.install(p, v);
                                pages.finish_restore(at, loading);
                                return;
                            }
                        }
                    }
                }
                other => unreachable!("{other:?}"),
            }
        }
    }

    fn write(&self, p: usize) {
        loop {
            if let Some(v) = self.memory[p].lock().unwrap().as_mut() {
                *v += 1;
                return;
            }
            self.fault(p);
        }
    }

    fn read(&self, p: usize) -> u64 {
        loop {
            if let Some(v) = *self.memory[p].lock().unwrap() {
                return v;
            }
            self.fault(p);
        }
    }

    /// Evicts page `p` of the split chunk, as `Evictor::evict_page` and
    /// `flush_pages` take it (zero pages are dropped).
    fn evict_page(&self, p: usize) {
        if self.table.load(CHUNK).tag() != Tag::Split {
            return;
        }
        let pages = self.table.pages().unwrap();
        let at = page(p);
        let state = pages.load(at);
        if state.tag() != PageTag::Resident {
            return;
        }
        let Ok(evicting) = pages.begin_evict(at, state) else {
            return;
        };
        // The chunk's slot, as `Evictor::split_slot` gets it while the page
        // is in flight: given only to a chunk whose word says Split.
        loop {
            let word = self.table.load(CHUNK);
            if word.split_slot().is_some() {
                break;
            }
            if word.tag() != Tag::Split {
                pages.settle(at, evicting, PageTransition::AbortEvict);
                return;
            }
            if self
                .table
                .assign_split_slot(chunk(), word, SlotId::new(1))
                .is_ok()
            {
                break;
            }
        }
        let v = self.memory[p]
            .lock()
            .unwrap()
            .take()
            .expect("a resident page is mapped");
        if v == 0 {
            pages.settle(at, evicting, PageTransition::SettleZero);
        } else {
            self.store.lock().unwrap().insert(p, v);
            pages.settle(at, evicting, PageTransition::SettleWritten);
        }
    }

    /// Splits the chunk if it is stored or resident, as `split_on_restore`
    /// and `split_resident` do.
    fn split_now(&self) {
        let state = self.table.load(CHUNK);
        let tag = match state.tag() {
            Tag::Stored => PageTag::Stored,
            Tag::Resident => PageTag::Resident,
            _ => return,
        };
        let Ok(loading) = self.table.begin_fault(chunk(), state) else {
            return;
        };
        let slot = (tag == PageTag::Stored).then(|| SlotId::new(0));
        self.table
            .finish_split(chunk(), loading, slot, &|_| PageState::new(tag));
    }

    /// Collapses the split chunk, as `collapse::try_collapse` does.
    fn collapse(&self) {
        let split = self.table.load(CHUNK);
        if split.tag() != Tag::Split {
            return;
        }
        let Ok(loading) = self.table.begin_merge(chunk(), split) else {
            return;
        };
        let pages = self.table.pages().unwrap();
        let before = pages.lock_all(CHUNK, &|| false).expect("never gives up");
        if before.iter().any(|p| p.tag() == PageTag::Stored) {
            assert!(
                loading.split_slot().is_some(),
                "a stored page but the merging word names no slot: {loading:?}"
            );
        }
        // Move the resident pages out, read the stored ones, then install.
        let mut values = [0u64; 2];
        for q in [A, B] {
            values[q] = match before[q].tag() {
                PageTag::Resident => self.memory[q]
                    .lock()
                    .unwrap()
                    .take()
                    .expect("a resident page is mapped"),
                PageTag::Stored => self.read_store(q),
                PageTag::Absent => 0,
                other => unreachable!("locked from {other:?}"),
            };
        }
        for q in [A, B] {
            self.install(q, values[q]);
        }
        self.store.lock().unwrap().clear();
        self.table.finish_collapse(chunk(), loading, true);
    }
}

fn iterations() -> usize {
    std::env::var("MODEL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn check(scenario: fn()) {
    let mut config = shuttle::Config::new();
    // A page group's 512 state words are shuttle's atomics in this build,
    // tens of bytes each, and the thread that first touches the group
    // builds them on its stack: more than shuttle's default 32 KiB
    // (a SIGSEGV, not a failure, once the access tables grew the group).
    config.stack_size = 1 << 20;
    shuttle::Runner::new(
        shuttle::scheduler::RandomScheduler::new(iterations()),
        config.clone(),
    )
    .run(scenario);
    shuttle::Runner::new(
        shuttle::scheduler::PctScheduler::new(3, iterations()),
        config,
    )
    .run(scenario);
}

fn spawn(model: &Arc<Model>, steps: fn(&Model)) -> thread::JoinHandle<()> {
    let model = model.clone();
    thread::spawn(move || steps(&model))
}

#[test]
fn a_fault_on_page_a_while_page_b_is_evicted_loses_nothing() {
    check(|| {
        let model = Model::split(Some((true, 1)), Some((true, 1)));
        let writer = spawn(&model, |m| {
            m.write(A);
            m.write(A);
        });
        let evictor = spawn(&model, |m| {
            m.evict_page(B);
            m.evict_page(A);
        });
        let reader = spawn(&model, |m| assert_eq!(m.read(B), 1));
        writer.join().unwrap();
        evictor.join().unwrap();
        reader.join().unwrap();
        assert_eq!(model.read(A), 3);
        assert_eq!(model.read(B), 1);
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
        let model = Model::split(Some((false, 5)), None);
        let readers: Vec<_> = (0..2)
            .map(|_| spawn(&model, |m| assert_eq!(m.read(A), 5)))
            .collect();
        let evictor = spawn(&model, |m| {
            m.evict_page(A);
            m.evict_page(A);
        });
        for r in readers {
            r.join().unwrap();
        }
        evictor.join().unwrap();
        assert_eq!(model.read(A), 5);
    });
}

#[test]
fn a_fault_during_a_split_sees_the_stored_content() {
    check(|| {
        let model = Model::stored(5, 7);
        let splitter = spawn(&model, Model::split_now);
        let writer = spawn(&model, |m| m.write(A));
        splitter.join().unwrap();
        writer.join().unwrap();
        assert_eq!(model.read(A), 6);
        assert_eq!(model.read(B), 7);
    });
}

#[test]
fn an_eviction_racing_a_collapse_loses_nothing() {
    check(|| {
        let model = Model::split(Some((true, 3)), Some((false, 4)));
        let collapser = spawn(&model, Model::collapse);
        let evictor = spawn(&model, |m| m.evict_page(A));
        let writer = spawn(&model, |m| m.write(B));
        collapser.join().unwrap();
        evictor.join().unwrap();
        writer.join().unwrap();
        assert_eq!(model.read(A), 3);
        assert_eq!(model.read(B), 5);
        let state = model.table.load(CHUNK);
        assert!(
            matches!(state.tag(), Tag::Resident | Tag::Split),
            "{state:?}"
        );
    });
}

#[test]
fn faults_during_a_collapse_wait_and_keep_every_write() {
    check(|| {
        let model = Model::split(Some((false, 10)), None);
        let collapser = spawn(&model, Model::collapse);
        let a = spawn(&model, |m| m.write(A));
        let b = spawn(&model, |m| {
            m.write(B);
            m.evict_page(B);
        });
        collapser.join().unwrap();
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(model.read(A), 11);
        assert_eq!(model.read(B), 1);
        // Pages of a chunk that is not split are locked.
        if model.table.load(CHUNK).tag() == Tag::Resident {
            let pages = model.table.pages().unwrap();
            for p in [0, PAGES_PER_CHUNK - 1] {
                assert_eq!(pages.load(page(p)).tag(), PageTag::Locked);
            }
        }
    });
}

#[test]
fn the_first_page_write_gives_the_chunk_its_slot_even_racing_a_collapse() {
    check(|| {
        let model = Model::split_with_slot(Some((true, 2)), Some((true, 9)), false);
        let evictor = spawn(&model, |m| {
            m.evict_page(A);
            m.evict_page(B);
        });
        let collapser = spawn(&model, Model::collapse);
        evictor.join().unwrap();
        collapser.join().unwrap();
        assert_eq!(model.read(A), 2);
        assert_eq!(model.read(B), 9);
    });
}
