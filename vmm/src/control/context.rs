//! Carrying out API requests against the running VM: each operation
//! returns its JSON body, or a [`Refusal`] with the status code and a
//! message that says what to do.

use crate::balloon_handle::{target_pages, BalloonHandle};
use crate::event::RunEvent;
use crate::stats::{balloon_json, LiveSummary};
use guestmem::{Backing, KvmStats, StageTwoPages, PAGE_BYTES};
use serde_json::{json, Value};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use swap::engine::{MemLimit, SwapEngine, SwapStats};

use crate::balloon_handle::BalloonSnapshot;

/// What the API's threads can reach of the VM.
///
/// One context serves every client at once, so requests from two clients
/// may run together. Each part is safe for that: the balloon's transport
/// is behind its own mutex, the one the vCPUs take for MMIO (`GET /balloon`
/// writes the used ring in guest memory under it, as a vCPU does; a fault
/// there is served by the swap engine's fault threads, which never take
/// it); the swap engine's run-time calls are built for concurrent callers
/// (its background evictor and faulting vCPUs already are); the KVM
/// statistics are read with `pread`; the event channel's sender is `Sync`
/// (two `quit`s send two events, the run loop ends at the first). The one
/// lock of the API's own, `pageout_lock`, is taken with no other held and
/// by nothing else, so it adds no lock-order cycle.
pub struct ControlContext {
    /// Payload name or kernel path, for `GET /stats`.
    pub payload: String,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size; balloon targets may not exceed it.
    pub mem_bytes: u64,
    /// Guest RAM backing.
    pub backing: Backing,
    /// The run's options as given (flags over `--config`), for `GET /vm`.
    pub config: Value,
    /// When the vCPUs started.
    pub started: Instant,
    /// The balloon, if the VM has one.
    pub balloon: Option<BalloonHandle>,
    /// The swap engine, if it runs.
    pub engine: Option<Arc<SwapEngine>>,
    /// The VM's KVM statistics (a descriptor of the API's own).
    pub kvm_stats: Option<KvmStats>,
    /// Where `quit` asks the run loop to end the VM.
    pub events: Sender<RunEvent>,
    /// Held for the length of a `pageout` (see [`ControlContext::pageout`]);
    /// give `Default::default()`.
    pub pageout_lock: Mutex<()>,
}

/// Why a request was not carried out: the status code and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// HTTP status code.
    pub status: u16,
    /// What went wrong and what to do instead.
    pub message: String,
}

impl Refusal {
    /// A request the VM cannot carry out as it is configured (409).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: 409,
            message: message.into(),
        }
    }

    /// A value out of range or malformed (400).
    pub fn bad_value(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
        }
    }
}

/// The result of an operation: its JSON body or why not.
pub type Outcome = Result<Value, Refusal>;

const NO_ENGINE: &str =
    "the swap engine is not running: start `hugevmm run` with --mem-limit or --swap-store";

const NO_BALLOON: &str =
    "this VM has no balloon: start `hugevmm run` with --balloon to change its size";

/// Everything `GET /metrics` reports, read at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Since the vCPUs started.
    pub uptime: Duration,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size.
    pub mem_bytes: u64,
    /// KVM stage-2 mapping counts, if they could be read.
    pub stage2: Option<StageTwoPages>,
    /// Swap engine counters, if the engine runs.
    pub swap: Option<SwapStats>,
    /// The balloon, if there is one.
    pub balloon: Option<BalloonSnapshot>,
}

impl ControlContext {
    /// `GET /vm`: state, uptime, the configuration as given and what the
    /// seccomp filters do with a forbidden call (`trap`, `log`, `off`).
    pub fn vm_info(&self) -> Value {
        json!({
            "state": "running",
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "config": self.config,
            "seccomp": crate::seccomp::mode().name(),
        })
    }

    /// `GET /stats`: the `--stats-json` fields known while the VM runs.
    pub fn stats(&self) -> Value {
        LiveSummary {
            payload: &self.payload,
            vcpus: self.vcpus,
            mem_bytes: self.mem_bytes,
            backing: self.backing,
            elapsed: self.started.elapsed(),
            stage2: self.read_stage2(),
            swap: self.engine.as_ref().map(|e| e.stats()),
            balloon: self.balloon.as_ref().map(BalloonHandle::snapshot),
        }
        .to_json()
    }

