//! What each kind of thread may call, and why (docs/SECURITY.md has the
//! same lists in prose, and a test holds the unconditional ones).
//!
//! Found by reading the code each kind runs and by running every
//! integration test with the filters; the trap names a missing call, and
//! for the calls checked by argument the argument that failed (an
//! `ioctl`'s request, `mmap`'s protection).
//!
//! Some calls are allowed only with some arguments:
//! - `ioctl` only with the requests of the kind's groups (`ioctls.rs`):
//!   `TIOCSTI`, `KVM_SET_USER_MEMORY_REGION` (but on the teardown thread)
//!   and every network configuration request are never allowed;
//! - `mmap` and `mprotect` never with `PROT_EXEC`;
//! - `tgkill` only to this process's threads (its pid is known when the
//!   filter is built); `tkill`, which names no process, never;
//! - `sendto` only without an address (on a connected socket);
//! - `socket` (NBD readers) only stream sockets of the Unix and IP
//!   families, `clone` (listeners) only threads, `prctl` (listeners)
//!   only to name a thread or set no-new-privileges, `seccomp`
//!   (listeners) only to add a filter to the calling thread, `getsockopt`
//!   (the API listener) only for `SO_PEERCRED`;
//! - `fcntl`, on the kinds that have no other use of it, only for
//!   `F_GETFD` (std's check of a descriptor it closes, in debug builds).

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

use super::ioctls::{self, Request};
pub use super::kind::ThreadKind;

