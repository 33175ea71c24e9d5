//! A hook the engine's user runs first thing on each engine thread: the
//! VMM installs the thread's seccomp filter there, so that the filters
//! (and what each kind of thread may do) live with the VMM, not here.

use std::fmt;
use std::sync::Arc;

/// The kinds of thread the engine starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineThread {
    /// A fault-service thread (`swap-fault-N`).
    FaultService,
    /// The background evictor (`swap-evictor`).
    Evictor,
    /// The restore-buffer refill thread (`swap-refill`).
    BufferRefill,
}

/// Called on each engine thread, with its kind, before it does its work
/// (a fault thread's nice value is set before it). It must not block:
/// the engine is not serving faults until it returns.
#[derive(Clone)]
pub struct ThreadSetup(pub Arc<dyn Fn(EngineThread) + Send + Sync>);

impl fmt::Debug for ThreadSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ThreadSetup(..)")
    }
}

impl ThreadSetup {
    /// Runs the hook, if there is one, for a thread of `kind`.
    pub fn run(setup: &Option<ThreadSetup>, kind: EngineThread) {
        if let Some(setup) = setup {
            (setup.0)(kind);
        }
    }
}
