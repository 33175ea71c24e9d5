//! The filters at work: each test installs a kind's allow-list on a
//! thread of its own, with a marker errno instead of the trap (a trap
//! would end the test process), and issues the calls the kind must not
//! make and some it must. Every call here is harmless if a filter lets it
//! through: descriptors are -1, signals are 0, what is mapped or opened
//! is released.

use super::ioctls;
use super::rules::{self, ThreadKind};
use seccompiler::SeccompAction;

/// What a refused call fails with: no system call returns it.
const REFUSED_ERRNO: i32 = 4000;

/// The filters a thread of `kind` installs, with the marker for the trap.
struct Filters([seccompiler::BpfProgram; 3]);

impl Filters {
    fn of(kind: ThreadKind) -> Self {
        let marker = SeccompAction::Errno(REFUSED_ERRNO as u32);
        Filters([
            super::filters::clone3_filter().unwrap(),
            super::filters::refused_filter().unwrap(),
            super::filters::compile(kind, std::process::id(), marker).unwrap(),
        ])
    }

    fn install(&self) {
        for program in &self.0 {
            seccompiler::apply_filter(program).unwrap();
        }
    }
}

/// Runs `probe` on a new thread under `kind`'s filters.
fn under_filter<T: Send + 'static>(
    kind: ThreadKind,
    probe: impl FnOnce() -> T + Send + 'static,
) -> T {
    let filters = Filters::of(kind);
    std::thread::spawn(move || {
        filters.install();
        probe()
    })
    .join()
    .unwrap()
}

/// The outcome of a raw call: its return value, or the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Returned(i64),
    Failed(i32),
}

impl Outcome {
    fn refused(self) -> bool {
        self == Outcome::Failed(REFUSED_ERRNO)
    }
}

