//! What the VMM hands the engine: the region, its memory kind, the unit
//! size and the knobs.

use std::os::fd::RawFd;
use std::str::FromStr;
use std::sync::Arc;

use super::hooks::{EngineHooks, NoHooks};
use crate::index::Gpa;
use guestmem::addr::{Hva, RegionOffset};

/// Size of the unit the engine swaps and restores whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SwapUnit {
    /// 2 MiB chunks, restored as one huge mapping.
    Huge2M,
    /// 4 KiB pages (the baseline to compare against).
    Small4K,
    /// 2 MiB chunks that the granularity policy splits into 4 KiB pages
    /// when they thrash with sparse use and collapses back when dense
    /// (docs/GRANULARITY.md); hugetlb memory cannot split and keeps 2m.
    /// The default.
    #[default]
    Auto,
}

impl SwapUnit {
    /// Bytes per unit.
    pub fn bytes(self) -> u64 {
        match self {
            SwapUnit::Huge2M | SwapUnit::Auto => 2 << 20,
            SwapUnit::Small4K => 4 << 10,
        }
    }
}

impl FromStr for SwapUnit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "2m" | "2mib" | "2097152" => Ok(SwapUnit::Huge2M),
            "4k" | "4kib" | "4096" => Ok(SwapUnit::Small4K),
            "auto" => Ok(SwapUnit::Auto),
            other => Err(format!(
                "unknown swap unit {other:?}: use auto (2 MiB chunks split per chunk when their use is sparse), 2m (2 MiB chunks) or 4k (4 KiB pages)"
            )),
        }
    }
}

impl std::fmt::Display for SwapUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SwapUnit::Huge2M => "2m",
            SwapUnit::Small4K => "4k",
            SwapUnit::Auto => "auto",
        })
    }
}

/// How guest RAM is backed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Private anonymous memory (THP when MADV_HUGEPAGE).
    Anonymous,
    /// A MAP_SHARED mapping of a `MFD_HUGETLB` memfd (2 MiB pages), mapped
    /// from file offset 0 (region offset == file offset). The fd stays
    /// owned by the VMM and must outlive the engine.
    Hugetlb {
        /// The memfd backing the region.
        memfd: RawFd,
    },
}

/// How units are installed and taken away, from memory kind and unit size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InstallMode {
    /// Anonymous memory, 2 MiB units: UFFDIO_MOVE of THP buffers.
    Thp,
    /// Hugetlb memfd, 2 MiB units: UFFDIO_COPY of 2 MiB, hole punching.
    Hugetlb {
        /// The memfd.
        memfd: RawFd,
    },
    /// Anonymous memory, 4 KiB units: UFFDIO_COPY / ZEROPAGE / MOVE of
    /// single pages.
    Small,
}

/// The guest RAM the engine manages: one host mapping.
#[derive(Debug, Clone)]
pub struct ManagedRegion {
    /// Host virtual address of the region (2 MiB aligned for 2 MiB units).
    pub host_base: Hva,
    /// Length (a multiple of the unit).
    pub len_bytes: u64,
    /// Backing kind.
    pub kind: MemoryKind,
    /// `(gpa, offset in region, len)` triples, only to name guest addresses
    /// in errors.
    pub gpa_ranges: Vec<(Gpa, RegionOffset, u64)>,
}

impl ManagedRegion {
    /// Guest-physical address of a region offset (the offset itself, marked
    /// by the caller, when no range covers it).
    pub fn gpa_of(&self, offset: RegionOffset) -> Option<Gpa> {
        self.gpa_ranges
            .iter()
            .find(|&&(_, start, len)| offset >= start && offset < start.offset_by(len))
            .map(|&(gpa, start, _)| gpa.offset_by(offset.get() - start.get()))
    }
}

