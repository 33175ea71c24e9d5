//! A bound on the setup of a session. The `vhost` crate reads replies in a
//! loop that retries on `EAGAIN`, so a socket read timeout does not end a
//! wait for a backend that never answers (one that hung, or one that
//! serves another frontend: QEMU's serves one at a time). Instead this
//! thread shuts the socket down once the bound passes, which ends the
//! read with an error.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Armed {
    /// The socket being set up and when to give up on it.
    target: Option<(UnixStream, Instant)>,
    /// The last armed setup ran out of time.
    fired: bool,
    closing: bool,
}

struct Shared {
    armed: Mutex<Armed>,
    changed: Condvar,
}

fn lock(shared: &Shared) -> MutexGuard<'_, Armed> {
    shared.armed.lock().unwrap_or_else(|e| e.into_inner())
}

/// One client's watchdog thread.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread; `setup` runs on it first (a seccomp filter).
    pub(crate) fn start(setup: impl FnOnce() + Send + 'static) -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            armed: Mutex::new(Armed::default()),
            changed: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("vhost-user-dog".into())
                .spawn(move || {
                    setup();
                    watch(&shared);
                })?
        };
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// Shuts `stream` down unless [`Self::disarm`] comes within `bound`.
    pub(crate) fn arm(&self, stream: &UnixStream, bound: Duration) -> std::io::Result<()> {
        let clone = stream.try_clone()?;
        let mut armed = lock(&self.shared);
        armed.target = Some((clone, Instant::now() + bound));
        armed.fired = false;
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Ends the bound; whether it had run out (the socket was shut down).
    pub(crate) fn disarm(&self) -> bool {
        let mut armed = lock(&self.shared);
        armed.target = None;
        armed.fired
    }
}

fn watch(shared: &Shared) {
    let mut armed = lock(shared);
    loop {
        if armed.closing {
            return;
        }
        let wait = match &armed.target {
            None => Duration::from_secs(3600),
            Some((stream, deadline)) => {
                let now = Instant::now();
                if now >= *deadline {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    armed.target = None;
                    armed.fired = true;
                    continue;
                }
                *deadline - now
            }
        };
        armed = shared
            .changed
            .wait_timeout(armed, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.shared).closing = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_read_that_outlives_the_bound_is_ended_and_a_disarmed_one_is_not() {
        let dog = Watchdog::start(|| {}).unwrap();
        let (mut ours, _peer) = UnixStream::pair().unwrap();
        dog.arm(&ours, Duration::from_millis(100)).unwrap();
        let mut byte = [0u8; 1];
        // The peer never writes: only the shutdown ends this read.
        assert_eq!(ours.read(&mut byte).unwrap(), 0);
        assert!(dog.disarm(), "fired");
        let (ours, _peer) = UnixStream::pair().unwrap();
        dog.arm(&ours, Duration::from_millis(100)).unwrap();
        assert!(!dog.disarm());
        std::thread::sleep(Duration::from_millis(200));
        ours.set_nonblocking(true).unwrap();
        let err = (&ours).read(&mut byte).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "still open");
    }
}
