//! How a device raises its interrupt.
//!
//! The VMM implements [`InterruptLine`] with a KVM irqfd: an eventfd whose
//! writes KVM turns into an edge on a guest IRQ line ([`EventFdLine`]).
//! Devices only ever see the trait, so tests count triggers instead
//! ([`CountingLine`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use vmm_sys_util::eventfd::EventFd;

/// One guest interrupt line that a device can pulse.
pub trait InterruptLine: Send + Sync {
    /// Raises the interrupt once.
    fn trigger(&self) -> io::Result<()>;
}

/// An [`InterruptLine`] over an eventfd (registered by the VMM as a KVM
/// irqfd): each trigger adds 1 to the counter, which KVM consumes.
#[derive(Debug)]
pub struct EventFdLine {
    event: EventFd,
}

impl EventFdLine {
    /// Wraps an eventfd.
    pub fn new(event: EventFd) -> Self {
        Self { event }
    }

    /// The eventfd, for registering it with KVM.
    pub fn event_fd(&self) -> &EventFd {
        &self.event
    }
}

impl InterruptLine for EventFdLine {
    fn trigger(&self) -> io::Result<()> {
        self.event.write(1)
    }
}

/// An [`InterruptLine`] that counts its triggers, for tests and for
/// devices whose interrupt nobody listens to.
#[derive(Debug, Default)]
pub struct CountingLine {
    count: AtomicU64,
}

impl CountingLine {
    /// A line that has not been triggered.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times the line was triggered.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

impl InterruptLine for CountingLine {
    fn trigger(&self) -> io::Result<()> {
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_line_adds_to_the_counter() {
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let line = EventFdLine::new(event.try_clone().unwrap());
        line.trigger().unwrap();
        line.trigger().unwrap();
        assert_eq!(event.read().unwrap(), 2);
        assert!(line.event_fd().read().is_err(), "counter consumed");
    }

    #[test]
    fn counting_line_counts() {
        let line = CountingLine::new();
        assert_eq!(line.count(), 0);
        line.trigger().unwrap();
        assert_eq!(line.count(), 1);
    }
}
