//! A thin, safe wrapper over userfaultfd(2) and its ioctls.
//!
//! Own wrapper rather than the `userfaultfd` crate: that crate lacks
//! `UFFDIO_MOVE`, drops the kernel's feature mask and needs libclang.
//! Constants and structs are written out here and checked against
//! `include/uapi/linux/userfaultfd.h` (Linux 6.18).
//!
//! Every ioctl error names the ioctl and the range and keeps the errno, so
//! callers can tell "someone else already resolved this" (`EEXIST`) from
//! "retry" (`EAGAIN`), "pinned" (`EBUSY`) and "hole in source" (`ENOENT`).
//! `UFFDIO_COPY`, `UFFDIO_ZEROPAGE` and `UFFDIO_MOVE` may stop part way; the
//! error then also carries the bytes done ([`UffdError::done_bytes`]).

use guestmem::addr::Hva;
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Feature bits returned by `UFFDIO_API` (`uffdio_api.features`).
pub mod feature {
    /// Write-protect faults are reported with `UFFD_PAGEFAULT_FLAG_WP`.
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// Fork events.
    pub const EVENT_FORK: u64 = 1 << 1;
    /// mremap events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// madvise(DONTNEED/REMOVE) events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// MISSING mode works on hugetlbfs.
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    /// MISSING mode works on shmem.
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// munmap events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Deliver SIGBUS instead of fault events.
    pub const SIGBUS: u64 = 1 << 7;
    /// Fault messages carry the faulting thread id.
    pub const THREAD_ID: u64 = 1 << 8;
    /// MINOR mode on hugetlbfs.
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// MINOR mode on shmem.
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// Fault addresses are not rounded down to the page.
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    /// WP mode works on hugetlbfs and shmem.
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// WP markers on unpopulated ptes.
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFDIO_POISON`.
    pub const POISON: u64 = 1 << 14;
    /// Asynchronous write-protect (splits THPs; the engine never enables it).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// `UFFDIO_MOVE`.
    pub const MOVE: u64 = 1 << 16;
}

/// Registration modes for [`Uffd::register`].
pub mod mode {
    /// Report faults on missing pages.
    pub const MISSING: u64 = 1 << 0;
    /// Report writes to write-protected pages.
    pub const WP: u64 = 1 << 1;
    /// Report faults on pages present in the page cache but not mapped.
    pub const MINOR: u64 = 1 << 2;
}

/// Bit numbers of the ioctls in the masks returned by `UFFDIO_API` and
/// `UFFDIO_REGISTER` (test with `mask & (1 << ioctl_bit::MOVE)`).
pub mod ioctl_bit {
    /// `UFFDIO_REGISTER`.
    pub const REGISTER: u32 = 0x00;
    /// `UFFDIO_UNREGISTER`.
    pub const UNREGISTER: u32 = 0x01;
    /// `UFFDIO_WAKE`.
    pub const WAKE: u32 = 0x02;
    /// `UFFDIO_COPY`.
    pub const COPY: u32 = 0x03;
    /// `UFFDIO_ZEROPAGE`.
    pub const ZEROPAGE: u32 = 0x04;
    /// `UFFDIO_MOVE`.
    pub const MOVE: u32 = 0x05;
    /// `UFFDIO_WRITEPROTECT`.
    pub const WRITEPROTECT: u32 = 0x06;
    /// `UFFDIO_CONTINUE`.
    pub const CONTINUE: u32 = 0x07;
    /// `UFFDIO_API`.
    pub const API: u32 = 0x3f;
}

const UFFD_API: u64 = 0xaa;
const UFFDIO: u32 = 0xaa;
const USERFAULTFD_IOC_NEW_NR: u32 = 0x00;

const COPY_MODE_DONTWAKE: u64 = 1 << 0;
const COPY_MODE_WP: u64 = 1 << 1;
const ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
const MOVE_MODE_DONTWAKE: u64 = 1 << 0;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
const CONTINUE_MODE_DONTWAKE: u64 = 1 << 0;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;
const PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

/// Size of `struct uffd_msg` (packed).
const MSG_BYTES: usize = 32;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

// The generated functions are module-private so they stay out of the
// documented API.
mod nr {
    use super::*;
    vmm_sys_util::ioctl_iowr_nr!(uffdio_api, UFFDIO, ioctl_bit::API, UffdioApi);
    vmm_sys_util::ioctl_iowr_nr!(uffdio_register, UFFDIO, ioctl_bit::REGISTER, UffdioRegister);
    vmm_sys_util::ioctl_ior_nr!(
        uffdio_unregister,
        UFFDIO,
        ioctl_bit::UNREGISTER,
        UffdioRange
    );
    vmm_sys_util::ioctl_ior_nr!(uffdio_wake, UFFDIO, ioctl_bit::WAKE, UffdioRange);
    vmm_sys_util::ioctl_iowr_nr!(uffdio_copy, UFFDIO, ioctl_bit::COPY, UffdioCopy);
    vmm_sys_util::ioctl_iowr_nr!(uffdio_zeropage, UFFDIO, ioctl_bit::ZEROPAGE, UffdioZeropage);
    vmm_sys_util::ioctl_iowr_nr!(uffdio_move, UFFDIO, ioctl_bit::MOVE, UffdioMove);
    vmm_sys_util::ioctl_iowr_nr!(
        uffdio_writeprotect,
        UFFDIO,
        ioctl_bit::WRITEPROTECT,
        UffdioWriteprotect
    );
    vmm_sys_util::ioctl_iowr_nr!(uffdio_continue, UFFDIO, ioctl_bit::CONTINUE, UffdioContinue);
    vmm_sys_util::ioctl_io_nr!(userfaultfd_ioc_new, UFFDIO, USERFAULTFD_IOC_NEW_NR);
}

/// A userfaultfd operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// Neither userfaultfd(2) nor /dev/userfaultfd gave a descriptor.
    #[error("cannot create a userfaultfd (syscall: {syscall}; /dev/userfaultfd: {dev}); run as root, set /proc/sys/vm/unprivileged_userfaultfd=1 or give access to /dev/userfaultfd")]
    Create {
        /// Why the syscall failed.
        syscall: std::io::Error,
        /// Why opening the device failed.
        dev: std::io::Error,
    },
    /// The `UFFDIO_API` handshake failed or a required feature is missing.
    #[error("UFFDIO_API handshake failed (asked features {requested:#x}): {source}; this kernel's userfaultfd lacks a feature the engine needs (Linux >= 6.8 has UFFDIO_MOVE)")]
    Api {
        /// Features asked for.
        requested: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A range ioctl failed. `done_bytes` is the partial progress reported
    /// by COPY, ZEROPAGE and MOVE (0 for the others).
    #[error("{op} {range}: {source}")]
    Ioctl {
        /// Ioctl name, e.g. `UFFDIO_MOVE`.
        op: &'static str,
        /// The range, e.g. `dst=0x.. src=0x.. len=0x..`.
        range: String,
        /// Bytes completed before the error.
        done_bytes: u64,
        /// The OS error (errno preserved).
        #[source]
        source: std::io::Error,
    },
    /// Reading fault messages failed.
    #[error("reading userfaultfd messages failed: {0}")]
    Read(#[source] std::io::Error),
}

impl UffdError {
    /// The errno of a failed operation, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            UffdError::Ioctl { source, .. }
            | UffdError::Api { source, .. }
            | UffdError::Read(source) => source.raw_os_error(),
            UffdError::Create { syscall, .. } => syscall.raw_os_error(),
        }
    }

    /// Bytes completed before a COPY/ZEROPAGE/MOVE failed.
    pub fn done_bytes(&self) -> u64 {
        match self {
            UffdError::Ioctl { done_bytes, .. } => *done_bytes,
            _ => 0,
        }
    }

    /// The same error with `done_bytes` replaced (progress summed over the
    /// calls of a whole-range operation).
    fn with_done_bytes(self, total: u64) -> UffdError {
        match self {
            UffdError::Ioctl {
                op, range, source, ..
            } => UffdError::Ioctl {
                op,
                range,
                done_bytes: total,
                source,
            },
            other => other,
        }
    }

    /// True when the destination was already populated (another path
    /// resolved the fault).
    pub fn is_eexist(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}

/// Options for [`Uffd::copy`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyOptions {
    /// Map the copied pages write-protected (atomically with the copy).
    pub write_protect: bool,
    /// Do not wake the threads waiting on the range.
    pub dont_wake: bool,
}

/// Options for [`Uffd::move_pages`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MoveOptions {
    /// Skip holes in the source instead of failing with `ENOENT`.
    pub allow_src_holes: bool,
    /// Do not wake the threads waiting on the destination.
    pub dont_wake: bool,
}

/// Why a page fault was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The page is missing (MISSING mode).
    Missing,
    /// A write hit a write-protected page (WP mode).
    WriteProtect,
    /// The page is in the page cache but not mapped (MINOR mode).
    Minor,
}

/// One message read from the userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdEvent {
    /// A thread faulted and sleeps until the range is resolved and woken.
    PageFault {
        /// Faulting address (page aligned unless EXACT_ADDRESS was asked).
        address: u64,
        /// Why.
        kind: FaultKind,
        /// The access was a write.
        write: bool,
        /// Faulting thread id (0 unless THREAD_ID was asked).
        thread_id: u32,
    },
    /// The process forked (only with EVENT_FORK); `uffd` is the child's.
    Fork {
        /// New userfaultfd of the child.
        uffd: u32,
    },
    /// A registered range was mremap()ed.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length.
        len: u64,
    },
    /// A registered range was madvise(DONTNEED/REMOVE)d.
    Remove {
        /// Start.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// A registered range was unmapped.
    Unmap {
        /// Start.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// An event this wrapper does not know; ignored by callers.
    Unknown {
        /// Raw event code.
        event: u8,
    },
}

impl UffdEvent {
    fn parse(raw: &[u8; MSG_BYTES]) -> UffdEvent {
        let u64_at =
            |off: usize| u64::from_ne_bytes(raw[off..off + 8].try_into().unwrap_or([0; 8]));
        let u32_at =
            |off: usize| u32::from_ne_bytes(raw[off..off + 4].try_into().unwrap_or([0; 4]));
        // The union starts at byte 8, after event/reserved fields.
        match raw[0] {
            EVENT_PAGEFAULT => {
                let flags = u64_at(8);
                let kind = if flags & PAGEFAULT_FLAG_WP != 0 {
                    FaultKind::WriteProtect
                } else if flags & PAGEFAULT_FLAG_MINOR != 0 {
                    FaultKind::Minor
                } else {
                    FaultKind::Missing
                };
                UffdEvent::PageFault {
                    address: u64_at(16),
                    kind,
                    write: flags & PAGEFAULT_FLAG_WRITE != 0,
                    thread_id: u32_at(24),
                }
            }
            EVENT_FORK => UffdEvent::Fork { uffd: u32_at(8) },
            EVENT_REMAP => UffdEvent::Remap {
                from: u64_at(8),
                to: u64_at(16),
                len: u64_at(24),
            },
            EVENT_REMOVE => UffdEvent::Remove {
                start: u64_at(8),
                end: u64_at(16),
            },
            EVENT_UNMAP => UffdEvent::Unmap {
                start: u64_at(8),
                end: u64_at(16),
            },
            event => UffdEvent::Unknown { event },
        }
    }
}

/// An open, API-negotiated userfaultfd. Non-blocking and close-on-exec.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
    api_ioctls: u64,
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// How long `EAGAIN` is retried without a byte of progress before it is
/// returned as an error. The kernel answers `EAGAIN` while the address
/// space is changing under the userfaultfd (`mmap_changing`), which ends
/// within microseconds; one that lasts this long will not end, and a
/// fault thread spinning on it would hold its unit in flight for ever.
const EAGAIN_WITHOUT_PROGRESS: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `op(done)` until the range of `len` bytes is done: `op` reports
/// partial progress in its error (`done_bytes`), `EAGAIN` is retried
/// (until [`EAGAIN_WITHOUT_PROGRESS`] passes with none), and any other
/// error is returned with the progress added up over all calls.
fn whole_range(len: u64, op: impl FnMut(u64) -> Result<(), UffdError>) -> Result<(), UffdError> {
    whole_range_within(len, EAGAIN_WITHOUT_PROGRESS, op)
}

/// [`whole_range`] with the `EAGAIN` bound as a parameter (for tests).
fn whole_range_within(
    len: u64,
    eagain_without_progress: std::time::Duration,
    mut op: impl FnMut(u64) -> Result<(), UffdError>,
) -> Result<(), UffdError> {
    let mut done = 0;
    let mut last_progress = std::time::Instant::now();
    loop {
        match op(done) {
            Ok(()) => return Ok(()),
            Err(e) if e.errno() == Some(libc::EAGAIN) && done + e.done_bytes() < len => {
                if e.done_bytes() > 0 {
                    last_progress = std::time::Instant::now();
                } else if last_progress.elapsed() > eagain_without_progress {
                    let total = done + e.done_bytes();
                    return Err(e.with_done_bytes(total));
                }
                done += e.done_bytes();
                std::thread::yield_now();
            }
            Err(e) if e.errno() == Some(libc::EAGAIN) => return Ok(()),
            Err(e) => {
                let total = done + e.done_bytes();
                return Err(e.with_done_bytes(total));
            }
        }
    }
}

fn os_err(ret: libc::c_int) -> Result<(), std::io::Error> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a userfaultfd and performs the `UFFDIO_API` handshake asking
    /// for `features` (0 is fine: the kernel reports what it supports in
    /// [`Uffd::features`]). Kernel-mode faults are delivered too (no
    /// `UFFD_USER_MODE_ONLY`): KVM and device I/O fault from the kernel.
    pub fn open(features: u64) -> Result<Uffd, UffdError> {
        let fd = Self::create_fd()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: `fd` is a valid userfaultfd and `api` is a live, correctly
        // laid out `struct uffdio_api` the kernel reads and writes.
        let ret =
            unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(&fd, nr::uffdio_api(), &mut api) };
        os_err(ret).map_err(|source| UffdError::Api {
            requested: features,
            source,
        })?;
        Ok(Uffd {
            fd,
            features: api.features,
            api_ioctls: api.ioctls,
        })
    }

    fn create_fd() -> Result<OwnedFd, UffdError> {
        // SAFETY: plain syscall with integer flags; it returns a new fd or -1.
        let ret =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if ret >= 0 {
            // SAFETY: the syscall returned a fresh descriptor that we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
        }
        let syscall = std::io::Error::last_os_error();
        // The syscall is refused for unprivileged users when
        // vm.unprivileged_userfaultfd=0; the device is the sanctioned way.
        let dev = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/userfaultfd")
        {
            Ok(dev) => dev,
            Err(dev) => return Err(UffdError::Create { syscall, dev }),
        };
        // SAFETY: `dev` is the open /dev/userfaultfd; the ioctl takes the
        // new fd's flags as its integer argument and returns the new fd.
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_val(
                &dev,
                nr::userfaultfd_ioc_new(),
                (libc::O_CLOEXEC | libc::O_NONBLOCK) as libc::c_ulong,
            )
        };
        if ret < 0 {
            return Err(UffdError::Create {
                syscall,
                dev: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the ioctl returned a fresh descriptor that we own.
        Ok(unsafe { OwnedFd::from_raw_fd(ret) })
    }

    /// The feature mask the kernel reported in the handshake.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The ioctl mask the kernel reported in the handshake.
    pub fn api_ioctls(&self) -> u64 {
        self.api_ioctls
    }

    /// True if the kernel supports `UFFDIO_MOVE`.
    pub fn has_move(&self) -> bool {
        self.features & feature::MOVE != 0
    }

    /// Registers `[start, start+len)` with `modes` (see [`mode`]); returns
    /// the mask of range ioctls available on it (see [`ioctl_bit`]).
    ///
    /// # Safety
    ///
    /// From here on every access to a missing page of the range blocks
    /// until this userfaultfd resolves it, and reads zeros once it is
    /// closed. The caller must own the range (no Rust reference into it may
    /// assume its pages stay populated: they are moved away and back
    /// behind the compiler's back), serve its faults for as long as anything
    /// may touch it, and never touch a missing page of it from the thread
    /// that serves them.
    pub unsafe fn register(&self, start: Hva, len: u64, modes: u64) -> Result<u64, UffdError> {
        let start = start.raw();
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: modes,
            ioctls: 0,
        };
        // SAFETY: valid fd; `reg` is a live `struct uffdio_register`. The
        // kernel validates the range against the caller's own mappings.
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(self, nr::uffdio_register(), &mut reg)
        };
        os_err(ret).map_err(|source| {
            ioctl_err(
                "UFFDIO_REGISTER",
                range_text(start, len) + &format!(" mode={modes:#x}"),
                0,
                source,
            )
        })?;
        Ok(reg.ioctls)
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: Hva, len: u64) -> Result<(), UffdError> {
        let start = start.raw();
        let range = UffdioRange { start, len };
        // SAFETY: valid fd; `range` is a live `struct uffdio_range` the
        // kernel only reads.
        let ret =
            unsafe { vmm_sys_util::ioctl::ioctl_with_ref(self, nr::uffdio_unregister(), &range) };
        os_err(ret)
            .map_err(|source| ioctl_err("UFFDIO_UNREGISTER", range_text(start, len), 0, source))
    }

    fn writeprotect_ioctl(
        &self,
        start: u64,
        len: u64,
        mode: u64,
        op: &'static str,
    ) -> Result<(), UffdError> {
        let arg = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode,
        };
        // SAFETY: valid fd; `arg` is a live `struct uffdio_writeprotect` the
        // kernel only reads (the ioctl is _IOWR but writes nothing back).
        let ret =
            unsafe { vmm_sys_util::ioctl::ioctl_with_ref(self, nr::uffdio_writeprotect(), &arg) };
        os_err(ret).map_err(|source| ioctl_err(op, range_text(start, len), 0, source))
    }

    /// Maps pages already in the page cache over a MINOR-registered range.
    pub fn continue_range(&self, start: Hva, len: u64, dont_wake: bool) -> Result<(), UffdError> {
        let start = start.raw();
        let mode = if dont_wake { CONTINUE_MODE_DONTWAKE } else { 0 };
        let mut arg = UffdioContinue {
            range: UffdioRange { start, len },
            mode,
            mapped: 0,
        };
        // SAFETY: valid fd; `arg` is a live `struct uffdio_continue`.
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(self, nr::uffdio_continue(), &mut arg)
        };
        os_err(ret).map_err(|source| {
            ioctl_err(
                "UFFDIO_CONTINUE",
                range_text(start, len),
                arg.mapped.max(0) as u64,
                source,
            )
        })
    }

    /// Waits up to `timeout_ms` (-1: forever) for messages to read.
    /// Returns false on timeout. `EINTR` counts as a timeout.
    pub fn poll_readable(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut pfd = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(UffdError::Read(err));
        }
        Ok(ret > 0)
    }

    /// Reads up to `out.capacity()` pending messages without blocking and
    /// appends them to `out`; returns how many were read (0 when none is
    /// pending). Several threads may read concurrently: each message goes
    /// to exactly one reader.
    pub fn read_events(
        &self,
        out: &mut Vec<UffdEvent>,
        max_events: usize,
    ) -> Result<usize, UffdError> {
        let max_events = max_events.clamp(1, 64);
        let mut raw = [[0u8; MSG_BYTES]; 64];
        // SAFETY: reads at most `max_events * MSG_BYTES` bytes into `raw`,
        // which is that large; the fd is non-blocking.
        let ret = unsafe {
            libc::read(
                self.as_raw_fd(),
                raw.as_mut_ptr().cast(),
                max_events * MSG_BYTES,
            )
        };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(UffdError::Read(err)),
            };
        }
        let count = ret as usize / MSG_BYTES;
        out.extend(raw[..count].iter().map(UffdEvent::parse));
        Ok(count)
    }
}

/// What the engine asks of the kernel to resolve faults and move memory in
/// registered ranges: the userfaultfd's range ioctls. [`Uffd`] is the
/// kernel's; the model checker (`engine::model`, `--features
/// model-check`) puts a model of the same calls behind it, so the
/// engine's own fault, eviction and discard steps run against both.
pub trait Userfaults: Send + Sync {
    /// Wakes threads waiting on faults in a range.
    fn wake(&self, start: Hva, len: u64) -> Result<(), UffdError>;