/// A system call with six arguments, as the filter sees it.
fn call(nr: i64, args: [u64; 6]) -> Outcome {
    // SAFETY: every call the tests make is harmless with these arguments:
    // fd -1, null or owned pointers, signal 0; what a call creates is
    // released by the caller.
    let ret = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    if ret == -1 {
        Outcome::Failed(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Outcome::Returned(ret)
    }
}

fn ioctl(request: u64) -> Outcome {
    call(libc::SYS_ioctl, [u64::MAX, request, 0, 0, 0, 0])
}

/// `KVM_SET_USER_MEMORY_REGION`: `_IOW(KVMIO, 0x46, struct
/// kvm_userspace_memory_region)`.
const KVM_SET_USER_MEMORY_REGION: u64 = 0x4020_ae46;
/// `UFFDIO_COPY`: `_IOWR(UFFDIO, 0x03, struct uffdio_copy)`.
const UFFDIO_COPY: u64 = 0xc028_aa03;

/// Closes what a call that should have been refused opened.
fn close_if_opened(outcome: Outcome) {
    if let Outcome::Returned(fd) = outcome {
        // SAFETY: the descriptor was just created by the probe and is not
        // used anywhere else.
        unsafe { libc::close(fd as i32) };
    }
}

#[test]
fn no_kind_may_type_into_the_terminal_map_memory_into_the_guest_or_configure_the_network() {
    for kind in ThreadKind::ALL {
        let (tiocsti, memslot, siocs) = under_filter(kind, || {
            (
                ioctl(libc::TIOCSTI),
                ioctl(KVM_SET_USER_MEMORY_REGION),
                ioctl(libc::SIOCSIFFLAGS),
            )
        });
        assert!(tiocsti.refused(), "{kind}: ioctl(TIOCSTI) gave {tiocsti:?}");
        // The teardown thread deletes the memslots once the run is over.
        assert_eq!(
            memslot.refused(),
            kind != ThreadKind::Teardown,
            "{kind}: ioctl(KVM_SET_USER_MEMORY_REGION) gave {memslot:?}"
        );
        assert!(
            siocs.refused(),
            "{kind}: ioctl(SIOCSIFFLAGS) gave {siocs:?}"
        );
    }
}

#[test]
fn no_kind_may_map_executable_memory() {
    const PAGE: u64 = 4096;
    let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let exec = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    for kind in ThreadKind::ALL {
        let (mapped_exec, mapped_rw, protected_exec) = under_filter(kind, move || {
            let mapped_exec = call(libc::SYS_mmap, [0, PAGE, exec, anon, u64::MAX, 0]);
            let mapped_rw = call(libc::SYS_mmap, [0, PAGE, rw, anon, u64::MAX, 0]);
            let protected_exec = match mapped_rw {
                Outcome::Returned(at) => call(libc::SYS_mprotect, [at as u64, PAGE, exec, 0, 0, 0]),
                failed => failed,
            };
            for outcome in [mapped_exec, mapped_rw] {
                if let Outcome::Returned(at) = outcome {
                    // SAFETY: the page was mapped just above and nothing
                    // else uses it.
                    unsafe { libc::munmap(at as *mut libc::c_void, PAGE as usize) };
                }
            }
            (mapped_exec, mapped_rw, protected_exec)
        });
        assert!(
            mapped_exec.refused(),
            "{kind}: mmap(PROT_EXEC) gave {mapped_exec:?}"
        );
        assert!(
            matches!(mapped_rw, Outcome::Returned(_)),
            "{kind}: mmap(PROT_READ | PROT_WRITE) gave {mapped_rw:?}"
        );
        assert!(
            protected_exec.refused(),
            "{kind}: mprotect(PROT_EXEC) gave {protected_exec:?}"
        );
    }
}

#[test]
fn signals_reach_only_this_process() {
    for kind in ThreadKind::ALL {
        let (own, other, tkill) = under_filter(kind, || {
            // SAFETY: getpid and gettid have no preconditions.
            let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
            // Signal 0 only checks that the target exists.
            (
                call(libc::SYS_tgkill, [pid as u64, tid as u64, 0, 0, 0, 0]),
                call(libc::SYS_tgkill, [1, 1, 0, 0, 0, 0]),
                call(libc::SYS_tkill, [1, 0, 0, 0, 0, 0]),
            )
        });
        assert_eq!(own, Outcome::Returned(0), "{kind}: tgkill on itself");
        assert!(other.refused(), "{kind}: tgkill(1, 1, 0) gave {other:?}");
        assert!(tkill.refused(), "{kind}: tkill(1, 0) gave {tkill:?}");
    }
}

#[test]
fn nbd_threads_make_stream_sockets_only() {
    let socket = |family: i32, kind: i32, protocol: i32| {
        call(
            libc::SYS_socket,
            [family as u64, kind as u64, protocol as u64, 0, 0, 0],
        )
    };
    let [dgram, raw, netlink, tcp, unix, tcp6] = under_filter(ThreadKind::Nbd, move || {
        let outcomes = [
            socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0),
            socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP),
            socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0),
            socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
            socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
            socket(
                libc::AF_INET6,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            ),
        ];
        outcomes.iter().copied().for_each(close_if_opened);
        outcomes
    });
    assert!(dgram.refused(), "SOCK_DGRAM gave {dgram:?}");
    assert!(raw.refused(), "SOCK_RAW gave {raw:?}");
    assert!(netlink.refused(), "AF_NETLINK gave {netlink:?}");
    for (what, outcome) in [("TCP", tcp), ("Unix", unix), ("TCP over IPv6", tcp6)] {
        // No IPv6 on the host is a failure of the call, not of the filter.
        assert!(
            !outcome.refused() && outcome != Outcome::Failed(libc::EPERM),
            "{what} stream socket gave {outcome:?}"
        );
    }
}

