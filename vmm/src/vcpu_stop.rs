//! Stopping vCPU threads at the end of a run, so that the swap engine can
//! be shut down only once no vCPU can touch guest RAM any more.
//!
//! A closed userfaultfd lets a later fault map a zero page: a vCPU still
//! running (or a virtio request it is serving) would then read zeros for
//! memory that is in the store, and could write them to a disk. So the run
//! ends in this order: ask every vCPU to stop, kick it out of `KVM_RUN`
//! with a signal (the engine keeps serving, so a vCPU blocked in a fault
//! gets its page and returns), wait until the thread has ended, and only
//! then release devices and the engine. A vCPU that does not stop in time
//! (blocked on memory the engine cannot serve after a store
//! failure) keeps the engine alive until the process exits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// The signal that kicks a vCPU thread out of `KVM_RUN` (its handler does
/// nothing: the interruption is the point).
fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the kick signal's handler; once per process, before vCPU
/// threads start (a thread sent it without a handler would be killed).
pub fn install_kick_handler() -> std::io::Result<()> {
    static INSTALLED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| register_signal_handler(kick_signal(), on_kick).map_err(|e| e.errno()))
        .map_err(std::io::Error::from_raw_os_error)
}

/// The flag a vCPU thread checks before every entry into the guest.
#[derive(Default, Clone)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// Whether the run asked its vCPUs to stop.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How often a vCPU that has not stopped is kicked again: the flag may be
/// set just after the thread checked it and before it entered the guest,
/// where the first kick found it still outside.
const KICK_INTERVAL: Duration = Duration::from_millis(5);

/// A run's vCPU threads and the flag that asks them to stop. Dropping it
/// does not wait for them: what did not stop is left to the process exit.
#[derive(Default)]
pub struct VcpuThreads {
    /// Checked by every thread before each entry into the guest.
    pub stop: StopFlag,
    /// The threads not known to have ended.
    pub threads: Vec<JoinHandle<()>>,
}

impl VcpuThreads {
    /// Stops every thread (setting the flag, then kicking them) and waits
    /// at most `limit`; returns how many are still running.
    pub fn stop_all(&mut self, limit: Duration) -> usize {
        self.stop.set();
        let deadline = Instant::now() + limit;
        loop {
            self.threads.retain(|t| !t.is_finished());
            if self.threads.is_empty() || Instant::now() >= deadline {
                break;
            }
            for thread in self.threads.iter() {
                // A thread that ended since the check above is no error.
                let _ = thread.kill(kick_signal());
            }
            std::thread::sleep(KICK_INTERVAL);
        }
        // The finished threads' handles were dropped above (nothing to
        // join for: they ended); what is left did not stop.
        self.threads.len()
    }
}