    /// Copies `len` bytes from `src` (any readable memory of this process)
    /// into the missing pages at `dst`. On failure the error reports the
    /// bytes already copied.
    fn copy(&self, dst: Hva, src: Hva, len: u64, options: CopyOptions) -> Result<(), UffdError>;

    /// Maps the zero page over the missing pages of a range.
    fn zeropage(&self, start: Hva, len: u64, dont_wake: bool) -> Result<(), UffdError>;

    /// Moves the pages of `[src, src+len)` to the empty `[dst, dst+len)`
    /// without copying (a 2 MiB aligned THP moves as one PMD). `dst` must be
    /// registered with this userfaultfd. On failure the error reports the
    /// bytes already moved.
    ///
    /// # Safety
    ///
    /// The pages leave `src` (it reads as missing after) and appear at
    /// `dst`: the caller must own both ranges and hold no Rust reference
    /// into either across the call (the memory is reached through raw
    /// pointers only), and must be the owner of the units they hold in the
    /// engine's state table, so that no other thread expects them in place.
    unsafe fn move_pages(
        &self,
        dst: Hva,
        src: Hva,
        len: u64,
        options: MoveOptions,
    ) -> Result<(), UffdError>;

    /// [`Userfaults::move_pages`] of a whole range: continues after partial
    /// progress and `EAGAIN` (the kernel's word for "the mappings changed
    /// under me, try again"); any other error is returned with the bytes
    /// moved so far, counted from `dst`.
    ///
    /// # Safety
    ///
    /// As for [`Userfaults::move_pages`].
    unsafe fn move_all(
        &self,
        dst: Hva,
        src: Hva,
        len: u64,
        options: MoveOptions,
    ) -> Result<(), UffdError> {
        whole_range(len, |done| {
            // SAFETY: the caller's contract covers the whole range, so
            // every part of it.
            unsafe {
                self.move_pages(
                    dst.offset_by(done),
                    src.offset_by(done),
                    len - done,
                    options,
                )
            }
        })
    }

