//! The thread that turns a trapped call into the end of the run: the
//! SIGSYS handler ([`super::trap`]) cannot send on a channel, so it writes
//! to an eventfd this thread reads; the thread sends the run loop a
//! [`RunEvent::Forbidden`], so that the VM ends as after a failure (its
//! statistics and status file written), and ends the process itself if
//! that end has not come within [`END_LIMIT`].

use std::sync::mpsc::Sender;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use vmm_sys_util::eventfd::EventFd;

use super::kind::ThreadKind;
use super::trap;
use crate::event::RunEvent;
use crate::exit::EXIT_TRAPPED;

/// How long the run may take to end after a trap before the process ends
/// without it: a failed run stops its vCPUs within a second and waits for
/// nothing else, so only a run whose end is stuck (on a lock the parked
/// thread holds, say) takes longer.
pub const END_LIMIT: Duration = Duration::from_secs(10);

/// Where the watcher sends the trap: the current run's event channel.
static EVENTS: Mutex<Option<Sender<RunEvent>>> = Mutex::new(None);

/// Sends a trapped call to `events` as [`RunEvent::Forbidden`]: starts
/// the watcher the first time (on the main thread, before its filter),
/// and points it at this run's channel. Nothing without filters.
pub fn forward_traps(events: Sender<RunEvent>) -> Result<()> {
    if !super::filters::enabled() {
        return Ok(());
    }
    *EVENTS.lock().unwrap_or_else(|p| p.into_inner()) = Some(events);
    if trap::has_doorbell() {
        return Ok(());
    }
    let doorbell =
        EventFd::new(libc::EFD_CLOEXEC).context("cannot create the seccomp trap's eventfd")?;
    let reader = doorbell
        .try_clone()
        .context("cannot duplicate the seccomp trap's eventfd")?;
    let delay = super::probe::watch_delay();
    std::thread::Builder::new()
        .name("seccomp-trap".into())
        .spawn(move || {
            trap::set_watcher();
            super::filters::install_or_exit(ThreadKind::Device);
            watch(&reader, delay)
        })
        .context("cannot spawn the seccomp trap's thread")?;
    // A trap before this ends the process at once, from the handler.
    trap::set_doorbell(doorbell);
    Ok(())
}

fn watch(doorbell: &EventFd, delay: Option<Duration>) {
    loop {
        match doorbell.read() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Without its doorbell the watcher has nothing to wait for; a
            // trap then ends the process from the handler.
            Err(_) => return,
        }
    }
    if let Some(delay) = delay {
        std::thread::sleep(delay);
    }
    let Some(trapped) = trap::trapped() else {
        return;
    };
    let mut message = String::new();
    trap::describe(&trapped, &mut message);
    let events = EVENTS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(events) = events {
        let _ = events.send(RunEvent::Forbidden { message });
    }
    std::thread::sleep(END_LIMIT);
    let line = format!(
        "hugevmm: the run did not end within {} s of the forbidden call: ending at once\n",
        END_LIMIT.as_secs()
    );
    // SAFETY: write on stderr with a valid buffer, then _exit, which runs
    // nothing that could wait for the stuck end.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
        libc::_exit(EXIT_TRAPPED);
    }
}
