//! How devices reach guest RAM.
//!
//! Devices hold a [`GuestMemoryHandle`] and borrow the vm-memory view from
//! it for each piece of work. The VMM passes its `Arc<GuestRam>`; tests pass
//! an `Arc<GuestMemoryMmap<()>>` of their own. Holding the owner rather than
//! a clone of the view matters: `GuestRam`'s view points into a mapping it
//! does not own, so a clone must not outlive the `GuestRam`.

use std::sync::Arc;

use guestmem::{GuestMemoryView, GuestRam};

/// Something that owns guest RAM and lends its vm-memory view.
pub trait GuestMemorySource: Send + Sync {
    /// The view of all guest RAM; addresses outside it are not RAM.
    fn memory(&self) -> &GuestMemoryView;
}

/// The shared handle devices keep.
pub type GuestMemoryHandle = Arc<dyn GuestMemorySource>;

impl GuestMemorySource for GuestRam {
    fn memory(&self) -> &GuestMemoryView {
        GuestRam::memory(self)
    }
}

impl GuestMemorySource for GuestMemoryView {
    fn memory(&self) -> &GuestMemoryView {
        self
    }
}