    /// [`Userfaults::copy`] of a whole range, continuing as [`Userfaults::move_all`]
    /// does.
    fn copy_all(
        &self,
        dst: Hva,
        src: Hva,
        len: u64,
        options: CopyOptions,
    ) -> Result<(), UffdError> {
        whole_range(len, |done| {
            self.copy(
                dst.offset_by(done),
                src.offset_by(done),
                len - done,
                options,
            )
        })
    }

    /// Makes the kernel give the 2 MiB chunk at `chunk` (aligned, with no
    /// page table under its PMD) an empty page table, mapping nothing
    /// there; a chunk that has one, or is mapped huge, is left as it is
    /// (what is mapped stays as it was).
    ///
    /// Why: a write fault on a chunk with no page table in a THP-enabled
    /// area makes the kernel allocate and zero a whole 2 MiB huge page
    /// *before* it sees the userfaultfd, then free it and hand the fault
    /// over (`__do_huge_pmd_anonymous_page`). On this host that is most
    /// of a 2 MiB fault's time on the faulting vCPU (measured: a write
    /// fault's round trip 477 µs over no page table against 15 µs over an
    /// empty one). Over an empty page table the fault takes the 4 KiB path,
    /// which checks the userfaultfd after zeroing 4 KiB. A huge page can
    /// then only be moved in once the table is gone again, which
    /// `MADV_DONTNEED` of the whole chunk does (`CONFIG_PT_RECLAIM`).
    fn prepare_page_table(&self, chunk: Hva) -> Result<(), UffdError>;

