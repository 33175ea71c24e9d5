//! The retry policy every store is opened with ([`super::StoreSpec::open`]
//! wraps it in a [`RetryingStore`]): what a store error means for the VM.
//!
//! - **Transient errors** ([`is_transient`]: an I/O error whose errno a
//!   retry can change — `EIO`, `EAGAIN`, `EINTR`, `EBUSY`, `ETIMEDOUT`,
//!   `ENOMEM`, `ENOBUFS` — and short reads) are retried up to
//!   [`RetryPolicy::max_retries`] times, sleeping a doubling backoff
//!   between attempts; the last error is returned (and is fatal for the VM)
//!   when every attempt failed. A batch retries only its failed requests.
//! - **A checksum mismatch** is re-read once, at once: a bit flipped on the
//!   way (bus, cache, a torn O_DIRECT read) reads back right, damage in the
//!   medium does not. A second mismatch is returned and is fatal. The
//!   buffer is never handed on with anything but the verified bytes, and
//!   nothing is ever replaced by zeros.
//! - **An authentication failure** of a sealed image (`--swap-encrypt`) is
//!   treated the same way, counted apart: re-read once (the damage may
//!   have been on the way), then fatal, naming the guest address; a
//!   tampered image opens on no re-read.
//! - **Everything else** (a full store or filesystem, a slot that is not
//!   allocated, an error without an errno that says it may pass) is
//!   returned at once: retrying cannot change it.
//!
//! The counts ([`StoreReport`]) are in the engine's stats
//! (`SwapStats::store`), the `--stats-json` `swap.store` object, the API's
//! `GET /stats` and the metrics.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{PageWrite, SharedStore, SlotId, Store, StoreError, WriteRequest};
use crate::counter_group::counter_group;
use crate::index::{PageIndex, StoreKey};

/// How often and how patiently transient errors are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first one, for one operation.
    pub max_retries: u32,
    /// Sleep before the first retry; doubled before each further one.
    pub first_backoff: Duration,
    /// The longest sleep between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 5 retries after 1, 2, 4, 8 and 16 ms (31 ms in all): long enough for
    /// a device that hiccups, short enough that a fault thread stuck on a
    /// dead one reports it within a few dozen milliseconds.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(16),
        }
    }
}

impl RetryPolicy {
    /// The sleep before retry number `retry` (1-based).
    fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32 << retry.saturating_sub(1).min(20);
        self.first_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

counter_group! {
    /// What the retry policy did. Every count is of operations (one
    /// request of a batch, one page) since the store was opened.
    pub struct RetryCounts / AtomicRetryCounts {
        /// Attempts that failed with a transient error.
        transient_errors,
        /// Attempts made again after a transient error.
        retries,
        /// Operations that succeeded after at least one transient error.
        recovered,
        /// Operations given up after the last retry failed too (each one
        /// fatal for the VM).
        exhausted,
        /// Checksum mismatches read again.
        checksum_rereads,
        /// Of those, the re-read verified.
        checksum_recovered,
        /// Of those, the re-read failed its checksum too (fatal).
        checksum_fatal,
        /// Sealed images that failed to open (authentication), read again.
        auth_rereads,
        /// Of those, the re-read opened.
        auth_recovered,
        /// Of those, the re-read failed too (fatal).
        auth_fatal,
    }
}

counter_group! {
    /// The faults a `faulty:` test store injected.
    pub struct InjectedFaults {
        /// Transient `EIO`s.
        transient_errors,
        /// Transient checksum failures.
        transient_corruptions,
        /// Operations delayed.
        delays,
    }
}

/// What the store wrappers did: the retry policy's counts, and the faults a
/// test store injected (the `store` object of the swap stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreReport {
    /// The retry policy's counts (their keys sit beside `sealed` in the
    /// stats object).
    #[serde(flatten)]
    pub retry: RetryCounts,
    /// Whether the store seals what it keeps (`--swap-encrypt`), so that
    /// the stats say so.
    pub sealed: bool,
    /// The faults a `faulty:` test store injected.
    pub injected: InjectedFaults,
}

