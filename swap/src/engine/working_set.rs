//! Working-set estimation by sampling, in the manner of VMware ESX
//! (Waldspurger, OSDI 2002): take a small random sample of resident units
//! out of the guest and count how many fault back within a window.
//!
//! Why sampling: this host's kernel offers no accessed bit the engine can
//! read for guest memory (no idle page tracking, no soft-dirty, DAMON for
//! physical addresses only; PAGEMAP_SCAN reports no accessed bit), and a
//! resident 2 MiB chunk that the guest touches raises no fault. Taking a
//! unit away is the one signal that works at 2 MiB without splitting: its
//! next touch faults.
//!
//! How a sample is taken: the sampler thread marks a unit, then evicts it
//! through the ordinary eviction path (clean units drop, dirty ones are
//! written), so no new unit state exists for it. The fault path reports
//! every restore of a marked unit ([`WorkingSet::on_return`]). A sampled
//! unit that never comes back stays in the store: sampling reclaims idle
//! memory as it measures it.
//!
//! The estimate: each sample is one draw from the resident memory of its
//! moment, `population_bytes`. A draw that came back within the window
//! counts its population, one that did not counts nothing, and the
//! estimate is the mean over the samples of the horizon. That is unbiased
//! even while resident memory shrinks under the sampling itself: a draw
//! from `R` resident bytes of which `H` are active comes back with
//! probability `H / R`, so its expected count is `H`. The cold-memory
//! figures are the same mean for "not back after `age`", over the samples
//! old enough to tell.
//!
//! What it costs: every active sample is a store fault the guest waits
//! for (`sample_wait_us`), about one per active sample; at the default rate
//! of 2 units per second on this host (a chunk's store fault 2.5-3 ms)
//! at most about 0.6 % of one vCPU's time.
//!
//! Split chunks are not sampled (their pages fault one by one and tell
//! their own story); their resident pages count in the population as
//! the huge units do. Pinned units (the VMM's own region) are never
//! sampled and always in use: they count as active, outside the
//! population.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::index::UnitIndex;

/// Idle ages of the cold-memory figures.
pub const COLD_AGES: [Duration; 3] = [
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(300),
];

/// Resolved samples below which there is no estimate: with fewer, one
/// sample moves it by more than 6 %.
pub const MIN_SAMPLES: u64 = 16;

/// The slowest sampling: one unit an hour (a slower rate gives no
/// estimate within any run, and its interval would not fit a `Duration`).
pub const MIN_UNITS_PER_SECOND: f64 = 1.0 / 3600.0;

/// The longest window or horizon: a day (a sample's times are kept in
/// milliseconds, and a longer span gives no estimate within any run).
pub const MAX_SPAN: Duration = Duration::from_secs(24 * 3600);

/// How the sampler samples (`EngineConfig::working_set`).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkingSetConfig {
    /// Units taken out per second.
    pub units_per_second: f64,
    /// A sample that faults back within this long was active.
    pub window: Duration,
    /// The estimate is the mean over the samples taken within this long
    /// before their window ended.
    pub horizon: Duration,
}

impl Default for WorkingSetConfig {
    fn default() -> WorkingSetConfig {
        WorkingSetConfig {
            units_per_second: 2.0,
            window: Duration::from_secs(10),
            horizon: Duration::from_secs(60),
        }
    }
}

impl WorkingSetConfig {
    /// Checks the values; the message says what to give instead.
    pub fn check(&self) -> Result<(), String> {
        if !(self.units_per_second >= MIN_UNITS_PER_SECOND && self.units_per_second <= 1000.0) {
            return Err(format!(
                "working-set sampling rate {} units per second: give a rate of at least {MIN_UNITS_PER_SECOND} (one unit an hour) and at most 1000",
                self.units_per_second
            ));
        }
        for (name, span) in [("window", self.window), ("horizon", self.horizon)] {
            if span < Duration::from_millis(1) || span > MAX_SPAN {
                return Err(format!(
                    "working-set {name} of {} ms: give at least 1 ms and at most {} ms (a day)",
                    span.as_millis(),
                    MAX_SPAN.as_millis()
                ));
            }
        }
        Ok(())
    }

