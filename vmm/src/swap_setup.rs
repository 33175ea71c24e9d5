//! Starting the swap engine over a VM's guest RAM.

use crate::event::RunEvent;
use anyhow::{Context, Result};
use guestmem::addr::RegionOffset;
use guestmem::{Backing, GuestRam};
use std::os::fd::AsRawFd;
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use swap::engine::{EngineConfig, ManagedRegion, MemoryKind, SwapEngine, SwapUnit};
use swap::index::Gpa;
use swap::store::file::OldContent;
use swap::store::spec::OpenedStore;
use swap::store::{CapacityNeed, Integrity, StoreSpec};
use vm_memory::Address;

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
    /// The split/collapse test knob (`--force-split-every`).
    pub force_split_every: Option<u32>,
    /// Sequential prefetch of the auto unit (`--prefetch`).
    pub prefetch: bool,
    /// Working-set sampling (`--working-set-sampling`).
    pub working_set: Option<swap::engine::WorkingSetConfig>,
    /// The run's sealing key (`--swap-encrypt`); None: crc32 only.
    pub seal: Option<std::sync::Arc<swap::store::Sealer>>,
    /// `--mem-limit auto`: the controller's target and bounds (the run
    /// starts at its maximum, `mem_limit_bytes`).
    pub auto_limit: Option<swap::engine::sizing::SizingTarget>,
}

/// A started engine, and what its store left for the main thread to do
/// before the guest is loaded.
pub struct StartedSwap {
    /// The engine.
    pub engine: SwapEngine,
    /// An `,overwrite` store file's old content: cut it ([`cut_old_content`])
    /// once every other file of the run is open (a `--disk` naming the same
    /// file must find it as it was) and before the guest is loaded (its
    /// first eviction would otherwise cut it on the evictor thread, whose
    /// seccomp filter forbids `fchmod` and `ftruncate`).
    pub old_content: Option<OldContent>,
}

/// Cuts an `,overwrite` store file's old content away (see
/// [`StartedSwap::old_content`]).
pub fn cut_old_content(old: Option<OldContent>) -> Result<()> {
    match old {
        Some(old) => old.cut().with_context(|| {
            format!(
                "cannot empty the --swap-store file {} (,overwrite)",
                old.path().display()
            )
        }),
        None => Ok(()),
    }
}

/// Registers all guest RAM with a new swap engine. Must run before anything
/// touches guest RAM. The VMM's own chunk (page tables, descriptor tables,
/// stacks) is pinned: the guest walks it on every TLB miss. `vcpus`: the
/// VM's, for the engine's stall accounting.
pub fn start(
    ram: &GuestRam,
    options: &SwapOptions,
    vcpus: u32,
    events: Sender<RunEvent>,
) -> Result<StartedSwap> {
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
            .map(|r| (Gpa::new(r.gpa.raw_value()), r.backing_offset, r.len_bytes))
            .collect(),
    };
    let config = EngineConfig {
        unit: options.unit,
        mem_limit_bytes: options.mem_limit_bytes,
        pinned_offsets: vec![(RegionOffset::ZERO, guestmem::CHUNK_BYTES)],
        fault_threads: options.fault_threads,
        fault_thread_nice: options.fault_thread_nice,
        force_split_every: options.force_split_every,
        prefetch: options.prefetch,
        working_set: options.working_set.clone(),
        thread_setup: crate::seccomp::engine_thread_setup(),
        vcpus,
        ..EngineConfig::default()
    };
    let need = store_need(ram.len_bytes(), options, &config);
    // A size= too small is refused before the store's file is created.
    options
        .store
        .check_size(&need)
        .with_context(|| format!("invalid --swap-store {}", options.store))?;
    let integrity = match &options.seal {
        Some(sealer) => Integrity::Sealed(std::sync::Arc::clone(sealer)),
        None => Integrity::Checksum,
    };
    let OpenedStore { store, old_content } = options
        .store
        .open_for_run(options.unit.bytes() as usize, ram.len_bytes(), &integrity)
        .with_context(|| format!("cannot open --swap-store {}", options.store))?;
    if let Some(warning) = options.store.lifecycle_warning(integrity.is_sealed()) {
        eprintln!("hugevmm: warning: {warning}");
    }
    // A block device can hold less than the size asked for. The test aid
    // `faulty:full-after=N` is left alone: filling up at run time is what
    // it is for.
    if !matches!(options.store, StoreSpec::Faulty { .. }) {
        need.check(
            &store.describe(),
            store.capacity_slots() * store.unit_bytes() as u64,
        )
        .with_context(|| match options.store {
            // size= only lowers an export's capacity: the fix is a larger
            // export.
            StoreSpec::Nbd { .. } => format!(
                "cannot use --swap-store {}: the NBD export is too small for this run; export at least {} bytes (e.g. `nbdkit memory {}`) or raise --mem-limit",
                options.store,
                need.bytes(),
                need.bytes()
            ),
            StoreSpec::VhostUserBlk { .. } => format!(
                "cannot use --swap-store {}: the backend's device is too small for this run; give its export a file of at least {} bytes or raise --mem-limit",
                options.store,
                need.bytes()
            ),
            _ => format!("cannot use --swap-store {}", options.store),
        })?;
    }
    // The engine calls this from its own threads; the run loop ends the VM.
    let events = Mutex::new(events);
    let on_fatal = Box::new(move |error: &swap::engine::SwapError| {
        let message = error.to_string();
        let _ = events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(RunEvent::SwapFatal { message });
    });
    let engine = SwapEngine::start(region, store, config, on_fatal)
        .context("cannot start the swap engine")?;
    Ok(StartedSwap {
        engine,
        old_content,
    })
}

/// What the store of a run with these options can need to hold
/// ([`swap::store::required_capacity_bytes`]).
pub fn store_need(
    guest_ram_bytes: u64,
    options: &SwapOptions,
    config: &EngineConfig,
) -> CapacityNeed {
    CapacityNeed {
        guest_ram_bytes,
        mem_limit_bytes: options.mem_limit_bytes,
        unit_bytes: options.unit.bytes(),
        in_flight_units: config.parking_units_or_default() as u64,
    }
}
