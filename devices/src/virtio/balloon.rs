//! virtio-balloon: the guest gives memory back, and says what is free.
//!
//! - Inflate / deflate queues: arrays of 32-bit page frame numbers (4 KiB
//!   pages) the guest hands over or takes back. Inflated pages go to the
//!   [`ChunkAccumulator`], which passes whole free 2 MiB chunks to the
//!   [`FreeMemorySink`]; deflated ones are forgotten there and reported to
//!   the sink as reclaimed.
//! - Statistics queue (`VIRTIO_BALLOON_F_STATS_VQ`): the driver leaves one
//!   buffer of statistics with the device; the device keeps the latest
//!   report and hands the buffer back ([`Balloon::request_stats`]) when it
//!   wants a fresh one.
//! - Free page reporting queue (`VIRTIO_BALLOON_F_REPORTING`): each
//!   device-writable buffer of a chain is a guest range that is free. The
//!   guest keeps those pages aside until the chain is returned, so whole
//!   chunks covered by one chain go to the sink before that; partial chunks
//!   are not remembered across chains (the guest may reuse those pages
//!   without the host seeing it).
//! - Configuration: `num_pages`, the target the host sets
//!   ([`Balloon::set_target_pages`], with a configuration-change interrupt),
//!   and `actual`, what the driver says it holds.
//!
//! Malformed chains on these queues (wrong direction, PFNs outside RAM,
//! oversized arrays) are returned unused: giving nothing back to the host
//! is always safe for the guest's data.

use std::io;
use std::sync::Arc;

use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{Queue, QueueT};

use guestmem::{GuestAddress, GuestMemoryView, PAGE_BYTES};

use super::balloon_stats::BalloonStats;
use super::chain::{parse_chain, range_in_ram, ParsedChain};
use super::device::{read_config_bytes, VirtioDevice};
use super::error::VirtioError;
use super::interrupt::VirtioInterrupt;
use super::queue_drain::{drain_queue, notify_used, Disposition};
use crate::chunk_accumulator::{ChunkAccumulator, FreeMemorySink};
use crate::memory::GuestMemoryHandle;

/// Statistics virtqueue present.
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// The guest may deflate on its own when it runs out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
/// Free page reporting virtqueue present.
pub const VIRTIO_BALLOON_F_REPORTING: u32 = 5;

/// The balloon counts in 4 KiB pages whatever the guest's page size.
const PFN_SHIFT: u32 = 12;
/// Entries of each queue; page reporting needs room for 32 ranges.
const QUEUE_SIZE: u16 = 128;
/// Descriptors accepted in one chain.
const MAX_CHAIN_DESCRIPTORS: usize = QUEUE_SIZE as usize;
/// Largest PFN array taken in one chain; Linux sends at most 256 PFNs.
const MAX_PFN_ARRAY_BYTES: u64 = 64 << 10;
/// Largest statistics report read; Linux sends 16 entries of 10 bytes.
const MAX_STATS_BYTES: u64 = 4096;
/// Bytes of the configuration space: num_pages, actual.
const CONFIG_BYTES: usize = 8;
/// Offset of `actual`, the only field the driver writes.
const ACTUAL_OFFSET: usize = 4;

/// What each queue is for; the numbering depends on negotiated features,
/// because the driver creates only the queues of features it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Inflate,
    Deflate,
    Stats,
    Reporting,
}

/// The virtio-balloon device.
pub struct Balloon {
    accumulator: Arc<ChunkAccumulator>,
    target_pages: u32,
    actual_pages: u32,
    inflated_pages: u64,
    stats: Option<BalloonStats>,
    stats_reports: u64,
    active: Option<Active>,
}

/// What the device holds between activation and reset.
struct Active {
    memory: GuestMemoryHandle,
    queues: Vec<Queue>,
    roles: Vec<Role>,
    interrupt: Arc<VirtioInterrupt>,
    /// The statistics buffer the driver left with the device.
    stats_head: Option<u16>,
}