#[test]
fn metrics_clients_may_not_do_block_io_spawn_or_use_the_engine() {
    let [pwrite, uring, clone, prctl, uffd_copy, fionbio, recv] =
        under_filter(ThreadKind::MetricsClient, || {
            let buf = [0u8; 8];
            [
                call(
                    libc::SYS_pwrite64,
                    [u64::MAX, buf.as_ptr() as u64, 8, 0, 0, 0],
                ),
                call(libc::SYS_io_uring_enter, [u64::MAX, 1, 0, 0, 0, 0]),
                // CLONE_THREAD without CLONE_SIGHAND: EINVAL when let through.
                call(libc::SYS_clone, [libc::CLONE_THREAD as u64, 0, 0, 0, 0, 0]),
                call(
                    libc::SYS_prctl,
                    [libc::PR_GET_DUMPABLE as u64, 0, 0, 0, 0, 0],
                ),
                ioctl(UFFDIO_COPY),
                ioctl(libc::FIONBIO),
                call(libc::SYS_recvfrom, [u64::MAX, 0, 0, 0, 0, 0]),
            ]
        });
    assert!(pwrite.refused(), "pwrite64 gave {pwrite:?}");
    assert!(uring.refused(), "io_uring_enter gave {uring:?}");
    assert!(clone.refused(), "clone gave {clone:?}");
    assert!(prctl.refused(), "prctl gave {prctl:?}");
    assert!(uffd_copy.refused(), "ioctl(UFFDIO_COPY) gave {uffd_copy:?}");
    assert_eq!(fionbio, Outcome::Failed(libc::EBADF), "ioctl(FIONBIO)");
    assert_eq!(recv, Outcome::Failed(libc::EBADF), "recvfrom");
}

/// What each kind is given still works: every request of its groups gets
/// past the filter (to fail on fd -1), and the usual thread calls too.
#[test]
fn every_kind_may_issue_its_own_requests() {
    for kind in ThreadKind::ALL {
        let requests: Vec<u32> = rules::allowed(kind).ioctls.into_iter().collect();
        let outcomes = under_filter(kind, move || {
            requests
                .iter()
                .map(|&request| (request, ioctl(u64::from(request))))
                .collect::<Vec<_>>()
        });
        for (request, outcome) in outcomes {
            assert_eq!(
                outcome,
                Outcome::Failed(libc::EBADF),
                "{kind}: ioctl {} ({request:#x})",
                ioctls::name(request).unwrap_or("?")
            );
        }
    }
    // The vCPU's and the engine's, by name.
    let vcpu = rules::allowed(ThreadKind::Vcpu).ioctls;
    for request in [ioctls::KVM_RUN, ioctls::KVM_GET_REGS, ioctls::UFFDIO_COPY] {
        assert!(vcpu.contains(&request.nr), "{}", request.name);
    }
    let api_client = rules::allowed(ThreadKind::ApiClient).ioctls;
    assert!(!api_client.contains(&ioctls::KVM_RUN.nr));
    assert!(api_client.contains(&ioctls::UFFDIO_MOVE.nr), "pageout");
}

/// The listener's filter, which its clients inherit, with a client's on
/// top: the client's calls pass both, and a client cannot start threads.
#[test]
fn a_client_thread_under_both_filters_works_and_cannot_spawn() {
    for (listener, client) in [
        (ThreadKind::Control, ThreadKind::ApiClient),
        (ThreadKind::Metrics, ThreadKind::MetricsClient),
    ] {
        let (outer, inner) = (Filters::of(listener), Filters::of(client));
        let (spawned, fionbio, nested) = std::thread::spawn(move || {
            outer.install();
            // A thread started by the listener, as its clients are.
            let spawned = std::thread::spawn(move || {
                inner.install();
                let fionbio = ioctl(libc::FIONBIO);
                let nested = std::thread::Builder::new().spawn(|| ()).map(|t| t.join());
                (fionbio, nested.is_ok())
            })
            .join();
            match spawned {
                Ok((fionbio, nested)) => (true, fionbio, nested),
                Err(_) => (false, Outcome::Returned(0), false),
            }
        })
        .join()
        .unwrap();
        assert!(spawned, "{listener}: cannot start a client thread");
        assert_eq!(fionbio, Outcome::Failed(libc::EBADF), "{client}: FIONBIO");
        assert!(!nested, "{client}: started a thread");
    }
}

