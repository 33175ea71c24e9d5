//! Test hooks: the engine asks these at the few places a test needs to
//! force a path (a pinned buffer, small buffers, a split or collapse on
//! demand). The production hooks, [`NoHooks`], answer "no" everywhere, so
//! the fault path has no test knob of its own.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Questions the engine asks on its paths; every answer defaults to the
/// production behaviour.
pub trait EngineHooks: Send + Sync + Debug {
    /// Restore buffers are never huge (advised `MADV_NOHUGEPAGE`, and
    /// evicted huge pages are not recycled as buffers), so every restore
    /// of a 2 MiB chunk on THP memory takes the small-page fallback a host
    /// out of huge pages forces.
    fn small_restore_buffers(&self) -> bool {
        false
    }

    /// Pin each THP restore buffer the way device DMA pins pages
    /// ([`blockio::pin`]) before it is installed, and unpin it only after
    /// this long of `EBUSY` retries, so that every install takes the
    /// pinned-page retry. The engine's threads then call `io_uring_setup`,
    /// which the VMM's seccomp filters forbid: for engine tests only.
    fn pin_restore_buffer_for(&self) -> Option<Duration> {
        None
    }

    /// Split this restore of a huge chunk instead of restoring it whole.
    fn split_this_restore(&self) -> bool {
        false
    }

    /// Try to collapse the split chunk this page fault landed in.
    fn collapse_after_this_page_fault(&self) -> bool {
        false
    }
}

/// The production hooks: nothing is forced.
#[derive(Debug, Default)]
pub struct NoHooks;

impl EngineHooks for NoHooks {}

/// The buffer test knobs as hooks.
#[derive(Debug, Default, Clone)]
pub struct BufferKnobs {
    /// See [`EngineHooks::small_restore_buffers`].
    pub small_restore_buffers: bool,
    /// See [`EngineHooks::pin_restore_buffer_for`], in microseconds.
    pub pin_restore_buffers_us: Option<u64>,
}

impl EngineHooks for BufferKnobs {
    fn small_restore_buffers(&self) -> bool {
        self.small_restore_buffers
    }

    fn pin_restore_buffer_for(&self) -> Option<Duration> {
        self.pin_restore_buffers_us.map(Duration::from_micros)
    }
}

/// `--force-split-every N`: every Nth restore of a huge chunk splits it,
/// and every Nth page fault on a split chunk tries to collapse it, so that
/// the split and collapse transitions run thousands of times in one run.
/// Other questions go to the hooks it wraps.
#[derive(Debug)]
pub(crate) struct ForcedSplits {
    every: u64,
    restores: AtomicU64,
    page_faults: AtomicU64,
    inner: Arc<dyn EngineHooks>,
}

impl ForcedSplits {
    /// Forces every `every`th split and collapse (at least every one).
    pub fn new(every: u32, inner: Arc<dyn EngineHooks>) -> ForcedSplits {
        ForcedSplits {
            every: u64::from(every.max(1)),
            restores: AtomicU64::new(0),
            page_faults: AtomicU64::new(0),
            inner,
        }
    }

    fn every_nth(&self, counter: &AtomicU64) -> bool {
        (counter.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(self.every)
    }
}

impl EngineHooks for ForcedSplits {
    fn small_restore_buffers(&self) -> bool {
        self.inner.small_restore_buffers()
    }

    fn pin_restore_buffer_for(&self) -> Option<Duration> {
        self.inner.pin_restore_buffer_for()
    }

    fn split_this_restore(&self) -> bool {
        self.every_nth(&self.restores)
    }

    fn collapse_after_this_page_fault(&self) -> bool {
        self.every_nth(&self.page_faults)
    }
}