    /// The figures of `GET /metrics`.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            uptime: self.started.elapsed(),
            vcpus: self.vcpus,
            mem_bytes: self.mem_bytes,
            stage2: self.read_stage2(),
            swap: self.engine.as_ref().map(|e| e.stats()),
            balloon: self.balloon.as_ref().map(BalloonHandle::snapshot),
        }
    }

    fn read_stage2(&self) -> Option<StageTwoPages> {
        self.kvm_stats.as_ref().and_then(|s| s.read().ok())
    }

    /// `PUT /actions {"action": "quit"}`: ends the VM with status 0, as
    /// Ctrl-A x does.
    pub fn quit(&self) -> Outcome {
        match self.events.send(RunEvent::Quit {
            how: "quit through the API socket",
        }) {
            Ok(()) => Ok(json!({ "quitting": true })),
            Err(_) => Err(Refusal::conflict("the VM is already ending")),
        }
    }

    /// `PUT /actions {"action": "pageout"}`: evicts everything, one pageout
    /// at a time: two at once would each wait on the other's writes and
    /// report only part of the pass, with a `resident_bytes_before` taken
    /// halfway through the other's. The second waits, then finds little
    /// left and says so. The lock is only ever taken here, with no other
    /// held, so holding it across the engine's waits cannot deadlock; a
    /// pageout stuck on a failed VM holds it for good, but the server is
    /// not waited for then.
    ///
    /// `PUT /mem-limit` takes no lock: setting the limit is one atomic
    /// store (the last of two concurrent changes wins, as if they had come
    /// in turn), and it must not wait behind a pageout of seconds.
    pub fn pageout(&self) -> Outcome {
        let engine = self.engine.as_ref().ok_or(Refusal::conflict(NO_ENGINE))?;
        // A poisoned lock guards nothing: the engine keeps its own state.
        let _one_pageout = self.pageout_lock.lock().unwrap_or_else(|e| e.into_inner());
        let resident_bytes_before = engine.stats().resident_bytes;
        let started = Instant::now();
        let report = engine.evict_all().map_err(|e| Refusal {
            status: 500,
            message: format!("pageout failed: {e}"),
        })?;
        Ok(json!({
            "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
            "resident_bytes_before": resident_bytes_before,
            // The guest runs on and faults memory back meanwhile.
            "resident_bytes_after": engine.stats().resident_bytes,
            "written_units": report.written_units,
            "written_bytes": report.written_bytes,
            "clean_dropped_units": report.clean_dropped_units,
            "zero_units": report.zero_units,
            "busy_units": report.busy_units,
        }))
    }

    /// `PUT /mem-limit`: changes the engine's cap; None lifts it.
    pub fn set_mem_limit(&self, limit_bytes: Option<u64>) -> Outcome {
        let engine = self.engine.as_ref().ok_or(Refusal::conflict(NO_ENGINE))?;
        let limit = limit_bytes
            .map(|bytes| MemLimit::new(bytes, engine.unit_bytes(), self.vcpus, self.mem_bytes))
            .transpose()
            .map_err(|e| Refusal::bad_value(format!("mem_limit_bytes: {e}")))?;
        engine
            .set_mem_limit(limit)
            .map_err(|e| Refusal::bad_value(format!("mem_limit_bytes: {e}")))?;
        let stats = engine.stats();
        Ok(json!({
            "mem_limit_bytes": limit_bytes,
            // Lowering the limit evicts in the background: watch /stats.
            "resident_bytes": stats.resident_bytes,
        }))
    }

    /// `PUT /balloon`: sets the balloon target.
    pub fn set_balloon(&self, target_bytes: u64) -> Outcome {
        let balloon = self.balloon.as_ref().ok_or(Refusal::conflict(NO_BALLOON))?;
        let pages = target_pages(target_bytes, self.mem_bytes)
            .map_err(|e| Refusal::bad_value(format!("target_bytes: {e}")))?;
        balloon.set_target_pages(pages).map_err(|e| Refusal {
            // The target is set; only the guest's nudge failed, and the
            // driver still sees the new value on its next configuration read.
            status: 500,
            message: format!(
                "the balloon target is set to {pages} pages but the guest could not be interrupted: {e}"
            ),
        })?;
        Ok(json!({
            "target_pages": pages,
            "target_bytes": u64::from(pages) * PAGE_BYTES,
        }))
    }

    /// `GET /balloon`: the balloon's figures; asks the guest for fresh
    /// statistics.
    pub fn balloon(&self) -> Outcome {
        let balloon = self.balloon.as_ref().ok_or(Refusal::conflict(NO_BALLOON))?;
        // Asked before the snapshot: the fresh report arrives later (the
        // guest answers on its own time), so this reply carries the
        // previous one and the next request the new one.
        let stats_requested = match balloon.request_stats() {
            Ok(requested) => requested,
            Err(e) => {
                eprintln!("hugevmm: API: cannot ask the guest for statistics: {e}");
                false
            }
        };
        let mut value = balloon_json(&balloon.snapshot());
        value["stats_requested"] = Value::Bool(stats_requested);
        Ok(value)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use devices::virtio::{Balloon, MmioTransport};
    use devices::{CountingLine, FreeMemorySink, GuestMemoryHandle};
    use guestmem::{GuestRam, Layout};

    struct NoSink;
    impl FreeMemorySink for NoSink {
        fn free_range(&self, _gpa: guestmem::GuestAddress, _len_bytes: u64) {}
        fn reclaim_range(&self, _gpa: guestmem::GuestAddress, _len_bytes: u64) {}
    }

    pub(crate) const MEM_BYTES: u64 = 64 << 20;

    /// A context for a 64 MiB VM without KVM or swap engine; with a balloon
    /// that no driver has started if `balloon`.
    pub(crate) fn context(balloon: bool) -> ControlContext {
        let balloon = balloon.then(|| {
            let ram =
                Arc::new(GuestRam::new(Layout::new(MEM_BYTES).unwrap(), Backing::Small4k).unwrap());
            let memory: GuestMemoryHandle = ram;
            let transport = MmioTransport::new(
                Balloon::new(Arc::new(NoSink)),
                memory,
                Arc::new(CountingLine::new()),
            );
            BalloonHandle::new(Arc::new(Mutex::new(transport)))
        });
        ControlContext {
            payload: "test".into(),
            vcpus: 2,
            mem_bytes: MEM_BYTES,
            backing: Backing::Small4k,
            config: json!({ "mem": MEM_BYTES, "vcpus": 2 }),
            started: Instant::now(),
            balloon,
            engine: None,
            kvm_stats: None,
            // The receiver is gone: `quit` then says the VM is ending.
            events: std::sync::mpsc::channel().0,
            pageout_lock: Mutex::default(),
        }
    }

    #[test]
    fn engine_operations_need_the_engine_and_quit_needs_a_run_loop() {
        let ctx = context(false);
        for refusal in [
            ctx.pageout().unwrap_err(),
            ctx.set_mem_limit(Some(64 << 20)).unwrap_err(),
            ctx.set_mem_limit(None).unwrap_err(),
        ] {
            assert_eq!(refusal.status, 409);
            assert!(
                refusal.message.contains("--mem-limit or --swap-store"),
                "{refusal}"
            );
        }
        assert_eq!(ctx.quit().unwrap_err().status, 409);
        let (tx, rx) = std::sync::mpsc::channel();
        let ctx = ControlContext {
            events: tx,
            ..context(false)
        };
        assert_eq!(ctx.quit().unwrap()["quitting"], true);
        assert!(matches!(rx.try_recv(), Ok(RunEvent::Quit { .. })));
    }

    #[test]
    fn balloon_target_round_trip() {
        let ctx = context(true);
        let r = ctx.set_balloon(8 << 20).unwrap();
        assert_eq!(r["target_pages"], 2048);
        assert_eq!(r["target_bytes"], 8 << 20);
        let r = ctx.balloon().unwrap();
        assert_eq!(r["target_pages"], 2048);
        assert_eq!(r["actual_pages"], 0);
        assert_eq!(r["driver_active"], false);
        assert_eq!(r["stats_requested"], false, "no driver to ask");
        assert!(r["guest_stats"].is_null());
        let r = ctx.stats();
        assert_eq!(r["balloon"]["target_pages"], 2048);
        assert_eq!(r["mem_bytes"], MEM_BYTES);
        assert!(r["elapsed_s"].as_f64().is_some());
        assert!(r.get("swap").is_none() && r.get("kvm").is_none());
        // The whole of RAM is allowed, more is not, nor part of a page.
        assert!(ctx.set_balloon(MEM_BYTES).is_ok());
        let refusal = ctx.set_balloon(MEM_BYTES + PAGE_BYTES).unwrap_err();
        assert_eq!(refusal.status, 400);
        assert!(
            refusal.message.contains("more than the guest's RAM"),
            "{refusal}"
        );
        let refusal = ctx.set_balloon(5000).unwrap_err();
        assert_eq!(refusal.status, 400);
        assert!(refusal.message.contains("multiple of 4 KiB"), "{refusal}");
        assert_eq!(ctx.balloon().unwrap()["target_pages"], 16384);
        assert_eq!(ctx.set_balloon(0).unwrap()["target_pages"], 0);
    }

    #[test]
    fn without_a_balloon_balloon_requests_say_how_to_get_one() {
        let ctx = context(false);
        for refusal in [
            ctx.set_balloon(8 << 20).unwrap_err(),
            ctx.balloon().unwrap_err(),
        ] {
            assert_eq!(refusal.status, 409);
            assert!(refusal.message.contains("--balloon"), "{refusal}");
        }
        let vm = ctx.vm_info();
        assert_eq!(vm["state"], "running");
        assert_eq!(vm["config"]["vcpus"], 2);
        let snapshot = ctx.snapshot();
        assert!(snapshot.swap.is_none() && snapshot.balloon.is_none());
    }
}
