//! The fault / evict / write-back / discard protocol, model-checked with
//! shuttle on the real unit table (`swap::chunk::ChunkTable`, built with
//! shuttle's atomics and locks under `--features model-check`).
//!
//! Each thread runs the engine's steps for one unit as `engine/restore.rs`,
//! `engine/evict/unit.rs` and `engine/discard.rs` take them — the same named
//! transitions, in the same order, with the same waits — on a model of
//! what the kernel does around them: the guest mapping is a `Mutex<Option<u64>>`
//! (`UFFDIO_MOVE` takes it away atomically, a guest access either finds it
//! or faults), the parking area and the store are maps of slots. The
//! invariants: a restore never lands on a mapped unit, a store or parking
//! slot read is never missing (that would be a zero fill), and after the
//! threads end the unit reads what the last write wrote.
//!
//! Run: `cargo test -p swap --features model-check --test model`
//! (`MODEL_ITERATIONS` sets the schedules per scheduler; CI runs the
//! default). Each test explores that many random schedules and as many PCT
//! schedules (priority-based, depth 3: finds bugs that need up to three
//! ill-timed preemptions with a known probability).
#![cfg(feature = "model-check")]

use shuttle::sync::Mutex;
use shuttle::thread;
use std::collections::HashMap;
use std::sync::Arc;
use swap::chunk::{ChunkTable, Restored, Settled, Tag, UnitRef};
use swap::index::UnitIndex;
use swap::store::SlotId;

const UNIT: UnitIndex = UnitIndex::FIRST;

fn at() -> UnitRef {
    UnitRef::unit(UNIT)
}

#[derive(Default)]
struct Slots {
    next: u32,
    used: HashMap<u32, u64>,
}

impl Slots {
    fn put(&mut self, value: u64) -> u32 {
        let slot = self.next;
        self.next += 1;
        self.used.insert(slot, value);
        slot
    }
}

struct Model {
    table: ChunkTable,
    /// The guest's mapping of the unit: Some(content) while mapped.
    memory: Mutex<Option<u64>>,
    parking: Mutex<Slots>,
    store: Mutex<Slots>,
}

impl Model {
    fn new() -> Arc<Model> {
        Arc::new(Model {
            table: ChunkTable::new(1, 2 << 20, false),
            memory: Mutex::new(None),
            parking: Mutex::new(Slots::default()),
            store: Mutex::new(Slots::default()),
        })
    }

    /// Installs restored content (UFFDIO_MOVE/COPY onto an empty range).
    fn install(&self, value: u64) {
        let mut memory = self.memory.lock().unwrap();
        assert!(memory.is_none(), "a restore landed on a mapped unit");
        *memory = Some(value);
    }

    /// A fault on the unit, served as `fault.rs` `handle` does.
    fn fault(&self) {
        let restored = Restored {
            huge: true,
            clean_slot: None,
            write_protected: false,
            prefetched: false,
        };
        loop {
            let state = self.table.load(UNIT);
            match state.tag() {
                Tag::Loading | Tag::Evicting => {
                    self.table.wait_settled(UNIT, &|| false);
                }
                Tag::Absent => {
                    if let Ok(loading) = self.table.begin_fault(at(), state) {
                        self.install(0);
                        self.table.finish_restore(at(), loading, restored);
                        return;
                    }
                }
                Tag::Stored => {
                    if let Ok(loading) = self.table.begin_fault(at(), state) {
                        let value = self
                            .store
                            .lock()
                            .unwrap()
                            .used
                            .remove(&loading.index())
                            .expect("a stored unit's slot holds its content");
                        self.install(value);
                        self.table.finish_restore(at(), loading, restored);
                        return;
                    }
                }
                Tag::Staged => {
                    if let Ok(loading) = self.table.begin_fault(at(), state) {
                        let p = loading.index();
                        let value = {
                            let mut parking = self.parking.lock().unwrap();
                            // Moved back, or copied while the write is in
                            // flight (the writer releases the slot then).
                            if loading.writing() {
                                *parking.used.get(&p).expect("the parked content")
                            } else {
                                parking.used.remove(&p).expect("the parked content")
                            }
                        };
                        self.install(value);
                        self.table.finish_restore(at(), loading, restored);
                        return;
                    }
                }
                Tag::Split => unreachable!("this model never splits (model_split.rs does)"),
                Tag::Resident => {
                    // A stale message for a unit someone else restored.
                    if let Ok(loading) = self.table.begin_fault(at(), state) {
                        self.table.end_resident_fault(at(), loading, state, false);
                        return;
                    }
                }
            }
        }
    }

    /// The guest writes the next value (faulting the unit in if needed).
    fn write(&self) {
        loop {
            if let Some(value) = self.memory.lock().unwrap().as_mut() {
                *value += 1;
                return;
            }
            self.fault();
        }
    }

    /// The guest reads the unit.
    fn read(&self) -> u64 {
        loop {
            if let Some(value) = *self.memory.lock().unwrap() {
                return value;
            }
            self.fault();
        }
    }