    /// Write-protects a range (needs WP registration). Never wakes.
    fn write_protect(&self, start: Hva, len: u64) -> Result<(), UffdError>;

    /// Removes write protection from a range and, unless `dont_wake`, wakes
    /// the threads blocked on write-protect faults there.
    fn write_unprotect(&self, start: Hva, len: u64, dont_wake: bool) -> Result<(), UffdError>;
}

/// A page of this process that no access can read: the source of the
/// copy that [`Uffd::prepare_page_table`] makes fail.
fn unreadable_page() -> Result<u64, std::io::Error> {
    static PAGE: std::sync::OnceLock<Result<u64, i32>> = std::sync::OnceLock::new();
    let page = PAGE.get_or_init(|| {
        // SAFETY: a fresh anonymous PROT_NONE mapping at an address the
        // kernel picks; nothing else refers to it, and it is never
        // unmapped, so the address stays unreadable for the process's life.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            Ok(addr as u64)
        }
    });
    page.map_err(std::io::Error::from_raw_os_error)
}

impl Userfaults for Uffd {
    fn prepare_page_table(&self, chunk: Hva) -> Result<(), UffdError> {
        let src = unreadable_page()
            .map_err(|source| ioctl_err("mmap", "an unreadable page".to_string(), 0, source))?;
        // UFFDIO_COPY allocates the page table under `chunk` before it reads
        // the source (mfill_atomic: `__pte_alloc`, then the copy), and the
        // read of an unreadable page fails with EFAULT before anything is
        // mapped (also over a mapped page: the copy comes before the check
        // for one). EEXIST: the chunk is mapped huge. Either way nothing
        // reaches the guest.
        let options = CopyOptions {
            write_protect: false,
            dont_wake: true,
        };
        match self.copy(chunk, Hva::new(src), 4096, options) {
            Err(e) if e.errno() == Some(libc::EFAULT) || e.is_eexist() => Ok(()),
            Err(e) => Err(e),
            Ok(()) => unreachable!("UFFDIO_COPY read an unreadable page"),
        }
    }

