//! seccomp filters, one per kind of thread (docs/SECURITY.md).
//!
//! Each thread installs its kind's filter itself ([`install`]) once it has
//! made what it needs (KVM fds, rings, sockets, the threads it spawns):
//! a filter is inherited by threads spawned later and can only narrow, so
//! the main thread installs its own last, after every other thread
//! started, and a listener's filter lets its clients' calls through
//! (each client narrows it to its own kind first thing). A system call
//! outside the kind's list raises SIGSYS; the handler ([`trap`]) prints
//! the call and the thread kind, parks the thread and has the run loop
//! end the VM as after a failure ([`watch`]: statistics and status file
//! written, status [`EXIT_TRAPPED`](crate::exit::EXIT_TRAPPED)).
//! `clone3` fails with ENOSYS (a second, tiny filter) so that
//! glibc's `pthread_create` falls back to `clone`, whose flags a filter
//! can read (`clone3` passes them in memory, out of a filter's reach);
//! `open` and `openat` fail with EACCES (a third), see `rules::REFUSED`.
//!
//! `--no-seccomp` ([`init`] with `false`) installs nothing.
//! `HUGEVMM_SECCOMP_LOG=1` installs the filters with the `log` action
//! instead of the trap: forbidden calls go through and the kernel logs
//! them (`dmesg`, `type=1326 ... comm="vcpu0" ... syscall=N`). Either
//! is said at the start of the run and in `GET /vm` ([`mode`]).

mod filters;
mod ioctls;
mod kind;
mod probe;
mod rules;
mod teardown;
mod trap;
mod watch;

pub use filters::{
    account_for_trap, enabled, engine_thread_setup, init, install, install_or_exit, mode,
    trapped_message,
};
pub use kind::ThreadKind;
pub use teardown::RamTeardown;
pub use watch::forward_traps;

#[cfg(test)]
mod filter_tests;
