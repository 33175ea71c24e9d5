//! What each kind of thread may call, and why (docs/SECURITY.md has the
//! same lists in prose). Found by running every integration test with
//! `HUGEVMM_SECCOMP_LOG=1` and reading the kernel's log, and by
//! `strace -f -Y` on the main jobs.

use std::collections::BTreeMap;
use std::fmt;

use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

/// The kinds of thread, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadKind {
    /// The main thread, after it started the others: the run loop, the
    /// statistics, the end of the run.
    Main,
    /// A vCPU thread: `KVM_RUN` and the exits, including the devices
    /// (virtio-blk I/O, the balloon's drops, the console).
    Vcpu,
    /// A swap fault-service thread: userfaultfd messages, store reads.
    FaultService,
    /// The swap evictor and the restore-buffer refill thread.
    Evictor,
    /// The helper threads that feed events in: the stop-signal forwarder
    /// and the console input.
    Device,
    /// The API and metrics listeners and their client threads.
    Control,
    /// The reply reader of an NBD store or disk (`blockio::nbd`), which
    /// also reconnects to the server after a drop: the one kind that may
    /// make sockets (stream sockets of the Unix and IP families) and
    /// connect them.
    Nbd,
}

impl ThreadKind {
    /// Every kind.
    pub const ALL: [ThreadKind; 7] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::FaultService,
        ThreadKind::Evictor,
        ThreadKind::Device,
        ThreadKind::Control,
        ThreadKind::Nbd,
    ];

    /// The kind's name in messages (and `HUGEVMM_SECCOMP_PROBE`).
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::FaultService => "fault-service",
            ThreadKind::Evictor => "evictor",
            ThreadKind::Device => "device",
            ThreadKind::Control => "control",
            ThreadKind::Nbd => "nbd",
        }
    }
}

impl fmt::Display for ThreadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The calls by their names, so that the table reads as names.
#[allow(non_upper_case_globals)]
mod sys {
    macro_rules! consts {
        ($($name:ident = $sys:ident),* $(,)?) => { $(pub const $name: i64 = libc::$sys;)* };
    }
    consts! {
        accept4 = SYS_accept4, brk = SYS_brk, clock_gettime = SYS_clock_gettime,
        clock_nanosleep = SYS_clock_nanosleep, clone = SYS_clone, clone3 = SYS_clone3,
        close = SYS_close, connect = SYS_connect, exit = SYS_exit, exit_group = SYS_exit_group,
        fallocate = SYS_fallocate, fcntl = SYS_fcntl, fdatasync = SYS_fdatasync,
        flock = SYS_flock, fstat = SYS_fstat, fsync = SYS_fsync, ftruncate = SYS_ftruncate,
        futex = SYS_futex, getcwd = SYS_getcwd, getpid = SYS_getpid, getrandom = SYS_getrandom,
        getsockname = SYS_getsockname, getsockopt = SYS_getsockopt, gettid = SYS_gettid,
        io_uring_enter = SYS_io_uring_enter, ioctl = SYS_ioctl, lseek = SYS_lseek,
        madvise = SYS_madvise, mincore = SYS_mincore, mmap = SYS_mmap, mprotect = SYS_mprotect,
        mremap = SYS_mremap, munmap = SYS_munmap, nanosleep = SYS_nanosleep,
        newfstatat = SYS_newfstatat, open = SYS_open, openat = SYS_openat, poll = SYS_poll,
        ppoll = SYS_ppoll, prctl = SYS_prctl, pread64 = SYS_pread64, preadv = SYS_preadv,
        pwrite64 = SYS_pwrite64, pwritev = SYS_pwritev, read = SYS_read,
        recvfrom = SYS_recvfrom, restart_syscall = SYS_restart_syscall, rseq = SYS_rseq,
        rt_sigaction = SYS_rt_sigaction, rt_sigprocmask = SYS_rt_sigprocmask,
        rt_sigreturn = SYS_rt_sigreturn, rt_tgsigqueueinfo = SYS_rt_tgsigqueueinfo,
        sched_getaffinity = SYS_sched_getaffinity, sched_yield = SYS_sched_yield,
        sendto = SYS_sendto, set_robust_list = SYS_set_robust_list, setsockopt = SYS_setsockopt,
        shutdown = SYS_shutdown, sigaltstack = SYS_sigaltstack, socket = SYS_socket,
        statx = SYS_statx, tgkill = SYS_tgkill, tkill = SYS_tkill, unlink = SYS_unlink,
        unlinkat = SYS_unlinkat, write = SYS_write, writev = SYS_writev,
    }
}

