//! [`GuestRam`]: all guest RAM in one 2 MiB-aligned host mapping.
//!
//! Chunk `i` of guest RAM is at `host_base + i * CHUNK_BYTES`, whichever
//! region it belongs to, so the swap engine can address chunks by index and
//! every memslot keeps guest-physical and host-virtual addresses congruent
//! modulo 2 MiB.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Mutex, PoisonError};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Address, Bytes, GuestAddress, GuestRegionMmap};

use crate::addr::{Hva, RegionOffset};
use crate::host;
use crate::mapping::{to_usize, HostMapping};
use crate::memslot::VmSlots;
use crate::{Backing, GuestMemError, Layout, CHUNK_BYTES};

/// The vm-memory view of guest RAM that device code uses.
///
/// The bitmap type is `()`: dirty tracking is done per 2 MiB chunk by the
/// swap engine (userfaultfd write-protection), so vm-memory's per-page
/// dirty bitmaps would cost memory and time for nothing.
pub type GuestMemoryView = vm_memory::GuestMemoryMmap<()>;

/// All guest RAM: one host mapping, its layout, its KVM memslots and a
/// vm-memory view of it.
///
/// Share it between threads as `Arc<GuestRam>`; it is `Send + Sync`.
///
/// # Lifetime
///
/// Dropping `GuestRam` deletes the KVM memslots it registered (it keeps a
/// duplicate of each VM fd for that) before unmapping, so KVM can never
/// reach freed memory whatever the drop order. Still, stop the vCPUs and
/// drop the VM first: a guest still running after its RAM is gone would
/// see its RAM turn into unbacked MMIO. In a struct, declare the `VmFd` (and
/// vCPU fds) field before the `GuestRam` (or `Arc<GuestRam>`) field: Rust
/// drops fields in declaration order.
#[derive(Debug)]
pub struct GuestRam {
    /// Raw-pointer regions over `mapping`; see [`GuestRam::memory`].
    memory: GuestMemoryView,
    /// Memslots per VM, deleted in `Drop` before the mapping goes.
    vm_slots: Mutex<Vec<VmSlots>>,
    layout: Layout,
    backing: Backing,
    /// Declared last so it is dropped last, after everything that points
    /// into it.
    mapping: HostMapping,
}

impl GuestRam {
    /// Maps guest RAM for `layout` with the given backing.
    ///
    /// Memory is not populated: every chunk is faulted in on first touch
    /// (hugetlb pages are reserved up front, though).
    pub fn new(layout: Layout, backing: Backing) -> Result<GuestRam, GuestMemError> {
        let len_bytes = layout.ram_bytes();
        let mapping = match backing {
            Backing::Thp => HostMapping::anonymous(len_bytes, true)?,
            Backing::Small4k => HostMapping::anonymous(len_bytes, false)?,
            Backing::Hugetlb => HostMapping::hugetlb(len_bytes)?,
        };
        let memory = build_view(&mapping, &layout, backing)?;
        Ok(GuestRam {
            memory,
            vm_slots: Mutex::new(Vec::new()),
            layout,
            backing,
            mapping,
        })
    }

    /// Host address of the start of guest RAM (offset 0 of the mapping),
    /// 2 MiB aligned.
    pub fn host_base(&self) -> *mut u8 {
        self.mapping.base()
    }

    /// [`GuestRam::host_base`] as an address.
    pub fn host_base_addr(&self) -> Hva {
        Hva::new(self.mapping.base() as u64)
    }

    /// Size of the mapping, equal to the guest RAM size.
    pub fn len_bytes(&self) -> u64 {
        self.mapping.len_bytes()
    }

    /// The guest-physical layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The host memory backing.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Host-virtual address of guest-physical `gpa`, or `None` if `gpa` is
    /// not RAM.
    pub fn hva(&self, gpa: GuestAddress) -> Option<Hva> {
        self.layout
            .gpa_to_offset(gpa)
            .map(|offset| self.host_base_addr().offset_by(offset.get()))
    }

