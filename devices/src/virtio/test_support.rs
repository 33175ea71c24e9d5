//! A test-side virtio driver: guest memory, a register-level driver for
//! the transport, and queues whose descriptors the test writes by hand.

use std::cell::Cell;
use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::device::VirtioDevice;
use super::mmio::MmioTransport;
use crate::bus::MmioDevice;

/// Guest memory owned by a test.
pub(crate) type TestMemory = Arc<GuestMemoryMmap<()>>;

/// RAM at [0, 8 MiB) and [16 MiB, 24 MiB): a hole in between, like the
/// real layout's gap below 4 GiB.
pub(crate) fn memory() -> TestMemory {
    Arc::new(
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 8 << 20),
            (GuestAddress(16 << 20), 8 << 20),
        ])
        .unwrap(),
    )
}

/// Drives a transport's registers as a guest driver would.
pub(crate) struct TestDriver<'a, D: VirtioDevice> {
    transport: &'a mut MmioTransport<D>,
}

impl<'a, D: VirtioDevice> TestDriver<'a, D> {
    pub(crate) fn new(transport: &'a mut MmioTransport<D>) -> Self {
        Self { transport }
    }

    pub(crate) fn read(&mut self, reg: u32) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(u64::from(reg), &mut data);
        u32::from_le_bytes(data)
    }

    pub(crate) fn write(&mut self, reg: u32, value: u32) {
        self.transport.write(u64::from(reg), &value.to_le_bytes());
    }

    pub(crate) fn ack_features(&mut self, features: u64) {
        self.write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        self.write(VIRTIO_MMIO_DRIVER_FEATURES, features as u32);
        self.write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write(VIRTIO_MMIO_DRIVER_FEATURES, (features >> 32) as u32);
    }

    pub(crate) fn device_features(&mut self) -> u64 {
        self.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        let low = self.read(VIRTIO_MMIO_DEVICE_FEATURES);
        self.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        let high = self.read(VIRTIO_MMIO_DEVICE_FEATURES);
        (u64::from(high) << 32) | u64::from(low)
    }

    /// ACKNOWLEDGE, DRIVER, the features, FEATURES_OK (which must stick).
    pub(crate) fn negotiate(&mut self, features: u64) {
        self.write(VIRTIO_MMIO_STATUS, 0);
        self.write(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.write(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        self.ack_features(features);
        let status = self.read(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_FEATURES_OK;
        self.write(VIRTIO_MMIO_STATUS, status);
        assert_ne!(
            self.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK,
            0,
            "features refused"
        );
    }

    pub(crate) fn setup_queue(&mut self, index: u32, queue: &TestQueue<'_>) {
        let addr = |a: GuestAddress| (a.0 as u32, (a.0 >> 32) as u32);
        self.write(VIRTIO_MMIO_QUEUE_SEL, index);
        self.write(VIRTIO_MMIO_QUEUE_NUM, u32::from(queue.size));
        let (lo, hi) = addr(queue.mock.desc_table_addr());
        self.write(VIRTIO_MMIO_QUEUE_DESC_LOW, lo);
        self.write(VIRTIO_MMIO_QUEUE_DESC_HIGH, hi);
        let (lo, hi) = addr(queue.mock.avail_addr());
        self.write(VIRTIO_MMIO_QUEUE_AVAIL_LOW, lo);
        self.write(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, hi);
        let (lo, hi) = addr(queue.mock.used_addr());
        self.write(VIRTIO_MMIO_QUEUE_USED_LOW, lo);
        self.write(VIRTIO_MMIO_QUEUE_USED_HIGH, hi);
        self.write(VIRTIO_MMIO_QUEUE_READY, 1);
    }

    pub(crate) fn driver_ok(&mut self) {
        let status = self.read(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_DRIVER_OK;
        self.write(VIRTIO_MMIO_STATUS, status);
    }

    pub(crate) fn notify(&mut self, index: u32) {
        self.write(VIRTIO_MMIO_QUEUE_NOTIFY, index);
    }

    pub(crate) fn config(&mut self, offset: u64, data: &mut [u8]) {
        self.transport.read(0x100 + offset, data);
    }
}

/// A split queue in test memory whose descriptors the test places.
pub(crate) struct TestQueue<'a> {
    mock: MockSplitQueue<'a, GuestMemoryMmap<()>>,
    size: u16,
    next_desc: Cell<u16>,
}

impl<'a> TestQueue<'a> {
    pub(crate) fn new(mem: &'a GuestMemoryMmap<()>, base: u64, size: u16) -> Self {
        Self {
            mock: MockSplitQueue::create(mem, GuestAddress(base), size),
            size,
            next_desc: Cell::new(0),
        }
    }

    /// Writes descriptor `index` of the table as given.
    pub(crate) fn set_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.mock
            .desc_table()
            .store(
                index,
                RawDescriptor::from(Descriptor::new(addr, len, flags, next)),
            )
            .unwrap();
    }

    /// Makes the chain headed at `head` available.
    pub(crate) fn publish(&self, head: u16) {
        let idx = self.mock.avail().idx().load();
        self.mock
            .avail()
            .ring()
            .ref_at(usize::from(idx % self.size))
            .unwrap()
            .store(head);
        self.mock.avail().idx().store(idx.wrapping_add(1));
    }

    /// Adds and publishes a chain of (addr, len, device-writable) buffers
    /// on consecutive free descriptors. Returns the head index.
    pub(crate) fn add_chain(&self, buffers: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc.get();
        for (i, &(addr, len, writable)) in buffers.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let mut flags = if writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            let next = (index + 1) % self.size;
            if i + 1 < buffers.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.set_desc(index, addr, len, flags, next);
        }
        self.next_desc
            .set((head + buffers.len() as u16) % self.size);
        self.publish(head);
        head
    }

    /// Entries the device has put in the used ring so far.
    pub(crate) fn used_count(&self) -> u16 {
        self.mock.used().idx().load()
    }

    /// Used entry `i`: (head index, bytes written).
    pub(crate) fn used(&self, i: u16) -> (u32, u32) {
        let elem = self
            .mock
            .used()
            .ring()
            .ref_at(usize::from(i % self.size))
            .unwrap()
            .load();
        (elem.id(), elem.len())
    }
}
