//! What a run gives back: how it ended and its figures, for the summary
//! lines, `--stats-json` and `--stats-timeline` (`stats.rs`).

use crate::balloon_handle::BalloonSnapshot;
use crate::exit::ExitKind;
use guestmem::StageTwoPages;
use std::time::Duration;
use swap::engine::{EvictReport, SwapStats};

/// The run's figures at one moment (`--stats-timeline`).
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// KVM stage-2 mapping counts.
    pub stage2: StageTwoPages,
    /// Swap engine counters, if it runs.
    pub swap: Option<SwapStats>,
}

/// A timed "swap out everything" after the payload (`--pageout`).
#[derive(Debug, Clone)]
pub struct Pageout {
    /// Resident guest RAM before.
    pub resident_bytes_before: u64,
    /// Resident guest RAM after.
    pub resident_bytes_after: u64,
    /// Wall time of the eviction, writes included.
    pub elapsed: Duration,
    /// What the engine did.
    pub report: EvictReport,
}

/// How a run ended.
pub struct RunOutcome {
    /// Process exit status to use.
    pub exit_status: i32,
    /// Why the run ended.
    pub exit_kind: ExitKind,
    /// Per-vCPU statuses written to the finish port (None: did not finish).
    pub vcpu_statuses: Vec<Option<u32>>,
    /// Why the VM failed, if it did.
    pub failure: Option<String>,
    /// Wall time from the first vCPU start to the end.
    pub elapsed: Duration,
    /// KVM stage-2 mapping counts read before the vCPUs were torn down.
    pub stage2: StageTwoPages,
    /// TSC frequency of vCPU 0, for converting payload cycle counts.
    pub tsc_khz: Option<u32>,
    /// Swap engine figures, read at the same moment as `stage2`.
    pub swap: Option<SwapStats>,
    /// Samples taken while the guest ran (`RunConfig::sample_interval`).
    pub timeline: Vec<Sample>,
    /// The timed eviction after the payload, if asked for.
    pub pageout: Option<Pageout>,
    /// The balloon's figures when the guest stopped, if it has one.
    pub balloon: Option<BalloonSnapshot>,
    /// What `--mem-limit auto` did, if it ran.
    pub sizing: Option<crate::auto_limit::SizingReport>,
}
