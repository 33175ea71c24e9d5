//! The working-set sampler thread: one resident unit taken out per
//! interval through the ordinary eviction path, its return watched by
//! [`WorkingSet`] (the estimate and its figures, which know nothing of
//! eviction: the configuration and the statistics depend on them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::SwapError;
use super::evict::EvictService;
use super::lifecycle::Lifecycle;
use super::limit::Limiter;
use super::working_set::WorkingSet;
use crate::chunk::{ChunkTable, Tag};
use crate::index::UnitRange;
use guestmem::host::PAGE_BYTES;

/// Draws per sample before the sampler gives up until its next turn: with
/// less than about 1/32 of the units resident, there is little to sample.
const DRAWS_PER_SAMPLE: usize = 32;

/// The sampler thread's work: one unit taken out per interval.
pub(crate) struct Sampler {
    pub working_set: Arc<WorkingSet>,
    pub evictor: Arc<EvictService>,
    pub table: Arc<ChunkTable>,
    pub limiter: Arc<Limiter>,
    pub life: Arc<Lifecycle>,
}

impl Sampler {
    /// Body of the sampler thread. A store error ends it (the evictor has
    /// reported it as fatal); so does shutting down.
    pub fn run(&self) {
        let interval = self.working_set.config().interval();
        let mut next = Instant::now() + interval;
        while !self.life.stopping() && !self.life.failed() {
            let now = Instant::now();
            if now < next {
                // Short naps, so that shutting down is not held up.
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            // After a long eviction the samples are not caught up: the rate
            // is an upper bound.
            next = (next + interval).max(now);
            if self.sample_one().is_err() {
                return;
            }
        }
    }

    /// Takes one resident unit out, if a draw finds one.
    fn sample_one(&self) -> Result<(), SwapError> {
        let ws = &self.working_set;
        for _ in 0..DRAWS_PER_SAMPLE {
            let unit = ws.draw_unit();
            let state = self.table.load(unit);
            if state.tag() != Tag::Resident || state.pinned() {
                continue;
            }
            let population_bytes =
                (self.limiter.held_pages() * PAGE_BYTES).saturating_sub(ws.pinned_bytes());
            let mark = ws.mark(unit);
            let report = self
                .evictor
                .evict_range(UnitRange::new(unit, unit.next()))?;
            // Out, or touched while being taken out (`WorkingSet::unmark`).
            if report.released_units() == 1 || !ws.unmark(unit, mark) {
                ws.record(unit, mark, population_bytes);
            }
            return Ok(());
        }
        Ok(())
    }
}
