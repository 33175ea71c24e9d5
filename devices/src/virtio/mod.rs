//! virtio 1.x devices on the virtio-mmio transport.
//!
//! - [`mmio`]: [`MmioTransport`], the register block a guest driver talks to;
//!   it negotiates features, collects the queue setup and hands both to the
//!   device when the driver says DRIVER_OK.
//! - [`device`]: [`VirtioDevice`], what each device implements.
//! - [`interrupt`]: [`VirtioInterrupt`], the interrupt status shared by
//!   transport and device.
//! - [`chain`]: checking a guest's descriptor chain before touching what it
//!   points to.
//! - [`block`]: virtio-blk over a raw image (O_DIRECT + io_uring).
//! - [`balloon`]: virtio-balloon with statistics and free page reporting.
//! - [`cmdline`]: the kernel command-line fragment that announces a device.

pub mod balloon;
pub mod balloon_stats;
pub mod block;
mod block_disk;
mod block_spec;
pub mod chain;
pub mod cmdline;
pub mod device;
mod error;
pub mod interrupt;
pub mod mmio;
mod queue_drain;
#[cfg(test)]
pub(crate) mod test_support;

pub use balloon::Balloon;
pub use balloon_stats::BalloonStats;
pub use block::Block;
pub use block_disk::{Disk, DiskError, DiskPathCounts};
pub use block_spec::{DiskSpec, DiskSpecError, NbdDisk};
pub use chain::{ChainError, GuestRange, ParsedChain};
pub use cmdline::kernel_cmdline_fragment;
pub use device::VirtioDevice;
pub use error::VirtioError;
pub use interrupt::VirtioInterrupt;
pub use mmio::{MmioTransport, MMIO_WINDOW_BYTES};
