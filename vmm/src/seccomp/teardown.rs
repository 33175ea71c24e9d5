//! The thread that drops guest RAM at the end of the run, the only one
//! whose filter allows `KVM_SET_USER_MEMORY_REGION`.
//!
//! Memslots are registered on the main thread while the machine is built,
//! before any filter. Dropping `GuestRam` deletes them (through the same
//! ioctl, with a size of 0) before it unmaps the memory, so that KVM never
//! points at whatever is mapped there next. The ioctl cannot be allowed
//! for deletions only (its argument is a pointer a filter cannot follow),
//! and whoever may call it can map any memory of the VMM, keys included,
//! into the guest. So no thread that runs while the guest does may: this
//! thread, started before the main thread's filter, waits for the end of
//! the run doing nothing else, and the run hands it guest RAM to drop.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use guestmem::GuestRam;

use super::kind::ThreadKind;

/// How often the wait for the drop looks for a trapped call.
const TRAP_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// The teardown thread, waiting for guest RAM; with the filters off,
/// nothing (RAM is dropped where it is released).
pub struct RamTeardown {
    thread: Option<(SyncSender<Arc<GuestRam>>, Receiver<()>)>,
}

impl RamTeardown {
    /// Starts the thread (none without filters). Call before the main
    /// thread installs its filter: it forbids starting threads.
    pub fn start() -> Result<Self> {
        if !super::filters::enabled() {
            return Ok(Self { thread: None });
        }
        let (ram_tx, ram_rx) = mpsc::sync_channel::<Arc<GuestRam>>(1);
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("ram-teardown".into())
            .spawn(move || {
                super::filters::install_or_exit(ThreadKind::Teardown);
                // A run that failed before handing RAM over drops the
                // sender: nothing to do then.
                if let Ok(ram) = ram_rx.recv() {
                    drop_if_last(ram);
                    let _ = done_tx.send(());
                }
            })
            .context("cannot spawn the thread that deletes guest RAM's memslots")?;
        Ok(Self {
            thread: Some((ram_tx, done_rx)),
        })
    }

    /// Drops `ram` on the teardown thread and waits until that is done:
    /// when no other thread holds it, its memslots are deleted and its
    /// memory unmapped.
    pub fn release(self, ram: Arc<GuestRam>) {
        let Some((ram_tx, done_rx)) = self.thread else {
            drop(ram);
            return;
        };
        if ram_tx.send(ram).is_err() {
            return;
        }
        // A run in which a filter stopped a call (this thread's, say)
        // ends now: the memory goes with the process.
        while let Err(RecvTimeoutError::Timeout) = done_rx.recv_timeout(TRAP_CHECK_INTERVAL) {
            if super::trap::trapped().is_some() {
                return;
            }
        }
    }
}

/// Drops guest RAM if this is its last holder. Otherwise a thread that
/// did not stop (a vCPU blocked on memory nobody serves after a failure)
/// still holds it: it is kept mapped until the process exits, so that its
/// drop never comes on a thread whose filter forbids deleting memslots.
fn drop_if_last(ram: Arc<GuestRam>) {
    match Arc::try_unwrap(ram) {
        Ok(ram) => drop(ram),
        Err(shared) => std::mem::forget(shared),
    }
}