/// Calls every filter lets through to a second filter that fails them
/// with EACCES instead of trapping: glibc opens files behind the
/// program's back long after the start (malloc reads
/// `/proc/sys/vm/overcommit_memory` the first time a thread's heap
/// shrinks, `/sys/devices/system/cpu/online` when it sizes its arenas)
/// and copes with a refusal; a trap there would end a healthy VM. Nothing
/// is opened either way.
pub const REFUSED: &[i64] = &[sys::open, sys::openat];

/// The name of x86_64 system call `nr` (the `syscalls` crate's table, the
/// kernel's `syscall_64.tbl`), when it has one. A constant match: the trap
/// handler calls it in signal context.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    let nr = usize::try_from(nr).ok()?;
    syscalls::Sysno::new(nr).map(|call| call.name())
}

/// Every thread, whatever its kind: memory (the allocator, thread stacks
/// and their guard pages going away), locks and channels (futex),
/// messages on stderr, sleeping, ending (a thread's exit unmaps its
/// stack; a panic aborts through tgkill), signals (the vCPU kick and
/// SIGSYS return through rt_sigreturn) and HashMap's keys. Also `sendto`
/// without an address (see `rules`): the stop-signal handler, on
/// whichever thread the signal lands, writes to signal-hook's socket.
const COMMON: &[i64] = &[
    sys::brk,
    sys::clock_gettime,
    sys::clock_nanosleep,
    sys::close,
    sys::exit,
    sys::exit_group,
    sys::futex,
    sys::getpid,
    sys::getrandom,
    sys::gettid,
    sys::madvise,
    sys::mmap,
    sys::mprotect,
    sys::mremap,
    sys::munmap,
    sys::nanosleep,
    sys::restart_syscall,
    sys::rt_sigprocmask,
    sys::rt_sigreturn,
    sys::sched_getaffinity,
    sys::sched_yield,
    sys::sigaltstack,
    sys::tgkill,
    sys::write,
    sys::writev,
];

/// Block I/O through `blockio` (stores and disks): io_uring submissions
/// on rings made before the filters, or pread/pwrite, flushes; hole
/// punching (hugetlb discards, store trims). On an NBD export requests go
/// out as `writev`/`sendto` on its connected socket (COMMON and the
/// `sendto` rule), and a sender whose write failed shuts the socket down
/// so that the reader thread notices the drop.
const BLOCK_IO: &[i64] = &[
    sys::shutdown,
    sys::io_uring_enter,
    sys::pread64,
    sys::preadv,
    sys::pwrite64,
    sys::pwritev,
    sys::fsync,
    sys::fdatasync,
    sys::fallocate,
];

/// The swap engine's memory work: userfaultfd ioctls (move, copy,
/// write-protect, wake), reading fault messages, residency checks.
const SWAP: &[i64] = &[sys::ioctl, sys::read, sys::poll, sys::mincore];

