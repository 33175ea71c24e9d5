//! The end-of-run statistics object written by `--stats-json`.

use crate::vm::RunOutcome;
use guestmem::Backing;
use serde_json::{json, Value};

/// Everything the stats object reports about one run.
pub struct RunSummary<'a> {
    /// Payload name or path.
    pub payload: &'a str,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size.
    pub mem_bytes: u64,
    /// Guest RAM backing.
    pub backing: Backing,
    /// How the run ended.
    pub outcome: &'a RunOutcome,
}

impl RunSummary<'_> {
    /// The JSON object (field names are a stable interface for scripts).
    pub fn to_json(&self) -> Value {
        let o = self.outcome;
        json!({
            "payload": self.payload,
            "elapsed_s": o.elapsed.as_secs_f64(),
            "vcpus": self.vcpus,
            "mem_bytes": self.mem_bytes,
            "backing": self.backing.to_string(),
            "exit_status": o.exit_status,
            "vcpu_statuses": o.vcpu_statuses,
            "failure": o.failure,
            "tsc_khz": o.tsc_khz,
            "kvm": {
                "pages_4k": o.stage2.pages_4k,
                "pages_2m": o.stage2.pages_2m,
                "pages_1g": o.stage2.pages_1g,
            },
        })
    }
}
