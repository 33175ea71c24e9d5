//! The `ioctl` requests the filters allow, by number, in the groups the
//! kinds of thread are given (`rules.rs`), and the names the trap prints.
//!
//! The numbers are built as the kernel's `_IO`/`_IOR`/`_IOW`/`_IOWR`
//! macros build them (include/uapi/asm-generic/ioctl.h), from the sizes
//! of the structures the requests carry; a test checks them against the
//! values in the kernel headers and in `libc`.

/// An `ioctl` request: its number and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The name in the kernel's headers.
    pub name: &'static str,
    /// The request number (the kernel reads it as an `unsigned int`).
    pub nr: u32,
}

const NONE: u32 = 0;
const WRITE: u32 = 1;
const READ: u32 = 2;

/// `_IOC(dir, type, nr, size)`.
const fn ioc(dir: u32, kind: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (kind << 8) | nr
}

const fn request(name: &'static str, nr: u32) -> Request {
    Request { name, nr }
}

const KVMIO: u32 = 0xae;
const UFFDIO: u32 = 0xaa;

/// `KVM_RUN`: enters the guest.
pub const KVM_RUN: Request = request("KVM_RUN", ioc(NONE, KVMIO, 0x80, 0));
/// `KVM_GET_REGS` (`struct kvm_regs`, 144 bytes).
pub const KVM_GET_REGS: Request = request("KVM_GET_REGS", ioc(READ, KVMIO, 0x81, 144));
/// `KVM_SET_REGS`.
pub const KVM_SET_REGS: Request = request("KVM_SET_REGS", ioc(WRITE, KVMIO, 0x82, 144));
/// `KVM_GET_SREGS` (`struct kvm_sregs`, 312 bytes).
pub const KVM_GET_SREGS: Request = request("KVM_GET_SREGS", ioc(READ, KVMIO, 0x83, 312));
/// `KVM_SET_SREGS`.
pub const KVM_SET_SREGS: Request = request("KVM_SET_SREGS", ioc(WRITE, KVMIO, 0x84, 312));
/// `KVM_SET_USER_MEMORY_REGION` (`struct kvm_userspace_memory_region`,
/// 32 bytes): maps host memory into the guest, or (size 0) deletes a slot.
pub const KVM_SET_USER_MEMORY_REGION: Request =
    request("KVM_SET_USER_MEMORY_REGION", ioc(WRITE, KVMIO, 0x46, 32));

/// `UFFDIO_UNREGISTER` (`struct uffdio_range`, 16 bytes).
pub const UFFDIO_UNREGISTER: Request = request("UFFDIO_UNREGISTER", ioc(READ, UFFDIO, 0x01, 16));
/// `UFFDIO_WAKE` (`struct uffdio_range`).
pub const UFFDIO_WAKE: Request = request("UFFDIO_WAKE", ioc(READ, UFFDIO, 0x02, 16));
/// `UFFDIO_COPY` (`struct uffdio_copy`, 40 bytes).
pub const UFFDIO_COPY: Request = request("UFFDIO_COPY", ioc(READ | WRITE, UFFDIO, 0x03, 40));
/// `UFFDIO_ZEROPAGE` (`struct uffdio_zeropage`, 32 bytes).
pub const UFFDIO_ZEROPAGE: Request =
    request("UFFDIO_ZEROPAGE", ioc(READ | WRITE, UFFDIO, 0x04, 32));
/// `UFFDIO_MOVE` (`struct uffdio_move`, 40 bytes).
pub const UFFDIO_MOVE: Request = request("UFFDIO_MOVE", ioc(READ | WRITE, UFFDIO, 0x05, 40));
/// `UFFDIO_WRITEPROTECT` (`struct uffdio_writeprotect`, 24 bytes).
pub const UFFDIO_WRITEPROTECT: Request =
    request("UFFDIO_WRITEPROTECT", ioc(READ | WRITE, UFFDIO, 0x06, 24));
/// `PAGEMAP_SCAN` on `/proc/self/pagemap` (`struct pm_scan_arg`, 96
/// bytes): whether a range of this process's memory is one huge page.
pub const PAGEMAP_SCAN: Request = request("PAGEMAP_SCAN", ioc(READ | WRITE, b'f' as u32, 16, 96));

/// `FIONBIO`: std's `set_nonblocking` on sockets.
pub const FIONBIO: Request = request("FIONBIO", libc::FIONBIO as u32);

/// `TIOCSTI`: pushes a byte into a terminal's input, as if typed. Never
/// allowed; named for the trap's message.
pub const TIOCSTI: Request = request("TIOCSTI", libc::TIOCSTI as u32);

/// A vCPU's own requests: running it, and the registers read and written
/// around an exception report (payloads' port I/O emulated at CPL 3) and
/// for a failure's message. Everything else of a vCPU (CPUID, MSRs, the
/// LAPIC, the FPU) is set on the main thread before the vCPU threads
/// start.
pub const VCPU: &[Request] = &[
    KVM_RUN,
    KVM_GET_REGS,
    KVM_SET_REGS,
    KVM_GET_SREGS,
    KVM_SET_SREGS,
];