    /// One eviction and its write-back, as `evict.rs` `Evictor::evict`,
    /// `classify`, `flush` and `complete` take them.
    fn evict(&self) {
        let state = self.table.load(UNIT);
        if state.tag() != Tag::Resident || state.pinned() {
            return;
        }
        let Ok(evicting) = self.table.begin_evict(at(), state) else {
            return;
        };
        let content = self
            .memory
            .lock()
            .unwrap()
            .take()
            .expect("a resident unit is mapped");
        if content == 0 {
            self.table.settle(at(), evicting, Settled::Zero);
            return;
        }
        let p = self.parking.lock().unwrap().put(content);
        self.table.settle(
            at(),
            evicting,
            Settled::Dirty {
                parking: swap::index::ParkingSlot::new(p),
            },
        );
        // flush(): claim the unit for writing unless it was handed back.
        loop {
            let staged = self.table.load(UNIT);
            if staged.tag() != Tag::Staged || staged.index() != p || staged.writing() {
                return;
            }
            if self.table.begin_write(at(), staged).is_ok() {
                break;
            }
        }
        let data = *self.parking.lock().unwrap().used.get(&p).unwrap();
        let slot = self.store.lock().unwrap().put(data);
        // complete()
        loop {
            let writing = self.table.load(UNIT);
            if writing.tag() == Tag::Staged && writing.index() == p && writing.writing() {
                if self
                    .table
                    .finish_write(at(), writing, SlotId::new(slot))
                    .is_err()
                {
                    continue;
                }
                self.parking.lock().unwrap().used.remove(&p);
                return;
            }
            // Handed back during the write: the stored copy is not needed;
            // the parking slot is released once the fault thread copied.
            self.store.lock().unwrap().used.remove(&slot);
            let after = self
                .table
                .wait_while(UNIT, &|s| s.tag() == Tag::Loading, &|| false);
            assert_ne!(after.tag(), Tag::Loading);
            self.parking.lock().unwrap().used.remove(&p);
            return;
        }
    }

    /// The guest gives the unit back (balloon): it reads as zero after, as
    /// `discard.rs` `discard_unit` takes it.
    fn discard(&self) {
        loop {
            let state = self.table.load(UNIT);
            match state.tag() {
                Tag::Split => unreachable!("this model never splits (model_split.rs does)"),
                Tag::Absent => return,
                Tag::Loading | Tag::Evicting => {
                    self.table.wait_settled(UNIT, &|| false);
                }
                // Owned by a write batch until the write completes.
                Tag::Staged => thread::yield_now(),
                Tag::Stored => {
                    if self.table.discard_stored(at(), state).is_ok() {
                        self.store.lock().unwrap().used.remove(&state.index());
                        return;
                    }
                }
                Tag::Resident => {
                    let Ok(evicting) = self.table.begin_evict(at(), state) else {
                        continue;
                    };
                    self.memory.lock().unwrap().take();
                    self.table.settle(at(), evicting, Settled::Discarded);
                    return;
                }
            }
        }
    }

    /// After the threads: no slot leaked, nothing in flight.
    fn check_quiescent(&self) {
        let state = self.table.load(UNIT);
        assert!(!state.tag().in_flight(), "left in flight: {state:?}");
        let parked = self.parking.lock().unwrap().used.len();
        let stored = self.store.lock().unwrap().used.len();
        match state.tag() {
            Tag::Staged => assert_eq!((parked, stored), (1, 0), "{state:?}"),
            Tag::Stored => assert_eq!((parked, stored), (0, 1), "{state:?}"),
            _ => assert_eq!((parked, stored), (0, 0), "leaked slots in {state:?}"),
        }
    }
}

fn iterations() -> usize {
    std::env::var("MODEL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Runs `scenario` under the random and the PCT scheduler.
fn check(scenario: fn()) {
    shuttle::check_random(scenario, iterations());
    shuttle::check_pct(scenario, iterations(), 3);
}

fn spawn(model: &Arc<Model>, steps: fn(&Model)) -> thread::JoinHandle<()> {
    let model = model.clone();
    thread::spawn(move || steps(&model))
}

#[test]
fn two_faults_on_one_unit_restore_it_once_and_keep_both_writes() {
    check(|| {
        let model = Model::new();
        let a = spawn(&model, Model::write);
        let b = spawn(&model, Model::write);
        a.join().unwrap();
        b.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(), 2);
    });
}

#[test]
fn faults_racing_evictions_at_every_step_lose_no_write() {
    check(|| {
        let model = Model::new();
        model.write();
        let writer = spawn(&model, |m| {
            m.write();
            m.write();
        });
        let evictor = spawn(&model, |m| {
            m.evict();
            m.evict();
        });
        writer.join().unwrap();
        evictor.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(), 3);
    });
}

#[test]
fn a_write_back_completing_while_the_unit_is_handed_back_loses_nothing() {
    check(|| {
        let model = Model::new();
        model.write();
        // Two evictors, so one writes back while the unit is handed back
        // and evicted again by the other.
        let evictors = [spawn(&model, Model::evict), spawn(&model, Model::evict)];
        let reader = spawn(&model, |m| {
            assert_eq!(m.read(), 1);
            m.write();
        });
        for e in evictors {
            e.join().unwrap();
        }
        reader.join().unwrap();
        model.check_quiescent();
        assert_eq!(model.read(), 2);
    });
}

#[test]
fn a_discard_racing_faults_and_evictions_leaves_zero_and_no_slot() {
    check(|| {
        let model = Model::new();
        for _ in 0..5 {
            model.write();
        }
        let reader = spawn(&model, |m| {
            let seen = m.read();
            assert!(seen == 5 || seen == 0, "read {seen}");
        });
        let evictor = spawn(&model, Model::evict);
        let discarder = spawn(&model, Model::discard);
        reader.join().unwrap();
        evictor.join().unwrap();
        discarder.join().unwrap();
        // Discarded last (the guest wrote nothing after): zero, and neither
        // a parked nor a stored copy left behind — unless the evictor took
        // it after the discard, which finds it zero and keeps nothing.
        model.check_quiescent();
        assert_eq!(model.read(), 0);
    });
}
