//! Memory stall accounting, in the manner of Linux's pressure stall
//! information (PSI): how long the guest's threads waited on the engine.
//!
//! A fault message is a thread waiting from the moment the engine reads
//! it (the kernel queued it a little earlier: that part is not seen) to
//! the wake that lets the thread go on. Two views of those intervals:
//! - **some / full**: wall time during which at least one thread waited,
//!   and during which as many threads as the VM has vCPUs waited (the
//!   whole guest stopped). Threads are told apart by the message's thread
//!   id (`UFFD_FEATURE_THREAD_ID`), so two messages of one vCPU count
//!   once; without thread ids every message counts as a thread.
//! - **by source**: the sum of every message's wait, by what served it
//!   (thread-seconds: two vCPUs waiting one second each are two).
//!
//! Threads that are not vCPUs (a device's I/O into guest memory) count as
//! waiting threads too: their wait stalls the guest as well. The clock is
//! one mutex taken twice per fault message, against fault costs of tens
//! of microseconds at least.

use std::sync::Mutex;
use std::time::Instant;

use crate::counter_group::counter_group;

counter_group! {
    /// Waits on the engine by what served the fault, µs summed over
    /// fault messages.
    pub struct StallBySource {
        /// A whole unit read from the store.
        store,
        /// A unit handed back from the parking area.
        parking,
        /// A never-written unit zero-filled.
        zero,
        /// A page of a split chunk (read from the store or zero-filled).
        page,
        /// The first write to a clean, write-protected unit.
        write_protect,
        /// Waited for another thread's work on the unit (a restore, an
        /// eviction or a collapse in flight), then found it resident.
        in_flight,
        /// Nothing to restore (a duplicate message, an address outside
        /// guest RAM).
        other,
    }
}

/// What served one fault message, for [`StallBySource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StallSource {
    Store,
    Parking,
    Zero,
    Page,
    WriteProtect,
    InFlight,
    Other,
}

/// The stall figures: the `stall` object of the swap stats.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallStats {
    /// The VM's vCPUs: `full_us` counts time with this many threads
    /// waiting.
    pub vcpus: u64,
    /// Wall time with at least one thread waiting on the engine, µs.
    pub some_us: u64,
    /// Wall time with every vCPU waiting on the engine, µs.
    pub full_us: u64,
    /// Every message's wait, by what served it.
    pub by_source_us: StallBySource,
}

/// The live clock.
pub(crate) struct StallClock {
    vcpus: u32,
    state: Mutex<ClockState>,
}

struct ClockState {
    /// Threads waiting now: (thread id, its messages in flight). Thread id
    /// 0 (the kernel gave none) counts once per message.
    waiting: Vec<(u32, u32)>,
    /// When `some_ns`/`full_ns` were last brought up to date.
    since: Instant,
    some_ns: u128,
    full_ns: u128,
    by_source: StallBySource,
}

impl ClockState {
    fn waiters(&self) -> u64 {
        self.waiting
            .iter()
            .map(|&(tid, n)| if tid == 0 { u64::from(n) } else { 1 })
            .sum()
    }

    /// Adds the time since the last change to some/full, as the waiters
    /// stood during it. Fault threads report instants taken outside the
    /// lock, so one may be a little older than the last change: time
    /// never runs backwards here.
    fn advance(&mut self, now: Instant, vcpus: u32) {
        if now <= self.since {
            return;
        }
        let elapsed = (now - self.since).as_nanos();
        let waiters = self.waiters();
        if waiters > 0 {
            self.some_ns += elapsed;
        }
        if waiters >= u64::from(vcpus.max(1)) {
            self.full_ns += elapsed;
        }
        self.since = now;
    }
}

