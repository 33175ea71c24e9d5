//! Carrying out control commands against the running VM, and the JSON
//! replies.

use super::command::{parse_line, Command, COMMANDS};
use crate::balloon_handle::{target_pages, BalloonHandle};
use crate::stats::{balloon_json, LiveSummary};
use crate::swap_setup::check_mem_limit;
use crate::vcpu::VcpuEvent;
use guestmem::{Backing, KvmStats, PAGE_BYTES};
use serde_json::{json, Value};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use swap::engine::SwapEngine;

/// What the control socket's threads can reach of the VM.
///
/// One context serves every client at once, so commands from two clients
/// may run together. Each part is safe for that: the balloon's transport
/// is behind its own mutex, the one the vCPUs take for MMIO (`balloon-stats`
/// writes the used ring in guest memory under it, as a vCPU does; a fault
/// there is served by the swap engine's fault threads, which never take
/// it); the swap engine's run-time calls are built for concurrent callers
/// (its background evictor and faulting vCPUs already are); the KVM
/// statistics are read with `pread`; the event channel's sender is `Sync`
/// (two `quit`s send two events, the run loop ends at the first). The one
/// lock of the control socket's own, `pageout_lock`, is taken with no
/// other held and by nothing else, so it adds no lock-order cycle.
pub struct ControlContext {
    /// Payload name or kernel path, for `stats`.
    pub payload: String,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM size; balloon targets may not exceed it.
    pub mem_bytes: u64,
    /// Guest RAM backing.
    pub backing: Backing,
    /// When the vCPUs started.
    pub started: Instant,
    /// The balloon, if the VM has one.
    pub balloon: Option<BalloonHandle>,
    /// The swap engine, if it runs.
    pub engine: Option<Arc<SwapEngine>>,
    /// The VM's KVM statistics (a descriptor of the control thread's own).
    pub kvm_stats: Option<KvmStats>,
    /// Where `quit` asks the run loop to end the VM.
    pub events: Sender<VcpuEvent>,
    /// Held for the length of a `pageout` (see [`ControlContext::pageout`]);
    /// give `Default::default()`.
    pub pageout_lock: Mutex<()>,
}

/// An error reply: `{"ok": false, "error": ...}`.
pub fn error_reply(message: impl Into<String>) -> Value {
    json!({ "ok": false, "error": message.into() })
}

/// A success reply: `object` with `"ok": true` added.
fn ok_reply(mut object: Value) -> Value {
    object["ok"] = Value::Bool(true);
    object
}

const NO_ENGINE: &str =
    "the swap engine is not running: start `hugevmm run` with --mem-limit or --swap-store";

const NO_BALLOON: &str =
    "this VM has no balloon: start `hugevmm run` with --balloon to change its size";

impl ControlContext {
    /// The reply to one line of a client.
    pub fn respond(&self, line: &[u8]) -> Value {
        match parse_line(line) {
            Ok(command) => self.execute(command),
            Err(e) => error_reply(e.to_string()),
        }
    }

    /// Carries out `command`.
    pub fn execute(&self, command: Command) -> Value {
        match command {
            Command::Help => ok_reply(json!({
                "commands": COMMANDS
                    .iter()
                    .map(|(usage, does)| json!({ "command": usage, "does": does }))
                    .collect::<Vec<_>>(),
            })),
            Command::Balloon { target_bytes } => self.set_balloon(target_bytes),
            Command::BalloonStats => self.balloon_stats(),
            Command::Stats => ok_reply(self.live_summary()),
            Command::MemLimit { limit_bytes } => self.set_mem_limit(limit_bytes),
            Command::Pageout => self.pageout(),
            Command::Quit => match self.events.send(VcpuEvent::Quit {
                how: "quit through the control socket",
            }) {
                Ok(()) => ok_reply(json!({ "quitting": true })),
                Err(_) => error_reply("the VM is already ending"),
            },
        }
    }

