//! GuestRam with a real KVM VM: memslots, stage-2 statistics and huge pages.

use guestmem::{Backing, GuestMemError, GuestRam, KvmStats, Layout};
use kvm_ioctls::{Kvm, VmFd};

const MIB: u64 = 1 << 20;

/// A fresh VM, or the reason there is none.
fn create_vm() -> Result<VmFd, String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    kvm.create_vm()
        .map_err(|e| format!("KVM_CREATE_VM failed: {e}"))
}

macro_rules! vm_or_skip {
    ($test:literal) => {
        match create_vm() {
            Ok(vm) => vm,
            Err(reason) => {
                test_resources::skip($test, test_resources::Resource::Kvm, reason);
                return;
            }
        }
    };
}

#[test]
fn memslots_and_stage_two_stats() {
    let vm = vm_or_skip!("memslots_and_stage_two_stats");
    let ram = GuestRam::new(Layout::new(64 * MIB).unwrap(), Backing::Thp).unwrap();
    ram.register_memslots(&vm).unwrap();

    let stats = KvmStats::open(&vm).unwrap();
    let pages = stats.read().unwrap();
    println!("stage-2 pages without vCPUs: {pages:?}");
    let all = stats.read_all().unwrap();
    println!("VM stats: {all:?}");
    for name in ["pages_4k", "pages_2m", "pages_1g"] {
        assert!(
            all.iter().any(|(stat, _)| stat == name),
            "{name} missing from {all:?}"
        );
    }

    // Registering the same RAM again is a no-op for KVM, and must not make
    // the drop fail to delete the slots.
    ram.register_memslots(&vm).unwrap();
}

#[test]
fn slots_of_other_ram_are_refused() {
    let vm = vm_or_skip!("slots_of_other_ram_are_refused");
    let first = GuestRam::new(Layout::new(64 * MIB).unwrap(), Backing::Small4k).unwrap();
    first.register_memslots(&vm).unwrap();
    let second = GuestRam::new(Layout::new(64 * MIB).unwrap(), Backing::Small4k).unwrap();
    let err = second.register_memslots(&vm).unwrap_err();
    assert!(
        matches!(err, GuestMemError::Memslot { slot: 0, .. }),
        "{err}"
    );
    println!("{err}");
}

#[test]
fn dropping_ram_deletes_its_memslots() {
    let vm = vm_or_skip!("dropping_ram_deletes_its_memslots");
    let first = GuestRam::new(Layout::new(64 * MIB).unwrap(), Backing::Small4k).unwrap();
    first.register_memslots(&vm).unwrap();
    drop(first);
    // KVM refuses to move an existing slot to another host address, so this
    // only succeeds if dropping `first` deleted slot 0.
    let second = GuestRam::new(Layout::new(64 * MIB).unwrap(), Backing::Small4k).unwrap();
    second.register_memslots(&vm).unwrap();
}

#[test]
fn ram_may_outlive_the_vm() {
    let vm = vm_or_skip!("ram_may_outlive_the_vm");
    let ram = GuestRam::new(Layout::new((3 << 30) + 64 * MIB).unwrap(), Backing::Small4k).unwrap();
    ram.register_memslots(&vm).unwrap();
    drop(vm);
    ram.write_bytes(vm_memory::GuestAddress(4 << 30), b"still mapped")
        .unwrap();
    drop(ram);
}