impl StallClock {
    /// A clock for a VM of `vcpus` vCPUs.
    pub fn new(vcpus: u32) -> StallClock {
        StallClock {
            vcpus: vcpus.max(1),
            state: Mutex::new(ClockState {
                waiting: Vec::new(),
                since: Instant::now(),
                some_ns: 0,
                full_ns: 0,
                by_source: StallBySource::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        // The state is a few counters: a panic elsewhere cannot leave them
        // inconsistent in a way that matters more than losing the figure.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Thread `thread_id` waits from `read_at` (its message was read).
    pub fn begin(&self, thread_id: u32, read_at: Instant) {
        let mut state = self.lock();
        state.advance(read_at, self.vcpus);
        match state.waiting.iter_mut().find(|(tid, _)| *tid == thread_id) {
            Some((_, n)) => *n += 1,
            None => state.waiting.push((thread_id, 1)),
        }
    }

    /// The message of `thread_id` read at `read_at` was served by `source`
    /// and its thread woken at `woken_at`.
    pub fn end(&self, thread_id: u32, read_at: Instant, woken_at: Instant, source: StallSource) {
        let wait_us = woken_at.saturating_duration_since(read_at).as_micros() as u64;
        let mut state = self.lock();
        state.advance(woken_at, self.vcpus);
        if let Some(i) = state.waiting.iter().position(|(tid, _)| *tid == thread_id) {
            state.waiting[i].1 -= 1;
            if state.waiting[i].1 == 0 {
                state.waiting.swap_remove(i);
            }
        }
        let by = &mut state.by_source;
        *match source {
            StallSource::Store => &mut by.store,
            StallSource::Parking => &mut by.parking,
            StallSource::Zero => &mut by.zero,
            StallSource::Page => &mut by.page,
            StallSource::WriteProtect => &mut by.write_protect,
            StallSource::InFlight => &mut by.in_flight,
            StallSource::Other => &mut by.other,
        } += wait_us;
    }

    /// The figures now, the waits still open included up to now.
    pub fn snapshot(&self) -> StallStats {
        let mut state = self.lock();
        state.advance(Instant::now(), self.vcpus);
        StallStats {
            vcpus: u64::from(self.vcpus),
            some_us: (state.some_ns / 1000) as u64,
            full_us: (state.full_ns / 1000) as u64,
            by_source_us: state.by_source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Two vCPUs: one waits 0-30 ms, the other 10-20 ms (two messages of
    /// the same thread, counted once): some is 30 ms, full 10 ms, and the
    /// waits by source are each message's own.
    #[test]
    fn some_and_full_follow_the_waiting_threads() {
        let clock = StallClock::new(2);
        let t0 = clock.lock().since + ms(1);
        clock.begin(7, t0);
        clock.begin(8, t0 + ms(10));
        clock.begin(8, t0 + ms(10));
        clock.end(8, t0 + ms(10), t0 + ms(20), StallSource::Store);
        clock.end(8, t0 + ms(10), t0 + ms(20), StallSource::InFlight);
        clock.end(7, t0, t0 + ms(30), StallSource::Page);
        let state = clock.lock();
        assert_eq!(state.some_ns, ms(30).as_nanos());
        assert_eq!(state.full_ns, ms(10).as_nanos());
        assert_eq!(
            state.by_source,
            StallBySource {
                store: 10_000,
                in_flight: 10_000,
                page: 30_000,
                ..Default::default()
            }
        );
        assert!(state.waiting.is_empty());
    }

    /// Without thread ids every message is a thread of its own.
    #[test]
    fn messages_without_a_thread_id_count_one_each() {
        let clock = StallClock::new(2);
        let t0 = clock.lock().since + ms(1);
        clock.begin(0, t0);
        clock.begin(0, t0);
        clock.end(0, t0, t0 + ms(5), StallSource::Zero);
        clock.end(0, t0, t0 + ms(5), StallSource::Zero);
        let state = clock.lock();
        assert_eq!(state.full_ns, ms(5).as_nanos());
    }

    /// An open wait counts up to the snapshot.
    #[test]
    fn a_snapshot_counts_the_waits_still_open() {
        let clock = StallClock::new(1);
        clock.begin(3, Instant::now());
        std::thread::sleep(ms(5));
        let stats = clock.snapshot();
        assert!(stats.some_us >= 5_000, "{stats:?}");
        assert_eq!(stats.some_us, stats.full_us, "one vCPU: some is full");
    }
}
