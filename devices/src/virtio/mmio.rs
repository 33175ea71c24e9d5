//! The virtio-mmio transport, version 2 (virtio 1.x, "modern") only.
//!
//! The register block is what a guest driver talks to: it reads the device
//! identity and features, acknowledges the features it accepts, describes
//! each queue (size and ring addresses) and sets status bits. When the
//! driver sets DRIVER_OK the transport checks the queues and activates the
//! device; from then on a QueueNotify write runs the device on that queue.
//!
//! Legacy (version 1) registers are not implemented: a legacy-only driver
//! sees Version 2 and gives up, as Linux's does.

use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};

use super::device::VirtioDevice;
use super::error::VirtioError;
use super::interrupt::VirtioInterrupt;
use crate::bus::MmioDevice;
use crate::interrupt::InterruptLine;
use crate::memory::GuestMemoryHandle;

/// Size of one device's MMIO window: registers up to 0x100, then the
/// configuration space.
pub const MMIO_WINDOW_BYTES: u64 = 0x1000;

/// "virt" in little-endian.
const MAGIC_VALUE: u32 = 0x7472_6976;
/// The virtio-mmio version of virtio 1.x.
const MMIO_VERSION: u32 = 2;
/// Vendor ID reported to the driver (no meaning to Linux).
const VENDOR_ID: u32 = 0x4856_4d4d; // "HVMM"
/// Where the device-specific configuration space starts.
const CONFIG_SPACE_OFFSET: u64 = VIRTIO_MMIO_CONFIG as u64;
/// Status bits the driver sets, in the order it must set them.
const DRIVER_STATUS_BITS: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE
    | VIRTIO_CONFIG_S_DRIVER
    | VIRTIO_CONFIG_S_FEATURES_OK
    | VIRTIO_CONFIG_S_DRIVER_OK
    | VIRTIO_CONFIG_S_FAILED;

/// A virtio device behind a virtio-mmio register block; put it on the
/// [`crate::MmioBus`] with a [`MMIO_WINDOW_BYTES`] window.
pub struct MmioTransport<D: VirtioDevice> {
    device: D,
    memory: GuestMemoryHandle,
    interrupt: Arc<VirtioInterrupt>,
    /// The queues as the driver configures them. At activation the device
    /// gets copies; these stay behind to answer register reads.
    queues: Vec<Queue>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    activated: bool,
}

impl<D: VirtioDevice> std::fmt::Debug for MmioTransport<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device.device_type())
            .field("status", &self.status)
            .field("acked_features", &self.acked_features)
            .field("activated", &self.activated)
            .finish_non_exhaustive()
    }
}

