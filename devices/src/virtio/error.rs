//! Why a virtio device stopped working.

use std::io;

use super::chain::ChainError;

/// A failure that leaves a device unusable until the driver resets it: the
/// transport answers it by setting DEVICE_NEEDS_RESET and raising a
/// configuration-change interrupt.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// virtio-queue refused the queue (e.g. the available index ran more
    /// than a queue's worth ahead, or a used-ring write failed).
    #[error("virtio queue {index}: {source}")]
    Queue {
        /// Queue index.
        index: usize,
        /// What virtio-queue said.
        #[source]
        source: virtio_queue::Error,
    },
    /// A ready queue's rings are misplaced: outside guest RAM, or not fitting.
    #[error("virtio queue {index} is unusable: its rings are not inside guest RAM")]
    QueueInvalid {
        /// Queue index.
        index: usize,
    },
    /// A descriptor chain is malformed in a way that leaves no place to
    /// report the failure of the request.
    #[error("malformed descriptor chain on virtio queue {index}: {source}")]
    Chain {
        /// Queue index.
        index: usize,
        /// What was wrong.
        #[source]
        source: ChainError,
    },
    /// The interrupt line could not be raised.
    #[error("cannot raise the virtio interrupt: {0}")]
    Interrupt(#[source] io::Error),
}