impl StoreReport {
    /// The sum of two reports (a wrapper's own counts and its inner
    /// store's).
    #[must_use]
    pub fn plus(self, other: StoreReport) -> StoreReport {
        StoreReport {
            retry: self.retry.plus(other.retry),
            sealed: self.sealed || other.sealed,
            injected: self.injected.plus(other.injected),
        }
    }
}

/// Whether a retry can change the outcome of the operation that failed
/// with `error`.
pub fn is_transient(error: &StoreError) -> bool {
    match error {
        StoreError::Io { source, .. } => io_is_transient(source),
        StoreError::ShortRead { .. } => true,
        StoreError::Checksum { .. }
        | StoreError::Authentication { .. }
        | StoreError::Full { .. }
        | StoreError::FilesystemFull { .. }
        | StoreError::BadSlot { .. } => false,
    }
}

fn io_is_transient(error: &io::Error) -> bool {
    if let Some(errno) = error.raw_os_error() {
        return matches!(
            errno,
            libc::EIO
                | libc::EAGAIN
                | libc::EINTR
                | libc::EBUSY
                | libc::ETIMEDOUT
                | libc::ENOMEM
                | libc::ENOBUFS
        );
    }
    matches!(
        error.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A store wrapper that applies a [`RetryPolicy`] to every operation of
/// its inner store, the page operations of split chunks included.
pub struct RetryingStore {
    inner: SharedStore,
    policy: RetryPolicy,
    counters: AtomicRetryCounts,
}

impl std::fmt::Debug for RetryingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryingStore")
            .field("inner", &self.inner.describe())
            .field("policy", &self.policy)
            .finish()
    }
}

impl RetryingStore {
    /// Wraps `inner`.
    pub fn new(inner: SharedStore, policy: RetryPolicy) -> Self {
        RetryingStore {
            inner,
            policy,
            counters: AtomicRetryCounts::default(),
        }
    }

