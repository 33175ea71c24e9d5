//! Priming the host's free memory before each VM run.
//!
//! On a host that is itself a virtual machine with free page reporting
//! (virtio-balloon `VIRTIO_BALLOON_F_REPORTING`, as this project's CI
//! machines are), memory that stays free for a few seconds is handed back
//! to the outer hypervisor, and the next first touch of it costs that
//! hypervisor's fault on every page. Measured here, a VM writing 768 MiB of
//! fresh memory took 0.35 s right after another run freed its memory and
//! 5.7 s after 6 s of idling: a 15x swing that depends on what ran before,
//! not on the unit being measured (with a fixed order, `auto` always
//! followed the long 4 KiB run and lost its seqwrite ratio to it).
//!
//! So before each run the bench touches as much memory as the VM will use
//! and frees it at once: the VM then starts on memory the outer hypervisor
//! backs, as every run on a bare-metal host does. `--no-prime` measures
//! without it.

use guestmem::addr::RegionOffset;
use guestmem::host::AnonMapping;

/// Memory the VMM maps beside guest RAM (restore buffers, parking slots,
/// metadata), rounded up generously.
const VMM_EXTRA_BYTES: u64 = 256 << 20;

/// Touches and frees `guest_bytes` plus the VMM's own share, in huge pages
/// where the kernel has them. Failing to prime is not an error of the run:
/// the run just starts cold, as it would with `--no-prime`.
pub fn prime(guest_bytes: u64) {
    let len = guest_bytes.saturating_add(VMM_EXTRA_BYTES);
    let Ok(mapping) = AnonMapping::new(len) else {
        return;
    };
    let range = mapping.range();
    // Huge pages, as the VM's THP-backed RAM will take: the order-9 blocks
    // freed below are the ones its first faults get.
    let _ = range.advise_hugepage(RegionOffset::ZERO, len);
    // No userfaultfd is registered on this private mapping.
    range.touch(RegionOffset::ZERO, len);
    drop(mapping);
}
