//! The loop every device runs on a notified queue: take each available
//! chain, let the device handle it, return it through the used ring, and
//! interrupt the driver once at the end.

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};

use guestmem::GuestMemoryView;

use super::error::VirtioError;
use super::interrupt::VirtioInterrupt;

/// What a device did with a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Done: return it with this many bytes written.
    Used(u32),
    /// The device keeps the chain and returns it later (balloon statistics).
    Hold,
}

/// Handles every chain available on `queue` (queue number `index`). A
/// handler error stops the loop; chains already used are still announced.
pub(crate) fn drain_queue<F>(
    queue: &mut Queue,
    index: usize,
    mem: &GuestMemoryView,
    interrupt: &VirtioInterrupt,
    mut handle: F,
) -> Result<(), VirtioError>
where
    F: FnMut(DescriptorChain<&GuestMemoryView>) -> Result<Disposition, VirtioError>,
{
    if !queue.ready() {
        return Ok(());
    }
    let mut used_any = false;
    let outcome = loop {
        // A fresh iterator per chain re-reads the available index (chains
        // the driver adds meanwhile are taken too) and releases the queue
        // borrow so the chain can be returned before the next is taken.
        let chain = match queue.iter(mem) {
            Ok(mut chains) => chains.next(),
            Err(source) => break Err(VirtioError::Queue { index, source }),
        };
        let Some(chain) = chain else {
            break Ok(());
        };
        let head = chain.head_index();
        match handle(chain) {
            Ok(Disposition::Used(len_bytes)) => {
                if let Err(source) = queue.add_used(mem, head, len_bytes) {
                    break Err(VirtioError::Queue { index, source });
                }
                used_any = true;
            }
            Ok(Disposition::Hold) => {}
            Err(err) => break Err(err),
        }
    };
    if used_any {
        notify_used(queue, index, mem, interrupt)?;
    }
    outcome
}

/// Interrupts the driver for new used entries on `queue` unless it asked
/// not to be.
pub(crate) fn notify_used(
    queue: &mut Queue,
    index: usize,
    mem: &GuestMemoryView,
    interrupt: &VirtioInterrupt,
) -> Result<(), VirtioError> {
    let wanted = queue
        .needs_notification(mem)
        .map_err(|source| VirtioError::Queue { index, source })?;
    if wanted {
        interrupt
            .signal_used_queue()
            .map_err(VirtioError::Interrupt)?;
    }
    Ok(())
}
