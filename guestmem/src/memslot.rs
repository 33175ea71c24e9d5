//! KVM memslots over guest RAM, removable from `GuestRam`'s drop.
//!
//! KVM keeps using a memslot's host range until the slot is deleted, even
//! after user space unmaps it; a later mapping at the same address would
//! then be exposed to the guest. So the slots are tied to the mapping's
//! lifetime rather than to the VM's: registration keeps a duplicate of the
//! VM fd, and `GuestRam` deletes its slots through it before unmapping. This
//! makes the drop order of `GuestRam` and `VmFd` a matter of taste, not of
//! memory safety.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use kvm_bindings::{kvm_userspace_memory_region, KVMIO};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

use crate::GuestMemError;

// kvm-ioctls only offers this ioctl on `VmFd`, which cannot be rebuilt from
// the duplicated fd, so deletion issues it directly.
ioctl_iow_nr!(
    KVM_SET_USER_MEMORY_REGION,
    KVMIO,
    0x46,
    kvm_userspace_memory_region
);

/// The memslots registered with one VM.
#[derive(Debug)]
pub(crate) struct VmSlots {
    /// A duplicate of the VM fd, which also keeps the VM alive until its
    /// slots are deleted.
    vm: OwnedFd,
    slots: Vec<u32>,
}

impl VmSlots {
    /// Prepares to register slots with `vm`.
    pub fn new(vm: &VmFd) -> Result<VmSlots, GuestMemError> {
        let vm = dup_vm_fd(vm).map_err(|error| GuestMemError::DupVmFd { error })?;
        Ok(VmSlots {
            vm,
            slots: Vec::new(),
        })
    }

    /// Registers one memslot and remembers it for deletion.
    ///
    /// # Safety
    ///
    /// `region.userspace_addr .. + region.memory_size` must be mapped, and
    /// stay mapped until [`VmSlots::remove_all`] has succeeded.
    pub unsafe fn add(
        &mut self,
        vm: &VmFd,
        region: kvm_userspace_memory_region,
    ) -> Result<(), kvm_ioctls::Error> {
        // SAFETY: the caller keeps the host range mapped until the slot is
        // deleted by `remove_all`.
        unsafe { vm.set_user_memory_region(region) }?;
        self.slots.push(region.slot);
        Ok(())
    }

    /// Deletes every slot registered so far; a slot that no longer exists
    /// counts as deleted.
    ///
    /// Deletion is attempted for every slot even if one fails; the first
    /// error is returned and the failed slots stay recorded.
    pub fn remove_all(&mut self) -> io::Result<()> {
        let mut first_error = None;
        let mut kept = Vec::new();
        for &slot in &self.slots {
            // A zero memory_size deletes the slot; KVM ignores the addresses.
            let delete = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: 0,
                memory_size: 0,
                userspace_addr: 0,
            };
            // SAFETY: KVM_SET_USER_MEMORY_REGION reads exactly one
            // `kvm_userspace_memory_region`, which `delete` is, from a live
            // reference; `self.vm` is an open VM fd.
            let ret = unsafe { ioctl_with_ref(&self.vm, KVM_SET_USER_MEMORY_REGION(), &delete) };
            if ret < 0 {
                let error = io::Error::last_os_error();
                // For a deletion KVM checks nothing that could fail with
                // all-zero addresses except the slot's existence, so EINVAL
                // means the slot is already gone (e.g. registered twice with
                // the same VM, which KVM treats as a no-op update).
                if error.raw_os_error() != Some(libc::EINVAL) {
                    first_error.get_or_insert(error);
                    kept.push(slot);
                }
            }
        }
        self.slots = kept;
        first_error.map_or(Ok(()), Err)
    }

    /// The slots currently registered.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }
}

/// Duplicates the VM's fd.
fn dup_vm_fd(vm: &VmFd) -> io::Result<OwnedFd> {
    // SAFETY: `vm` owns this fd and keeps it open while it is borrowed here,
    // and the borrow ends with this function.
    let borrowed = unsafe { BorrowedFd::borrow_raw(vm.as_raw_fd()) };
    borrowed.try_clone_to_owned()
}