/// What the swap engine issues on whichever thread calls it (faults,
/// evictions, balloon drops, `pageout`): userfaultfd's copy, zero-page,
/// move, wake and write-protect, and `PAGEMAP_SCAN`. Registering is done
/// when the engine starts, before any filter; `UFFDIO_API` never again.
pub const ENGINE: &[Request] = &[
    UFFDIO_WAKE,
    UFFDIO_COPY,
    UFFDIO_ZEROPAGE,
    UFFDIO_MOVE,
    UFFDIO_WRITEPROTECT,
    PAGEMAP_SCAN,
];

/// The engine's shutdown at the end of the run (main thread): guest RAM
/// unregistered from the userfaultfd.
pub const ENGINE_SHUTDOWN: &[Request] = &[UFFDIO_UNREGISTER];

/// The terminal's settings, read and restored: glibc's `tcgetattr` and
/// `tcsetattr` (`TCSANOW`, `TCSADRAIN`, `TCSAFLUSH`), and their termios2
/// forms, which newer glibc releases issue instead.
pub const TERMINAL: &[Request] = &[
    request("TCGETS", libc::TCGETS as u32),
    request("TCSETS", libc::TCSETS as u32),
    request("TCSETSW", libc::TCSETSW as u32),
    request("TCSETSF", libc::TCSETSF as u32),
    request("TCGETS2", libc::TCGETS2 as u32),
    request("TCSETS2", libc::TCSETS2 as u32),
    request("TCSETSW2", libc::TCSETSW2 as u32),
    request("TCSETSF2", libc::TCSETSF2 as u32),
];

/// Sockets switched to and from non-blocking.
pub const NONBLOCKING: &[Request] = &[FIONBIO];

/// Deleting guest RAM's memslots (the teardown thread only).
pub const MEMSLOTS: &[Request] = &[KVM_SET_USER_MEMORY_REGION];

/// Requests no filter allows that the trap names when it meets them.
const NAMED_ONLY: &[Request] = &[
    TIOCSTI,
    request("KVM_CREATE_VCPU", ioc(NONE, KVMIO, 0x41, 0)),
    request("KVM_SET_USER_MEMORY_REGION2", ioc(WRITE, KVMIO, 0x49, 160)),
    request("UFFDIO_REGISTER", ioc(READ | WRITE, UFFDIO, 0x00, 32)),
    request("UFFDIO_API", ioc(READ | WRITE, UFFDIO, 0x3f, 24)),
    request("SIOCSIFFLAGS", libc::SIOCSIFFLAGS as u32),
    request("SIOCSIFADDR", libc::SIOCSIFADDR as u32),
    request("SIOCADDRT", libc::SIOCADDRT as u32),
];

/// Every group, for names.
const ALL: &[&[Request]] = &[
    VCPU,
    ENGINE,
    ENGINE_SHUTDOWN,
    TERMINAL,
    NONBLOCKING,
    MEMSLOTS,
    NAMED_ONLY,
];

/// The name of request `nr`, if it is one of those above. No allocation:
/// the trap handler calls it in signal context.
pub fn name(nr: u32) -> Option<&'static str> {
    let mut g = 0;
    while g < ALL.len() {
        let group = ALL[g];
        let mut i = 0;
        while i < group.len() {
            if group[i].nr == nr {
                return Some(group[i].name);
            }
            i += 1;
        }
        g += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers the kernel's headers give (linux/kvm.h,
    /// linux/userfaultfd.h, linux/fs.h, asm-generic/ioctls.h as compiled
    /// for x86_64), and the sizes they are built from.
    #[test]
    fn request_numbers_are_the_kernels() {
        for (request, want) in [
            (KVM_RUN, 0xae80),
            (KVM_GET_REGS, 0x8090_ae81),
            (KVM_SET_REGS, 0x4090_ae82),
            (KVM_GET_SREGS, 0x8138_ae83),
            (KVM_SET_SREGS, 0x4138_ae84),
            (KVM_SET_USER_MEMORY_REGION, 0x4020_ae46),
            (UFFDIO_UNREGISTER, 0x8010_aa01),
            (UFFDIO_WAKE, 0x8010_aa02),
            (UFFDIO_COPY, 0xc028_aa03),
            (UFFDIO_ZEROPAGE, 0xc020_aa04),
            (UFFDIO_MOVE, 0xc028_aa05),
            (UFFDIO_WRITEPROTECT, 0xc018_aa06),
            (PAGEMAP_SCAN, 0xc060_6610),
            (FIONBIO, 0x5421),
            (TIOCSTI, 0x5412),
            (TERMINAL[0], 0x5401),
            (TERMINAL[1], 0x5402),
        ] {
            assert_eq!(request.nr, want, "{}", request.name);
        }
        assert_eq!(
            std::mem::size_of::<kvm_bindings::kvm_regs>(),
            144,
            "KVM_GET_REGS's size"
        );
        assert_eq!(std::mem::size_of::<kvm_bindings::kvm_sregs>(), 312);
        assert_eq!(
            std::mem::size_of::<kvm_bindings::kvm_userspace_memory_region>(),
            32
        );
    }

    #[test]
    fn every_request_has_one_name() {
        for group in ALL {
            for request in *group {
                assert_eq!(name(request.nr), Some(request.name), "{request:?}");
            }
        }
        assert_eq!(name(0x5412), Some("TIOCSTI"));
        assert_eq!(name(0xdead_beef), None);
    }
}