    /// Time between two samples.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.units_per_second)
    }
}

/// Memory not touched for at least an age, estimated over resident memory
/// (bytes; `None` until enough samples are that old).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdMemory {
    /// Idle for 10 s or more.
    pub idle_10s_bytes: Option<u64>,
    /// Idle for 60 s or more.
    pub idle_60s_bytes: Option<u64>,
    /// Idle for 300 s or more.
    pub idle_300s_bytes: Option<u64>,
}

/// The `working_set` object of the swap stats.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkingSetStats {
    /// Sampling is on.
    pub sampling: bool,
    /// A sample that came back within this long was active, ms.
    pub window_ms: u64,
    /// Active memory over the window (`None` until
    /// [`MIN_SAMPLES`] samples resolved).
    pub estimate_bytes: Option<u64>,
    /// The estimate's standard error: the estimate is within twice this
    /// of the active memory 19 times in 20 (`None` with the estimate).
    pub estimate_stderr_bytes: Option<u64>,
    /// Samples the estimate is the mean of.
    pub estimate_samples: u64,
    /// Memory idle for 10, 60 and 300 s.
    pub cold: ColdMemory,
    /// Units taken out to sample them.
    pub samples: u64,
    /// Sampled units that faulted back (at any age).
    pub returned: u64,
    /// Time the guest's threads waited for sampled units to come back, µs:
    /// the sampling's cost.
    pub sample_wait_us: u64,
}

/// One sample.
#[derive(Debug, Clone, Copy)]
struct Sample {
    unit: UnitIndex,
    /// When it was taken, ms since the clock's start.
    at_ms: u64,
    /// Resident bytes when it was taken.
    population_bytes: u64,
    /// How long after `at_ms` it faulted back.
    returned_after_ms: Option<u64>,
}

/// The live estimator: one mark per unit for the fault path, the samples
/// for the figures.
pub(crate) struct WorkingSet {
    config: WorkingSetConfig,
    start: Instant,
    /// Per unit: `at_ms + 1` of its outstanding sample, 0 when none.
    marks: Box<[AtomicU64]>,
    samples: Mutex<VecDeque<Sample>>,
    taken: AtomicU64,
    returned: AtomicU64,
    wait_us: AtomicU64,
    /// The sampler's random state (xorshift64).
    rng: AtomicU64,
    /// Bytes of pinned units (the VMM's own region): never sampled,
    /// always resident and in use, so counted active and left out of the
    /// population the samples are drawn from.
    pinned_bytes: AtomicU64,
}

impl WorkingSet {
    /// An estimator over `units` units.
    pub fn new(units: usize, config: WorkingSetConfig) -> WorkingSet {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            | 1;
        WorkingSet {
            config,
            start: Instant::now(),
            marks: (0..units).map(|_| AtomicU64::new(0)).collect(),
            samples: Mutex::new(VecDeque::new()),
            taken: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            wait_us: AtomicU64::new(0),
            rng: AtomicU64::new(seed),
            pinned_bytes: AtomicU64::new(0),
        }
    }