impl std::fmt::Debug for Balloon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balloon")
            .field("target_pages", &self.target_pages)
            .field("actual_pages", &self.actual_pages)
            .field("inflated_pages", &self.inflated_pages)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl Balloon {
    /// A balloon with target 0 whose freed memory goes to `sink`.
    pub fn new(sink: Arc<dyn FreeMemorySink>) -> Self {
        Self {
            accumulator: Arc::new(ChunkAccumulator::new(sink)),
            target_pages: 0,
            actual_pages: 0,
            inflated_pages: 0,
            stats: None,
            stats_reports: 0,
            active: None,
        }
    }

    /// The page accumulator, for the VMM to call
    /// [`ChunkAccumulator::forget`] when the guest writes a chunk.
    pub fn accumulator(&self) -> &Arc<ChunkAccumulator> {
        &self.accumulator
    }

    /// Asks the guest to hold `pages` 4 KiB pages in the balloon. Raises a
    /// configuration-change interrupt if the driver is running; otherwise
    /// the driver reads the target when it starts.
    pub fn set_target_pages(&mut self, pages: u32) -> io::Result<()> {
        self.target_pages = pages;
        match &self.active {
            Some(active) => active.interrupt.signal_config_change(),
            None => Ok(()),
        }
    }

    /// The target set by the host.
    pub fn target_pages(&self) -> u32 {
        self.target_pages
    }

    /// Pages the driver says the balloon holds (its `actual` field).
    pub fn actual_pages(&self) -> u32 {
        self.actual_pages
    }

    /// Pages inflated minus pages deflated, as seen on the queues.
    pub fn inflated_pages(&self) -> u64 {
        self.inflated_pages
    }

    /// The latest statistics report, if the guest sent one.
    pub fn latest_stats(&self) -> Option<&BalloonStats> {
        self.stats.as_ref()
    }

    /// Statistics reports received so far.
    pub fn stats_reports(&self) -> u64 {
        self.stats_reports
    }

    /// Hands the statistics buffer back so that the guest sends a fresh
    /// report (it arrives later, on a notification). Returns false when
    /// there is no buffer to hand back (no statistics queue, or the guest
    /// has not refilled it yet).
    pub fn request_stats(&mut self) -> Result<bool, VirtioError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(false);
        };
        let Some(head) = active.stats_head.take() else {
            return Ok(false);
        };
        let Some(index) = active.roles.iter().position(|&r| r == Role::Stats) else {
            return Ok(false);
        };
        let memory = active.memory.clone();
        let mem = memory.memory();
        let queue = &mut active.queues[index];
        queue
            .add_used(mem, head, 0)
            .map_err(|source| VirtioError::Queue { index, source })?;
        notify_used(queue, index, mem, &active.interrupt)?;
        Ok(true)
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        // Room for every queue of every offered feature; the driver sets up
        // those it needs, numbered as in `roles_for`.
        &[QUEUE_SIZE; 4]
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_BALLOON_F_STATS_VQ)
            | (1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM)
            | (1 << VIRTIO_BALLOON_F_REPORTING)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut config = self.config_bytes();
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        let Some(end) = start
            .checked_add(data.len())
            .filter(|&end| end <= CONFIG_BYTES)
        else {
            return;
        };
        config[start..end].copy_from_slice(data);
        let actual = &config[ACTUAL_OFFSET..ACTUAL_OFFSET + 4];
        self.actual_pages = u32::from_le_bytes(actual.try_into().expect("4 bytes"));
    }

    fn activate(
        &mut self,
        acked_features: u64,
        memory: GuestMemoryHandle,
        queues: Vec<Queue>,
        interrupt: Arc<VirtioInterrupt>,
    ) -> Result<(), VirtioError> {
        self.active = Some(Active {
            memory,
            queues,
            roles: roles_for(acked_features),
            interrupt,
            stats_head: None,
        });
        Ok(())
    }

    fn process_queue(&mut self, index: usize) -> Result<(), VirtioError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let (Some(&role), Some(queue)) = (active.roles.get(index), active.queues.get_mut(index))
        else {
            return Ok(());
        };
        let memory = active.memory.clone();
        let mem = memory.memory();
        let accumulator = &self.accumulator;
        let inflated_pages = &mut self.inflated_pages;
        let stats = &mut self.stats;
        let stats_reports = &mut self.stats_reports;
        let stats_head = &mut active.stats_head;
        let mut stale_stats_heads = Vec::new();
        drain_queue(queue, index, mem, &active.interrupt, |chain| {
            let head = chain.head_index();
            let Ok(parsed) = parse_chain(chain, mem, MAX_CHAIN_DESCRIPTORS) else {
                return Ok(Disposition::Used(0));
            };
            match role {
                Role::Inflate => {
                    let pages =
                        for_each_pfn_run(mem, &parsed, |gpa, len| accumulator.mark_free(gpa, len));
                    *inflated_pages += pages;
                }
                Role::Deflate => {
                    let pages =
                        for_each_pfn_run(mem, &parsed, |gpa, len| accumulator.reclaim(gpa, len));
                    *inflated_pages = inflated_pages.saturating_sub(pages);
                }
                Role::Reporting => {
                    // Reported pages go back to the guest's allocator when
                    // the chain is returned, and a later write to them is
                    // invisible here: only pages reported together in one
                    // chain may complete a chunk, so each chain gets its own
                    // accumulator, forgotten afterwards.
                    if parsed.readable.is_empty() {
                        let one_report = ChunkAccumulator::new(accumulator.sink());
                        for range in &parsed.writable {
                            one_report.mark_free(range.gpa, u64::from(range.len_bytes));
                        }
                    }
                }
                Role::Stats => {
                    if let Some(report) = read_stats(mem, &parsed) {
                        *stats = Some(report);
                        *stats_reports += 1;
                    }
                    // Keep the buffer until the host wants the next report;
                    // a driver that sent another meanwhile gets the old one
                    // back.
                    stale_stats_heads.extend(stats_head.replace(head));
                    return Ok(Disposition::Hold);
                }
            }
            Ok(Disposition::Used(0))
        })?;
        for &head in &stale_stats_heads {
            queue
                .add_used(mem, head, 0)
                .map_err(|source| VirtioError::Queue { index, source })?;
        }
        if !stale_stats_heads.is_empty() {
            notify_used(queue, index, mem, &active.interrupt)?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.actual_pages = 0;
        self.inflated_pages = 0;
    }
}

