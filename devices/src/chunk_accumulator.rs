//! Gathers free 4 KiB guest pages into whole free 2 MiB chunks.
//!
//! The balloon learns about free guest memory page by page (inflated PFNs)
//! or in ranges of any size (free page reports), but the swap engine can
//! only drop whole 2 MiB chunks. The accumulator keeps, for each chunk that
//! is partly known to be free, a bitmap of its free pages, and hands the
//! sink a chunk the moment all 512 of its pages are free.
//!
//! A page stops being free when the guest uses it again. The balloon calls
//! [`ChunkAccumulator::reclaim`] for deflated pages; the VMM calls
//! [`ChunkAccumulator::forget`] when the guest writes a chunk, so that a
//! page reported long ago and reused since never completes a chunk.
//!
//! The sink is called with the accumulator's lock held. A `forget` racing
//! with the completion of a chunk therefore either comes first (the chunk
//! is not whole and is not dropped) or waits until the sink has returned
//! (the chunk was dropped before the write that caused the `forget` could
//! land in it). The price: the sink must not wait for anything that itself
//! calls `forget`, or it deadlocks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use guestmem::{GuestAddress, CHUNK_BYTES, PAGE_BYTES};
use vm_memory::Address;

/// Pages in a chunk.
const PAGES_PER_CHUNK: u64 = CHUNK_BYTES / PAGE_BYTES;
/// 64-bit words in a chunk's page bitmap.
const BITMAP_WORDS: usize = (PAGES_PER_CHUNK / 64) as usize;

/// Where free guest memory goes: the VMM's swap engine.
pub trait FreeMemorySink: Send + Sync {
    /// Guest RAM `[gpa, gpa + len_bytes)` is free: its content may be
    /// dropped, and the guest will not read it before writing it. Called
    /// with whole chunks only: `gpa` and `len_bytes` are multiples of 2 MiB.
    fn free_range(&self, gpa: GuestAddress, len_bytes: u64);
    /// The guest takes `[gpa, gpa + len_bytes)` back (balloon deflate);
    /// 4 KiB granular. Content is whatever the sink left (zero after a drop).
    fn reclaim_range(&self, gpa: GuestAddress, len_bytes: u64);
}

/// The free pages of one chunk that is not wholly free.
#[derive(Clone, Copy, Debug, Default)]
struct ChunkPages {
    bits: [u64; BITMAP_WORDS],
    free_pages: u32,
}

impl ChunkPages {
    /// Marks pages `[first, end)` of the chunk free.
    fn set(&mut self, first: u64, end: u64) {
        for page in first..end {
            let (word, bit) = ((page / 64) as usize, page % 64);
            if self.bits[word] & (1 << bit) == 0 {
                self.bits[word] |= 1 << bit;
                self.free_pages += 1;
            }
        }
    }

    /// Marks pages `[first, end)` of the chunk in use.
    fn clear(&mut self, first: u64, end: u64) {
        for page in first..end {
            let (word, bit) = ((page / 64) as usize, page % 64);
            if self.bits[word] & (1 << bit) != 0 {
                self.bits[word] &= !(1 << bit);
                self.free_pages -= 1;
            }
        }
    }

    fn is_whole(&self) -> bool {
        u64::from(self.free_pages) == PAGES_PER_CHUNK
    }
}

/// Consecutive whole chunks waiting to go to the sink in one call.
#[derive(Default)]
struct Run {
    start_gpa: u64,
    len_bytes: u64,
}

impl Run {
    /// Adds the chunk at `chunk_gpa`; if it does not continue the run, the
    /// run so far goes to the sink first.
    fn push(&mut self, chunk_gpa: u64, sink: &dyn FreeMemorySink) {
        if self.len_bytes > 0 && self.start_gpa + self.len_bytes == chunk_gpa {
            self.len_bytes += CHUNK_BYTES;
            return;
        }
        self.flush(sink);
        self.start_gpa = chunk_gpa;
        self.len_bytes = CHUNK_BYTES;
    }

    fn flush(&mut self, sink: &dyn FreeMemorySink) {
        if self.len_bytes > 0 {
            sink.free_range(GuestAddress(self.start_gpa), self.len_bytes);
            self.len_bytes = 0;
        }
    }
}

/// Free-page bitmaps of partly free chunks; see the module documentation.
///
/// Memory use is 72 bytes and a tree node per partly free chunk; callers
/// pass guest RAM ranges only, so it is bounded by the guest's size.
pub struct ChunkAccumulator {
    sink: Arc<dyn FreeMemorySink>,
    /// Chunk index (gpa / 2 MiB) to its free pages. Wholly free chunks are
    /// not kept: they went to the sink.
    partial: Mutex<BTreeMap<u64, ChunkPages>>,
}

impl std::fmt::Debug for ChunkAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkAccumulator")
            .field("partial_chunks", &self.partial_chunks())
            .finish_non_exhaustive()
    }
}