/// Device and teardown threads may only check that a descriptor is open
/// (std does before it closes one, in debug builds), nothing else of
/// `fcntl`.
#[test]
fn fcntl_is_only_a_descriptor_check_on_device_and_teardown_threads() {
    for kind in [ThreadKind::Device, ThreadKind::Teardown] {
        let (getfd, setfl, dupfd) = under_filter(kind, || {
            (
                call(
                    libc::SYS_fcntl,
                    [u64::MAX, libc::F_GETFD as u64, 0, 0, 0, 0],
                ),
                call(
                    libc::SYS_fcntl,
                    [u64::MAX, libc::F_SETFL as u64, 0, 0, 0, 0],
                ),
                call(
                    libc::SYS_fcntl,
                    [u64::MAX, libc::F_DUPFD as u64, 0, 0, 0, 0],
                ),
            )
        });
        assert_eq!(getfd, Outcome::Failed(libc::EBADF), "{kind}: F_GETFD");
        assert!(setfl.refused(), "{kind}: F_SETFL gave {setfl:?}");
        assert!(dupfd.refused(), "{kind}: F_DUPFD gave {dupfd:?}");
    }
}

#[test]
fn no_kind_may_poison_pages_and_sockets_take_only_hugevmm_s_options() {
    // Length 0: a call the filter lets through does nothing.
    let madvise = |advice: i32| call(libc::SYS_madvise, [0, 0, advice as u64, 0, 0, 0]);
    let setsockopt = |level: i32, name: i32| {
        call(
            libc::SYS_setsockopt,
            [u64::MAX, level as u64, name as u64, 0, 0, 0],
        )
    };
    for kind in ThreadKind::ALL {
        let [dontneed, collapse, hwpoison, soft_offline, nodelay, timeout, user_timeout, keepalive, keep_idle, bind_device, mark] =
            under_filter(kind, move || {
                [
                    madvise(libc::MADV_DONTNEED),
                    madvise(libc::MADV_COLLAPSE),
                    madvise(libc::MADV_HWPOISON),
                    madvise(libc::MADV_SOFT_OFFLINE),
                    setsockopt(libc::IPPROTO_TCP, libc::TCP_NODELAY),
                    setsockopt(libc::SOL_SOCKET, libc::SO_RCVTIMEO),
                    setsockopt(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
                    setsockopt(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
                    setsockopt(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
                    setsockopt(libc::SOL_SOCKET, libc::SO_BINDTODEVICE),
                    setsockopt(libc::SOL_SOCKET, libc::SO_MARK),
                ]
            });
        assert!(
            !dontneed.refused() && !collapse.refused(),
            "{kind}: madvise(DONTNEED) gave {dontneed:?}, madvise(COLLAPSE) {collapse:?}"
        );
        assert!(
            hwpoison.refused() && soft_offline.refused(),
            "{kind}: madvise(HWPOISON) gave {hwpoison:?}, madvise(SOFT_OFFLINE) {soft_offline:?}"
        );
        assert!(
            bind_device.refused() && mark.refused(),
            "{kind}: setsockopt(SO_BINDTODEVICE) gave {bind_device:?}, SO_MARK {mark:?}"
        );
        let sets_options = rules::allowed(kind).calls.contains(&libc::SYS_setsockopt);
        for (what, outcome) in [
            ("TCP_NODELAY", nodelay),
            ("SO_RCVTIMEO", timeout),
            ("TCP_USER_TIMEOUT", user_timeout),
            ("SO_KEEPALIVE", keepalive),
            ("TCP_KEEPIDLE", keep_idle),
        ] {
            assert_eq!(
                !outcome.refused(),
                sets_options,
                "{kind}: setsockopt({what}) gave {outcome:?}"
            );
        }
    }
}