    /// Sets the bytes of pinned units ([`WorkingSet::pinned_bytes`]).
    pub fn set_pinned_bytes(&self, bytes: u64) {
        self.pinned_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of pinned units.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Relaxed)
    }

    /// The configuration.
    pub fn config(&self) -> &WorkingSetConfig {
        &self.config
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A uniformly drawn unit index (xorshift64; the sampler is the only
    /// caller, so a lost update between threads cannot happen).
    pub fn draw_unit(&self) -> UnitIndex {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        UnitIndex::new((x % self.marks.len().max(1) as u64) as usize)
    }

    /// Marks `unit` as sampled before the sampler evicts it, so that a
    /// fault racing the eviction is seen. Returns the mark for
    /// [`WorkingSet::record`] or [`WorkingSet::unmark`].
    pub fn mark(&self, unit: UnitIndex) -> u64 {
        let mark = self.now_ms() + 1;
        self.marks[unit.get()].store(mark, Ordering::Relaxed);
        mark
    }

    /// The eviction did not happen: clears the mark and returns true, or
    /// returns false when a fault took the mark first. A unit the guest
    /// touched while it was being taken out (a write-protect fault aborts
    /// the eviction of a unit being written) was active, so the caller
    /// records it as a sample that came back at once: leaving it out would
    /// leave out exactly the units written most, and lean the estimate
    /// low. A unit skipped untouched (busy, gone meanwhile) is no sample.
    pub fn unmark(&self, unit: UnitIndex, mark: u64) -> bool {
        self.marks[unit.get()]
            .compare_exchange(mark, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether `unit` is a sample that has not come back.
    pub fn is_marked(&self, unit: UnitIndex) -> bool {
        self.marks[unit.get()].load(Ordering::Relaxed) != 0
    }

    /// The unit is out: the sample counts from its mark. A fault that came
    /// between the mark and this call is kept (it returned at once).
    pub fn record(&self, unit: UnitIndex, mark: u64, population_bytes: u64) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let at_ms = mark - 1;
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the lock: a fault's `on_return` takes the mark before
        // it takes the lock, so either the mark is gone here or the return
        // finds this sample once it is pushed.
        let returned_now = self.marks[unit.get()].load(Ordering::Relaxed) != mark;
        samples.push_back(Sample {
            unit,
            at_ms,
            population_bytes,
            returned_after_ms: returned_now.then(|| self.now_ms().saturating_sub(at_ms)),
        });
        // Samples older than the longest age plus the horizon tell nothing.
        let keep_ms = (COLD_AGES[2] + self.config.horizon + self.config.window).as_millis() as u64;
        let now = self.now_ms();
        while samples
            .front()
            .is_some_and(|s| now.saturating_sub(s.at_ms) > keep_ms)
        {
            samples.pop_front();
        }
    }

    /// Called by the fault path before it restores `unit` (from the store,
    /// the parking area or zero): true when the unit was a sample, whose
    /// wait the caller then reports with [`WorkingSet::add_wait`].
    pub fn on_return(&self, unit: UnitIndex) -> bool {
        let mark = &self.marks[unit.get()];
        if mark.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let at = mark.swap(0, Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        self.returned.fetch_add(1, Ordering::Relaxed);
        let at_ms = at - 1;
        let after = self.now_ms().saturating_sub(at_ms);
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        // Recorded after the mark: a return before `record` is found there.
        if let Some(sample) = samples
            .iter_mut()
            .rev()
            .find(|s| s.unit == unit && s.at_ms == at_ms)
        {
            sample.returned_after_ms.get_or_insert(after);
        }
        true
    }

    /// A sampled unit's fault was served after `waited`.
    pub fn add_wait(&self, waited: Duration) {
        self.wait_us
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> WorkingSetStats {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let samples: Vec<Sample> = samples.iter().copied().collect();
        let active = estimate(&samples, self.now_ms(), &self.config);
        WorkingSetStats {
            sampling: true,
            window_ms: self.config.window.as_millis() as u64,
            estimate_bytes: active.bytes.map(|b| b + self.pinned_bytes()),
            estimate_stderr_bytes: active.stderr_bytes,
            estimate_samples: active.samples,
            cold: cold_memory(&samples, self.now_ms(), &self.config),
            samples: self.taken.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
            sample_wait_us: self.wait_us.load(Ordering::Relaxed),
        }
    }
}

/// A mean over samples: its value (`None` below [`MIN_SAMPLES`]), how
/// many samples it is over, and its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mean {
    bytes: Option<u64>,
    samples: u64,
    stderr_bytes: Option<u64>,
}

/// The mean, over the samples whose `age` ended within the horizon, of
/// `population_bytes` where `counts` says so and 0 elsewhere. Each sample
/// counts a whole population or nothing, so one drawn while much memory
/// was resident moves the mean a lot: the standard error says how much
/// the figure can be trusted.
fn mean_over(
    samples: &[Sample],
    now_ms: u64,
    age: Duration,
    horizon: Duration,
    counts: impl Fn(&Sample) -> bool,
) -> Mean {
    let age_ms = age.as_millis() as u64;
    let horizon_ms = horizon.as_millis() as u64;
    let mut sum = 0f64;
    let mut sum_squares = 0f64;
    let mut n = 0u64;
    for s in samples {
        // Only samples `age` old at least, returned or not: counting the
        // younger ones that already came back, without the younger ones
        // still out, would lean the mean towards active memory. So the
        // figures lag by their age.
        let elapsed = now_ms.saturating_sub(s.at_ms);
        if elapsed < age_ms || elapsed > age_ms + horizon_ms {
            continue;
        }
        n += 1;
        if counts(s) {
            let x = s.population_bytes as f64;
            sum += x;
            sum_squares += x * x;
        }
    }
    if n < MIN_SAMPLES {
        return Mean {
            bytes: None,
            samples: n,
            stderr_bytes: None,
        };
    }
    let count = n as f64;
    let mean = sum / count;
    // The sample variance (n - 1), then the mean's standard error.
    let variance = ((sum_squares - count * mean * mean) / (count - 1.0)).max(0.0);
    Mean {
        bytes: Some(mean.round() as u64),
        samples: n,
        stderr_bytes: Some((variance / count).sqrt().round() as u64),
    }
}

/// Active memory over the window.
fn estimate(samples: &[Sample], now_ms: u64, config: &WorkingSetConfig) -> Mean {
    let window_ms = config.window.as_millis() as u64;
    mean_over(samples, now_ms, config.window, config.horizon, |s| {
        s.returned_after_ms.is_some_and(|after| after <= window_ms)
    })
}

/// Memory idle for each of [`COLD_AGES`].
fn cold_memory(samples: &[Sample], now_ms: u64, config: &WorkingSetConfig) -> ColdMemory {
    let idle_for = |age: Duration| {
        let age_ms = age.as_millis() as u64;
        mean_over(samples, now_ms, age, config.horizon, |s| {
            s.returned_after_ms.is_none_or(|after| after > age_ms)
        })
        .bytes
    };
    ColdMemory {
        idle_10s_bytes: idle_for(COLD_AGES[0]),
        idle_60s_bytes: idle_for(COLD_AGES[1]),
        idle_300s_bytes: idle_for(COLD_AGES[2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sample(at_ms: u64, population_mib: u64, returned_after_ms: Option<u64>) -> Sample {
        Sample {
            unit: UnitIndex::new(0),
            at_ms,
            population_bytes: population_mib * MIB,
            returned_after_ms,
        }
    }

    fn config() -> WorkingSetConfig {
        WorkingSetConfig::default()
    }

    #[test]
    fn the_estimate_is_the_share_that_came_back_times_the_population() {
        // 100 samples over 50 s from 400 MiB resident, 30 back quickly.
        let samples: Vec<Sample> = (0..100)
            .map(|i| sample(i * 500, 400, (i % 10 < 3).then_some(200)))
            .collect();
        let active = estimate(&samples, 61_000, &config());
        assert_eq!(active.samples, 100);
        assert_eq!(active.bytes, Some(120 * MIB));
        // A Bernoulli(0.3) times 400 MiB: sd 400 * sqrt(0.3 * 0.7 * 100 / 99)
        // MiB, over 10 samples' square root.
        let stderr = active.stderr_bytes.unwrap() as f64 / MIB as f64;
        assert!((stderr - 18.424).abs() < 0.01, "{stderr} MiB");
    }

    #[test]
    fn a_sample_back_after_the_window_was_idle_for_it() {
        let samples: Vec<Sample> = (0..20)
            .map(|i| sample(i * 100, 100, Some(if i < 10 { 9_000 } else { 11_000 })))
            .collect();
        assert_eq!(estimate(&samples, 30_000, &config()).bytes, Some(50 * MIB));
    }

    #[test]
    fn no_estimate_until_enough_samples_resolved() {
        // Outstanding for less than the window: not resolved.
        let samples: Vec<Sample> = (0..40).map(|i| sample(i * 100, 100, None)).collect();
        let none = estimate(&samples, 5_000, &config());
        assert_eq!(
            (none.bytes, none.samples, none.stderr_bytes),
            (None, 0, None)
        );
        let few: Vec<Sample> = (0..(MIN_SAMPLES - 1))
            .map(|i| sample(i * 100, 100, Some(5)))
            .collect();
        assert_eq!(estimate(&few, 20_000, &config()).bytes, None);
    }

    #[test]
    fn draws_from_a_shrinking_population_still_estimate_the_active_memory() {
        // 64 MiB active; resident memory shrinks from 256 MiB as idle
        // samples stay out. A draw from R comes back with probability
        // 64/R: with the draws spread evenly, the estimate is 64 MiB.
        let mut samples = Vec::new();
        let mut at = 0;
        for resident in [256u64, 128, 64] {
            let draws = resident / 4;
            let active = draws * 64 / resident;
            for d in 0..draws {
                samples.push(sample(at, resident, (d < active).then_some(100)));
                at += 100;
            }
        }
        let estimate =
            estimate(&samples, at + 11_000, &config()).bytes.unwrap() as f64 / MIB as f64;
        assert!((estimate - 64.0).abs() < 1.0, "{estimate} MiB");
    }

    #[test]
    fn cold_memory_by_age_counts_what_stayed_out_that_long() {
        // A sample every 500 ms for 400 s: a quarter back within 5 s, a
        // quarter after 30 s, a quarter after 120 s, a quarter never.
        let now = 400_000;
        let samples: Vec<Sample> = (0..800)
            .map(|i| {
                let back = match i % 4 {
                    0 => Some(5_000),
                    1 => Some(30_000),
                    2 => Some(120_000),
                    _ => None,
                };
                sample(i * 500, 800, back)
            })
            .collect();
        let cold = cold_memory(&samples, now, &config());
        let near = |got: Option<u64>, want_mib: f64| {
            let got = got.expect("enough samples") as f64 / MIB as f64;
            assert!(
                (got - want_mib).abs() < want_mib * 0.02,
                "{got} MiB, not {want_mib}"
            );
        };
        near(cold.idle_10s_bytes, 600.0);
        near(cold.idle_60s_bytes, 400.0);
        near(cold.idle_300s_bytes, 200.0);
    }

    #[test]
    fn young_samples_count_for_no_age() {
        // Taken 5 s ago, half already back: the window has not ended for
        // the other half, so none counts yet.
        let samples: Vec<Sample> = (0..40)
            .map(|i| sample(95_000 + i * 10, 100, (i % 2 == 0).then_some(100)))
            .collect();
        assert_eq!(estimate(&samples, 100_000, &config()).samples, 0);
    }

    #[test]
    fn a_return_before_the_sample_is_recorded_counts_as_active() {
        let ws = WorkingSet::new(4, config());
        let unit = UnitIndex::new(2);
        let mark = ws.mark(unit);
        assert!(ws.on_return(unit), "the eviction raced a fault");
        ws.record(unit, mark, 8 * MIB);
        let samples = ws.samples.lock().unwrap();
        assert_eq!(samples.len(), 1);
        assert!(samples[0].returned_after_ms.is_some());
        drop(samples);
        assert!(!ws.on_return(unit), "one return per sample");
        assert!(!ws.on_return(UnitIndex::new(1)), "never sampled");
    }

    #[test]
    fn only_a_skip_the_guest_caused_is_a_sample() {
        let ws = WorkingSet::new(4, config());
        let (touched, skipped) = (UnitIndex::new(1), UnitIndex::new(3));
        let mark = ws.mark(touched);
        assert!(ws.on_return(touched), "a write-protect fault aborted it");
        assert!(!ws.unmark(touched, mark), "the fault took the mark");
        let mark = ws.mark(skipped);
        assert!(ws.unmark(skipped, mark), "nothing touched it");
        assert!(!ws.on_return(skipped), "no mark left to count");
    }

    #[test]
    fn bad_rates_are_refused_with_what_to_give() {
        for rate in [0.0, -1.0, f64::NAN, 1e-20, 5000.0] {
            let c = WorkingSetConfig {
                units_per_second: rate,
                ..config()
            };
            let e = c.check().unwrap_err();
            assert!(e.contains("give a rate"), "{e}");
        }
        assert!(config().check().is_ok());
    }
}
