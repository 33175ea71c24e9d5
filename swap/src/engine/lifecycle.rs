//! Whether the engine runs, stops or has failed, and the VMM's callback
//! for an unrecoverable error. Every thread polls it; it depends on
//! nothing else in the engine.

use super::error::SwapError;
use std::sync::atomic::{AtomicBool, Ordering};

/// Callback for unrecoverable errors (the VMM exits); the error names the
/// unit's guest address where one is concerned.
pub type FatalHandler = Box<dyn Fn(&SwapError) + Send + Sync>;

/// The engine's run state.
pub(crate) struct Lifecycle {
    shutdown: AtomicBool,
    /// Set once `on_fatal` was called: waits for units that can no longer
    /// settle give up.
    failed: AtomicBool,
    on_fatal: FatalHandler,
}

impl Lifecycle {
    /// A running engine reporting unrecoverable errors to `on_fatal`.
    pub fn new(on_fatal: FatalHandler) -> Lifecycle {
        Lifecycle {
            shutdown: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            on_fatal,
        }
    }

    /// True once shutdown started.
    pub fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// True once an unrecoverable error was reported.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// True when waiting for something to settle is pointless: stopping,
    /// or failed (a unit may then stay in flight for good).
    pub fn giving_up(&self) -> bool {
        self.stopping() || self.failed()
    }

    /// Starts shutdown.
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
    }

    /// Reports an unrecoverable error to the VMM.
    pub fn fatal(&self, error: &SwapError) {
        self.failed.store(true, Ordering::Release);
        (self.on_fatal)(error);
    }
}