/// The calls by their names, so that the table reads as names.
#[allow(non_upper_case_globals)]
pub(super) mod sys {
    macro_rules! consts {
        ($($name:ident = $sys:ident),* $(,)?) => { $(pub const $name: i64 = libc::$sys;)* };
    }
    consts! {
        accept4 = SYS_accept4, brk = SYS_brk, clock_gettime = SYS_clock_gettime,
        clock_nanosleep = SYS_clock_nanosleep, clone = SYS_clone, clone3 = SYS_clone3,
        close = SYS_close, connect = SYS_connect, eventfd2 = SYS_eventfd2, exit = SYS_exit,
        exit_group = SYS_exit_group,
        fallocate = SYS_fallocate, fcntl = SYS_fcntl, fdatasync = SYS_fdatasync,
        flock = SYS_flock, fstat = SYS_fstat, fsync = SYS_fsync, ftruncate = SYS_ftruncate,
        futex = SYS_futex, getcwd = SYS_getcwd, getpid = SYS_getpid, getrandom = SYS_getrandom,
        getsockname = SYS_getsockname, getsockopt = SYS_getsockopt, gettid = SYS_gettid,
        io_uring_enter = SYS_io_uring_enter, ioctl = SYS_ioctl, lseek = SYS_lseek,
        madvise = SYS_madvise, memfd_create = SYS_memfd_create, mincore = SYS_mincore,
        mmap = SYS_mmap, mprotect = SYS_mprotect,
        mremap = SYS_mremap, munmap = SYS_munmap, nanosleep = SYS_nanosleep,
        newfstatat = SYS_newfstatat, open = SYS_open, openat = SYS_openat, poll = SYS_poll,
        ppoll = SYS_ppoll, prctl = SYS_prctl, pread64 = SYS_pread64, preadv = SYS_preadv,
        pwrite64 = SYS_pwrite64, pwritev = SYS_pwritev, read = SYS_read,
        recvfrom = SYS_recvfrom, recvmsg = SYS_recvmsg, restart_syscall = SYS_restart_syscall, rseq = SYS_rseq,
        rt_sigaction = SYS_rt_sigaction, rt_sigprocmask = SYS_rt_sigprocmask,
        rt_sigreturn = SYS_rt_sigreturn, sched_getaffinity = SYS_sched_getaffinity,
        sched_yield = SYS_sched_yield, seccomp = SYS_seccomp, sendmsg = SYS_sendmsg,
        sendto = SYS_sendto,
        set_robust_list = SYS_set_robust_list, setsockopt = SYS_setsockopt,
        shutdown = SYS_shutdown, sigaltstack = SYS_sigaltstack, socket = SYS_socket,
        statx = SYS_statx, tgkill = SYS_tgkill, unlink = SYS_unlink,
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
/// stack), signals (the vCPU kick and SIGSYS return through
/// rt_sigreturn) and HashMap's keys. Also, checked by argument (see
/// [`rules`]): `mmap` and `mprotect` without `PROT_EXEC`, `tgkill` to this
/// process (a panic's abort), `sendto` without an address (the
/// stop-signal handler, on whichever thread the signal lands, writes to
/// signal-hook's socket) and `fcntl(F_GETFD)`.
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
    sys::mremap,
    sys::munmap,
    sys::nanosleep,
    sys::restart_syscall,
    sys::rt_sigprocmask,
    sys::rt_sigreturn,
    sys::sched_getaffinity,
    sys::sched_yield,
    sys::sigaltstack,
    sys::write,
    sys::writev,
];

/// Calls in the kinds' lists whose arguments [`rules`] checks: listed as
/// allowed (what the kind needs), compiled with conditions.
const BY_ARGUMENT: &[i64] = &[sys::madvise, sys::setsockopt];

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

/// The swap engine's memory work besides its ioctls
/// ([`ioctls::ENGINE`]): reading fault messages, residency checks.
const SWAP: &[i64] = &[sys::read, sys::poll, sys::mincore];

/// A listener's own calls: accepting, waiting on the socket and the stop
/// eventfd, and starting a thread per client (`clone` with
/// `CLONE_THREAD`, `clone3` failed with ENOSYS; the new thread's start:
/// `set_robust_list`, `rseq`, `prctl(PR_SET_NAME)`; its filter:
/// `prctl(PR_SET_NO_NEW_PRIVS)` and `seccomp`).
const LISTENER: &[i64] = &[
    sys::accept4,
    sys::poll,
    sys::ppoll,
    sys::fcntl,
    sys::getsockname,
    sys::setsockopt,
    sys::set_robust_list,
    sys::rseq,
];

/// What one kind may call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// Calls allowed whatever their arguments.
    pub calls: BTreeSet<i64>,
    /// `ioctl` requests allowed (on any descriptor the thread has).
    pub ioctls: BTreeSet<u32>,
    /// The address families of the stream sockets the kind may make.
    pub socket_families: BTreeSet<i32>,
    /// `clone` of threads (`CLONE_THREAD` set: no new processes).
    pub clone_threads: bool,
    /// `prctl` options allowed.
    pub prctl_options: BTreeSet<i32>,
    /// `seccomp(SECCOMP_SET_MODE_FILTER, 0, ...)`: a new client thread
    /// adding its kind's filter to itself (filters only narrow).
    pub add_filter: bool,
    /// `getsockopt(fd, SOL_SOCKET, SO_PEERCRED)`: a client's uid.
    pub peer_credentials: bool,
}

impl Allowed {
    fn of(calls: &[&[i64]], ioctls: &[&[Request]]) -> Self {
        Allowed {
            calls: calls.iter().copied().flatten().copied().collect(),
            ioctls: ioctls.iter().copied().flatten().map(|r| r.nr).collect(),
            ..Allowed::default()
        }
    }

    /// What either may call: a listener's filter, which its clients
    /// inherit, must let their calls through.
    fn union(mut self, other: Allowed) -> Allowed {
        self.calls.extend(other.calls);
        self.ioctls.extend(other.ioctls);
        self.socket_families.extend(other.socket_families);
        self.clone_threads |= other.clone_threads;
        self.prctl_options.extend(other.prctl_options);
        self.add_filter |= other.add_filter;
        self.peer_credentials |= other.peer_credentials;
        self
    }

    /// A listener: its own calls, and its clients'.
    fn listener(clients: Allowed) -> Allowed {
        let own = Allowed {
            clone_threads: true,
            prctl_options: [libc::PR_SET_NAME, libc::PR_SET_NO_NEW_PRIVS].into(),
            add_filter: true,
            ..Allowed::of(&[COMMON, LISTENER], &[ioctls::NONBLOCKING])
        };
        own.union(clients)
    }