/// Engine knobs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Unit size.
    pub unit: SwapUnit,
    /// Cap on guest bytes held in memory (resident + staged + in flight);
    /// `None`: no cap (faults are still served, whole units at a time).
    pub mem_limit_bytes: Option<u64>,
    /// `(offset, len)` ranges never evicted (e.g. the VMM's boot area).
    pub pinned_offsets: Vec<(RegionOffset, u64)>,
    /// Fault-service threads (at least 1).
    pub fault_threads: usize,
    /// Track clean units with synchronous write-protection so that
    /// unchanged units are dropped without a write.
    pub track_clean: bool,
    /// Units written to the store per batch (default: 8 for 2 MiB, 256 for
    /// 4 KiB units).
    pub batch_units: Option<usize>,
    /// Parking-area slots (default: 4 batches).
    pub parking_units: Option<usize>,
    /// Pre-filled restore buffers (default: 2 per fault thread + 4); also
    /// the most evicted huge pages kept for reuse as restore buffers, the
    /// two together.
    pub buffer_count: Option<usize>,
    /// Pre-touch THP restore buffers on a background thread (the default).
    /// Off: a restore that finds no evicted page to reuse clears a fresh
    /// one itself, on the fault path.
    pub refill_buffers: bool,
    /// Nice value of the fault-service threads. Below the vCPU threads'
    /// (0), a vCPU waiting for a fault is served before vCPUs that can run
    /// on when there are more vCPUs than cores; raising priority needs
    /// CAP_SYS_NICE, without it the threads keep the default.
    pub fault_thread_nice: i32,
    /// Test knob (`--force-split-every N`): every Nth restore of a huge
    /// chunk splits it into pages, and every Nth page fault on a split chunk
    /// tries to collapse it, so that the split and collapse transitions run
    /// thousands of times in one test. Needs 2 MiB units of anonymous (THP)
    /// memory and a store that keeps pages.
    pub force_split_every: Option<u32>,
    /// Sequential prefetch with the auto unit (see `prefetch`): a fault
    /// that continues a stream offers the next chunk to a prefetch thread.
    /// Off: no prefetch thread (the fixed units never prefetch).
    pub prefetch: bool,
    /// Run first thing on each engine thread (the VMM's seccomp filters).
    pub thread_setup: Option<super::thread_setup::ThreadSetup>,
    /// Test hooks ([`super::hooks`]); the default, [`NoHooks`], forces
    /// nothing.
    pub hooks: Arc<dyn EngineHooks>,
    /// The VM's vCPUs: stall accounting counts time with this many
    /// threads waiting on the engine as the whole guest stalled
    /// ([`super::stall`]).
    pub vcpus: u32,
    /// Working-set sampling ([`super::working_set`]); `None`: off.
    pub working_set: Option<super::working_set::WorkingSetConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            unit: SwapUnit::Auto,
            mem_limit_bytes: None,
            pinned_offsets: Vec::new(),
            fault_threads: 1,
            track_clean: true,
            batch_units: None,
            parking_units: None,
            buffer_count: None,
            refill_buffers: true,
            fault_thread_nice: -10,
            force_split_every: None,
            prefetch: true,
            thread_setup: None,
            hooks: Arc::new(NoHooks),
            vcpus: 1,
            working_set: None,
        }
    }
}

impl EngineConfig {
    /// Batch size after defaults.
    pub fn batch_units_or_default(&self) -> usize {
        self.batch_units
            .unwrap_or(match self.unit {
                SwapUnit::Huge2M | SwapUnit::Auto => 8,
                SwapUnit::Small4K => 256,
            })
            .max(1)
    }

    /// Parking-area slots after defaults (at least one batch): the most
    /// units that can be in memory and in a store slot at once, the
    /// in-flight margin of [`crate::store::required_capacity_bytes`].
    pub fn parking_units_or_default(&self) -> usize {
        let batch_units = self.batch_units_or_default();
        self.parking_units
            .unwrap_or(4 * batch_units)
            .max(batch_units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_unit_round_trips_through_text() {
        for unit in [SwapUnit::Huge2M, SwapUnit::Small4K, SwapUnit::Auto] {
            assert_eq!(unit.to_string().parse::<SwapUnit>().unwrap(), unit);
        }
        assert!("3m".parse::<SwapUnit>().unwrap_err().contains("use auto"));
        assert_eq!(SwapUnit::default(), SwapUnit::Auto);
    }

    #[test]
    fn gpa_of_maps_offsets_through_ranges() {
        let r = ManagedRegion {
            host_base: Hva::new(0),
            len_bytes: 8 << 20,
            kind: MemoryKind::Anonymous,
            gpa_ranges: vec![
                (Gpa::new(0), RegionOffset::ZERO, 2 << 20),
                (Gpa::new(1 << 32), RegionOffset::new(2 << 20), 6 << 20),
            ],
        };
        let gpa_of = |offset| r.gpa_of(RegionOffset::new(offset)).map(Gpa::raw);
        assert_eq!(gpa_of(4096), Some(4096));
        assert_eq!(gpa_of((2 << 20) + 5), Some((1 << 32) + 5));
        assert_eq!(gpa_of(9 << 20), None);
    }
}
