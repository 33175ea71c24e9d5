//! A guest driver for the virtio targets, run from fuzz input: register
//! accesses on the virtio-mmio window, descriptors and ring entries written
//! into guest memory, notifications, and the host's side of each device.
//! Everything a device reads comes from guest RAM, as with a real guest.

use std::sync::Arc;

use devices::interrupt::CountingLine;
use devices::virtio::{MmioTransport, VirtioDevice};
use devices::{GuestMemoryHandle, MmioDevice};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::input::{Input, InputWriter};

/// Guest RAM: two regions with a hole between them, like the real layout's
/// gap below 4 GiB, so that ranges can straddle the end of RAM.
pub const RAM: [(u64, usize); 2] = [(0, 4 << 20), (8 << 20, 4 << 20)];
/// Where queue `q`'s rings live: descriptor table, then the available and
/// used rings at fixed offsets (room for 256 entries each).
pub const QUEUE_BASE: u64 = 2 << 20;
/// Bytes between two queues' areas.
pub const QUEUE_STRIDE: u64 = 0x2_0000;
/// Offset of the available ring in a queue's area.
pub const AVAIL_OFFSET: u64 = 0x1_0000;
/// Offset of the used ring in a queue's area.
pub const USED_OFFSET: u64 = 0x1_8000;

/// Descriptor table of queue `q`.
pub fn desc_table(q: u16) -> u64 {
    QUEUE_BASE + u64::from(q) * QUEUE_STRIDE
}

/// Available ring of queue `q`.
pub fn avail_ring(q: u16) -> u64 {
    desc_table(q) + AVAIL_OFFSET
}

/// Used ring of queue `q`.
pub fn used_ring(q: u16) -> u64 {
    desc_table(q) + USED_OFFSET
}

/// Fresh guest RAM (zero pages until written).
pub fn guest_memory() -> Arc<GuestMemoryMmap<()>> {
    let ranges: Vec<_> = RAM
        .iter()
        .map(|&(gpa, len)| (GuestAddress(gpa), len))
        .collect();
    Arc::new(GuestMemoryMmap::from_ranges(&ranges).expect("fuzz guest RAM"))
}

/// The operations of a driver script; the first byte of each, modulo the
/// count, picks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// `u16` offset, a width byte (1, 2, 4 or 8 bytes), `u64` value: a
    /// write anywhere in the window, configuration space included.
    Write = 0,
    /// `u16` offset, a width byte: a read anywhere in the window.
    Read,
    /// Queue byte, `u16` index, address mode byte, `u64` address, `u32`
    /// length, `u16` flags, `u16` next: one descriptor of the table.
    Desc,
    /// Queue byte, `u16` head: the next available ring entry, and the
    /// available index moved past it.
    Publish,
    /// Queue byte: a QueueNotify register write.
    Notify,
    /// Address mode byte, `u64` address, length-prefixed bytes: guest RAM.
    Memory,
    /// `u64` features to decline, then one byte per queue shifting its
    /// size down: a reset and the whole setup to DRIVER_OK.
    Handshake,
    /// Reads the interrupt status and acknowledges it.
    AckInterrupt,
    /// Selector byte and `u32` argument: something the host does to the
    /// device (see the device's [`Host`] impl).
    Host,
}

const OPS: [Op; 9] = [
    Op::Write,
    Op::Read,
    Op::Desc,
    Op::Publish,
    Op::Notify,
    Op::Memory,
    Op::Handshake,
    Op::AckInterrupt,
    Op::Host,
];

/// What the host side of a device does between guest operations, and
/// what it checks at the end.
pub trait Host: VirtioDevice {
    /// One host action on the device, chosen by `selector`.
    fn host_op(transport: &mut MmioTransport<Self>, selector: u8, arg: u32)
    where
        Self: Sized;
}

/// A guest address from a mode byte and a raw value: mostly inside RAM,
/// where buffers are useful, sometimes at a region's edge or anywhere.
pub fn guest_addr(mode: u8, raw: u64) -> u64 {
    match mode % 4 {
        0 => raw % RAM[0].1 as u64,
        1 => RAM[1].0 + raw % RAM[1].1 as u64,
        2 => {
            let (gpa, len) = RAM[usize::from(mode >> 2) % RAM.len()];
            (gpa + len as u64).wrapping_sub(raw % 0x1_0000)
        }
        _ => raw,
    }
}

/// A driver running one script against one transport.
pub struct Driver<'a, D: Host> {
    /// The device's register window.
    pub transport: &'a mut MmioTransport<D>,
    /// Guest RAM, as the driver writes it.
    pub mem: &'a GuestMemoryMmap<()>,
    /// Queue sizes set by the last handshake (0: not set up).
    pub sizes: Vec<u16>,
}

impl<'a, D: Host> Driver<'a, D> {
    /// A driver of `transport`, with rings in `mem`.
    pub fn new(transport: &'a mut MmioTransport<D>, mem: &'a GuestMemoryMmap<()>) -> Self {
        let queues = transport.device().queue_max_sizes().len();
        Self {
            transport,
            mem,
            sizes: vec![0; queues],
        }
    }

