//! A test aid: a store wrapper that fails on purpose, so that tests (this
//! crate's, other crates', and integration tests driving `hugevmm run
//! --swap-store faulty:...`) can check that store failures reach the
//! operator as errors naming the chunk, never as silently zeroed memory.
//! Not meant for production use.
//!
//! Besides the lasting failures (from the Nth operation on, every one
//! fails), it injects *transient* ones that the retry policy
//! ([`super::retry`]) must absorb: an `EIO` that the same operation, tried
//! again, does not meet; a checksum failure that a re-read does not meet;
//! and delays.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{
    InjectedFaults, PageWrite, SharedStore, SlotId, Store, StoreError, StoreReport, WriteRequest,
};
use crate::index::{PageIndex, StoreKey};

/// Which failures a [`FaultyStore`] injects. Counts are of units (one
/// request of a batch is one write), and "after N" means the first N succeed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Reads after the first N fail with an I/O error (`EIO`).
    pub read_error_after: Option<u64>,
    /// Reads after the first N find their slot corrupted in the inner store,
    /// so the inner store's checksum check fails.
    pub corrupt_after: Option<u64>,
    /// Writes after the first N fail with an I/O error (`EIO`).
    pub write_error_after: Option<u64>,
    /// Writes that would make more than N slots used fail with `Full`.
    pub full_after_slots: Option<u64>,
    /// Every Nth operation (a read, one request of a batch, one page)
    /// fails with `EIO`; the same operation tried again (same kind, same
    /// guest address) passes.
    pub transient_eio_every: Option<u64>,
    /// Every Nth read of a whole unit finds its slot damaged in the inner
    /// store (its checksum fails); the damage is undone right after, and
    /// the next read of that slot meets none, so a re-read verifies.
    pub transient_corrupt_every: Option<u64>,
    /// Every operation first sleeps a pseudo-random time of 0 to N µs.
    pub delay_us: Option<u64>,
}

/// The kinds of operation a transient `EIO` is remembered by, so that the
/// retry of the one that failed passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Read,
    Write,
    PageWrite,
    /// A whole-unit read that met a transient corruption (keyed by slot).
    CorruptRead,
}

/// A store that forwards to an inner store and injects [`Faults`].
pub struct FaultyStore {
    inner: SharedStore,
    faults: Faults,
    reads: AtomicU64,
    writes: AtomicU64,
    /// Slots already damaged: damaging twice could undo the damage.
    corrupted: Mutex<HashSet<SlotId>>,
    /// Operations counted for `transient_eio_every`.
    transient_ops: AtomicU64,
    /// Whole-unit reads counted for `transient_corrupt_every`.
    unit_reads: AtomicU64,
    /// Operations that met a transient `EIO`: their next attempt passes.
    failed_once: Mutex<HashSet<(Op, u64)>>,
    injected_eio: AtomicU64,
    injected_corruptions: AtomicU64,
    delays: AtomicU64,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner.describe())
            .field("faults", &self.faults)
            .finish()
    }
}

impl FaultyStore {
    /// Wraps `inner`.
    pub fn new(inner: SharedStore, faults: Faults) -> Self {
        Self {
            inner,
            faults,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            corrupted: Mutex::new(HashSet::new()),
            transient_ops: AtomicU64::new(0),
            unit_reads: AtomicU64::new(0),
            failed_once: Mutex::new(HashSet::new()),
            injected_eio: AtomicU64::new(0),
            injected_corruptions: AtomicU64::new(0),
            delays: AtomicU64::new(0),
        }
    }

    /// The faults injected.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    fn corrupted(&self) -> std::sync::MutexGuard<'_, HashSet<SlotId>> {
        self.corrupted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a read and injects its fault, if one is due.
    fn before_read(&self, slot: SlotId, gpa: StoreKey) -> Result<(), StoreError> {
        self.delay();
        if self.transient_eio(Op::Read, gpa) {
            return Err(Self::transient_error(gpa, slot));
        }
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        if tripped(self.faults.read_error_after, n) {
            return Err(StoreError::Io {
                gpa,
                slot,
                source: Self::injected("read"),
            });
        }
        if tripped(self.faults.corrupt_after, n) && self.corrupted().insert(slot) {
            self.inner
                .corrupt_slot(slot)
                .map_err(|source| StoreError::Io { gpa, slot, source })?;
        }
        Ok(())
    }