impl<D: VirtioDevice> MmioTransport<D> {
    /// Wraps `device`, whose buffers live in `memory` and whose interrupt
    /// is `irq`.
    pub fn new(device: D, memory: GuestMemoryHandle, irq: Arc<dyn InterruptLine>) -> Self {
        let queues = fresh_queues(device.queue_max_sizes());
        Self {
            device,
            memory,
            interrupt: Arc::new(VirtioInterrupt::new(irq)),
            queues,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            activated: false,
        }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, e.g. to set a balloon target.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The device status register (`VIRTIO_CONFIG_S_*` bits).
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the device is working (activated and not needing a reset).
    pub fn is_active(&self) -> bool {
        self.activated && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
    }

    /// Features both sides agreed on.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// The interrupt state shared with the device.
    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    /// Runs the device on queue `index`, as a QueueNotify write does. For a
    /// VMM that takes notifications through an ioeventfd instead of MMIO
    /// exits. Does nothing unless the device is working.
    pub fn notify_queue(&mut self, index: usize) {
        if !self.is_active() || index >= self.queues.len() {
            return;
        }
        if let Err(err) = self.device.process_queue(index) {
            self.fail(&err);
        }
    }

    fn offered_features(&self) -> u64 {
        self.device.features() | (1 << VIRTIO_F_VERSION_1)
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    /// Queue registers may change only between FEATURES_OK and DRIVER_OK.
    fn selected_queue_mut(&mut self) -> Option<&mut Queue> {
        let configurable = self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0;
        if !configurable {
            return None;
        }
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// The device broke: tell the driver through DEVICE_NEEDS_RESET and a
    /// configuration-change interrupt, and stop running the device.
    fn fail(&mut self, err: &VirtioError) {
        // The guest breaks a device as often as it likes: the binary rate
        // limits records of this target.
        log::warn!(
            target: "guest::virtio",
            "virtio device type {} needs a reset: {err}",
            self.device.device_type()
        );
        self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            // Failing to raise it leaves the driver to find out on its next
            // status read; there is nobody else to tell.
            let _ = self.interrupt.signal_config_change();
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        self.queues = fresh_queues(self.device.queue_max_sizes());
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
        self.activated = false;
        self.interrupt.clear();
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status & DRIVER_STATUS_BITS;
        let new = value & DRIVER_STATUS_BITS;
        // The driver only ever adds bits (or resets); anything else is a
        // confused driver, and the device keeps its state.
        if new & old != old {
            return;
        }
        let added = new & !old;
        let mut accepted = new;
        if added & VIRTIO_CONFIG_S_FEATURES_OK != 0 && !self.features_acceptable() {
            // The driver reads the status back and gives up.
            accepted &= !VIRTIO_CONFIG_S_FEATURES_OK;
        }
        if added & VIRTIO_CONFIG_S_DRIVER_OK != 0 && accepted & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
            accepted &= !VIRTIO_CONFIG_S_DRIVER_OK;
        }
        self.status = accepted | (self.status & VIRTIO_CONFIG_S_NEEDS_RESET);
        if added & accepted & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            self.activate();
        }
    }

    /// Modern devices only: a driver that did not accept VERSION_1 would
    /// expect the legacy layout.
    fn features_acceptable(&self) -> bool {
        self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        if self.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0 {
            return;
        }
        let memory = self.memory.clone();
        let mut copies = Vec::with_capacity(self.queues.len());
        // Buffers made available before DRIVER_OK: Linux's virtio_balloon
        // primes its statistics queue and kicks it while probing, before
        // the device is live, and then waits for that buffer to come back.
        let mut pending = Vec::new();
        for (index, queue) in self.queues.iter().enumerate() {
            if queue.ready() && !queue.is_valid(memory.memory()) {
                self.fail(&VirtioError::QueueInvalid { index });
                return;
            }
            if queue.ready()
                && queue
                    .avail_idx(memory.memory(), std::sync::atomic::Ordering::Acquire)
                    .is_ok_and(|avail| avail != std::num::Wrapping(queue.next_avail()))
            {
                pending.push(index);
            }
            match Queue::try_from(queue.state()) {
                Ok(copy) => copies.push(copy),
                Err(source) => {
                    self.fail(&VirtioError::Queue { index, source });
                    return;
                }
            }
        }
        let result =
            self.device
                .activate(self.acked_features, memory, copies, self.interrupt.clone());
        match result {
            Ok(()) => self.activated = true,
            Err(err) => return self.fail(&err),
        }
        for index in pending {
            self.notify_queue(index);
        }
    }

    fn read_register(&self, offset: u32) -> u32 {
        match offset {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC_VALUE,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => {
                self.selected_queue().map_or(0, |q| u32::from(q.max_size()))
            }
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt.status(),
            VIRTIO_MMIO_STATUS => self.status,
            VIRTIO_MMIO_CONFIG_GENERATION => self.interrupt.config_generation(),
            // No shared memory regions: a length of all ones says so.
            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            VIRTIO_MMIO_SHM_BASE_LOW | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            _ => 0,
        }
    }

    fn write_register(&mut self, offset: u32, value: u32) {
        match offset {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => {
                if let Some(queue) = self.selected_queue_mut() {
                    // An invalid size is ignored; the driver then runs with
                    // a mismatched ring and gets what it asked for.
                    let _ = queue.try_set_size(value.try_into().unwrap_or(0));
                }
            }
            VIRTIO_MMIO_QUEUE_READY => {
                if let Some(queue) = self.selected_queue_mut() {
                    queue.set_ready(value == 1);
                }
            }
            VIRTIO_MMIO_QUEUE_DESC_LOW => {
                self.with_queue(|q| q.set_desc_table_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_DESC_HIGH => {
                self.with_queue(|q| q.set_desc_table_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => {
                self.with_queue(|q| q.set_avail_ring_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.with_queue(|q| q.set_avail_ring_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_USED_LOW => {
                self.with_queue(|q| q.set_used_ring_address(Some(value), None))
            }
            VIRTIO_MMIO_QUEUE_USED_HIGH => {
                self.with_queue(|q| q.set_used_ring_address(None, Some(value)))
            }
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify_queue(value as usize),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt.ack(value),
            VIRTIO_MMIO_STATUS => self.write_status(value),
            _ => {}
        }
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(queue) = self.selected_queue_mut() {
            f(queue);
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        // Features are settled once FEATURES_OK is set.
        let negotiating = self.status & VIRTIO_CONFIG_S_DRIVER != 0
            && self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0;
        if !negotiating {
            return;
        }
        let (shift, mask) = match self.driver_features_sel {
            0 => (0, 0xffff_ffffu64),
            1 => (32, 0xffff_ffff_0000_0000u64),
            _ => return,
        };
        // Bits the device did not offer cannot be accepted.
        let word = (u64::from(value) << shift) & self.offered_features();
        self.acked_features = (self.acked_features & !mask) | word;
    }
}

impl<D: VirtioDevice> MmioDevice for MmioTransport<D> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.read_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        // Registers are 32 bits wide and accessed as such; anything else
        // reads as 0.
        data.fill(0);
        if data.len() == 4 && offset % 4 == 0 {
            let value = self.read_register(offset as u32);
            data.copy_from_slice(&value.to_le_bytes());
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.write_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        if let (Ok(bytes), true) = (<[u8; 4]>::try_from(data), offset % 4 == 0) {
            self.write_register(offset as u32, u32::from_le_bytes(bytes));
        }
    }
}

fn fresh_queues(max_sizes: &[u16]) -> Vec<Queue> {
    max_sizes
        .iter()
        // Devices declare power-of-two sizes up to 32768; anything else is a
        // bug in the device, caught by every test that builds one.
        .map(|&size| Queue::new(size).expect("virtio device declares a valid queue size"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use virtio_queue::QueueOwnedT;

    use super::*;
    use crate::interrupt::CountingLine;
    use crate::virtio::test_support::{self, TestDriver, TestMemory};

    /// Records what the transport asks of it.
    #[derive(Default)]
    struct Recorder {
        config: [u8; 8],
        activations: Vec<(u64, Vec<bool>)>,
        notified: Vec<usize>,
        queues: Vec<Queue>,
        memory: Option<GuestMemoryHandle>,
        interrupt: Option<Arc<VirtioInterrupt>>,
        resets: usize,
        fail_next: Arc<Mutex<bool>>,
    }

    impl VirtioDevice for Recorder {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 8]
        }
        fn features(&self) -> u64 {
            1 << 3
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            crate::virtio::device::read_config_bytes(&self.config, offset, data);
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) {
            if let Some(slot) = self
                .config
                .get_mut(offset as usize..offset as usize + data.len())
            {
                slot.copy_from_slice(data);
            }
        }
        fn activate(
            &mut self,
            acked_features: u64,
            memory: GuestMemoryHandle,
            queues: Vec<Queue>,
            interrupt: Arc<VirtioInterrupt>,
        ) -> Result<(), VirtioError> {
            self.activations
                .push((acked_features, queues.iter().map(|q| q.ready()).collect()));
            self.queues = queues;
            self.memory = Some(memory);
            self.interrupt = Some(interrupt);
            Ok(())
        }
        fn process_queue(&mut self, index: usize) -> Result<(), VirtioError> {
            self.notified.push(index);
            if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
                return Err(VirtioError::QueueInvalid { index });
            }
            // Consume and return every chain, as a device would.
            let memory = self.memory.clone().unwrap();
            let mem = memory.memory();
            let queue = &mut self.queues[index];
            while let Some(chain) = queue.iter(mem).unwrap().next() {
                let head = chain.head_index();
                queue.add_used(mem, head, 0).unwrap();
            }
            self.interrupt
                .as_ref()
                .unwrap()
                .signal_used_queue()
                .unwrap();
            Ok(())
        }
        fn reset(&mut self) {
            self.resets += 1;
            self.queues.clear();
            self.memory = None;
        }
    }

    fn transport() -> (MmioTransport<Recorder>, Arc<CountingLine>, TestMemory) {
        let mem = test_support::memory();
        let line = Arc::new(CountingLine::new());
        let t = MmioTransport::new(Recorder::default(), mem.clone(), line.clone());
        (t, line, mem)
    }

    #[test]
    fn identity_registers() {
        let (mut t, _line, _mem) = transport();
        let mut d = TestDriver::new(&mut t);
        assert_eq!(d.read(VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
        assert_eq!(d.read(VIRTIO_MMIO_VERSION), 2);
        assert_eq!(d.read(VIRTIO_MMIO_DEVICE_ID), 42);
        assert_eq!(d.read(VIRTIO_MMIO_DEVICE_FEATURES), 1 << 3);
        d.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        assert_eq!(
            d.read(VIRTIO_MMIO_DEVICE_FEATURES),
            1,
            "VERSION_1 is bit 32"
        );
        d.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 2);
        assert_eq!(d.read(VIRTIO_MMIO_DEVICE_FEATURES), 0);
        // Narrow or unaligned register accesses read 0 and write nothing.
        let mut narrow = [0xffu8; 2];
        t.read(u64::from(VIRTIO_MMIO_MAGIC_VALUE), &mut narrow);
        assert_eq!(narrow, [0, 0]);
        let mut word = [0u8; 4];
        t.read(2, &mut word);
        assert_eq!(word, [0; 4]);
        t.write(u64::from(VIRTIO_MMIO_STATUS), &[1]);
        assert_eq!(t.status(), 0);
    }

    #[test]
    fn features_ok_requires_version_1() {
        let (mut t, _line, _mem) = transport();
        let mut d = TestDriver::new(&mut t);
        d.write(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        d.ack_features(1 << 3);
        let status = d.read(VIRTIO_MMIO_STATUS);
        d.write(VIRTIO_MMIO_STATUS, status | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(d.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK, 0);
        // DRIVER_OK without FEATURES_OK is refused too.
        let status = d.read(VIRTIO_MMIO_STATUS);
        d.write(VIRTIO_MMIO_STATUS, status | VIRTIO_CONFIG_S_DRIVER_OK);
        assert_eq!(d.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_DRIVER_OK, 0);
        // Unoffered bits are dropped; with VERSION_1 it is accepted.
        d.ack_features((1 << 32) | (1 << 3) | (1 << 5) | (1 << 40));
        let status = d.read(VIRTIO_MMIO_STATUS);
        d.write(VIRTIO_MMIO_STATUS, status | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_ne!(d.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK, 0);
        assert_eq!(t.acked_features(), (1 << 32) | (1 << 3));
        // Features are frozen after FEATURES_OK.
        let mut d = TestDriver::new(&mut t);
        d.ack_features(1 << 32);
        assert_eq!(t.acked_features(), (1 << 32) | (1 << 3));
    }

    #[test]
    fn queue_setup_activation_notify_and_interrupts() {
        let (mut t, line, mem) = transport();
        let vq = test_support::TestQueue::new(&mem, 0x10000, 16);
        let mut d = TestDriver::new(&mut t);
        d.negotiate((1 << 32) | (1 << 3));
        d.write(VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
        d.write(VIRTIO_MMIO_QUEUE_SEL, 1);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 8);
        d.write(VIRTIO_MMIO_QUEUE_SEL, 2);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 0, "no third queue");
        d.setup_queue(0, &vq);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_READY), 1);
        d.driver_ok();
        assert!(t.is_active());
        assert_eq!(
            t.device().activations,
            vec![((1 << 32) | (1 << 3), vec![true, false])]
        );

        // Queue registers are frozen after DRIVER_OK.
        let mut d = TestDriver::new(&mut t);
        d.write(VIRTIO_MMIO_QUEUE_SEL, 1);
        d.write(VIRTIO_MMIO_QUEUE_READY, 1);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_READY), 0);

        vq.add_chain(&[(0x20000, 8, false)]);
        d.write(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(vq.used_count(), 1);
        assert_eq!(line.count(), 1);
        assert_eq!(d.read(VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
        d.write(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
        assert_eq!(d.read(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        // A notify for a queue that does not exist is ignored.
        d.write(VIRTIO_MMIO_QUEUE_NOTIFY, 7);
        assert_eq!(t.device().notified, vec![0]);
    }

    #[test]
    fn config_space_and_generation() {
        let (mut t, _line, _mem) = transport();
        t.write(0x100 + 2, &[7, 8]);
        let mut data = [0u8; 4];
        t.read(0x100, &mut data);
        assert_eq!(data, [0, 0, 7, 8]);
        let generation = TestDriver::new(&mut t).read(VIRTIO_MMIO_CONFIG_GENERATION);
        t.interrupt().signal_config_change().unwrap();
        assert_ne!(
            TestDriver::new(&mut t).read(VIRTIO_MMIO_CONFIG_GENERATION),
            generation
        );
    }

    #[test]
    fn reset_returns_to_the_initial_state() {
        let (mut t, _line, mem) = transport();
        let vq = test_support::TestQueue::new(&mem, 0x10000, 16);
        let mut d = TestDriver::new(&mut t);
        d.negotiate(1 << 32);
        d.setup_queue(0, &vq);
        d.driver_ok();
        let resets_before = t.device().resets;
        let mut d = TestDriver::new(&mut t);
        d.write(VIRTIO_MMIO_STATUS, 0);
        assert_eq!(d.read(VIRTIO_MMIO_STATUS), 0);
        d.write(VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_eq!(d.read(VIRTIO_MMIO_QUEUE_READY), 0);
        assert!(!t.is_active());
        assert_eq!(t.device().resets, resets_before + 1);
        assert_eq!(t.acked_features(), 0);
        // And it can be brought up again.
        let mut d = TestDriver::new(&mut t);
        d.negotiate(1 << 32);
        d.setup_queue(0, &vq);
        d.driver_ok();
        assert!(t.is_active());
        assert_eq!(t.device().activations.len(), 2);
    }

    #[test]
    fn device_errors_set_needs_reset_and_raise_a_config_interrupt() {
        let (mut t, line, mem) = transport();
        let vq = test_support::TestQueue::new(&mem, 0x10000, 16);
        let fail = t.device().fail_next.clone();
        let mut d = TestDriver::new(&mut t);
        d.negotiate(1 << 32);
        d.setup_queue(0, &vq);
        d.driver_ok();
        *fail.lock().unwrap() = true;
        d.write(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_ne!(d.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
        assert_ne!(
            d.read(VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG,
            0
        );
        assert_eq!(line.count(), 1);
        // A broken device is not run again until reset.
        d.write(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(t.device().notified.len(), 1);
    }

    /// Linux's balloon driver kicks its statistics queue before DRIVER_OK;
    /// that buffer must not be lost.
    #[test]
    fn buffers_made_available_before_driver_ok_are_processed_at_activation() {
        let (mut t, line, mem) = transport();
        let vq = test_support::TestQueue::new(&mem, 0x10000, 16);
        let mut d = TestDriver::new(&mut t);
        d.negotiate(1 << 32);
        d.setup_queue(0, &vq);
        vq.add_chain(&[(0x40000, 16, false)]);
        d.notify(0);
        assert!(t.device().notified.is_empty(), "not live yet");
        let mut d = TestDriver::new(&mut t);
        d.driver_ok();
        assert_eq!(t.device().notified, [0]);
        assert_eq!(vq.used_count(), 1);
        assert_eq!(line.count(), 1);
    }

    #[test]
    fn rings_outside_ram_fail_activation() {
        let (mut t, _line, _mem) = transport();
        let mut d = TestDriver::new(&mut t);
        d.negotiate(1 << 32);
        d.write(VIRTIO_MMIO_QUEUE_SEL, 0);
        d.write(VIRTIO_MMIO_QUEUE_NUM, 16);
        d.write(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000);
        d.write(VIRTIO_MMIO_QUEUE_DESC_HIGH, 0x10); // far outside RAM
        d.write(VIRTIO_MMIO_QUEUE_AVAIL_LOW, 0x2000);
        d.write(VIRTIO_MMIO_QUEUE_USED_LOW, 0x3000);
        d.write(VIRTIO_MMIO_QUEUE_READY, 1);
        d.driver_ok();
        assert!(!t.is_active());
        assert_ne!(t.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
        assert!(t.device().activations.is_empty());
    }
}