    fn read32(&mut self, reg: u32) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(u64::from(reg), &mut data);
        u32::from_le_bytes(data)
    }

    fn write32(&mut self, reg: u32, value: u32) {
        self.transport.write(u64::from(reg), &value.to_le_bytes());
    }

    fn queue(&self, byte: u8) -> u16 {
        u16::from(byte) % self.sizes.len() as u16
    }

    /// Reset, features, every queue, DRIVER_OK: what Linux's driver does
    /// at probe, with the features in `decline` refused and queue `q`'s
    /// size shifted down by `shifts[q]`.
    pub fn handshake(&mut self, decline: u64, shifts: &[u8]) {
        self.write32(VIRTIO_MMIO_STATUS, 0);
        self.write32(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.write32(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        let mut offered = 0u64;
        for sel in 0..2 {
            self.write32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, sel);
            offered |= u64::from(self.read32(VIRTIO_MMIO_DEVICE_FEATURES)) << (32 * sel);
        }
        let accepted = offered & !decline;
        for sel in 0..2 {
            self.write32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
            self.write32(VIRTIO_MMIO_DRIVER_FEATURES, (accepted >> (32 * sel)) as u32);
        }
        let status = self.read32(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_FEATURES_OK;
        self.write32(VIRTIO_MMIO_STATUS, status);
        for q in 0..self.sizes.len() as u16 {
            self.write32(VIRTIO_MMIO_QUEUE_SEL, u32::from(q));
            let max = self.read32(VIRTIO_MMIO_QUEUE_NUM_MAX);
            let shift = shifts.get(usize::from(q)).copied().unwrap_or(0) % 16;
            let size = (max >> shift) as u16;
            self.sizes[usize::from(q)] = size;
            self.write32(VIRTIO_MMIO_QUEUE_NUM, u32::from(size));
            for (low, high, addr) in [
                (
                    VIRTIO_MMIO_QUEUE_DESC_LOW,
                    VIRTIO_MMIO_QUEUE_DESC_HIGH,
                    desc_table(q),
                ),
                (
                    VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                    VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
                    avail_ring(q),
                ),
                (
                    VIRTIO_MMIO_QUEUE_USED_LOW,
                    VIRTIO_MMIO_QUEUE_USED_HIGH,
                    used_ring(q),
                ),
            ] {
                self.write32(low, addr as u32);
                self.write32(high, (addr >> 32) as u32);
            }
            self.write32(VIRTIO_MMIO_QUEUE_READY, 1);
        }
        let status = self.read32(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_DRIVER_OK;
        self.write32(VIRTIO_MMIO_STATUS, status);
    }

    /// Runs the operations of `input` until it ends.
    pub fn run(&mut self, input: &mut Input<'_>) {
        while !input.is_empty() {
            let op = OPS[usize::from(input.u8()) % OPS.len()];
            self.step(op, input);
        }
    }

    fn step(&mut self, op: Op, input: &mut Input<'_>) {
        match op {
            Op::Write => {
                let offset = u64::from(input.u16()) % 0x1000;
                let width = [1, 2, 4, 8][usize::from(input.u8()) % 4];
                let value = input.u64().to_le_bytes();
                self.transport.write(offset, &value[..width]);
            }
            Op::Read => {
                let offset = u64::from(input.u16()) % 0x1000;
                let width = [1, 2, 4, 8][usize::from(input.u8()) % 4];
                let mut data = [0u8; 8];
                self.transport.read(offset, &mut data[..width]);
            }
            Op::Desc => {
                let q = self.queue(input.u8());
                let index = input.u16();
                let mode = input.u8();
                let addr = guest_addr(mode, input.u64());
                let len = input.u32();
                let flags = input.u16();
                let next = input.u16();
                let size = self.sizes[usize::from(q)].max(1);
                let at = desc_table(q) + 16 * u64::from(index % size);
                let mut desc = [0u8; 16];
                desc[..8].copy_from_slice(&addr.to_le_bytes());
                desc[8..12].copy_from_slice(&len.to_le_bytes());
                desc[12..14].copy_from_slice(&flags.to_le_bytes());
                desc[14..].copy_from_slice(&next.to_le_bytes());
                let _ = self.mem.write_slice(&desc, GuestAddress(at));
            }
            Op::Publish => {
                let q = self.queue(input.u8());
                let head = input.u16();
                self.publish(q, head);
            }
            Op::Notify => {
                let q = input.u8();
                self.write32(VIRTIO_MMIO_QUEUE_NOTIFY, u32::from(q) % 8);
            }
            Op::Memory => {
                let mode = input.u8();
                let addr = guest_addr(mode, input.u64());
                let bytes = input.short_bytes();
                let _ = self.mem.write_slice(bytes, GuestAddress(addr));
            }
            Op::Handshake => {
                let decline = input.u64();
                let shifts: Vec<u8> = (0..self.sizes.len()).map(|_| input.u8()).collect();
                self.handshake(decline, &shifts);
            }
            Op::AckInterrupt => {
                let status = self.read32(VIRTIO_MMIO_INTERRUPT_STATUS);
                self.write32(VIRTIO_MMIO_INTERRUPT_ACK, status);
            }
            Op::Host => {
                let selector = input.u8();
                let arg = input.u32();
                D::host_op(self.transport, selector, arg);
            }
        }
    }

    /// Makes `head` available on queue `q`, as a driver does.
    pub fn publish(&mut self, q: u16, head: u16) {
        let size = self.sizes[usize::from(q)].max(1);
        let idx_at = GuestAddress(avail_ring(q) + 2);
        let idx: u16 = self.mem.read_obj(idx_at).unwrap_or(0);
        let slot = avail_ring(q) + 4 + 2 * u64::from(idx % size);
        let _ = self.mem.write_obj(head, GuestAddress(slot));
        let _ = self.mem.write_obj(idx.wrapping_add(1), idx_at);
    }

    /// Entries the device has put in queue `q`'s used ring.
    pub fn used_idx(&self, q: u16) -> u16 {
        self.mem
            .read_obj(GuestAddress(used_ring(q) + 2))
            .unwrap_or(0)
    }

    /// Used entry `i` of queue `q`: (head, bytes written).
    pub fn used(&self, q: u16, i: u16) -> (u32, u32) {
        let size = self.sizes[usize::from(q)].max(1);
        let at = used_ring(q) + 4 + 8 * u64::from(i % size);
        let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap_or(u32::MAX);
        let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap_or(u32::MAX);
        (id, len)
    }
}

/// A transport over `device` and fresh guest RAM.
pub fn transport<D: Host>(device: D, mem: &Arc<GuestMemoryMmap<()>>) -> MmioTransport<D> {
    let handle: GuestMemoryHandle = mem.clone();
    MmioTransport::new(device, handle, Arc::new(CountingLine::new()))
}

/// Builds driver scripts: the seed generators use it.
#[derive(Debug, Default)]
pub struct Script {
    w: InputWriter,
}

impl Script {
    /// An empty script.
    pub fn new() -> Self {
        Self::default()
    }

    /// The prefix the device targets read before the operations: features
    /// to decline and the queues' size shifts.
    pub fn setup(&mut self, decline: u64, shifts: &[u8]) -> &mut Self {
        self.w.u64(decline).bytes(shifts);
        self
    }

    /// [`Op::Memory`] at a RAM offset in region 0.
    pub fn memory(&mut self, addr: u64, bytes: &[u8]) -> &mut Self {
        self.w
            .u8(Op::Memory as u8)
            .u8(0)
            .u64(addr)
            .short_bytes(bytes);
        self
    }

    /// [`Op::Desc`] with an address in region 0.
    pub fn desc(
        &mut self,
        q: u8,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> &mut Self {
        self.w
            .u8(Op::Desc as u8)
            .u8(q)
            .u16(index)
            .u8(0)
            .u64(addr)
            .u32(len)
            .u16(flags)
            .u16(next);
        self
    }

    /// [`Op::Publish`].
    pub fn publish(&mut self, q: u8, head: u16) -> &mut Self {
        self.w.u8(Op::Publish as u8).u8(q).u16(head);
        self
    }

    /// [`Op::Notify`].
    pub fn notify(&mut self, q: u8) -> &mut Self {
        self.w.u8(Op::Notify as u8).u8(q);
        self
    }

    /// [`Op::Write`] of a 32-bit register.
    pub fn write32(&mut self, offset: u16, value: u32) -> &mut Self {
        self.w
            .u8(Op::Write as u8)
            .u16(offset)
            .u8(2)
            .u64(u64::from(value));
        self
    }

    /// [`Op::Read`] of a 32-bit register.
    pub fn read32(&mut self, offset: u16) -> &mut Self {
        self.w.u8(Op::Read as u8).u16(offset).u8(2);
        self
    }

    /// [`Op::Handshake`].
    pub fn handshake(&mut self, decline: u64, shifts: &[u8]) -> &mut Self {
        self.w.u8(Op::Handshake as u8).u64(decline).bytes(shifts);
        self
    }

    /// [`Op::AckInterrupt`].
    pub fn ack_interrupt(&mut self) -> &mut Self {
        self.w.u8(Op::AckInterrupt as u8);
        self
    }

    /// [`Op::Host`].
    pub fn host(&mut self, selector: u8, arg: u32) -> &mut Self {
        self.w.u8(Op::Host as u8).u8(selector).u32(arg);
        self
    }

    /// Raw bytes (e.g. a selector the target reads first).
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.w.bytes(bytes);
        self
    }

    /// The input.
    pub fn finish(&self) -> Vec<u8> {
        self.w.finish()
    }
}