fn kind_calls(kind: ThreadKind) -> Vec<&'static [i64]> {
    match kind {
        // The run loop, statistics (KVM stats fd, engine counters), the
        // vCPU kicks, --pageout (the engine's eviction: block I/O), the
        // end of the run: memslots deleted and guest RAM unmapped,
        // the API socket file removed, --stats-json and --status-file
        // (opened before) rewritten, the terminal restored.
        ThreadKind::Main => vec![
            COMMON,
            BLOCK_IO,
            SWAP,
            &[
                sys::rt_sigaction,
                sys::rt_tgsigqueueinfo,
                sys::tkill,
                sys::lseek,
                sys::ftruncate,
                sys::fstat,
                sys::newfstatat,
                sys::statx,
                sys::fcntl,
                sys::unlink,
                sys::unlinkat,
                sys::shutdown,
                sys::ppoll,
                sys::flock,
                sys::getcwd,
            ],
        ],
        // KVM_RUN and the register ioctls, the devices served on exits:
        // virtio-blk I/O, the balloon's drops through the engine or
        // madvise, irqfd and eventfd writes, the console.
        ThreadKind::Vcpu => vec![
            COMMON,
            BLOCK_IO,
            SWAP,
            &[sys::fcntl, sys::lseek, sys::fstat],
        ],
        ThreadKind::FaultService => vec![COMMON, BLOCK_IO, SWAP],
        ThreadKind::Evictor => vec![COMMON, BLOCK_IO, SWAP],
        // Reading the signal pipe or the terminal, the event channel, and
        // the terminal restored on the way out (ioctl TCSETS).
        ThreadKind::Device => vec![
            COMMON,
            &[
                sys::read,
                sys::recvfrom,
                sys::poll,
                sys::ppoll,
                sys::ioctl,
                sys::rt_sigaction,
            ],
        ],
        // Accepting and serving connections (client threads are spawned
        // with `clone`, see `control_rules`), the stop eventfd, the KVM
        // statistics fd, the balloon (its interrupt), PUT /mem-limit and
        // pageout through the engine.
        // Reading replies (recvfrom), and reconnecting: std's TCP connect
        // with a timeout (socket, ioctl FIONBIO, connect, poll, getsockopt
        // SO_ERROR), TCP_NODELAY and the handshake's receive timeout
        // (setsockopt), the broken socket shut down. `socket` and `ioctl`
        // are narrowed in `rules`.
        ThreadKind::Nbd => vec![
            COMMON,
            &[
                sys::read,
                sys::recvfrom,
                sys::connect,
                sys::poll,
                sys::ppoll,
                sys::getsockopt,
                sys::setsockopt,
                sys::shutdown,
                sys::fcntl,
            ],
        ],
        ThreadKind::Control => vec![
            COMMON,
            BLOCK_IO,
            SWAP,
            &[
                sys::accept4,
                sys::recvfrom,
                sys::shutdown,
                sys::ppoll,
                sys::fcntl,
                sys::getsockname,
                sys::setsockopt,
                sys::set_robust_list,
                sys::rseq,
                sys::prctl,
            ],
        ],
    }
}