    /// The policy applied.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// Runs `op` under the policy. `op` must leave the store as it found
    /// it when it fails (every read does; see the trait's docs).
    fn run(
        &self,
        what: &str,
        mut op: impl FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut retry = 0u32;
        let mut reread = false;
        let mut auth_reread = false;
        loop {
            let error = match op() {
                Ok(()) => {
                    if retry > 0 {
                        bump(&self.counters.recovered);
                    }
                    if reread {
                        bump(&self.counters.checksum_recovered);
                    }
                    if auth_reread {
                        bump(&self.counters.auth_recovered);
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            if matches!(error, StoreError::Checksum { .. }) {
                if reread {
                    bump(&self.counters.checksum_fatal);
                    log::warn!("swap store: {what} failed its checksum twice: {error}");
                    return Err(error);
                }
                reread = true;
                bump(&self.counters.checksum_rereads);
                continue;
            }
            if matches!(error, StoreError::Authentication { .. }) {
                if auth_reread {
                    bump(&self.counters.auth_fatal);
                    log::warn!("swap store: {what} failed authentication twice: {error}");
                    return Err(error);
                }
                auth_reread = true;
                bump(&self.counters.auth_rereads);
                continue;
            }
            if !is_transient(&error) {
                return Err(error);
            }
            bump(&self.counters.transient_errors);
            if retry == self.policy.max_retries {
                bump(&self.counters.exhausted);
                log::warn!(
                    "swap store: {what} failed {} times, giving up: {error}",
                    retry + 1
                );
                return Err(error);
            }
            retry += 1;
            bump(&self.counters.retries);
            log::debug!("swap store: {what} failed ({error}), retry {retry}");
            std::thread::sleep(self.policy.backoff(retry));
        }
    }

    /// Runs a batch under the policy: `submit` takes the indices still to
    /// do and returns one result per index. Requests that fail with a
    /// transient error are submitted again, alone with the others that did.
    fn run_batch<T>(
        &self,
        len: usize,
        mut submit: impl FnMut(&[usize]) -> Vec<Result<T, StoreError>>,
    ) -> Vec<Result<T, StoreError>> {
        let mut results: Vec<Option<Result<T, StoreError>>> = (0..len).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..len).collect();
        let mut retry = 0u32;
        while !todo.is_empty() {
            let outcome = submit(&todo);
            debug_assert_eq!(outcome.len(), todo.len(), "one result per request");
            let mut again = Vec::new();
            for (&i, result) in todo.iter().zip(outcome) {
                match result {
                    Ok(v) => {
                        if retry > 0 {
                            bump(&self.counters.recovered);
                        }
                        results[i] = Some(Ok(v));
                    }
                    Err(e) if is_transient(&e) => {
                        bump(&self.counters.transient_errors);
                        if retry == self.policy.max_retries {
                            bump(&self.counters.exhausted);
                            log::warn!(
                                "swap store: a write failed {} times, giving up: {e}",
                                retry + 1
                            );
                            results[i] = Some(Err(e));
                        } else {
                            bump(&self.counters.retries);
                            again.push(i);
                        }
                    }
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            if !again.is_empty() {
                retry += 1;
                std::thread::sleep(self.policy.backoff(retry));
            }
            todo = again;
        }
        results
            .into_iter()
            .map(|r| r.expect("every request has a result"))
            .collect()
    }
}

impl Store for RetryingStore {
    fn unit_bytes(&self) -> usize {
        self.inner.unit_bytes()
    }

    fn capacity_slots(&self) -> u64 {
        self.inner.capacity_slots()
    }

    /// The inner store's: the policy is not a kind of store.
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        // A failed request holds no slot, so writing it again is a fresh
        // write.
        self.run_batch(requests.len(), |todo| {
            let batch: Vec<WriteRequest<'_>> = todo
                .iter()
                .map(|&i| WriteRequest {
                    gpa: requests[i].gpa,
                    data: requests[i].data,
                })
                .collect();
            self.inner.write_batch(&batch)
        })
    }

    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        self.run("a read", || self.inner.read(slot, gpa, buf))
    }

    fn free(&self, slot: SlotId) {
        self.inner.free(slot)
    }

    fn used_slots(&self) -> u64 {
        self.inner.used_slots()
    }

    fn stored_bytes(&self) -> u64 {
        self.inner.stored_bytes()
    }

    fn supports_pages(&self) -> bool {
        self.inner.supports_pages()
    }

    fn allocate_paged(&self, gpa: StoreKey) -> Result<SlotId, StoreError> {
        let mut slot = None;
        self.run("allocating a paged slot", || {
            slot = Some(self.inner.allocate_paged(gpa)?);
            Ok(())
        })?;
        Ok(slot.expect("set on success"))
    }

    /// The stores read and verify the unit before they change the slot,
    /// so a failed attempt leaves it whole and unsplit.
    fn read_and_split(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.run("a read (to split)", || {
            self.inner.read_and_split(slot, gpa, buf)
        })
    }

    /// A failed page keeps its old content, so writing it again is safe.
    fn write_pages(&self, slot: SlotId, pages: &[PageWrite<'_>]) -> Vec<Result<(), StoreError>> {
        self.run_batch(pages.len(), |todo| {
            let batch: Vec<PageWrite<'_>> = todo
                .iter()
                .map(|&i| PageWrite {
                    page: pages[i].page,
                    gpa: pages[i].gpa,
                    data: pages[i].data,
                })
                .collect();
            self.inner.write_pages(slot, &batch)
        })
    }

    fn read_paged_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.run("a read of a split chunk", || {
            self.inner.read_paged_unit(slot, gpa, buf)
        })
    }

    fn read_page(
        &self,
        slot: SlotId,
        page: PageIndex,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.run("a page read", || self.inner.read_page(slot, page, gpa, buf))
    }

    fn corrupt_slot(&self, slot: SlotId) -> io::Result<()> {
        self.inner.corrupt_slot(slot)
    }

    fn sealed(&self) -> bool {
        self.inner.sealed()
    }

    fn report(&self) -> StoreReport {
        StoreReport {
            retry: self.counters.snapshot(),
            sealed: self.inner.sealed(),
            ..StoreReport::default()
        }
        .plus(self.inner.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::Codec;
    use crate::store::faulty::{Faults, FaultyStore};
    use crate::store::mem::MemStore;
    use crate::store::test_support::unit_image;
    use crate::store::PAGE_BYTES;
    use blockio::AlignedBuf;
    use std::sync::Arc;

    const MIB2: usize = 2 << 20;

    /// No sleeping in tests: the schedule itself is checked on its own.
    const QUICK: RetryPolicy = RetryPolicy {
        max_retries: 5,
        first_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    fn retrying(faults: Faults) -> RetryingStore {
        let mem = Arc::new(MemStore::new(Codec::Lz4, MIB2, 16, None).unwrap());
        RetryingStore::new(Arc::new(FaultyStore::new(mem, faults)), QUICK)
    }

    fn write(store: &dyn Store, gpa: StoreKey, img: &[u8]) -> Result<SlotId, StoreError> {
        store
            .write_batch(&[WriteRequest { gpa, data: img }])
            .pop()
            .unwrap()
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let p = RetryPolicy::default();
        let ms: Vec<u128> = (1..=7).map(|r| p.backoff(r).as_millis()).collect();
        assert_eq!(ms, [1, 2, 4, 8, 16, 16, 16]);
    }

    #[test]
    fn transient_eios_of_whole_batches_are_retried_request_by_request() {
        let store = retrying(Faults {
            transient_eio_every: Some(2),
            ..Faults::default()
        });
        let imgs: Vec<AlignedBuf> = (0..4).map(|i| unit_image(i + 1, MIB2)).collect();
        let requests: Vec<WriteRequest<'_>> = imgs
            .iter()
            .enumerate()
            .map(|(i, img)| WriteRequest {
                gpa: StoreKey::new((i * MIB2) as u64),
                data: img,
            })
            .collect();
        let slots: Vec<SlotId> = store
            .write_batch(&requests)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(store.used_slots(), 4, "the failed attempts hold no slot");
        let mut buf = AlignedBuf::new(MIB2, 4096);
        for (i, &slot) in slots.iter().enumerate() {
            store
                .read(slot, StoreKey::new((i * MIB2) as u64), &mut buf)
                .unwrap();
            assert!(buf[..] == imgs[i][..], "unit {i}");
        }
        let r = store.report();
        assert!(r.injected.transient_errors >= 3, "{r:?}");
        assert_eq!(
            r.retry.transient_errors, r.injected.transient_errors,
            "{r:?}"
        );
        assert_eq!(r.retry.retries, r.retry.transient_errors, "{r:?}");
        assert_eq!(r.retry.recovered, r.retry.transient_errors, "{r:?}");
        assert_eq!(r.retry.exhausted, 0);
    }

    #[test]
    fn page_operations_are_retried_too() {
        let store = retrying(Faults {
            transient_eio_every: Some(1),
            ..Faults::default()
        });
        assert!(store.supports_pages());
        let slot = store.allocate_paged(StoreKey::new(0x20_0000)).unwrap();
        let page = unit_image(9, PAGE_BYTES);
        let results = store.write_pages(
            slot,
            &[
                PageWrite {
                    page: PageIndex::new(3),
                    gpa: StoreKey::new(0x20_3000),
                    data: &page,
                },
                PageWrite {
                    page: PageIndex::new(7),
                    gpa: StoreKey::new(0x20_7000),
                    data: &page,
                },
            ],
        );
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let mut buf = AlignedBuf::new(PAGE_BYTES, 4096);
        store
            .read_page(slot, PageIndex::new(7), StoreKey::new(0x20_7000), &mut buf)
            .unwrap();
        assert!(buf[..] == page[..]);
        let mut unit = AlignedBuf::new(MIB2, 4096);
        store
            .read_paged_unit(slot, StoreKey::new(0x20_0000), &mut unit)
            .unwrap();
        assert!(unit[3 * PAGE_BYTES..4 * PAGE_BYTES] == page[..]);
        let whole = write(&store, StoreKey::new(0x40_0000), &unit_image(4, MIB2)).unwrap();
        store
            .read_and_split(whole, StoreKey::new(0x40_0000), &mut unit)
            .unwrap();
        assert!(unit[..] == unit_image(4, MIB2)[..]);
        let r = store.report();
        // Two page writes, one page read, one paged read, one write, one
        // read to split: each failed once and passed on its retry.
        assert_eq!(r.injected.transient_errors, 6, "{r:?}");
        assert_eq!(r.retry.recovered, 6, "{r:?}");
    }

    #[test]
    fn a_checksum_failure_that_passes_on_a_reread_is_recovered() {
        let store = retrying(Faults {
            transient_corrupt_every: Some(1),
            ..Faults::default()
        });
        let img = unit_image(5, MIB2);
        let slot = write(&store, StoreKey::new(0x60_0000), &img).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store
            .read(slot, StoreKey::new(0x60_0000), &mut buf)
            .unwrap();
        assert!(buf[..] == img[..]);
        let r = store.report();
        assert_eq!(r.injected.transient_corruptions, 1, "{r:?}");
        assert_eq!(
            (r.retry.checksum_rereads, r.retry.checksum_recovered),
            (1, 1),
            "{r:?}"
        );
    }

    #[test]
    fn lasting_corruption_is_read_twice_then_fatal() {
        let store = retrying(Faults {
            corrupt_after: Some(0),
            ..Faults::default()
        });
        let slot = write(&store, StoreKey::new(0x80_0000), &unit_image(6, MIB2)).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        let err = store
            .read(slot, StoreKey::new(0x80_0000), &mut buf)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Checksum { gpa, .. } if gpa == StoreKey::new(0x80_0000)),
            "{err}"
        );
        let r = store.report();
        assert_eq!(
            (r.retry.checksum_rereads, r.retry.checksum_fatal),
            (1, 1),
            "{r:?}"
        );
        assert_eq!(
            r.retry.retries, 0,
            "a checksum failure is no transient error"
        );
    }

    /// Fails every read with `error`, counting the attempts.
    struct Failing {
        errno: Option<i32>,
        attempts: AtomicU64,
    }

    impl Store for Failing {
        fn unit_bytes(&self) -> usize {
            MIB2
        }
        fn capacity_slots(&self) -> u64 {
            1
        }
        fn describe(&self) -> String {
            "failing".into()
        }
        fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
            requests
                .iter()
                .map(|r| {
                    Err(StoreError::Full {
                        gpa: r.gpa,
                        capacity_bytes: MIB2 as u64,
                        capacity_slots: 1,
                    })
                })
                .collect()
        }
        fn read(&self, slot: SlotId, gpa: StoreKey, _buf: &mut [u8]) -> Result<(), StoreError> {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            Err(StoreError::Io {
                gpa,
                slot,
                source: match self.errno {
                    Some(errno) => io::Error::from_raw_os_error(errno),
                    None => io::Error::other("no errno"),
                },
            })
        }
        fn free(&self, _slot: SlotId) {}
        fn used_slots(&self) -> u64 {
            0
        }
    }

    fn failing(errno: Option<i32>) -> (Arc<Failing>, RetryingStore) {
        let inner = Arc::new(Failing {
            errno,
            attempts: AtomicU64::new(0),
        });
        (inner.clone(), RetryingStore::new(inner, QUICK))
    }

    #[test]
    fn a_lasting_eio_is_fatal_after_the_last_retry() {
        let (inner, store) = failing(Some(libc::EIO));
        let mut buf = AlignedBuf::new(MIB2, 4096);
        let err = store
            .read(SlotId::new(0), StoreKey::new(0xa0_0000), &mut buf)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Io { gpa, .. } if gpa == StoreKey::new(0xa0_0000)),
            "{err}"
        );
        assert_eq!(inner.attempts.load(Ordering::Relaxed), 6, "1 + 5 retries");
        let r = store.report();
        assert_eq!(
            (r.retry.transient_errors, r.retry.retries, r.retry.exhausted),
            (6, 5, 1)
        );
        assert_eq!(r.retry.recovered, 0);
    }

    #[test]
    fn errors_a_retry_cannot_change_are_returned_at_once() {
        for errno in [Some(libc::EINVAL), Some(libc::ENOSPC), None] {
            let (inner, store) = failing(errno);
            let mut buf = AlignedBuf::new(MIB2, 4096);
            store
                .read(SlotId::new(0), StoreKey::new(0), &mut buf)
                .unwrap_err();
            assert_eq!(inner.attempts.load(Ordering::Relaxed), 1, "{errno:?}");
        }
        let (_, store) = failing(Some(libc::EIO));
        let img = unit_image(1, MIB2);
        assert!(matches!(
            write(&store, StoreKey::new(0), &img),
            Err(StoreError::Full { .. })
        ));
        assert_eq!(
            store.report(),
            StoreReport::default(),
            "Full is no transient error"
        );
    }
}
