//! The kinds of thread, each with a filter of its own (`rules.rs`).

use std::fmt;

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
    /// The helper threads that feed events in: the stop-signal forwarder,
    /// the console input and the seccomp trap's watcher.
    Device,
    /// The API socket's listener (`api`), which starts a thread per client
    /// and checks each client's uid. Its clients inherit its filter, so it
    /// holds theirs too ([`ThreadKind::ApiClient`]).
    Control,
    /// An API client's thread (`api-client`): one client's requests,
    /// `pageout` and `PUT /mem-limit` through the engine included.
    ApiClient,
    /// The `--metrics-addr` listener (`metrics`): as [`ThreadKind::Control`]
    /// for metrics clients.
    Metrics,
    /// A metrics client's thread (`metrics-client`): `GET /metrics` only,
    /// for a peer that may be on another host.
    MetricsClient,
    /// The reply reader of an NBD store or disk (`blockio::nbd`), which
    /// also reconnects to the server after a drop: the one kind that may
    /// make sockets (stream sockets of the Unix and IP families) and
    /// connect them.
    Nbd,
    /// The worker of a vhost-user-blk store or disk
    /// (`blockio::vhost_user_blk`), which takes completions and
    /// reconnects a lost backend, and its setup watchdog: the one kind
    /// that may make Unix stream sockets, memfds and shared mappings of
    /// them, and pass descriptors over a socket.
    VhostUser,
    /// The thread that deletes guest RAM's KVM memslots at the end of the
    /// run (`ram-teardown`): the one kind that may set memory regions, and
    /// it does nothing before the run is over.
    Teardown,
}

impl ThreadKind {
    /// Every kind.
    pub const ALL: [ThreadKind; 12] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::FaultService,
        ThreadKind::Evictor,
        ThreadKind::Device,
        ThreadKind::Control,
        ThreadKind::ApiClient,
        ThreadKind::Metrics,
        ThreadKind::MetricsClient,
        ThreadKind::Nbd,
        ThreadKind::VhostUser,
        ThreadKind::Teardown,
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
            ThreadKind::ApiClient => "api-client",
            ThreadKind::Metrics => "metrics",
            ThreadKind::MetricsClient => "metrics-client",
            ThreadKind::Nbd => "nbd",
            ThreadKind::VhostUser => "vhost-user",
            ThreadKind::Teardown => "teardown",
        }
    }
}

impl fmt::Display for ThreadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