/// The filter rules of `kind`: the calls allowed without conditions (and
/// [`REFUSED`] and `clone3`, which the other filters fail: seccomp takes
/// the strictest answer of all filters, so a call this one trapped could
/// not be failed quietly by another), and
/// `clone` only for threads (CLONE_THREAD set: no new processes) on the
/// control threads, which start a thread per client.
pub fn rules(kind: ThreadKind) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = kind_calls(kind)
        .into_iter()
        .chain([REFUSED, &[sys::clone3][..]])
        .flatten()
        .map(|&nr| (nr, Vec::new()))
        .collect();
    // sendto(fd, buf, len, flags, NULL, 0) only: on a connected socket.
    let no_address = SeccompCondition::new(4, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0)
        .and_then(|c| SeccompRule::new(vec![c]))
        .expect("a one-condition rule on argument 4 is valid");
    rules.entry(sys::sendto).or_insert_with(|| vec![no_address]);
    if kind == ThreadKind::Nbd {
        // socket(AF_UNIX | AF_INET | AF_INET6, ...) only: what an NBD URI
        // can name. (The type carries SOCK_CLOEXEC, so it is not matched.)
        let family = |af: i32| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, af as u64)
                .and_then(|c| SeccompRule::new(vec![c]))
                .expect("a one-condition rule on argument 0 is valid")
        };
        rules.insert(
            sys::socket,
            vec![
                family(libc::AF_UNIX),
                family(libc::AF_INET),
                family(libc::AF_INET6),
            ],
        );
        // ioctl(FIONBIO) only: std switches a connecting socket to and
        // from non-blocking with it.
        let fionbio =
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::FIONBIO)
                .and_then(|c| SeccompRule::new(vec![c]))
                .expect("a one-condition rule on argument 1 is valid");
        rules.insert(sys::ioctl, vec![fionbio]);
    }
    if kind == ThreadKind::Control {
        let thread = libc::CLONE_THREAD as u64;
        let rule = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(thread),
            thread,
        )
        .and_then(|c| SeccompRule::new(vec![c]))
        .expect("a one-condition rule on argument 0 is valid");
        rules.insert(sys::clone, vec![rule]);
        // getsockopt(fd, SOL_SOCKET, SO_PEERCRED) only: the API socket
        // checks each client's uid (control/server.rs).
        let peer_cred = [(1, libc::SOL_SOCKET), (2, libc::SO_PEERCRED)]
            .into_iter()
            .map(|(arg, value)| {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value as u64)
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(SeccompRule::new)
            .expect("two conditions on arguments 1 and 2 are valid");
        rules.insert(sys::getsockopt, vec![peer_cred]);
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_kind_may_start_programs_or_open_files() {
        // open and openat pass this filter only to be refused by the next.
        assert_eq!(REFUSED, [sys::open, sys::openat]);
        for kind in ThreadKind::ALL {
            let rules = rules(kind);
            for nr in [
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_openat2,
                libc::SYS_ptrace,
                libc::SYS_io_uring_setup,
                libc::SYS_io_uring_register,
                libc::SYS_seccomp,
                libc::SYS_mount,
            ] {
                assert!(
                    !rules.contains_key(&nr),
                    "{kind} threads may call {}",
                    syscall_name(nr).unwrap()
                );
            }
        }
    }

    #[test]
    fn only_nbd_threads_make_sockets_and_only_stream_families() {
        for kind in ThreadKind::ALL {
            let rules = rules(kind);
            for nr in [sys::socket, sys::connect] {
                assert_eq!(
                    rules.contains_key(&nr),
                    kind == ThreadKind::Nbd,
                    "{kind} and {}",
                    syscall_name(nr).unwrap()
                );
            }
        }
        let nbd = rules(ThreadKind::Nbd);
        assert_eq!(nbd[&sys::socket].len(), 3, "one rule per address family");
        assert_eq!(nbd[&sys::ioctl].len(), 1, "ioctl only for FIONBIO");
    }

    #[test]
    fn only_control_threads_spawn_and_only_threads() {
        for kind in ThreadKind::ALL {
            let rules = rules(kind);
            let clone = rules.get(&sys::clone);
            assert_eq!(clone.is_some(), kind == ThreadKind::Control, "{kind}");
            if let Some(conditions) = clone {
                assert_eq!(conditions.len(), 1, "clone has its CLONE_THREAD rule");
            }
        }
    }

    #[test]
    fn every_allowed_call_has_a_name() {
        for kind in ThreadKind::ALL {
            for nr in rules(kind).keys() {
                assert!(syscall_name(*nr).is_some(), "{nr}");
            }
        }
        assert_eq!(syscall_name(libc::SYS_execve), Some("execve"));
        assert_eq!(syscall_name(100_000), None);
        assert_eq!(syscall_name(-1), None);
    }

    /// The trap names any call, not only those the filters mention (the
    /// first one met in the wild was fchmod, 91, which no list had).
    #[test]
    fn calls_no_filter_mentions_have_names_too() {
        for (nr, name) in [
            (libc::SYS_fchmod, "fchmod"),
            (libc::SYS_chmod, "chmod"),
            (libc::SYS_fchown, "fchown"),
            (libc::SYS_truncate, "truncate"),
            (libc::SYS_kexec_load, "kexec_load"),
            (libc::SYS_process_vm_writev, "process_vm_writev"),
            (libc::SYS_pidfd_open, "pidfd_open"),
            (libc::SYS_rseq, "rseq"),
        ] {
            assert_eq!(syscall_name(nr), Some(name), "{nr}");
        }
        // Names agree with libc's numbers for every call the filters use.
        for kind in ThreadKind::ALL {
            for nr in rules(kind).keys() {
                let name = syscall_name(*nr).unwrap();
                let back = syscalls::Sysno::new(*nr as usize).unwrap();
                assert_eq!(back.id() as i64, *nr, "{name}");
            }
        }
    }
}