    fn wake(&self, start: Hva, len: u64) -> Result<(), UffdError> {
        let start = start.raw();
        let range = UffdioRange { start, len };
        // SAFETY: valid fd; `range` is read by the kernel only.
        let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(self, nr::uffdio_wake(), &range) };
        os_err(ret).map_err(|source| ioctl_err("UFFDIO_WAKE", range_text(start, len), 0, source))
    }

    fn copy(&self, dst: Hva, src: Hva, len: u64, options: CopyOptions) -> Result<(), UffdError> {
        let dst = dst.raw();
        let src = src.raw();
        let mut mode = 0;
        if options.write_protect {
            mode |= COPY_MODE_WP;
        }
        if options.dont_wake {
            mode |= COPY_MODE_DONTWAKE;
        }
        let mut arg = UffdioCopy {
            dst,
            src,
            len,
            mode,
            copy: 0,
        };
        // SAFETY: valid fd; `arg` is a live `struct uffdio_copy`. The kernel
        // reads `src` with copy_from_user (faults there are errors, not UB)
        // and only fills empty pages at `dst`.
        let ret =
            unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(self, nr::uffdio_copy(), &mut arg) };
        os_err(ret).map_err(|source| {
            ioctl_err(
                "UFFDIO_COPY",
                format!("dst={dst:#x} src={src:#x} len={len:#x}"),
                arg.copy.max(0) as u64,
                source,
            )
        })
    }

    fn zeropage(&self, start: Hva, len: u64, dont_wake: bool) -> Result<(), UffdError> {
        let start = start.raw();
        let mode = if dont_wake { ZEROPAGE_MODE_DONTWAKE } else { 0 };
        let mut arg = UffdioZeropage {
            range: UffdioRange { start, len },
            mode,
            zeropage: 0,
        };
        // SAFETY: valid fd; `arg` is a live `struct uffdio_zeropage`.
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(self, nr::uffdio_zeropage(), &mut arg)
        };
        os_err(ret).map_err(|source| {
            ioctl_err(
                "UFFDIO_ZEROPAGE",
                range_text(start, len),
                arg.zeropage.max(0) as u64,
                source,
            )
        })
    }

    unsafe fn move_pages(
        &self,
        dst: Hva,
        src: Hva,
        len: u64,
        options: MoveOptions,
    ) -> Result<(), UffdError> {
        let dst = dst.raw();
        let src = src.raw();
        let mut mode = 0;
        if options.allow_src_holes {
            mode |= MOVE_MODE_ALLOW_SRC_HOLES;
        }
        if options.dont_wake {
            mode |= MOVE_MODE_DONTWAKE;
        }
        let mut arg = UffdioMove {
            dst,
            src,
            len,
            mode,
            moved: 0,
        };
        // SAFETY: valid fd; `arg` is a live `struct uffdio_move`. The kernel
        // checks both ranges belong to this process's anonymous mappings;
        // the caller holds no Rust references into either range across the
        // call (this function's contract).
        let ret =
            unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(self, nr::uffdio_move(), &mut arg) };
        os_err(ret).map_err(|source| {
            ioctl_err(
                "UFFDIO_MOVE",
                format!("dst={dst:#x} src={src:#x} len={len:#x}"),
                arg.moved.max(0) as u64,
                source,
            )
        })
    }

    fn write_protect(&self, start: Hva, len: u64) -> Result<(), UffdError> {
        let start = start.raw();
        self.writeprotect_ioctl(
            start,
            len,
            WRITEPROTECT_MODE_WP,
            "UFFDIO_WRITEPROTECT(protect)",
        )
    }

    fn write_unprotect(&self, start: Hva, len: u64, dont_wake: bool) -> Result<(), UffdError> {
        let start = start.raw();
        let mode = if dont_wake {
            WRITEPROTECT_MODE_DONTWAKE
        } else {
            0
        };
        self.writeprotect_ioctl(start, len, mode, "UFFDIO_WRITEPROTECT(unprotect)")
    }
}