    /// Whether everything `other` may call passes this filter too.
    #[cfg(test)]
    pub fn covers(&self, other: &Allowed) -> bool {
        self.clone().union(other.clone()) == *self
    }
}

/// What `kind` may call.
pub fn allowed(kind: ThreadKind) -> Allowed {
    match kind {
        // The run loop, statistics (KVM stats fd, engine counters), the
        // vCPU kicks, --pageout (the engine's eviction: block I/O), the
        // end of the run: the engine shut down (its userfaultfd
        // unregistered), the API socket file removed, --stats-json and
        // --status-file (opened before) rewritten, the terminal restored.
        ThreadKind::Main => Allowed::of(
            &[
                COMMON,
                BLOCK_IO,
                SWAP,
                &[
                    sys::rt_sigaction,
                    sys::lseek,
                    sys::ftruncate,
                    sys::fstat,
                    sys::newfstatat,
                    sys::statx,
                    sys::fcntl,
                    sys::unlink,
                    sys::unlinkat,
                    sys::ppoll,
                    sys::flock,
                    sys::getcwd,
                ],
            ],
            &[ioctls::ENGINE, ioctls::ENGINE_SHUTDOWN, ioctls::TERMINAL],
        ),
        // KVM_RUN and the register ioctls, the devices served on exits:
        // virtio-blk I/O, the balloon's drops through the engine or
        // madvise, irqfd and eventfd writes, the console.
        ThreadKind::Vcpu => Allowed::of(
            &[
                COMMON,
                BLOCK_IO,
                SWAP,
                &[sys::fcntl, sys::lseek, sys::fstat],
            ],
            &[ioctls::VCPU, ioctls::ENGINE],
        ),
        ThreadKind::FaultService | ThreadKind::Evictor => {
            Allowed::of(&[COMMON, BLOCK_IO, SWAP], &[ioctls::ENGINE])
        }
        // Reading the signal socket, the terminal or the trap's eventfd,
        // the event channel; the terminal restored when a second stop
        // signal ends the process from the signal thread (atexit); the
        // console input may drop the serial port last, closing its
        // interrupt's eventfd.
        ThreadKind::Device => Allowed::of(
            &[
                COMMON,
                &[
                    sys::read,
                    sys::recvfrom,
                    sys::poll,
                    sys::ppoll,
                    sys::rt_sigaction,
                ],
            ],
            &[ioctls::TERMINAL],
        ),
        ThreadKind::Control => Allowed {
            peer_credentials: true,
            ..Allowed::listener(allowed(ThreadKind::ApiClient))
        },
        // One client's requests: reading and answering on its socket
        // (non-blocking through FIONBIO), the KVM statistics fd, the
        // balloon (its interrupt, an eventfd write), PUT /mem-limit and
        // pageout through the engine (block I/O, its ioctls).
        ThreadKind::ApiClient => Allowed::of(
            &[COMMON, BLOCK_IO, SWAP, &[sys::recvfrom, sys::ppoll]],
            &[ioctls::NONBLOCKING, ioctls::ENGINE],
        ),
        ThreadKind::Metrics => Allowed::listener(allowed(ThreadKind::MetricsClient)),
        // GET /metrics: reading and answering on its socket, the KVM
        // statistics fd; the engine's counters and the balloon's figures
        // are memory reads.
        ThreadKind::MetricsClient => Allowed::of(
            &[
                COMMON,
                &[
                    sys::recvfrom,
                    sys::poll,
                    sys::ppoll,
                    sys::shutdown,
                    sys::pread64,
                ],
            ],
            &[ioctls::NONBLOCKING],
        ),
        // Reading replies (recvfrom), and reconnecting: std's TCP connect
        // with a timeout (socket, ioctl FIONBIO, connect, poll, getsockopt
        // SO_ERROR), TCP_NODELAY, the dead-peer bounds (TCP_USER_TIMEOUT,
        // keepalive) and the handshake's receive timeout (setsockopt), the
        // broken socket shut down.
        ThreadKind::Nbd => Allowed {
            socket_families: [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6].into(),
            ..Allowed::of(
                &[
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
                &[ioctls::NONBLOCKING],
            )
        },
        // Taking completions (the call eventfds read, waited on with
        // poll) and reconnecting a lost backend: a Unix stream socket
        // connected with a bound (non-blocking connect, poll, SO_ERROR,
        // fcntl), the vhost-user messages with descriptors in them
        // (sendmsg, recvmsg), a new memfd sized and mapped shared (mmap is
        // checked for PROT_EXEC as everywhere), new eventfds; the watchdog
        // shuts a socket down.
        ThreadKind::VhostUser => Allowed {
            socket_families: [libc::AF_UNIX].into(),
            ..Allowed::of(
                &[
                    COMMON,
                    &[
                        sys::read,
                        sys::poll,
                        sys::ppoll,
                        sys::connect,
                        sys::getsockopt,
                        sys::fcntl,
                        sys::sendmsg,
                        sys::recvmsg,
                        sys::memfd_create,
                        sys::ftruncate,
                        sys::eventfd2,
                        sys::shutdown,
                    ],
                ],
                &[ioctls::NONBLOCKING],
            )
        },
        // Guest RAM dropped once the run is over: its memslots deleted,
        // the VM fd they were registered through closed, its mapping
        // unmapped.
        ThreadKind::Teardown => Allowed::of(&[COMMON], &[ioctls::MEMSLOTS]),
    }
}

/// `arg == value`, on the argument's low 32 bits (the kernel reads these
/// arguments as `int`s).
fn eq(arg: u8, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .expect("an argument index below 6 is valid")
}

/// `arg & mask == value`, on the argument's low 32 bits.
fn masked(arg: u8, mask: u64, value: u64) -> SeccompCondition {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )
    .expect("an argument index below 6 is valid")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a rule with conditions is valid")
}

