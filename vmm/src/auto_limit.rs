//! `--mem-limit auto`: the run loop's side of the limit controller
//! (`swap::engine::sizing` has the control law). Once a period it reads
//! the engine's stall, asks the controller, and sets the limit it gives.
//!
//! A limit set by anyone else (`PUT /mem-limit`, `hugevmm ctl mem-limit`)
//! ends auto sizing: the operator's word wins, and the controller would
//! otherwise undo it within a period.

use std::time::{Duration, Instant};

use guestmem::PAGE_BYTES;
use serde::Serialize;
use swap::engine::sizing::{LimitController, Sizing, SizingTarget};
use swap::engine::{MemLimit, SwapEngine};

/// How often the controller decides: PSI's shortest window (10 s) is too
/// slow for a guest whose working set moves in seconds, and much shorter
/// periods hold too few faults to tell stall from noise (at a 2 % target
/// half a second holds 10 ms of stall per vCPU, a handful of 2 MiB store
/// faults). Half a second rather than one: letting go of a set that
/// shrank takes five or six quiet periods of cuts; under the same rules,
/// the phases payload's 64-to-16 MiB change was followed in 3.3 s with
/// half-second periods and not within its 7 s phase with one-second ones
/// (single runs of `hugevmm bench self-sizing`'s follow payload).
pub const PERIOD: Duration = Duration::from_millis(500);

/// How often the guest's growth is checked between periods
/// (`LimitController::on_growth`): a guest loads hundreds of MiB within
/// one period, and every first touch against a binding limit evicts
/// something it will want back.
pub const GROWTH_CHECK: Duration = Duration::from_millis(100);

/// What auto sizing did over the run (`mem_limit_auto` in --stats-json).
#[derive(Debug, Clone, Serialize)]
pub struct SizingReport {
    /// The stall aimed for, percent of wall time.
    pub stall_target_pct: f64,
    /// The bounds, bytes.
    pub min_bytes: u64,
    /// The bounds, bytes.
    pub max_bytes: u64,
    /// Periods that raised the limit.
    pub raises: u64,
    /// Periods that lowered it.
    pub lowers: u64,
    /// The lowest and highest limit it set (the start included), bytes.
    pub lowest_bytes: u64,
    /// See `lowest_bytes`.
    pub highest_bytes: u64,
    /// The mean limit over the periods, bytes.
    pub mean_bytes: u64,
    /// Why it stopped before the run ended, if it did (a limit set through
    /// the API, or a limit the engine refused).
    pub stopped: Option<String>,
}

/// The waits a higher limit would have spared, µs over every thread: the
/// refaults (store, parking, pages of split chunks, units in flight) and
/// the write-protect faults that follow a restore; not the zero fills of
/// first touches, which any limit pays.
pub(crate) fn refault_wait_us(stall: &swap::engine::StallStats) -> u64 {
    let by = &stall.by_source_us;
    by.store + by.parking + by.page + by.in_flight + by.write_protect
}

/// Guest memory first touched so far, bytes: the zero fills of whole
/// units and of pages of split chunks. A unit evicted as all zero and
/// touched again counts again; the guest is using it again either way.
pub(crate) fn first_touched_bytes(stats: &swap::engine::SwapStats) -> u64 {
    stats
        .faults
        .zero
        .saturating_mul(stats.unit_bytes)
        .saturating_add(stats.split.page_faults.zero.saturating_mul(PAGE_BYTES))
}

/// The controller as the run loop drives it.
pub struct AutoLimit {
    controller: LimitController,
    vcpus: u32,
    mem_bytes: u64,
    started: Instant,
    /// When the next period ends (`next_at` is the next growth check).
    period_at: Instant,
    next_at: Instant,
    /// The limit it set last (and expects to find).
    limit_bytes: u64,
    report: SizingReport,
    limit_sum_bytes: u128,
    periods: u64,
}

impl AutoLimit {
    /// Auto sizing for a run that started at `started` with the limit
    /// `target.max_bytes`.
    pub fn new(target: SizingTarget, vcpus: u32, mem_bytes: u64, started: Instant) -> AutoLimit {
        AutoLimit {
            controller: LimitController::new(target),
            vcpus,
            mem_bytes,
            started,
            next_at: started,
            period_at: started,
            limit_bytes: target.max_bytes,
            report: SizingReport {
                stall_target_pct: target.stall_share * 100.0,
                min_bytes: target.min_bytes,
                max_bytes: target.max_bytes,
                raises: 0,
                lowers: 0,
                lowest_bytes: target.max_bytes,
                highest_bytes: target.max_bytes,
                mean_bytes: target.max_bytes,
                stopped: None,
            },
            limit_sum_bytes: 0,
            periods: 0,
        }
    }

    /// When the next period ends or the next growth check is due; None
    /// once it stopped.
    pub fn next_at(&self) -> Option<Instant> {
        self.report.stopped.is_none().then_some(self.next_at)
    }

    /// Ends a period if one is due (reads the stall), else checks for
    /// growth if that is due; sets the limit the controller gives.
    pub fn tick(&mut self, engine: &SwapEngine, now: Instant) {
        if self.report.stopped.is_some() || now < self.next_at {
            return;
        }
        self.next_at = now + GROWTH_CHECK;
        let stats = engine.stats();
        if stats.mem_limit_bytes != Some(self.limit_bytes) {
            self.stop(format!(
                "the limit was set to {} by another hand (PUT /mem-limit); auto sizing ends, that limit stays",
                stats
                    .mem_limit_bytes
                    .map_or_else(|| "none".to_string(), guestmem::format_size)
            ));
            return;
        }
        let touched_bytes = first_touched_bytes(&stats);
        let sizing = if now >= self.period_at {
            self.period_at = now + PERIOD;
            self.periods += 1;
            self.limit_sum_bytes += u128::from(self.limit_bytes);
            let now_us = now.duration_since(self.started).as_micros() as u64;
            self.controller.decide(
                refault_wait_us(&stats.stall) / u64::from(self.vcpus.max(1)),
                now_us,
                self.limit_bytes,
                stats.resident_bytes,
                touched_bytes,
            )
        } else {
            self.controller
                .on_growth(self.limit_bytes, stats.resident_bytes, touched_bytes)
        };
        let wanted = match sizing {
            Sizing::Hold => return,
            Sizing::Raise(bytes) | Sizing::Lower(bytes) => bytes,
        };
        let unit_bytes = self.controller.target().unit_bytes;
        let set = MemLimit::new(wanted, unit_bytes, self.vcpus, self.mem_bytes)
            .map_err(|e| e.to_string())
            .and_then(|limit| engine.set_mem_limit(Some(limit)).map_err(|e| e.to_string()));
        if let Err(e) = set {
            self.stop(format!("the engine refused the limit {wanted}: {e}"));
            return;
        }
        self.limit_bytes = wanted;
        self.report.lowest_bytes = self.report.lowest_bytes.min(wanted);
        self.report.highest_bytes = self.report.highest_bytes.max(wanted);
        (self.report.raises, self.report.lowers) = self.controller.moves();
    }

    fn stop(&mut self, why: String) {
        eprintln!("hugevmm: --mem-limit auto: {why}");
        self.report.stopped = Some(why);
    }

    /// What it did.
    pub fn report(&self) -> SizingReport {
        let mut report = self.report.clone();
        if self.periods > 0 {
            report.mean_bytes = (self.limit_sum_bytes / u128::from(self.periods)) as u64;
        }
        report
    }
}