    /// Evicts everything, one pageout at a time: two at once would each
    /// wait on the other's writes and report only part of the pass, with a
    /// `resident_bytes_before` taken halfway through the other's. The
    /// second waits, then finds little left and says so. The lock is only
    /// ever taken here, with no other held, so holding it across the
    /// engine's waits cannot deadlock; a pageout stuck on a failed VM
    /// holds it for good, but the server is then no longer waited for.
    ///
    /// `mem-limit` takes no lock: setting the limit is one atomic store
    /// (the last of two concurrent changes wins, as if they had come in
    /// turn), and it must not wait behind a pageout of seconds.
    fn pageout(&self) -> Value {
        let Some(engine) = &self.engine else {
            return error_reply(NO_ENGINE);
        };
        // A poisoned lock guards nothing: the engine keeps its own state.
        let _one_pageout = self.pageout_lock.lock().unwrap_or_else(|e| e.into_inner());
        let resident_bytes_before = engine.stats().resident_bytes;
        let started = Instant::now();
        match engine.evict_all() {
            Ok(report) => ok_reply(json!({
                "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
                "resident_bytes_before": resident_bytes_before,
                // The guest runs on and faults memory back meanwhile.
                "resident_bytes_after": engine.stats().resident_bytes,
                "written_units": report.written_units,
                "written_bytes": report.written_bytes,
                "clean_dropped_units": report.clean_dropped_units,
                "zero_units": report.zero_units,
                "busy_units": report.busy_units,
            })),
            Err(e) => error_reply(format!("pageout failed: {e}")),
        }
    }

    fn set_mem_limit(&self, limit_bytes: Option<u64>) -> Value {
        let Some(engine) = &self.engine else {
            return error_reply(NO_ENGINE);
        };
        if let Some(bytes) = limit_bytes {
            if let Err(e) = check_mem_limit(bytes, engine.unit_bytes(), self.vcpus, self.mem_bytes)
            {
                return error_reply(format!("mem-limit: {e}"));
            }
        }
        engine.set_mem_limit_bytes(limit_bytes);
        let stats = engine.stats();
        ok_reply(json!({
            "mem_limit_bytes": limit_bytes,
            // Lowering the limit evicts in the background: watch `stats`.
            "resident_bytes": stats.resident_bytes,
        }))
    }

    fn set_balloon(&self, target_bytes: u64) -> Value {
        let Some(balloon) = &self.balloon else {
            return error_reply(NO_BALLOON);
        };
        let pages = match target_pages(target_bytes, self.mem_bytes) {
            Ok(pages) => pages,
            Err(e) => return error_reply(format!("balloon: {e}")),
        };
        if let Err(e) = balloon.set_target_pages(pages) {
            // The target is set; only the guest's nudge failed, and the
            // driver still sees the new value on its next configuration read.
            return error_reply(format!(
                "balloon: the target is set to {pages} pages but the guest could not be interrupted: {e}"
            ));
        }
        ok_reply(json!({
            "target_pages": pages,
            "target_bytes": u64::from(pages) * PAGE_BYTES,
        }))
    }

    fn balloon_stats(&self) -> Value {
        let Some(balloon) = &self.balloon else {
            return error_reply(NO_BALLOON);
        };
        // Asked before the snapshot: the fresh report arrives later (the
        // guest answers on its own time), so this reply carries the
        // previous one and the next `balloon-stats` the new one.
        let stats_requested = match balloon.request_stats() {
            Ok(requested) => requested,
            Err(e) => {
                eprintln!("hugevmm: control socket: cannot ask the guest for statistics: {e}");
                false
            }
        };
        let mut value = balloon_json(&balloon.snapshot());
        value["stats_requested"] = Value::Bool(stats_requested);
        ok_reply(value)
    }

