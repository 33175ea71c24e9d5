//! Engine errors.

use crate::store::StoreError;
use crate::uffd::UffdError;

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The region or configuration cannot be managed as given.
    #[error("swap engine cannot manage this region: {0}")]
    Config(String),
    /// A userfaultfd operation failed.
    #[error("userfaultfd operation failed for {what}: {source}")]
    Uffd {
        /// What the engine was doing (names the unit's guest address).
        what: String,
        /// The failed operation.
        #[source]
        source: UffdError,
    },
    /// The store failed; the affected unit stays in memory or blocked.
    #[error("swap store failed: {0}; check the store device/file (the VMM should exit: guest memory cannot be restored)")]
    Store(#[from] StoreError),
    /// A memory-management syscall failed.
    #[error("{what} failed: {source}")]
    Os {
        /// What was attempted.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A userfaultfd operation on one unit failed; `what` names the
    /// operation and the unit's guest address.
    #[error("cannot {what}: {source}")]
    UnitUffd {
        /// E.g. "zero-fill the chunk at gpa 0x...".
        what: String,
        /// The failed operation.
        #[source]
        source: UffdError,
    },
    /// The store failed for one unit; `what` names the operation and the
    /// unit's guest address. The unit stays in memory or its faults stay
    /// blocked: it is never zero-filled.
    #[error("cannot {what}: {source}")]
    UnitStore {
        /// E.g. "restore the swapped-out chunk at gpa 0x...".
        what: String,
        /// The store's complaint.
        #[source]
        source: StoreError,
    },
    /// The store broke its contract (e.g. no result for a write).
    #[error("{0}")]
    StoreContract(String),
    /// The engine is shutting down.
    #[error("swap engine is shutting down")]
    ShuttingDown,
    /// An earlier fatal error (reported through the fatal handler) stopped
    /// the engine: units it left in flight never settle, so a call that
    /// would wait for them returns this instead of waiting for ever.
    #[error("swap engine stopped after an earlier fatal error (the first one reported says why); the VM cannot go on")]
    Failed,
    /// An engine thread panicked (an engine bug): the guest memory it was
    /// serving can no longer be restored, so the VM must end.
    #[error("swap engine thread {thread} panicked: {message} (an engine bug; the VM cannot go on, guest memory faults are no longer served)")]
    ThreadPanicked {
        /// The thread's name.
        thread: String,
        /// The panic's message.
        message: String,
    },
}

impl SwapError {
    /// Wraps a userfaultfd error with context.
    pub(crate) fn uffd(what: impl Into<String>, source: UffdError) -> SwapError {
        SwapError::Uffd {
            what: what.into(),
            source,
        }
    }

    /// A failed userfaultfd operation on one unit.
    pub(crate) fn unit_uffd(what: impl Into<String>, source: UffdError) -> SwapError {
        SwapError::UnitUffd {
            what: what.into(),
            source,
        }
    }

    /// A failed store operation on one unit.
    pub(crate) fn unit_store(what: impl Into<String>, source: StoreError) -> SwapError {
        SwapError::UnitStore {
            what: what.into(),
            source,
        }
    }

    /// Wraps an OS error with context.
    pub(crate) fn os(what: impl Into<String>, source: std::io::Error) -> SwapError {
        SwapError::Os {
            what: what.into(),
            source,
        }
    }
}