/// The filter rules of `kind` in process `pid`: the calls allowed without
/// conditions (and [`REFUSED`] and `clone3`, which the other filters
/// fail: seccomp takes the strictest answer of all filters, so a call
/// this one trapped could not be failed quietly by another), and the
/// calls allowed with some arguments only (see the module's comment).
pub fn rules(kind: ThreadKind, pid: u32) -> BTreeMap<i64, Vec<SeccompRule>> {
    let allowed = allowed(kind);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed
        .calls
        .iter()
        .filter(|nr| !BY_ARGUMENT.contains(nr))
        .chain(REFUSED)
        .chain(&[sys::clone3])
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let mut conditional = |nr: i64, alternatives: Vec<SeccompRule>| {
        // An unconditional entry already allows every argument.
        if !alternatives.is_empty() {
            rules.entry(nr).or_insert(alternatives);
        }
    };
    // madvise: any advice below MADV_HWPOISON (100). The ones above it,
    // MADV_HWPOISON and MADV_SOFT_OFFLINE, act on physical pages for
    // every process on the host (root has CAP_SYS_ADMIN); what glibc, std
    // and the engine use (DONTNEED, FREE, HUGEPAGE, COLLAPSE, DONTDUMP,
    // DONTFORK, ...) are all below.
    if allowed.calls.contains(&sys::madvise) {
        let below_hwpoison = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Lt,
            libc::MADV_HWPOISON as u64,
        )
        .expect("argument 2 is valid");
        conditional(sys::madvise, vec![rule(vec![below_hwpoison])]);
    }
    // setsockopt: only the options hugevmm sets (std's socket timeouts;
    // on NBD connections TCP_NODELAY, TCP_USER_TIMEOUT and keepalive), not
    // SO_BINDTODEVICE, SO_MARK, IP options and the like.
    if allowed.calls.contains(&sys::setsockopt) {
        let option = |level: i32, name: i32| rule(vec![eq(1, level as u64), eq(2, name as u64)]);
        conditional(
            sys::setsockopt,
            vec![
                option(libc::SOL_SOCKET, libc::SO_RCVTIMEO),
                option(libc::SOL_SOCKET, libc::SO_SNDTIMEO),
                option(libc::IPPROTO_TCP, libc::TCP_NODELAY),
                option(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
                option(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
                option(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
                option(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
                option(libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
            ],
        );
    }
    let no_exec = || vec![rule(vec![masked(2, libc::PROT_EXEC as u64, 0)])];
    conditional(sys::mmap, no_exec());
    conditional(sys::mprotect, no_exec());
    conditional(sys::tgkill, vec![rule(vec![eq(0, u64::from(pid))])]);
    // fcntl(fd, F_GETFD): std checks, in debug builds, that a descriptor
    // it closes is open; whatever thread drops a socket or an eventfd last
    // does.
    conditional(sys::fcntl, vec![rule(vec![eq(1, libc::F_GETFD as u64)])]);
    // sendto(fd, buf, len, flags, NULL, 0): the address is a pointer, all
    // 64 bits of it.
    let no_address = SeccompCondition::new(4, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0)
        .expect("argument 4 is valid");
    conditional(sys::sendto, vec![rule(vec![no_address])]);
    conditional(
        sys::ioctl,
        allowed
            .ioctls
            .iter()
            .map(|&request| rule(vec![eq(1, u64::from(request))]))
            .collect(),
    );
    // The type with SOCK_CLOEXEC and SOCK_NONBLOCK taken out must be
    // SOCK_STREAM.
    let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u32;
    let stream = masked(1, u64::from(!flags), libc::SOCK_STREAM as u64);
    conditional(
        sys::socket,
        allowed
            .socket_families
            .iter()
            .map(|&family| rule(vec![eq(0, family as u64), stream.clone()]))
            .collect(),
    );
    if allowed.clone_threads {
        let thread = libc::CLONE_THREAD as u64;
        conditional(sys::clone, vec![rule(vec![masked(0, thread, thread)])]);
    }
    conditional(
        sys::prctl,
        allowed
            .prctl_options
            .iter()
            .map(|&option| rule(vec![eq(0, option as u64)]))
            .collect(),
    );
    if allowed.add_filter {
        conditional(
            sys::seccomp,
            vec![rule(vec![
                eq(0, u64::from(libc::SECCOMP_SET_MODE_FILTER)),
                eq(1, 0),
            ])],
        );
    }
    if allowed.peer_credentials {
        conditional(
            sys::getsockopt,
            vec![rule(vec![
                eq(1, libc::SOL_SOCKET as u64),
                eq(2, libc::SO_PEERCRED as u64),
            ])],
        );
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call a kind may make whatever its arguments, and why. A call
    /// added to a kind's list fails this test until it is added here with
    /// its reason (and to docs/SECURITY.md's table).
    const COMMON_GOLDEN: &[(&str, &str)] = &[
        ("brk", "glibc's allocator grows the heap"),
        (
            "clock_gettime",
            "Instant and SystemTime where the vDSO is not used",
        ),
        ("clock_nanosleep", "thread::sleep"),
        ("close", "descriptors dropped"),
        ("exit", "a thread ends"),
        ("exit_group", "the process ends (the trap's _exit too)"),
        ("futex", "locks, condition variables, channels, joins"),
        ("getpid", "the trap handler; glibc's raise"),
        ("getrandom", "HashMap's keys"),
        ("gettid", "the trap handler; glibc's raise"),
        ("mremap", "glibc's realloc of large blocks"),
        ("munmap", "freed memory, ended threads' stacks"),
        ("nanosleep", "the trap handler parks the thread"),
        ("restart_syscall", "a sleep interrupted by a signal"),
        (
            "rt_sigprocmask",
            "glibc masks signals around thread start and raise",
        ),
        (
            "rt_sigreturn",
            "return from the vCPU kick and other handlers",
        ),
        ("sched_getaffinity", "available_parallelism"),
        ("sched_yield", "spin loops of locks"),
        (
            "sigaltstack",
            "Rust's stack-overflow handler on every thread",
        ),
        ("write", "stderr, stdout, eventfds"),
        ("writev", "stderr; NBD requests"),
        ("open", "passed on to the EACCES filter"),
        ("openat", "passed on to the EACCES filter"),
        ("clone3", "passed on to the ENOSYS filter"),
    ];

    const BLOCK_IO_GOLDEN: &[(&str, &str)] = &[
        ("shutdown", "an NBD socket whose send failed"),
        ("io_uring_enter", "restricted rings made at open"),
        ("pread64", "store and disk reads without io_uring"),
        ("preadv", "store reads"),
        ("pwrite64", "store and disk writes without io_uring"),
        ("pwritev", "store writes"),
        ("fsync", "disk flushes"),
        ("fdatasync", "disk flushes"),
        ("fallocate", "hole punching: discards, trims"),
    ];

    const SWAP_GOLDEN: &[(&str, &str)] = &[
        ("read", "userfaultfd messages; eventfds"),
        ("poll", "waiting on the userfaultfd"),
        ("mincore", "which pages of the parking area are there"),
    ];

    const LISTENER_GOLDEN: &[(&str, &str)] = &[
        ("accept4", "a new client"),
        ("poll", "waiting on the socket and the stop eventfd"),
        ("ppoll", "waiting on the socket and the stop eventfd"),
        ("fcntl", "the accepted socket's flags"),
        ("getsockname", "the accepted socket's address"),
        ("set_robust_list", "a new client thread's start (glibc)"),
        ("rseq", "a new client thread's start (glibc)"),
    ];

    fn golden(kind: ThreadKind) -> Vec<(&'static str, &'static str)> {
        let api_client_own: &[(&str, &str)] = &[
            ("recvfrom", "the client's request"),
            ("ppoll", "waiting on the socket"),
        ];
        let metrics_client_own: &[(&str, &str)] = &[
            ("recvfrom", "the client's request"),
            ("poll", "waiting on the socket and the stop eventfd"),
            ("ppoll", "waiting on the socket and the stop eventfd"),
            ("shutdown", "the end of the answer"),
            ("pread64", "the KVM statistics fd"),
        ];
        let groups: Vec<&[(&str, &str)]> = match kind {
            ThreadKind::Main => vec![
                BLOCK_IO_GOLDEN,
                SWAP_GOLDEN,
                &[
                    ("rt_sigaction", "signal handlers reset at the end"),
                    ("lseek", "--stats-json, --status-file rewritten"),
                    ("ftruncate", "--stats-json, --status-file rewritten"),
                    ("fstat", "files written at the end"),
                    ("newfstatat", "the API socket file checked before removal"),
                    ("statx", "the API socket file checked before removal"),
                    ("fcntl", "descriptors duplicated"),
                    ("unlink", "the API socket file removed"),
                    ("unlinkat", "the API socket file removed"),
                    ("ppoll", "waiting for events"),
                    ("flock", "store and disk locks released"),
                    ("getcwd", "relative paths of the files removed"),
                ],
            ],
            ThreadKind::Vcpu => vec![
                BLOCK_IO_GOLDEN,
                SWAP_GOLDEN,
                &[
                    ("fcntl", "descriptors duplicated by devices"),
                    ("lseek", "console log and disk files"),
                    ("fstat", "console log and disk files"),
                ],
            ],
            ThreadKind::FaultService | ThreadKind::Evictor => {
                vec![BLOCK_IO_GOLDEN, SWAP_GOLDEN]
            }
            ThreadKind::Device => vec![&[
                ("read", "the terminal, the trap's eventfd"),
                ("recvfrom", "signal-hook's socket"),
                ("poll", "waiting on the terminal"),
                ("ppoll", "waiting on the terminal"),
                ("rt_sigaction", "signal-hook at the end"),
            ]],
            ThreadKind::Control => vec![
                LISTENER_GOLDEN,
                BLOCK_IO_GOLDEN,
                SWAP_GOLDEN,
                api_client_own,
            ],
            ThreadKind::ApiClient => vec![BLOCK_IO_GOLDEN, SWAP_GOLDEN, api_client_own],
            ThreadKind::Metrics => vec![LISTENER_GOLDEN, metrics_client_own],
            ThreadKind::MetricsClient => vec![metrics_client_own],
            ThreadKind::Nbd => vec![&[
                ("read", "replies"),
                ("recvfrom", "replies"),
                ("connect", "reconnecting to the server"),
                ("poll", "connect with a timeout"),
                ("ppoll", "connect with a timeout"),
                ("getsockopt", "SO_ERROR of a connect"),
                ("shutdown", "a broken connection"),
                ("fcntl", "the new socket's flags"),
            ]],
            ThreadKind::VhostUser => vec![&[
                ("read", "call eventfds"),
                ("poll", "waiting for calls and hang-ups"),
                ("ppoll", "waiting for calls and hang-ups"),
                ("connect", "reconnecting to the backend"),
                ("getsockopt", "SO_ERROR of a connect"),
                ("fcntl", "the new socket's flags"),
                ("sendmsg", "vhost-user messages with descriptors"),
                ("recvmsg", "vhost-user replies"),
                ("memfd_create", "a new session's shared memory"),
                ("ftruncate", "sizing that memory"),
                ("eventfd2", "a new session's kick and call eventfds"),
                ("shutdown", "the watchdog ending a setup that hung"),
            ]],
            ThreadKind::Teardown => vec![],
        };
        std::iter::once(COMMON_GOLDEN)
            .chain(groups)
            .flatten()
            .copied()
            .collect()
    }

    #[test]
    fn every_unconditional_call_of_every_kind_is_listed_with_its_reason() {
        for kind in ThreadKind::ALL {
            let want: BTreeSet<&str> = golden(kind).iter().map(|(name, _)| *name).collect();
            let got: BTreeSet<&str> = rules(kind, 1)
                .iter()
                .filter(|(_, alternatives)| alternatives.is_empty())
                .map(|(nr, _)| syscall_name(*nr).unwrap())
                .collect();
            let added: Vec<_> = got.difference(&want).collect();
            let dropped: Vec<_> = want.difference(&got).collect();
            assert!(
                added.is_empty() && dropped.is_empty(),
                "{kind}: allowed without conditions but not listed here: {added:?}; listed but not allowed: {dropped:?}"
            );
        }
        for (name, why) in [COMMON_GOLDEN, BLOCK_IO_GOLDEN, SWAP_GOLDEN, LISTENER_GOLDEN]
            .into_iter()
            .flatten()
        {
            assert!(!why.is_empty(), "{name} has no reason");
        }
    }

    #[test]
    fn the_calls_checked_by_argument_are_checked_on_every_kind() {
        for kind in ThreadKind::ALL {
            let rules = rules(kind, 1);
            for nr in [
                sys::mmap,
                sys::mprotect,
                sys::tgkill,
                sys::sendto,
                sys::ioctl,
                sys::madvise,
            ] {
                let alternatives = rules.get(&nr).map_or(0, Vec::len);
                assert!(
                    alternatives > 0,
                    "{kind}: {} is not checked by argument",
                    syscall_name(nr).unwrap()
                );
            }
            assert!(!rules.contains_key(&libc::SYS_tkill), "{kind} may tkill");
        }
    }

    #[test]
    fn no_kind_may_start_programs_or_open_files() {
        // open and openat pass this filter only to be refused by the next.
        assert_eq!(REFUSED, [sys::open, sys::openat]);
        for kind in ThreadKind::ALL {
            let rules = rules(kind, 1);
            for nr in [
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_openat2,
                libc::SYS_ptrace,
                libc::SYS_io_uring_setup,
                libc::SYS_io_uring_register,
                libc::SYS_mount,
                libc::SYS_pkey_mprotect,
                libc::SYS_process_vm_writev,
            ] {
                assert!(
                    !rules.contains_key(&nr),
                    "{kind} threads may call {}",
                    syscall_name(nr).unwrap()
                );
            }
            // seccomp only for a listener's new client, by argument.
            let seccomp = rules.get(&sys::seccomp).map(Vec::len);
            let listener = matches!(kind, ThreadKind::Control | ThreadKind::Metrics);
            assert_eq!(seccomp, listener.then_some(1), "{kind}: seccomp");
        }
    }

    #[test]
    fn only_storage_clients_make_sockets_and_only_stream_families() {
        let clients = [ThreadKind::Nbd, ThreadKind::VhostUser];
        for kind in ThreadKind::ALL {
            let rules = rules(kind, 1);
            for nr in [sys::socket, sys::connect] {
                assert_eq!(
                    rules.contains_key(&nr),
                    clients.contains(&kind),
                    "{kind} and {}",
                    syscall_name(nr).unwrap()
                );
            }
            // Descriptors passed over a socket and memory shared with
            // another process: the vhost-user worker only.
            for nr in [sys::sendmsg, sys::recvmsg, sys::memfd_create] {
                assert_eq!(
                    rules.contains_key(&nr),
                    kind == ThreadKind::VhostUser,
                    "{kind} and {}",
                    syscall_name(nr).unwrap()
                );
            }
        }
        let nbd = rules(ThreadKind::Nbd, 1);
        assert_eq!(nbd[&sys::socket].len(), 3, "one rule per address family");
        let vhost_user = rules(ThreadKind::VhostUser, 1);
        assert_eq!(vhost_user[&sys::socket].len(), 1, "Unix sockets only");
        assert_eq!(
            allowed(ThreadKind::Nbd).ioctls,
            [ioctls::FIONBIO.nr].into(),
            "ioctl only for FIONBIO"
        );
    }

    #[test]
    fn only_listeners_spawn_and_only_threads() {
        for kind in ThreadKind::ALL {
            let rules = rules(kind, 1);
            let clone = rules.get(&sys::clone);
            let listener = matches!(kind, ThreadKind::Control | ThreadKind::Metrics);
            assert_eq!(clone.is_some(), listener, "{kind}");
            if let Some(conditions) = clone {
                assert_eq!(conditions.len(), 1, "clone has its CLONE_THREAD rule");
            }
        }
    }

    /// A client thread inherits its listener's filter and adds its own:
    /// what the client may call must pass both.
    #[test]
    fn listeners_let_their_clients_calls_through() {
        for (listener, client) in [
            (ThreadKind::Control, ThreadKind::ApiClient),
            (ThreadKind::Metrics, ThreadKind::MetricsClient),
        ] {
            assert!(
                allowed(listener).covers(&allowed(client)),
                "{listener} and {client}"
            );
        }
        // A metrics client reaches neither the engine nor the disks.
        let metrics = allowed(ThreadKind::MetricsClient);
        assert!(!metrics.calls.contains(&sys::pwrite64));
        assert!(!metrics.calls.contains(&sys::io_uring_enter));
        assert!(!metrics.ioctls.contains(&ioctls::UFFDIO_COPY.nr));
        assert!(!allowed(ThreadKind::Metrics).covers(&allowed(ThreadKind::ApiClient)));
    }

    #[test]
    fn only_the_teardown_thread_sets_memory_regions_and_no_one_types_into_terminals() {
        for kind in ThreadKind::ALL {
            let ioctls = allowed(kind).ioctls;
            assert_eq!(
                ioctls.contains(&ioctls::KVM_SET_USER_MEMORY_REGION.nr),
                kind == ThreadKind::Teardown,
                "{kind}"
            );
            assert!(!ioctls.contains(&ioctls::TIOCSTI.nr), "{kind}");
            let terminal = ioctls::TERMINAL.iter().any(|r| ioctls.contains(&r.nr));
            assert_eq!(
                terminal,
                matches!(kind, ThreadKind::Main | ThreadKind::Device),
                "{kind}: terminal requests"
            );
        }
        assert_eq!(
            allowed(ThreadKind::Teardown).ioctls,
            [ioctls::KVM_SET_USER_MEMORY_REGION.nr].into()
        );
    }

    #[test]
    fn every_allowed_call_has_a_name() {
        for kind in ThreadKind::ALL {
            for nr in rules(kind, 1).keys() {
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
            for nr in rules(kind, 1).keys() {
                let name = syscall_name(*nr).unwrap();
                let back = syscalls::Sysno::new(*nr as usize).unwrap();
                assert_eq!(back.id() as i64, *nr, "{name}");
            }
        }
    }
}
