//! The synchronization primitives of the unit table: std's, or with
//! `--features model-check` shuttle's, whose scheduler controls every
//! atomic access and lock so that a test can explore the interleavings of
//! the engine's protocol (swap/tests/model.rs). Only the table switches:
//! it is where the protocol's concurrency lives (one compare-and-swap per
//! transition, wait shards for the in-flight states).

#[cfg(not(feature = "model-check"))]
pub(super) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(feature = "model-check"))]
pub(super) use std::sync::{Condvar, Mutex};

#[cfg(feature = "model-check")]
pub(super) use shuttle::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(feature = "model-check")]
pub(super) use shuttle::sync::{Condvar, Mutex};

/// Pauses a thread that polls the table for another thread's progress
/// where the state has no wait of its own (`Staged` until its write ends):
/// a sleep of `pause`, or under the model checker a yield to shuttle's
/// scheduler, since a sleep would hold the one thread shuttle runs and let
/// no other make the progress polled for.
#[cfg(not(feature = "model-check"))]
pub(crate) fn poll_pause(pause: std::time::Duration) {
    std::thread::sleep(pause);
}

/// See the std version above.
#[cfg(feature = "model-check")]
pub(crate) fn poll_pause(_pause: std::time::Duration) {
    shuttle::thread::yield_now();
}