    /// Sleeps the injected delay, if any.
    fn delay(&self) {
        let Some(max_us) = self.faults.delay_us.filter(|&us| us > 0) else {
            return;
        };
        let n = self.delays.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of the count: delays that vary, reproducibly.
        let mut x = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        std::thread::sleep(std::time::Duration::from_micros(x % (max_us + 1)));
    }

    /// Whether this attempt of the operation `op` on `gpa` meets a
    /// transient `EIO`: every Nth operation does, and its next attempt
    /// does not.
    fn transient_eio(&self, op: Op, gpa: StoreKey) -> bool {
        let Some(every) = self.faults.transient_eio_every.filter(|&n| n > 0) else {
            return false;
        };
        let mut failed = self.failed_once.lock().unwrap_or_else(|p| p.into_inner());
        // Keyed by the raw number: `CorruptRead` entries are slot numbers.
        if failed.remove(&(op, gpa.raw())) {
            return false;
        }
        let n = self.transient_ops.fetch_add(1, Ordering::Relaxed);
        if !(n + 1).is_multiple_of(every) {
            return false;
        }
        failed.insert((op, gpa.raw()));
        self.injected_eio.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn transient_error(gpa: StoreKey, slot: SlotId) -> StoreError {
        StoreError::Io {
            gpa,
            slot,
            source: io::Error::from_raw_os_error(libc::EIO),
        }
    }

    /// A whole-unit read of `slot` through `read`, with the transient
    /// corruption injected when one is due: the slot is damaged for this
    /// read only (damage is an XOR, so damaging again undoes it).
    fn read_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        read: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let due = self.faults.transient_corrupt_every.is_some_and(|every| {
            let mut failed = self.failed_once.lock().unwrap_or_else(|p| p.into_inner());
            let key = (Op::CorruptRead, u64::from(slot));
            if failed.remove(&key) {
                return false;
            }
            let due = every > 0
                && (self.unit_reads.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every);
            if due {
                failed.insert(key);
            }
            due
        });
        // A slot damaged for good stays so; nobody else reads or writes
        // the slot of a unit being restored.
        if !due || self.corrupted().contains(&slot) {
            return read();
        }
        self.inner
            .corrupt_slot(slot)
            .map_err(|source| StoreError::Io { gpa, slot, source })?;
        self.injected_corruptions.fetch_add(1, Ordering::Relaxed);
        let result = read();
        self.inner
            .corrupt_slot(slot)
            .map_err(|source| StoreError::Io { gpa, slot, source })?;
        result
    }

    fn injected(what: &str) -> io::Error {
        io::Error::other(format!(
            "injected {what} error (faulty test store): {}",
            io::Error::from_raw_os_error(libc::EIO)
        ))
    }
}

impl Faults {
    /// The faults by their `faulty:` spec keys, in the spec's order.
    pub fn by_key(&self) -> [(&'static str, Option<u64>); 7] {
        let Faults {
            read_error_after,
            corrupt_after,
            write_error_after,
            full_after_slots,
            transient_eio_every,
            transient_corrupt_every,
            delay_us,
        } = *self;
        [
            ("read-error-after", read_error_after),
            ("corrupt-after", corrupt_after),
            ("write-error-after", write_error_after),
            ("full-after", full_after_slots),
            ("transient-eio-every", transient_eio_every),
            ("transient-corrupt-every", transient_corrupt_every),
            ("delay-us", delay_us),
        ]
    }
}

/// `n` (0-based count of an operation) is past the first `after` ones.
fn tripped(after: Option<u64>, n: u64) -> bool {
    after.is_some_and(|after| n >= after)
}

impl Store for FaultyStore {
    fn unit_bytes(&self) -> usize {
        self.inner.unit_bytes()
    }