impl Balloon {
    fn config_bytes(&self) -> [u8; CONFIG_BYTES] {
        let mut config = [0u8; CONFIG_BYTES];
        config[..4].copy_from_slice(&self.target_pages.to_le_bytes());
        config[ACTUAL_OFFSET..].copy_from_slice(&self.actual_pages.to_le_bytes());
        config
    }
}

/// Queue index to role for the features the driver accepted.
fn roles_for(acked_features: u64) -> Vec<Role> {
    let mut roles = vec![Role::Inflate, Role::Deflate];
    if acked_features & (1 << VIRTIO_BALLOON_F_STATS_VQ) != 0 {
        roles.push(Role::Stats);
    }
    if acked_features & (1 << VIRTIO_BALLOON_F_REPORTING) != 0 {
        roles.push(Role::Reporting);
    }
    roles
}

/// Reads a PFN array (device-readable only, whole 32-bit entries, at most
/// [`MAX_PFN_ARRAY_BYTES`]) and calls `f` for each run of consecutive
/// pages inside guest RAM. Returns the pages passed to `f`.
fn for_each_pfn_run(
    mem: &GuestMemoryView,
    parsed: &ParsedChain,
    mut f: impl FnMut(GuestAddress, u64),
) -> u64 {
    let len_bytes = parsed.readable_len_bytes();
    if !parsed.writable.is_empty() || len_bytes % 4 != 0 || len_bytes > MAX_PFN_ARRAY_BYTES {
        return 0;
    }
    let mut bytes = vec![0u8; len_bytes as usize];
    if parsed.read_at(mem, 0, &mut bytes).is_err() {
        return 0;
    }
    let pfns = bytes
        .chunks_exact(4)
        .map(|b| u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))));
    let mut pages = 0;
    let mut run: Option<(u64, u64)> = None; // (first pfn, count)
    let mut emit = |(first, count): (u64, u64)| {
        let gpa = GuestAddress(first << PFN_SHIFT);
        let len = count * PAGE_BYTES;
        // A run that leaves RAM is dropped whole: a correct driver never
        // sends one, and partial handling would buy nothing.
        if range_in_ram(mem, gpa, len) {
            f(gpa, len);
            pages += count;
        }
    };
    for pfn in pfns {
        run = match run {
            Some((first, count)) if first + count == pfn => Some((first, count + 1)),
            Some(done) => {
                emit(done);
                Some((pfn, 1))
            }
            None => Some((pfn, 1)),
        };
    }
    if let Some(done) = run {
        emit(done);
    }
    pages
}

/// Reads a statistics report, if the chain is one (device-readable only).
fn read_stats(mem: &GuestMemoryView, parsed: &ParsedChain) -> Option<BalloonStats> {
    if !parsed.writable.is_empty() {
        return None;
    }
    let len_bytes = parsed.readable_len_bytes().min(MAX_STATS_BYTES);
    let mut bytes = vec![0u8; len_bytes as usize];
    parsed.read_at(mem, 0, &mut bytes).ok()?;
    Some(BalloonStats::parse(&bytes))
}

#[cfg(test)]
#[path = "balloon_tests.rs"]
mod tests;
