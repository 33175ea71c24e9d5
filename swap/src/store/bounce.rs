//! The buffers a sealed file store makes its images in: the caller's
//! buffer keeps the plaintext (faults copy from a parking slot while its
//! write is in flight), so each unit is copied into one of these and
//! sealed there in place.
//!
//! Why a mapping of huge pages rather than heap buffers: an `O_DIRECT`
//! write from a 2 MiB heap buffer is 512 scattered 4 KiB pages, which the
//! block layer pins one by one and splits into several requests; from one
//! huge page it is a single contiguous segment. Measured here (seqwrite,
//! 1 vCPU, 256 MiB at 128 MiB, `--swap-encrypt`): heap buffers made the
//! run 2.7x slower than without encryption while the cipher itself took
//! an eighth of the CPU. The mapping is `MADV_DONTDUMP` too: a buffer
//! holds plaintext between the copy and the seal.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use blockio::AlignedBuf;
use guestmem::addr::RegionOffset;
use guestmem::host::AnonMapping;

/// Buffers kept: one eviction batch at 2 MiB units.
pub(crate) const POOL_UNITS: usize = 8;

/// [`POOL_UNITS`] unit-sized buffers in one mapping of huge pages.
#[derive(Debug)]
pub(crate) struct BouncePool {
    mapping: AnonMapping,
    unit_bytes: usize,
    free: Mutex<Vec<usize>>,
}

impl BouncePool {
    /// Maps and populates the buffers; `None` when that fails (the store
    /// then makes heap buffers: slower, not wrong).
    pub(crate) fn new(unit_bytes: usize) -> Option<BouncePool> {
        let len = (POOL_UNITS * unit_bytes) as u64;
        let mapping = AnonMapping::new(len).ok()?;
        let range = *mapping.range();
        range
            .advise_hugepage(RegionOffset::ZERO, range.len())
            .ok()?;
        range.dont_dump(RegionOffset::ZERO, range.len()).ok()?;
        // Populated now, so a seal never waits for the kernel's zeroing.
        range.touch(RegionOffset::ZERO, range.len());
        Some(BouncePool {
            mapping,
            unit_bytes,
            free: Mutex::new((0..POOL_UNITS).collect()),
        })
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A buffer for one image: from the pool, or from the heap when the pool
/// has none left (or `len` is not a unit).
pub(crate) enum Bounce<'a> {
    /// Buffer `index` of the pool, returned on drop.
    Pooled {
        /// The pool.
        pool: &'a BouncePool,
        /// Which buffer.
        index: usize,
    },
    /// A heap buffer.
    Heap(AlignedBuf),
}

impl<'a> Bounce<'a> {
    /// A buffer of `len` bytes aligned to `align` (for `O_DIRECT`).
    pub(crate) fn take(pool: Option<&'a BouncePool>, len: usize, align: usize) -> Bounce<'a> {
        if let Some(pool) = pool.filter(|p| p.unit_bytes == len) {
            if let Some(index) = pool.free().pop() {
                return Bounce::Pooled { pool, index };
            }
        }
        Bounce::Heap(AlignedBuf::new(len, align))
    }
}

impl Deref for Bounce<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bounce::Pooled { pool, index } => {
                // SAFETY: buffer `index` is populated (touched in `new`),
                // lies inside the mapping, which outlives `'a`, and is
                // used by this value alone until it is dropped (the free
                // list hands each index out once).
                unsafe {
                    pool.mapping.range().slice(
                        RegionOffset::new((index * pool.unit_bytes) as u64),
                        pool.unit_bytes as u64,
                    )
                }
            }
            Bounce::Heap(buf) => buf,
        }
    }
}

impl DerefMut for Bounce<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Bounce::Pooled { pool, index } => {
                // SAFETY: as in `deref`; `&mut self` makes this the only
                // access to buffer `index`.
                unsafe {
                    pool.mapping.range().slice_mut(
                        RegionOffset::new((*index * pool.unit_bytes) as u64),
                        pool.unit_bytes as u64,
                    )
                }
            }
            Bounce::Heap(buf) => buf,
        }
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Bounce::Pooled { pool, index } = self {
            pool.free().push(*index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_buffers_are_distinct_and_come_back() {
        let pool = BouncePool::new(2 << 20).expect("a pool");
        let mut taken: Vec<Bounce<'_>> = (0..POOL_UNITS + 1)
            .map(|_| Bounce::take(Some(&pool), 2 << 20, 4096))
            .collect();
        assert!(
            matches!(taken[POOL_UNITS], Bounce::Heap(_)),
            "the pool is empty"
        );
        for (i, b) in taken.iter_mut().enumerate() {
            b.fill(i as u8);
        }
        for (i, b) in taken.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u8),
                "buffer {i} was overwritten"
            );
            assert_eq!(b.as_ptr() as usize % 4096, 0);
        }
        drop(taken);
        assert_eq!(pool.free().len(), POOL_UNITS);
        assert!(matches!(
            Bounce::take(Some(&pool), 4096, 4096),
            Bounce::Heap(_)
        ));
    }
}