    fn capacity_slots(&self) -> u64 {
        let inner = self.inner.capacity_slots();
        self.faults.full_after_slots.map_or(inner, |n| n.min(inner))
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (key, value) in self.faults.by_key() {
            if let Some(v) = value {
                parts.push(format!("{key}={v}"));
            }
        }
        parts.push(format!("inner={}", self.inner.describe()));
        format!("faulty:{}", parts.join(","))
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        let mut results: Vec<Option<Result<SlotId, StoreError>>> =
            Vec::with_capacity(requests.len());
        let mut forwarded: Vec<WriteRequest<'_>> = Vec::new();
        let mut used = self.inner.used_slots();
        self.delay();
        for req in requests {
            if self.transient_eio(Op::Write, req.gpa) {
                results.push(Some(Err(Self::transient_error(req.gpa, SlotId::new(0)))));
                continue;
            }
            let n = self.writes.fetch_add(1, Ordering::Relaxed);
            if tripped(self.faults.write_error_after, n) {
                results.push(Some(Err(StoreError::Io {
                    gpa: req.gpa,
                    slot: SlotId::new(0),
                    source: Self::injected("write"),
                })));
            } else if tripped(self.faults.full_after_slots, used) {
                let capacity_slots = self.capacity_slots();
                results.push(Some(Err(StoreError::Full {
                    gpa: req.gpa,
                    capacity_bytes: capacity_slots * self.unit_bytes() as u64,
                    capacity_slots,
                })));
            } else {
                used += 1;
                forwarded.push(WriteRequest {
                    gpa: req.gpa,
                    data: req.data,
                });
                results.push(None);
            }
        }
        let mut inner_results = self.inner.write_batch(&forwarded).into_iter();
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    inner_results
                        .next()
                        .expect("one inner result per forwarded request")
                })
            })
            .collect()
    }

    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        self.before_read(slot, gpa)?;
        self.read_unit(slot, gpa, || self.inner.read(slot, gpa, buf))
    }

    fn supports_pages(&self) -> bool {
        self.inner.supports_pages()
    }

    fn allocate_paged(&self, gpa: StoreKey) -> Result<SlotId, StoreError> {
        self.delay();
        if tripped(self.faults.full_after_slots, self.inner.used_slots()) {
            let capacity_slots = self.capacity_slots();
            return Err(StoreError::Full {
                gpa,
                capacity_bytes: capacity_slots * self.unit_bytes() as u64,
                capacity_slots,
            });
        }
        self.inner.allocate_paged(gpa)
    }

    /// Counts as one read of the slot (faults injected as for `read`).
    fn read_and_split(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.before_read(slot, gpa)?;
        self.read_unit(slot, gpa, || self.inner.read_and_split(slot, gpa, buf))
    }

    /// Each page counts as one write.
    fn write_pages(&self, slot: SlotId, pages: &[PageWrite<'_>]) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Option<Result<(), StoreError>>> = Vec::with_capacity(pages.len());
        let mut forwarded: Vec<PageWrite<'_>> = Vec::new();
        self.delay();
        for p in pages {
            if self.transient_eio(Op::PageWrite, p.gpa) {
                results.push(Some(Err(Self::transient_error(p.gpa, slot))));
                continue;
            }
            let n = self.writes.fetch_add(1, Ordering::Relaxed);
            if tripped(self.faults.write_error_after, n) {
                results.push(Some(Err(StoreError::Io {
                    gpa: p.gpa,
                    slot,
                    source: Self::injected("write"),
                })));
            } else {
                forwarded.push(PageWrite {
                    page: p.page,
                    gpa: p.gpa,
                    data: p.data,
                });
                results.push(None);
            }
        }
        let mut inner_results = self.inner.write_pages(slot, &forwarded).into_iter();
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    inner_results
                        .next()
                        .expect("one inner result per forwarded page")
                })
            })
            .collect()
    }

    /// Counts as one read.
    fn read_paged_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.before_read(slot, gpa)?;
        self.inner.read_paged_unit(slot, gpa, buf)
    }

    /// Each page read counts as one read.
    fn read_page(
        &self,
        slot: SlotId,
        page: PageIndex,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.before_read(slot, gpa)?;
        self.inner.read_page(slot, page, gpa, buf)
    }

    fn free(&self, slot: SlotId) {
        // A rewritten slot starts out intact again.
        self.corrupted().remove(&slot);
        self.inner.free(slot)
    }

    fn used_slots(&self) -> u64 {
        self.inner.used_slots()
    }

    fn stored_bytes(&self) -> u64 {
        self.inner.stored_bytes()
    }

    fn corrupt_slot(&self, slot: SlotId) -> io::Result<()> {
        self.inner.corrupt_slot(slot)
    }

    fn sealed(&self) -> bool {
        self.inner.sealed()
    }

    fn report(&self) -> StoreReport {
        StoreReport {
            injected: InjectedFaults {
                transient_errors: self.injected_eio.load(Ordering::Relaxed),
                transient_corruptions: self.injected_corruptions.load(Ordering::Relaxed),
                delays: if self.faults.delay_us.is_some_and(|us| us > 0) {
                    self.delays.load(Ordering::Relaxed)
                } else {
                    0
                },
            },
            ..StoreReport::default()
        }
        .plus(self.inner.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::Codec;
    use crate::store::mem::MemStore;
    use crate::store::test_support::{check_round_trip, unit_image};
    use blockio::AlignedBuf;
    use std::sync::Arc;

    const MIB2: usize = 2 << 20;

    fn faulty(faults: Faults) -> FaultyStore {
        FaultyStore::new(
            Arc::new(MemStore::new(Codec::Lz4, MIB2, 16, None).unwrap()),
            faults,
        )
    }

    fn write(store: &FaultyStore, gpa: StoreKey, seed: u64) -> Result<SlotId, StoreError> {
        let img = unit_image(seed, MIB2);
        store
            .write_batch(&[WriteRequest { gpa, data: &img }])
            .pop()
            .unwrap()
    }

    #[test]
    fn no_faults_is_transparent() {
        let store = faulty(Faults::default());
        check_round_trip(&store, 10);
        assert_eq!(store.describe(), "faulty:inner=mem:lz4");
    }

    #[test]
    fn read_error_after_n_reads_names_the_chunk() {
        let store = faulty(Faults {
            read_error_after: Some(2),
            ..Faults::default()
        });
        let slot = write(&store, StoreKey::new(0x1_4000_0000), 1).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store
            .read(slot, StoreKey::new(0x1_4000_0000), &mut buf)
            .unwrap();
        store
            .read(slot, StoreKey::new(0x1_4000_0000), &mut buf)
            .unwrap();
        let err = store
            .read(slot, StoreKey::new(0x1_4000_0000), &mut buf)
            .unwrap_err();
        assert!(matches!(
            err,
            StoreError::Io { gpa, .. } if gpa == StoreKey::new(0x1_4000_0000)
        ));
        assert!(err.to_string().contains("0x140000000"), "{err}");
    }

    #[test]
    fn corruption_trips_the_inner_checksum() {
        let store = faulty(Faults {
            corrupt_after: Some(1),
            ..Faults::default()
        });
        let slot = write(&store, StoreKey::new(0x60_0000), 2).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store
            .read(slot, StoreKey::new(0x60_0000), &mut buf)
            .unwrap();
        for _ in 0..2 {
            assert!(matches!(
                store.read(slot, StoreKey::new(0x60_0000), &mut buf),
                Err(StoreError::Checksum { gpa, .. }) if gpa == StoreKey::new(0x60_0000)
            ));
        }
    }

    #[test]
    fn corruption_works_on_a_file_store_too() {
        let dir = blockio::test_support::test_dir();
        let inner =
            Arc::new(crate::store::FileStore::temporary(&dir, MIB2, 4 * MIB2 as u64).unwrap());
        let store = FaultyStore::new(
            inner,
            Faults {
                corrupt_after: Some(0),
                ..Faults::default()
            },
        );
        let slot = write(&store, StoreKey::new(0xa0_0000), 7).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        for _ in 0..2 {
            assert!(matches!(
                store.read(slot, StoreKey::new(0xa0_0000), &mut buf),
                Err(StoreError::Checksum { gpa, .. }) if gpa == StoreKey::new(0xa0_0000)
            ));
        }
    }

    #[test]
    fn write_error_after_n_writes() {
        let store = faulty(Faults {
            write_error_after: Some(1),
            ..Faults::default()
        });
        let img = unit_image(3, MIB2);
        let res = store.write_batch(&[
            WriteRequest {
                gpa: StoreKey::new(0),
                data: &img,
            },
            WriteRequest {
                gpa: StoreKey::new(0x20_0000),
                data: &img,
            },
        ]);
        assert!(res[0].is_ok());
        assert!(
            matches!(res[1], Err(StoreError::Io { gpa, .. }) if gpa == StoreKey::new(0x20_0000))
        );
        assert_eq!(store.used_slots(), 1, "a failed write holds no slot");
    }

    #[test]
    fn full_after_n_slots_and_space_comes_back_on_free() {
        let store = faulty(Faults {
            full_after_slots: Some(2),
            ..Faults::default()
        });
        assert_eq!(store.capacity_slots(), 2);
        let a = write(&store, StoreKey::new(0), 4).unwrap();
        write(&store, StoreKey::new(0x20_0000), 5).unwrap();
        assert!(matches!(
            write(&store, StoreKey::new(0x40_0000), 6),
            Err(StoreError::Full {
                capacity_slots: 2,
                gpa,
                ..
            }) if gpa == StoreKey::new(0x40_0000)
        ));
        store.free(a);
        write(&store, StoreKey::new(0x40_0000), 6).unwrap();
    }
}