    /// The hugetlb memfd behind guest RAM (`Backing::Hugetlb` only). Offset
    /// `o` of the file is offset `o` of the mapping.
    pub fn memfd(&self) -> Option<BorrowedFd<'_>> {
        self.mapping.memfd().map(|fd| fd.as_fd())
    }

    /// Releases the host memory behind `[offset, offset + len_bytes)` of
    /// the mapping (whole 2 MiB chunks only, so no huge mapping is split):
    /// the guest reads zeros there next. Used for memory the guest declared
    /// free when no swap engine manages guest RAM (with one, use its
    /// discard, which also keeps its chunk table true).
    pub fn discard(&self, offset: RegionOffset, len_bytes: u64) -> Result<(), GuestMemError> {
        let offset = offset.get();
        let end = offset
            .checked_add(len_bytes)
            .filter(|end| *end <= self.len_bytes());
        if offset % CHUNK_BYTES != 0 || len_bytes % CHUNK_BYTES != 0 || end.is_none() {
            return Err(GuestMemError::DiscardRange { offset, len_bytes });
        }
        let result = match self.mapping.memfd() {
            // The range is inside the hugetlb memfd that backs this mapping
            // (checked above); punching a hole only releases pages.
            Some(fd) => host::punch_hole(fd.as_raw_fd(), offset, len_bytes),
            // The range lies inside this mapping (checked above);
            // MADV_DONTNEED on private anonymous memory only drops pages,
            // which then read as zero. Nothing in the VMM holds references
            // into guest RAM across this call.
            None => self
                .mapping
                .range()
                .discard(RegionOffset::new(offset), len_bytes),
        };
        result.map_err(|error| GuestMemError::Discard {
            offset,
            len_bytes,
            error,
        })
    }

    /// The vm-memory view of guest RAM, for device code.
    ///
    /// The view's regions point into this `GuestRam`'s mapping without
    /// owning it. Borrowing keeps that sound; a *clone* of the view
    /// (`GuestMemoryMmap` is `Clone`) must not outlive this `GuestRam`.
    /// Devices that need the memory beyond a borrow should hold an
    /// `Arc<GuestRam>` and call `memory()` when they need it.
    ///
    /// The view deliberately carries no file offset for the hugetlb memfd:
    /// I/O on the file would bypass the userfaults through which the swap
    /// engine brings swapped-out chunks back, and read holes as zeros.
    pub fn memory(&self) -> &GuestMemoryView {
        &self.memory
    }

    /// Registers guest RAM with `vm`: one memslot per RAM region, numbered
    /// from 0, without flags (no dirty logging: it would force 4 KiB stage-2
    /// mappings).
    ///
    /// The slots stay until this `GuestRam` is dropped, which deletes them
    /// (see the type's *Lifetime* section). Call once per VM.
    pub fn register_memslots(&self, vm: &VmFd) -> Result<(), GuestMemError> {
        let mut registrations = self.vm_slots.lock().unwrap_or_else(PoisonError::into_inner);
        registrations.push(VmSlots::new(vm)?);
        let slots = registrations.last_mut().expect("just pushed");
        for (index, region) in self.layout.regions().iter().enumerate() {
            let slot = u32::try_from(index).expect("a layout has at most two regions");
            let hva = self
                .host_base_addr()
                .offset_by(region.backing_offset.get())
                .raw();
            let gpa = region.gpa.raw_value();
            debug_assert_eq!(
                gpa % CHUNK_BYTES,
                hva % CHUNK_BYTES,
                "memslot {slot} incongruent"
            );
            if gpa % CHUNK_BYTES != hva % CHUNK_BYTES {
                return Err(GuestMemError::Incongruent { slot, gpa, hva });
            }
            let memslot = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: gpa,
                memory_size: region.len_bytes,
                userspace_addr: hva,
            };
            // SAFETY: [hva, hva + len) lies inside `self.mapping` (the layout
            // places every region inside the RAM size, which is the mapping's
            // length). The mapping is unmapped only in `HostMapping::drop`,
            // which runs after `GuestRam::drop` has deleted this slot through
            // `slots`, and is leaked instead if deletion fails.
            unsafe { slots.add(vm, memslot) }.map_err(|error| GuestMemError::Memslot {
                slot,
                gpa: region.gpa.raw_value(),
                len_bytes: region.len_bytes,
                error,
            })?;
        }
        Ok(())
    }

    /// Copies guest RAM at `gpa` into `buf`.
    ///
    /// Fails, naming the range, unless `[gpa, gpa + buf.len())` is inside
    /// one RAM region.
    pub fn read_bytes(&self, gpa: GuestAddress, buf: &mut [u8]) -> Result<(), GuestMemError> {
        self.check_range(gpa, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.memory
            .read_slice(buf, gpa)
            .map_err(|error| GuestMemError::Access {
                gpa: gpa.raw_value(),
                error,
            })
    }

    /// Copies `data` into guest RAM at `gpa`.
    ///
    /// Fails, naming the range, unless `[gpa, gpa + data.len())` is inside
    /// one RAM region.
    pub fn write_bytes(&self, gpa: GuestAddress, data: &[u8]) -> Result<(), GuestMemError> {
        self.check_range(gpa, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.memory
            .write_slice(data, gpa)
            .map_err(|error| GuestMemError::Access {
                gpa: gpa.raw_value(),
                error,
            })
    }

    fn check_range(&self, gpa: GuestAddress, len: usize) -> Result<(), GuestMemError> {
        let len_bytes = len as u64;
        if self.layout.contains(gpa, len_bytes) {
            return Ok(());
        }
        let ram = self
            .layout
            .regions()
            .iter()
            .map(|region| {
                format!(
                    "[{:#x}, {:#x})",
                    region.gpa.raw_value(),
                    region.end_gpa().raw_value()
                )
            })
            .collect::<Vec<_>>()
            .join(" and ");
        Err(GuestMemError::OutOfRam {
            gpa: gpa.raw_value(),
            len_bytes,
            ram,
        })
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        let registrations = self
            .vm_slots
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for slots in registrations.iter_mut() {
            if let Err(error) = slots.remove_all() {
                // Drop cannot return the error; unmapping now would leave KVM
                // pointing at whatever gets mapped here next, so keeping the
                // memory is the only safe choice.
                log::error!(
                    "cannot delete KVM memslots {:?} of guest RAM ({error}); \
                     keeping {} of guest RAM mapped until the process exits",
                    slots.slots(),
                    crate::format_size(self.mapping.len_bytes()),
                );
                self.mapping.leak();
            }
        }
    }
}

/// Builds the vm-memory view: one region per RAM region, pointing into the
/// mapping without owning it.
fn build_view(
    mapping: &HostMapping,
    layout: &Layout,
    backing: Backing,
) -> Result<GuestMemoryView, GuestMemError> {
    let view_error = |reason: String| GuestMemError::MemoryView { reason };
    let mut regions = Vec::with_capacity(layout.regions().len());
    for region in layout.regions() {
        let len = to_usize(region.len_bytes);
        let start = mapping
            .base()
            .wrapping_add(to_usize(region.backing_offset.get()));
        // SAFETY: [start, start + len) lies inside `mapping` (every region
        // is inside the RAM size, the mapping's length). The view is stored
        // in the `GuestRam` that owns `mapping` and is dropped before it; the
        // documented caveat is that clones of the view must not outlive it.
        let builder = unsafe { MmapRegionBuilder::<()>::new(len).with_raw_mmap_pointer(start) };
        let mmap_region = builder
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(mapping.mmap_flags())
            .with_hugetlbfs(backing == Backing::Hugetlb)
            .build()
            .map_err(|e| view_error(e.to_string()))?;
        let guest_region = GuestRegionMmap::new(mmap_region, region.gpa).ok_or_else(|| {
            view_error(format!(
                "region at {:#x} overflows the address space",
                region.gpa.raw_value()
            ))
        })?;
        regions.push(guest_region);
    }
    GuestMemoryView::from_regions(regions).map_err(|e| view_error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn view_mirrors_the_layout() {
        let ram = GuestRam::new(Layout::new(3 * GIB + 4 * MIB).unwrap(), Backing::Small4k).unwrap();
        assert_eq!(ram.host_base_addr().raw() % CHUNK_BYTES, 0);
        let regions: Vec<_> = ram
            .memory()
            .iter()
            .map(|r| (r.start_addr().0, r.len()))
            .collect();
        assert_eq!(regions, vec![(0, 3 * GIB), (4 * GIB, 4 * MIB)]);
        assert_eq!(
            ram.hva(GuestAddress(4 * GIB)),
            Some(ram.host_base_addr().offset_by(3 * GIB))
        );
        assert_eq!(ram.hva(GuestAddress(3 * GIB)), None);
        assert!(ram.memfd().is_none());
    }

    #[test]
    fn high_region_is_backed_right_after_low_region() {
        let ram = GuestRam::new(Layout::new(3 * GIB + 4 * MIB).unwrap(), Backing::Small4k).unwrap();
        ram.memory()
            .write_obj(0xabcd_u16, GuestAddress(4 * GIB + 2))
            .unwrap();
        // SAFETY: offset 3 GiB + 2 is inside the 3 GiB + 4 MiB mapping, and
        // no one else writes it concurrently.
        let through_host = unsafe {
            ram.host_base()
                .add(to_usize(3 * GIB + 2))
                .cast::<u16>()
                .read_unaligned()
        };
        assert_eq!(through_host, 0xabcd);
    }

    #[test]
    fn byte_copies_check_the_range() {
        let ram = GuestRam::new(Layout::new(4 * MIB).unwrap(), Backing::Small4k).unwrap();
        ram.write_bytes(GuestAddress(2 * MIB), b"hello").unwrap();
        let mut buf = [0u8; 5];
        ram.read_bytes(GuestAddress(2 * MIB), &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        ram.write_bytes(GuestAddress(4 * MIB), &[]).unwrap();

        let err = ram
            .write_bytes(GuestAddress(4 * MIB - 2), b"abc")
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("0x3ffffe..0x400001 (3 bytes)"),
            "{message}"
        );
        assert!(message.contains("[0x0, 0x400000)"), "{message}");
        assert!(ram.read_bytes(GuestAddress(3 * GIB), &mut buf).is_err());
    }

    #[test]
    fn discard_drops_whole_chunks_and_refuses_parts() {
        let ram = GuestRam::new(Layout::new(8 * MIB).unwrap(), Backing::Small4k).unwrap();
        for chunk in 0..4u64 {
            ram.write_bytes(GuestAddress(chunk * 2 * MIB + 100), &[chunk as u8 + 1; 64])
                .unwrap();
        }
        ram.discard(RegionOffset::new(2 * MIB), 4 * MIB).unwrap();
        let mut buf = [0u8; 64];
        for (chunk, want) in [(0u64, 1u8), (1, 0), (2, 0), (3, 4)] {
            ram.read_bytes(GuestAddress(chunk * 2 * MIB + 100), &mut buf)
                .unwrap();
            assert_eq!(buf, [want; 64], "chunk {chunk}");
        }
        for (offset, len) in [
            (MIB, 2 * MIB),
            (0, MIB),
            (6 * MIB, 4 * MIB),
            (u64::MAX - 1, 2),
        ] {
            assert!(
                matches!(
                    ram.discard(RegionOffset::new(offset), len),
                    Err(GuestMemError::DiscardRange { .. })
                ),
                "{offset:#x}+{len:#x}"
            );
        }
        ram.read_bytes(GuestAddress(100), &mut buf).unwrap();
        assert_eq!(buf, [1; 64], "a refused discard dropped nothing");
    }

    #[test]
    fn ram_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<GuestRam>();
    }
}
