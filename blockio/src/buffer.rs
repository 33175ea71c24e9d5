//! Heap buffers aligned for `O_DIRECT`.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zeroed heap buffer with a chosen alignment, for `O_DIRECT` transfers
/// (a `Vec<u8>` is only byte aligned).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
    /// The allocation's layout; its size is at least 1 because zero-sized
    /// allocations are not allowed.
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like a Box<[u8]>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` bytes whose start is a multiple of
    /// `align_bytes` (a power of two). Panics if the layout is invalid or on
    /// allocation failure, like `Vec`.
    pub fn new(len_bytes: usize, align_bytes: usize) -> Self {
        let layout = Layout::from_size_align(len_bytes.max(1), align_bytes)
            .expect("AlignedBuf: alignment must be a power of two and the size must fit");
        // SAFETY: the layout has a non-zero size (max(1) above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self {
            ptr,
            len_bytes,
            layout,
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to an owned allocation of layout.size() >=
        // len_bytes initialised (zeroed) bytes that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len_bytes", &self.len_bytes)
            .field("align_bytes", &self.layout.align())
            .finish()
    }
}