    fn live_summary(&self) -> Value {
        LiveSummary {
            payload: &self.payload,
            vcpus: self.vcpus,
            mem_bytes: self.mem_bytes,
            backing: self.backing,
            elapsed: self.started.elapsed(),
            stage2: self.kvm_stats.as_ref().and_then(|s| s.read().ok()),
            swap: self.engine.as_ref().map(|e| e.stats()),
            balloon: self.balloon.as_ref().map(BalloonHandle::snapshot),
        }
        .to_json()
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
        fn free_range(&self, _gpa: u64, _len_bytes: u64) {}
        fn reclaim_range(&self, _gpa: u64, _len_bytes: u64) {}
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
            started: Instant::now(),
            balloon,
            engine: None,
            kvm_stats: None,
            // The receiver is gone: `quit` then says the VM is ending.
            events: std::sync::mpsc::channel().0,
            pageout_lock: Mutex::default(),
        }
    }

    fn reply(ctx: &ControlContext, line: &str) -> Value {
        let value = ctx.respond(line.as_bytes());
        assert!(value["ok"].is_boolean(), "{value}");
        value
    }

    #[test]
    fn engine_commands_need_the_engine_and_quit_needs_a_run_loop() {
        let ctx = context(false);
        for line in ["pageout", "mem-limit 64M", "mem-limit none"] {
            let r = reply(&ctx, line);
            assert_eq!(r["ok"], false, "{line}: {r}");
            assert!(
                r["error"]
                    .as_str()
                    .unwrap()
                    .contains("--mem-limit or --swap-store"),
                "{line}: {r}"
            );
        }
        let r = reply(&ctx, "quit");
        assert_eq!(r["ok"], false, "{r}");
        let (tx, rx) = std::sync::mpsc::channel();
        let ctx = ControlContext {
            events: tx,
            ..context(false)
        };
        assert_eq!(reply(&ctx, "quit")["quitting"], true);
        assert!(matches!(rx.try_recv(), Ok(VcpuEvent::Quit { .. })));
    }

    #[test]
    fn balloon_target_round_trip() {
        let ctx = context(true);
        let r = reply(&ctx, "balloon 8M");
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["target_pages"], 2048);
        assert_eq!(r["target_bytes"], 8 << 20);
        let r = reply(&ctx, "balloon-stats");
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["target_pages"], 2048);
        assert_eq!(r["actual_pages"], 0);
        assert_eq!(r["driver_active"], false);
        assert_eq!(r["stats_requested"], false, "no driver to ask");
        assert!(r["guest_stats"].is_null());
        let r = reply(&ctx, "stats");
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["balloon"]["target_pages"], 2048);
        assert_eq!(r["mem_bytes"], MEM_BYTES);
        assert!(r["elapsed_s"].as_f64().is_some());
        assert!(r.get("swap").is_none() && r.get("kvm").is_none());
        // The whole of RAM is allowed, more is not.
        assert_eq!(reply(&ctx, "balloon 64M")["ok"], true);
        let r = reply(&ctx, "balloon 65M");
        assert_eq!(r["ok"], false);
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .contains("more than the guest's RAM"),
            "{r}"
        );
        assert_eq!(reply(&ctx, "balloon-stats")["target_pages"], 16384);
        assert_eq!(reply(&ctx, "balloon 0")["target_pages"], 0);
    }

    #[test]
    fn errors_are_replies() {
        let ctx = context(false);
        for line in ["balloon 8M", "balloon-stats"] {
            let r = reply(&ctx, line);
            assert_eq!(r["ok"], false);
            assert!(r["error"].as_str().unwrap().contains("--balloon"), "{r}");
        }
        let r = reply(&ctx, "frobnicate");
        assert_eq!(r["ok"], false);
        assert!(r["error"].as_str().unwrap().contains("balloon SIZE"), "{r}");
        let r = reply(&ctx, "help");
        assert_eq!(r["ok"], true);
        assert_eq!(r["commands"].as_array().unwrap().len(), COMMANDS.len());
        assert_eq!(reply(&ctx, "stats")["ok"], true);
        assert_eq!(ctx.respond(b"\xc3\x28")["ok"], false);
    }
}