impl ChunkAccumulator {
    /// An accumulator that knows of no free page and reports to `sink`.
    pub fn new(sink: Arc<dyn FreeMemorySink>) -> Self {
        Self {
            sink,
            partial: Mutex::new(BTreeMap::new()),
        }
    }

    /// The sink whole chunks go to.
    pub fn sink(&self) -> Arc<dyn FreeMemorySink> {
        self.sink.clone()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, ChunkPages>> {
        // The map stays consistent at every step, so a panic elsewhere
        // while it was held leaves nothing to repair.
        self.partial.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guest says `[gpa, gpa + len_bytes)` is free. Only the whole
    /// 4 KiB pages inside the range count. Every chunk that becomes wholly
    /// free goes to the sink before this returns (consecutive ones in one
    /// call), and is forgotten here.
    pub fn mark_free(&self, gpa: GuestAddress, len_bytes: u64) {
        let gpa = gpa.raw_value();
        let end = align_down(gpa.saturating_add(len_bytes), PAGE_BYTES);
        let Some(start) = align_up(gpa, PAGE_BYTES).filter(|&start| start < end) else {
            return;
        };
        let mut partial = self.lock();
        let mut run = Run::default();
        let mut addr = start;
        while addr < end {
            let chunk = addr / CHUNK_BYTES;
            let chunk_gpa = chunk * CHUNK_BYTES;
            let piece_end = end.min(chunk_gpa.saturating_add(CHUNK_BYTES));
            let whole = if addr == chunk_gpa && piece_end - chunk_gpa == CHUNK_BYTES {
                partial.remove(&chunk);
                true
            } else {
                let pages = partial.entry(chunk).or_default();
                pages.set(
                    (addr - chunk_gpa) / PAGE_BYTES,
                    (piece_end - chunk_gpa) / PAGE_BYTES,
                );
                let whole = pages.is_whole();
                if whole {
                    partial.remove(&chunk);
                }
                whole
            };
            if whole {
                run.push(chunk_gpa, self.sink.as_ref());
            } else {
                run.flush(self.sink.as_ref());
            }
            addr = piece_end;
        }
        run.flush(self.sink.as_ref());
    }

    /// The guest uses `[gpa, gpa + len_bytes)` again (e.g. wrote it): every
    /// page the range touches stops counting as free.
    pub fn forget(&self, gpa: GuestAddress, len_bytes: u64) {
        let mut partial = self.lock();
        Self::forget_locked(&mut partial, gpa.raw_value(), len_bytes);
    }

    fn forget_locked(partial: &mut BTreeMap<u64, ChunkPages>, gpa: u64, len_bytes: u64) {
        if len_bytes == 0 {
            return;
        }
        let start = align_down(gpa, PAGE_BYTES);
        // An end past the address space clamps to it: nothing is there.
        let end = gpa.saturating_add(len_bytes);
        let first_chunk = start / CHUNK_BYTES;
        let last_chunk = (end - 1) / CHUNK_BYTES;
        let mut emptied = Vec::new();
        for (&chunk, pages) in partial.range_mut(first_chunk..=last_chunk) {
            let chunk_gpa = chunk * CHUNK_BYTES;
            let lo = start.max(chunk_gpa) - chunk_gpa;
            let hi = end.min(chunk_gpa.saturating_add(CHUNK_BYTES)) - chunk_gpa;
            pages.clear(lo / PAGE_BYTES, hi.div_ceil(PAGE_BYTES));
            if pages.free_pages == 0 {
                emptied.push(chunk);
            }
        }
        for chunk in emptied {
            partial.remove(&chunk);
        }
    }

    /// The guest takes `[gpa, gpa + len_bytes)` back (balloon deflate):
    /// forgets its pages and tells the sink.
    pub fn reclaim(&self, gpa: GuestAddress, len_bytes: u64) {
        let mut partial = self.lock();
        Self::forget_locked(&mut partial, gpa.raw_value(), len_bytes);
        self.sink.reclaim_range(gpa, len_bytes);
    }

    /// Chunks with some but not all pages known free.
    pub fn partial_chunks(&self) -> usize {
        self.lock().len()
    }

    /// Pages known free in the chunk holding `gpa` (0 if none, and 0 for a
    /// chunk that went to the sink).
    pub fn free_pages_in_chunk(&self, gpa: GuestAddress) -> u32 {
        self.lock()
            .get(&(gpa.raw_value() / CHUNK_BYTES))
            .map_or(0, |pages| pages.free_pages)
    }
}

/// `value` rounded up to a multiple of `align` (a power of two), or None
/// if that overflows.
fn align_up(value: u64, align: u64) -> Option<u64> {
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// `value` rounded down to a multiple of `align` (a power of two).
fn align_down(value: u64, align: u64) -> u64 {
    value & !(align - 1)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A sink that records its calls.
    #[derive(Default)]
    pub(crate) struct RecordingSink {
        pub(crate) freed: Mutex<Vec<(u64, u64)>>,
        pub(crate) reclaimed: Mutex<Vec<(u64, u64)>>,
    }

    impl FreeMemorySink for RecordingSink {
        fn free_range(&self, gpa: GuestAddress, len_bytes: u64) {
            let gpa = gpa.raw_value();
            assert_eq!(gpa % CHUNK_BYTES, 0, "free_range start {gpa:#x}");
            assert_eq!(len_bytes % CHUNK_BYTES, 0, "free_range len {len_bytes:#x}");
            self.freed.lock().unwrap().push((gpa, len_bytes));
        }
        fn reclaim_range(&self, gpa: GuestAddress, len_bytes: u64) {
            let gpa = gpa.raw_value();
            self.reclaimed.lock().unwrap().push((gpa, len_bytes));
        }
    }

    fn setup() -> (Arc<RecordingSink>, ChunkAccumulator) {
        let sink = Arc::new(RecordingSink::default());
        let acc = ChunkAccumulator::new(sink.clone());
        (sink, acc)
    }

    #[test]
    fn pages_accumulate_into_a_whole_chunk() {
        let (sink, acc) = setup();
        let chunk = 6 * MIB;
        // Every page of the chunk, in a scrambled order, one at a time.
        for i in 0..PAGES_PER_CHUNK {
            let page = (i * 97) % PAGES_PER_CHUNK;
            assert!(sink.freed.lock().unwrap().is_empty(), "early at page {i}");
            acc.mark_free(GuestAddress(chunk + page * PAGE_BYTES), PAGE_BYTES);
        }
        assert_eq!(*sink.freed.lock().unwrap(), vec![(chunk, CHUNK_BYTES)]);
        assert_eq!(acc.partial_chunks(), 0);
    }

    #[test]
    fn large_ranges_go_out_as_whole_chunks_and_keep_their_edges() {
        let (sink, acc) = setup();
        // From the middle of chunk 1 to the middle of chunk 5: chunks 2-4
        // are whole; the edges wait.
        acc.mark_free(GuestAddress(3 * MIB), 8 * MIB);
        assert_eq!(*sink.freed.lock().unwrap(), vec![(4 * MIB, 6 * MIB)]);
        assert_eq!(acc.partial_chunks(), 2);
        assert_eq!(acc.free_pages_in_chunk(GuestAddress(3 * MIB)), 256);
        assert_eq!(acc.free_pages_in_chunk(GuestAddress(10 * MIB)), 256);
        // Completing chunk 1 sends it alone.
        acc.mark_free(GuestAddress(2 * MIB), MIB);
        assert_eq!(sink.freed.lock().unwrap()[1], (2 * MIB, CHUNK_BYTES));
        assert_eq!(acc.partial_chunks(), 1);
    }

    #[test]
    fn partial_pages_do_not_count() {
        let (sink, acc) = setup();
        acc.mark_free(GuestAddress(100), 4000); // inside page 0, no whole page
        acc.mark_free(GuestAddress(PAGE_BYTES + 1), 2 * PAGE_BYTES); // only page 2 whole
        assert_eq!(acc.free_pages_in_chunk(GuestAddress(0)), 1);
        acc.mark_free(GuestAddress(u64::MAX - 10), 100); // wraps: ignored
        acc.mark_free(GuestAddress(5 * PAGE_BYTES), 0);
        assert!(sink.freed.lock().unwrap().is_empty());
        assert_eq!(acc.partial_chunks(), 1);
    }

    #[test]
    fn forgotten_pages_must_be_reported_again() {
        let (sink, acc) = setup();
        acc.mark_free(GuestAddress(0), CHUNK_BYTES - PAGE_BYTES);
        // The guest writes somewhere in the middle (unaligned, 2 pages).
        acc.forget(GuestAddress(100 * PAGE_BYTES + 10), PAGE_BYTES);
        assert_eq!(acc.free_pages_in_chunk(GuestAddress(0)), 511 - 2);
        acc.mark_free(GuestAddress(CHUNK_BYTES - PAGE_BYTES), PAGE_BYTES);
        assert!(sink.freed.lock().unwrap().is_empty());
        acc.mark_free(GuestAddress(100 * PAGE_BYTES), 2 * PAGE_BYTES);
        assert_eq!(*sink.freed.lock().unwrap(), vec![(0, CHUNK_BYTES)]);
        // Forgetting everything empties the map.
        acc.mark_free(GuestAddress(4 * MIB), PAGE_BYTES);
        acc.forget(GuestAddress(0), u64::MAX);
        assert_eq!(acc.partial_chunks(), 0);
    }

    #[test]
    fn reclaim_forgets_and_tells_the_sink() {
        let (sink, acc) = setup();
        acc.mark_free(GuestAddress(0), 16 * PAGE_BYTES);
        acc.reclaim(GuestAddress(0), 8 * PAGE_BYTES);
        assert_eq!(acc.free_pages_in_chunk(GuestAddress(0)), 8);
        assert_eq!(*sink.reclaimed.lock().unwrap(), vec![(0, 8 * PAGE_BYTES)]);
    }
}