fn range_text(start: u64, len: u64) -> String {
    format!("start={start:#x} len={len:#x}")
}

fn ioctl_err(
    op: &'static str,
    range: String,
    done_bytes: u64,
    source: std::io::Error,
) -> UffdError {
    UffdError::Ioctl {
        op,
        range,
        done_bytes,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eagain(done_bytes: u64) -> UffdError {
        UffdError::Ioctl {
            op: "UFFDIO_MOVE",
            range: "test".into(),
            done_bytes,
            source: std::io::Error::from_raw_os_error(libc::EAGAIN),
        }
    }

    #[test]
    fn eagain_is_retried_while_it_makes_progress_and_ends_when_it_does_not() {
        let bound = std::time::Duration::from_millis(20);
        // Progress on every call: the range completes.
        let mut calls = 0;
        let r = whole_range_within(4096 * 4, bound, |done| {
            calls += 1;
            if done == 4096 * 3 {
                Ok(())
            } else {
                Err(eagain(4096))
            }
        });
        assert!(r.is_ok() && calls == 4, "{r:?} after {calls} calls");
        // Never any progress: an error once the bound passed, not a spin.
        let started = std::time::Instant::now();
        let r = whole_range_within(4096, bound, |_| Err(eagain(0)));
        assert_eq!(r.unwrap_err().errno(), Some(libc::EAGAIN));
        assert!(started.elapsed() >= bound);
    }

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<UffdioApi>(), 24);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioZeropage>(), 32);
        assert_eq!(std::mem::size_of::<UffdioMove>(), 40);
        assert_eq!(std::mem::size_of::<UffdioWriteprotect>(), 24);
        assert_eq!(std::mem::size_of::<UffdioContinue>(), 32);
        // _IOWR(0xAA, 0x05, 40 bytes) as the kernel header computes it.
        assert_eq!(nr::uffdio_move(), 0xc028_aa05);
        assert_eq!(nr::uffdio_api(), 0xc018_aa3f);
        assert_eq!(nr::uffdio_wake(), 0x8010_aa02);
    }

    #[test]
    fn parses_a_pagefault_message() {
        let mut raw = [0u8; MSG_BYTES];
        raw[0] = EVENT_PAGEFAULT;
        raw[8..16].copy_from_slice(&(PAGEFAULT_FLAG_WP | PAGEFAULT_FLAG_WRITE).to_ne_bytes());
        raw[16..24].copy_from_slice(&0x7f00_0020_0000u64.to_ne_bytes());
        raw[24..28].copy_from_slice(&42u32.to_ne_bytes());
        assert_eq!(
            UffdEvent::parse(&raw),
            UffdEvent::PageFault {
                address: 0x7f00_0020_0000,
                kind: FaultKind::WriteProtect,
                write: true,
                thread_id: 42
            }
        );
        raw[0] = 0x77;
        assert_eq!(UffdEvent::parse(&raw), UffdEvent::Unknown { event: 0x77 });
    }
}
