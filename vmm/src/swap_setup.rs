//! Starting the swap engine over a VM's guest RAM.

use crate::vcpu::VcpuEvent;
use anyhow::{Context, Result};
use guestmem::{Backing, GuestRam};
use std::os::fd::AsRawFd;
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use swap::engine::{EngineConfig, ManagedRegion, MemoryKind, SwapEngine, SwapUnit};
use swap::store::StoreSpec;

/// The swap options of a run.
#[derive(Clone, Debug)]
pub struct SwapOptions {
    /// Resident guest RAM cap (`--mem-limit`); None: serve faults only.
    pub mem_limit_bytes: Option<u64>,
    /// Where evicted units go (`--swap-store`).
    pub store: StoreSpec,
    /// 2 MiB chunks or the 4 KiB baseline (`--swap-unit`).
    pub unit: SwapUnit,
    /// Threads reading the userfaultfd.
    pub fault_threads: usize,
    /// Their nice value.
    pub fault_thread_nice: i32,
}

/// Registers all guest RAM with a new swap engine. Must run before anything
/// touches guest RAM. The VMM's own chunk (page tables, descriptor tables,
/// stacks) is pinned: the guest walks it on every TLB miss.
pub fn start(
    ram: &GuestRam,
    options: &SwapOptions,
    events: Sender<VcpuEvent>,
) -> Result<SwapEngine> {
    let kind = match ram.backing() {
        Backing::Hugetlb => MemoryKind::Hugetlb {
            memfd: ram
                .memfd()
                .context("hugetlb guest RAM has no memfd")?
                .as_raw_fd(),
        },
        Backing::Thp | Backing::Small4k => MemoryKind::Anonymous,
    };
    let region = ManagedRegion {
        host_base: ram.host_base_addr(),
        len_bytes: ram.len_bytes(),
        kind,
        gpa_ranges: ram
            .layout()
            .regions()
            .iter()
            .map(|r| (r.gpa, r.backing_offset, r.len_bytes))
            .collect(),
    };
    let store = options
        .store
        .open(options.unit.bytes() as usize, ram.len_bytes())
        .with_context(|| format!("cannot open --swap-store {}", options.store))?;
    let config = EngineConfig {
        unit: options.unit,
        mem_limit_bytes: options.mem_limit_bytes,
        pinned_offsets: vec![(0, guestmem::CHUNK_BYTES)],
        fault_threads: options.fault_threads,
        fault_thread_nice: options.fault_thread_nice,
        ..EngineConfig::default()
    };
    // The engine calls this from its own threads; the run loop ends the VM.
    let events = Mutex::new(events);
    let on_fatal = Box::new(move |message: String| {
        let _ = events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(VcpuEvent::SwapFatal { message });
    });
    SwapEngine::start(region, store, config, on_fatal).context("cannot start the swap engine")
}
